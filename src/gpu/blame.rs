//! Pure: which GPUs the failing pairs point at. The one rule the pair judge (`gpu::pairs`, whose
//! [`Blame`] the Node condition and Events take), the pair probe's table and the failure texts
//! all apply, so that none names a GPU another does not:
//!
//! - a GPU all of whose pairs fail, with three GPUs or more, is at fault (the broken-GPU case),
//!   as is a lost GPU; every GPU so is the node's fault (fabric, platform, driver), no GPU's;
//! - else the GPU in the most failing pairs, two or more;
//! - else either end of each failing pair.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Blame, PairReason, Suspect, SuspectBy};

/// One pair as the rule sees it. Ordered pairs (the probe's) count each direction as a pair.
#[derive(Debug, Clone, Copy)]
pub struct PairOutcome<'a> {
    pub gpu: u32,
    pub peer_gpu: u32,
    pub failing: bool,
    /// Why it fails, for the suspects' reasons.
    pub reasons: &'a [PairReason],
}

impl PairOutcome<'_> {
    fn has(&self, gpu: u32) -> bool {
        self.gpu == gpu || self.peer_gpu == gpu
    }
}

/// The GPUs `pairs` point at, ranked. `lost`: GPUs gone, which fail with all their peers: named
/// first, their pairs left out when the others are judged.
pub fn blame(pairs: &[PairOutcome<'_>], lost: &BTreeSet<u32>) -> Blame {
    let (with_all, node_wide) = fails_with_all(pairs, lost);
    let failing: Vec<&PairOutcome<'_>> = pairs.iter().filter(|p| p.failing).collect();
    if node_wide || failing.is_empty() {
        return Blame {
            suspects: Vec::new(),
            node_wide,
        };
    }
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for p in &failing {
        for g in [p.gpu, p.peer_gpu] {
            *count.entry(g).or_default() += 1;
        }
    }
    let most = count.values().copied().max().unwrap_or(0);
    let chosen: Vec<(u32, SuspectBy)> = if !with_all.is_empty() || !lost.is_empty() {
        with_all
            .union(lost)
            .map(|&g| (g, SuspectBy::FailsWithAll))
            .collect()
    } else if most >= 2 {
        count
            .iter()
            .filter(|&(_, &n)| n == most)
            .map(|(&g, _)| (g, SuspectBy::MostPairs))
            .collect()
    } else {
        either_end(failing.iter().map(|p| (p.gpu, p.peer_gpu)))
            .into_iter()
            .map(|g| (g, SuspectBy::EitherEnd))
            .collect()
    };
    let mut suspects: Vec<Suspect> = chosen
        .into_iter()
        .map(|(gpu, by)| Suspect {
            gpu,
            bad_pairs: count.get(&gpu).copied().unwrap_or(0),
            by,
            reasons: reasons_of(gpu, &failing),
        })
        .collect();
    suspects.sort_by_key(|s| (std::cmp::Reverse(s.bad_pairs), s.gpu));
    Blame {
        suspects,
        node_wide: false,
    }
}

/// The GPUs (not lost) all of whose pairs with GPUs not lost fail, with three such GPUs or more;
/// and whether that is every one of them (the node).
fn fails_with_all(pairs: &[PairOutcome<'_>], lost: &BTreeSet<u32>) -> (BTreeSet<u32>, bool) {
    let mut tally: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for p in pairs
        .iter()
        .filter(|p| !lost.contains(&p.gpu) && !lost.contains(&p.peer_gpu))
    {
        for g in [p.gpu, p.peer_gpu] {
            let (all, failing) = tally.entry(g).or_default();
            *all += 1;
            *failing += usize::from(p.failing);
        }
    }
    if tally.len() < 3 {
        return (BTreeSet::new(), false);
    }
    let with_all: BTreeSet<u32> = tally
        .iter()
        .filter(|(_, (all, failing))| *failing > 0 && failing == all)
        .map(|(&g, _)| g)
        .collect();
    let node_wide = with_all.len() == tally.len();
    (with_all, node_wide)
}

/// Either end of each failing pair: what is left to say when nothing points at fewer GPUs.
fn either_end(failing: impl IntoIterator<Item = (u32, u32)>) -> BTreeSet<u32> {
    failing.into_iter().flat_map(|(a, b)| [a, b]).collect()
}

/// Of a job's `gpus`, those `blame` names; else either end of the job's `failing` pairs.
pub fn among(
    blame: Option<&Blame>,
    gpus: &[u32],
    failing: impl IntoIterator<Item = (u32, u32)>,
) -> Vec<u32> {
    let named: Vec<u32> = blame
        .map(|b| {
            b.suspects
                .iter()
                .map(|s| s.gpu)
                .filter(|g| gpus.contains(g))
                .collect()
        })
        .unwrap_or_default();
    if named.is_empty() {
        either_end(failing).into_iter().collect()
    } else {
        named
    }
}

/// The GPUs that fail with all their peers (ascending): what the probe's table names.
pub fn failing_with_all(blame: &Blame) -> Vec<u32> {
    let mut gpus: Vec<u32> = blame
        .suspects
        .iter()
        .filter(|s| s.by == SuspectBy::FailsWithAll)
        .map(|s| s.gpu)
        .collect();
    gpus.sort_unstable();
    gpus
}

/// The distinct reasons of `gpu`'s failing pairs that name it, else all of them.
fn reasons_of(gpu: u32, failing: &[&PairOutcome<'_>]) -> Vec<PairReason> {
    let mut all: Vec<&PairReason> = Vec::new();
    for r in failing
        .iter()
        .filter(|p| p.has(gpu))
        .flat_map(|p| p.reasons)
    {
        if !all.iter().any(|a| a.text == r.text) {
            all.push(r);
        }
    }
    let own: Vec<&PairReason> = all.iter().copied().filter(|r| r.names_gpu(gpu)).collect();
    if own.is_empty() { all } else { own }
        .into_iter()
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ReasonKind, Weight};

    /// Every pair of `gpus`, those in `bad` failing with an inactive link.
    fn board(gpus: &[u32], bad: &[(u32, u32)]) -> Vec<(u32, u32, bool, Vec<PairReason>)> {
        let mut pairs = Vec::new();
        for (i, &a) in gpus.iter().enumerate() {
            for &b in &gpus[i + 1..] {
                let failing = bad.contains(&(a, b));
                let reasons = failing.then(|| inactive(a, b)).into_iter().collect();
                pairs.push((a, b, failing, reasons));
            }
        }
        pairs
    }

    fn inactive(a: u32, b: u32) -> PairReason {
        let words = format!("NVLink 0 of GPU {a} to GPU {b} is inactive");
        PairReason::new(ReasonKind::LinkInactive, Weight::Down, words)
            .naming(&[a, b])
            .on_links(&[0])
    }

    fn judge(pairs: &[(u32, u32, bool, Vec<PairReason>)]) -> Blame {
        let outcomes: Vec<PairOutcome<'_>> = pairs
            .iter()
            .map(|(gpu, peer_gpu, failing, reasons)| PairOutcome {
                gpu: *gpu,
                peer_gpu: *peer_gpu,
                failing: *failing,
                reasons,
            })
            .collect();
        blame(&outcomes, &BTreeSet::new())
    }

    fn suspects(pairs: &[(u32, u32, bool, Vec<PairReason>)]) -> Vec<(u32, SuspectBy, usize)> {
        judge(pairs)
            .suspects
            .iter()
            .map(|s| (s.gpu, s.by, s.bad_pairs))
            .collect()
    }

    #[test]
    fn the_gpu_in_the_most_failing_pairs_is_named_alone() {
        assert_eq!(
            suspects(&board(&[1, 2, 5, 6, 7], &[(5, 7), (6, 7), (1, 2)])),
            vec![(7, SuspectBy::MostPairs, 2)]
        );
    }

    #[test]
    fn pairs_that_share_no_gpu_blame_either_end_of_each() {
        let s = suspects(&board(&[0, 1, 2, 3], &[(0, 1), (2, 3)]));
        assert_eq!(s.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(s.iter().all(|s| s.1 == SuspectBy::EitherEnd));
    }

    #[test]
    fn node_wide_blames_no_gpu() {
        let b = judge(&board(&[0, 1, 2], &[(0, 1), (0, 2), (1, 2)]));
        assert!(b.node_wide && b.suspects.is_empty());
    }

    #[test]
    fn a_gpu_failing_with_all_its_peers_is_named_with_its_own_reasons() {
        let b = judge(&board(&[0, 1, 2, 3], &[(0, 2), (1, 2), (2, 3), (0, 1)]));
        assert!(!b.node_wide);
        assert_eq!(
            b.suspects
                .iter()
                .map(|s| (s.gpu, s.by, s.bad_pairs))
                .collect::<Vec<_>>(),
            vec![(2, SuspectBy::FailsWithAll, 3)]
        );
        assert_eq!(b.suspects[0].reasons.len(), 3);
        assert_eq!(failing_with_all(&b), vec![2]);
    }

    #[test]
    fn of_a_jobs_gpus_the_blamed_else_either_end_of_its_failing_pairs() {
        let b = judge(&board(&[1, 2, 5, 6, 7], &[(5, 7), (6, 7), (1, 2)]));
        assert_eq!(among(Some(&b), &[5, 7], [(5, 7)]), vec![7]);
        assert_eq!(among(Some(&b), &[1, 2], [(1, 2)]), vec![1, 2]);
        assert_eq!(among(None, &[1, 2, 3], [(2, 3), (1, 2)]), vec![1, 2, 3]);
    }

    #[test]
    fn a_suspect_takes_the_reasons_that_name_it_by_their_gpus_not_their_words() {
        let mut pairs = board(&[0, 1, 2, 3], &[(0, 2), (1, 2), (2, 3)]);
        // On GPU 3's side of its pair with GPU 2: its words name GPU 3 and "GPU 2" only as a
        // prefix of another number; its GPUs say whose it is.
        let other = PairReason::new(
            ReasonKind::LinkErrors,
            Weight::Errors,
            "NVLink replay errors on GPU 3 link 9 (GPU 20's peer)".into(),
        )
        .naming(&[3])
        .on_links(&[9]);
        pairs[5].3.push(other.clone());
        let b = judge(&pairs);
        assert_eq!(b.suspects[0].gpu, 2);
        assert_eq!(b.suspects[0].reasons.len(), 3);
        assert!(b.suspects[0].reasons.iter().all(|r| r.names_gpu(2)));
        assert!(!b.suspects[0].reasons.contains(&other));
    }
}

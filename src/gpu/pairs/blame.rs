//! Which GPUs the failing pairs point at (rule 6's culprits, ranked): the one answer that
//! conditions, Events and `check` take when they tell a person what to reset.

use std::collections::{BTreeMap, BTreeSet};

use super::reasons::Judged;
use crate::model::{Blame, Suspect, SuspectBy};

/// `failing`: the pairs that fail among GPUs still there; `culprits`: the GPUs all of whose
/// pairs fail (`findings.rs`), `node_wide` when that is every GPU.
pub(super) fn blame(failing: &[&Judged], culprits: &BTreeSet<u32>, node_wide: bool) -> Blame {
    if node_wide || failing.is_empty() {
        return Blame {
            suspects: Vec::new(),
            node_wide,
        };
    }
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for j in failing {
        for g in [j.verdict.gpu, j.verdict.peer_gpu] {
            *count.entry(g).or_default() += 1;
        }
    }
    let most = count.values().copied().max().unwrap_or(0);
    let chosen: Vec<(u32, SuspectBy)> = if !culprits.is_empty() {
        culprits
            .iter()
            .map(|&g| (g, SuspectBy::FailsWithAll))
            .collect()
    } else if most >= 2 {
        count
            .iter()
            .filter(|&(_, &n)| n == most)
            .map(|(&g, _)| (g, SuspectBy::MostPairs))
            .collect()
    } else {
        count.keys().map(|&g| (g, SuspectBy::EitherEnd)).collect()
    };
    let mut suspects: Vec<Suspect> = chosen
        .into_iter()
        .map(|(gpu, by)| Suspect {
            gpu,
            bad_pairs: count.get(&gpu).copied().unwrap_or(0),
            by,
            reasons: reasons_of(gpu, failing),
        })
        .collect();
    suspects.sort_by_key(|s| (std::cmp::Reverse(s.bad_pairs), s.gpu));
    Blame {
        suspects,
        node_wide: false,
    }
}

/// The distinct reasons of `gpu`'s failing pairs that name it, else all of them.
fn reasons_of(gpu: u32, failing: &[&Judged]) -> Vec<String> {
    let mut all: Vec<&str> = Vec::new();
    for r in failing
        .iter()
        .filter(|j| j.has(gpu))
        .flat_map(|j| &j.verdict.reasons)
    {
        if !all.contains(&r.as_str()) {
            all.push(r);
        }
    }
    let own: Vec<&str> = all.iter().copied().filter(|r| names_gpu(r, gpu)).collect();
    if own.is_empty() { all } else { own }
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Whether `text` says `GPU <gpu>` (not `GPU <gpu>0`).
fn names_gpu(text: &str, gpu: u32) -> bool {
    let needle = format!("GPU {gpu}");
    text.match_indices(&needle)
        .any(|(i, m)| !text[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PairStatus, PairVerdict, Weight};

    fn bad(gpu: u32, peer_gpu: u32) -> Judged {
        Judged {
            weight: Some(Weight::Down),
            verdict: PairVerdict {
                reasons: vec![format!(
                    "NVLink 0 of GPU {gpu} to GPU {peer_gpu} is inactive"
                )],
                ..crate::fixtures::pair(gpu, peer_gpu, PairStatus::Down)
            },
        }
    }

    fn suspects(pairs: &[Judged]) -> Vec<(u32, SuspectBy, usize)> {
        let failing: Vec<&Judged> = pairs.iter().collect();
        blame(&failing, &BTreeSet::new(), false)
            .suspects
            .iter()
            .map(|s| (s.gpu, s.by, s.bad_pairs))
            .collect()
    }

    #[test]
    fn the_gpu_in_the_most_failing_pairs_is_named_alone() {
        assert_eq!(
            suspects(&[bad(5, 7), bad(6, 7), bad(1, 2)]),
            vec![(7, SuspectBy::MostPairs, 2)]
        );
    }

    #[test]
    fn pairs_that_share_no_gpu_blame_either_end_of_each() {
        let s = suspects(&[bad(0, 1), bad(2, 3)]);
        assert_eq!(s.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(s.iter().all(|s| s.1 == SuspectBy::EitherEnd));
    }

    #[test]
    fn node_wide_blames_no_gpu() {
        let pairs = [bad(0, 1)];
        let failing: Vec<&Judged> = pairs.iter().collect();
        let b = blame(&failing, &BTreeSet::from([0, 1]), true);
        assert!(b.node_wide && b.suspects.is_empty());
    }

    #[test]
    fn a_gpu_is_named_as_itself_not_as_a_prefix() {
        assert!(names_gpu("link 9 of GPU 4: 5 failed link recoveries", 4));
        assert!(!names_gpu("link 9 of GPU 40: 5 failed link recoveries", 4));
        assert!(names_gpu("GPU 4", 4));
    }
}

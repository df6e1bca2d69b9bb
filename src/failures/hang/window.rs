//! Pure: what the links of a job's GPUs did over a hang's window, from the ledger's history
//! (`model::LinkHistory`, fed by serve's scans, read by `check` from serve's store), and what
//! that makes of the hang: a link that went down (or a pair that failed) is the culprit, errors
//! that grew a suspect, every link watched and still means the ranks; a window not watched is
//! said so, never called clean.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::links::LinkChange;
use crate::model::{
    rfc3339, GpuLinkDelta, HangLinks, HangVerdict, JobLinks, LinkDownAtStart, LinkEvent,
    LinkHistory, LinkKey, LinkWent, NotWatched, PairChange, PairStatus, Watched,
};

/// What is known of the job: its GPUs (NVML indices) and the ledger, None where nothing was
/// sampled (no NVML, `--no-gpu`).
pub struct Asked<'a> {
    pub gpus: &'a [u32],
    pub ledger: Option<&'a JobLinks>,
}

/// The GPUs failing pairs point at by the one culprit rule (`gpu::blame`), from the pairs alone:
/// the blame of a later scan is not the window's.
fn blamed(gpus: &[u32], pairs: &[(u32, u32)]) -> Vec<u32> {
    crate::gpu::blame::among(None, gpus, pairs.iter().copied())
}

/// The links over `window` (None: the line gave no duration).
pub fn links_over(window: Option<(SystemTime, SystemTime)>, asked: &Asked<'_>) -> HangLinks {
    let not = |why| unknown(Watched::No, Some(why));
    let Some((start, end)) = window else {
        return not(NotWatched::WindowUnknown);
    };
    if asked.gpus.is_empty() {
        return not(NotWatched::NoGpus);
    }
    let Some(ledger) = asked.ledger.filter(|l| l.sampled_at.is_some()) else {
        return not(NotWatched::NoNvml);
    };
    let h = &ledger.history;
    if h.runs.is_empty() {
        return not(NotWatched::NoHistory);
    }
    // The job's links, by the GPU index and peer the last sample gave them.
    let keys: BTreeMap<&LinkKey, (u32, &str)> = ledger
        .last
        .iter()
        .filter(|(_, l)| asked.gpus.contains(&l.gpu))
        .map(|(k, l)| (k, (l.gpu, l.peer.as_str())))
        .collect();
    if keys.is_empty() {
        return not(NotWatched::NoLinks);
    }
    let Some((from, until, mut watched, mut why_not)) = coverage(h, start, end) else {
        let why = if h.runs.front().is_some_and(|r| r.from > start) {
            NotWatched::StartedLater
        } else {
            NotWatched::Gap
        };
        return not(why);
    };
    let mut out = unknown(watched, why_not);
    out.links = keys.len() as u32;
    for (key, (gpu, peer)) in &keys {
        let link = Link {
            key,
            gpu: *gpu,
            peer,
        };
        if !link_over(&mut out, ledger, &link, (from, until)) {
            // Known only from later on (its older marks dropped): not watched whole.
            watched = Watched::Partly;
            why_not = why_not.or(Some(NotWatched::Gap));
        }
    }
    out.watched = watched;
    out.why_not = why_not;
    out.pairs = pairs(h, &keys, from, until);
    out.events
        .sort_by(|a, b| (&a.at, a.gpu, a.link).cmp(&(&b.at, b.gpu, b.link)));
    judge(&mut out, asked);
    out.from = Some(rfc3339(from));
    out.until = Some(rfc3339(until));
    out
}

/// One link of the job, as the last sample named it.
struct Link<'a> {
    key: &'a LinkKey,
    gpu: u32,
    peer: &'a str,
}

/// What one link did over `(from, until)` into `out`; false when the ledger does not know it
/// at `from`.
fn link_over(
    out: &mut HangLinks,
    ledger: &JobLinks,
    l: &Link<'_>,
    (from, until): (SystemTime, SystemTime),
) -> bool {
    let h = &ledger.history;
    let (Some(base), Some(last)) = (h.mark_at(l.key, from), h.mark_at(l.key, until)) else {
        return false;
    };
    if !last.read {
        out.unread += 1;
    }
    let delta = last.counts.since(&base.counts);
    if !delta.is_zero() {
        let total = ledger.totals.get(l.key);
        out.changed.push(GpuLinkDelta::from(&LinkChange {
            gpu: l.gpu,
            link: l.key.1,
            peer: l.peer.to_string(),
            delta,
            dl: total.is_some_and(|t| t.dl),
            nvlink5: total.is_some_and(|t| t.nvlink5),
        }));
    }
    if !base.active {
        out.down_at_start.push(LinkDownAtStart {
            gpu: l.gpu,
            link: l.key.1,
            peer: l.peer.to_string(),
            since: went_down_by(h, l.key, from).map(rfc3339),
        });
    }
    let mut before = base;
    for m in h.marks_within(l.key, from, until) {
        let went = if m.counts.went_down > before.counts.went_down {
            Some(LinkWent::Down)
        } else if m.counts.came_up > before.counts.came_up {
            Some(LinkWent::Up)
        } else {
            None
        };
        if let Some(went) = went {
            out.events.push(LinkEvent {
                gpu: l.gpu,
                link: l.key.1,
                peer: l.peer.to_string(),
                at: rfc3339(m.at),
                went,
            });
        }
        before = *m;
    }
    true
}

fn unknown(watched: Watched, why_not: Option<NotWatched>) -> HangLinks {
    HangLinks {
        verdict: HangVerdict::Unknown,
        gpus: Vec::new(),
        watched,
        why_not,
        from: None,
        until: None,
        links: 0,
        unread: 0,
        events: Vec::new(),
        down_at_start: Vec::new(),
        changed: Vec::new(),
        pairs: Vec::new(),
    }
}

/// The part of `[start, end]` the ledger's runs cover: the whole of it when one run spans it,
/// else the first run that reaches into it (from, until, how watched, why not whole).
fn coverage(
    h: &LinkHistory,
    start: SystemTime,
    end: SystemTime,
) -> Option<(SystemTime, SystemTime, Watched, Option<NotWatched>)> {
    if h.run_at(start).is_some_and(|r| r.to >= end) {
        return Some((start, end, Watched::Whole, None));
    }
    let r = h.runs.iter().find(|r| r.to >= start && r.from <= end)?;
    let why = if h.runs.front().is_some_and(|first| first.from > start) {
        NotWatched::StartedLater
    } else {
        NotWatched::Gap
    };
    Some((r.from.max(start), r.to.min(end), Watched::Partly, Some(why)))
}

/// When a scan first saw the link down in its current drop, if the ledger still holds it.
fn went_down_by(h: &LinkHistory, key: &LinkKey, at: SystemTime) -> Option<SystemTime> {
    let marks = h.marks.get(key)?;
    let mut down_since = None;
    let mut before: Option<&crate::model::Mark> = None;
    for m in marks.iter().take_while(|m| m.at <= at) {
        if before.is_some_and(|b| m.counts.went_down > b.counts.went_down) {
            down_since = Some(m.at);
        }
        before = Some(m);
    }
    down_since
}

/// The pairs among the job's GPUs that failed before the window began (still failing then) or
/// whose verdict changed inside it.
fn pairs(
    h: &LinkHistory,
    keys: &BTreeMap<&LinkKey, (u32, &str)>,
    from: SystemTime,
    until: SystemTime,
) -> Vec<PairChange> {
    let index: BTreeMap<&str, u32> = keys.iter().map(|(k, (g, _))| (k.0.as_str(), *g)).collect();
    let ours =
        |p: &crate::model::PairKey| Some((*index.get(p.0.as_str())?, *index.get(p.1.as_str())?));
    let change = |m: &crate::model::PairMark, (gpu, peer_gpu): (u32, u32)| PairChange {
        gpu: gpu.min(peer_gpu),
        peer_gpu: gpu.max(peer_gpu),
        status: m.status,
        at: rfc3339(m.at),
        reason: m.reason.clone(),
    };
    let mut out: Vec<PairChange> = h
        .pairs_now
        .keys()
        .filter_map(|p| Some((h.pair_failing_at(p, from)?, ours(p)?)))
        .map(|(m, g)| change(m, g))
        .collect();
    out.extend(
        h.pairs_within(from, until)
            .filter_map(|m| Some(change(m, ours(&m.pair)?))),
    );
    out
}

/// The verdict and the GPUs it names: a link that dropped, or a pair that went down, is the
/// culprit; errors that grew or a pair degraded (counters over threshold: the link still
/// carries traffic) a suspect; nothing moved over a window watched whole, clean.
fn judge(out: &mut HangLinks, asked: &Asked<'_>) {
    let mut dropped: Vec<u32> = out
        .events
        .iter()
        .filter(|e| e.went == LinkWent::Down)
        .map(|e| e.gpu)
        .chain(out.down_at_start.iter().map(|d| d.gpu))
        .collect();
    let pairs_with = |status| -> Vec<(u32, u32)> {
        out.pairs
            .iter()
            .filter(|p| p.status == status)
            .map(|p| (p.gpu, p.peer_gpu))
            .collect()
    };
    let (down, degraded) = (
        pairs_with(PairStatus::Down),
        pairs_with(PairStatus::Degraded),
    );
    let (verdict, mut gpus) = if !dropped.is_empty() {
        (HangVerdict::Culprit, std::mem::take(&mut dropped))
    } else if !down.is_empty() {
        (HangVerdict::Culprit, blamed(asked.gpus, &down))
    } else if !out.changed.is_empty() || !degraded.is_empty() {
        let mut gpus: Vec<u32> = out.changed.iter().map(|c| c.gpu).collect();
        gpus.extend(blamed(asked.gpus, &degraded));
        (HangVerdict::Suspect, gpus)
    } else if out.watched == Watched::Whole && out.unread == 0 {
        (HangVerdict::Clean, Vec::new())
    } else {
        (HangVerdict::Unknown, Vec::new())
    };
    gpus.sort_unstable();
    gpus.dedup();
    out.verdict = verdict;
    out.gpus = gpus;
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::fixtures::{gpu_board, pair};
    use crate::links::LINK_MARKS;
    use crate::model::{LinkErrors, LinkReading, Peer, Snapshot};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_000_000 + secs)
    }

    /// Three GPUs of 2 links each; GPU 1's link 1 (to GPU 0) `up` with `recovery`; the pair
    /// 0-1 `pair01`.
    fn board(up: bool, recovery: u64, pair01: PairStatus) -> Snapshot {
        let mut s = gpu_board(3);
        for g in &mut s.gpus {
            let flaky = |l: u32| g.index == 1 && l == 1;
            g.links = (0..2)
                .map(|l| LinkReading {
                    link: l,
                    active: !flaky(l) || up,
                    peer: Peer::Gpu(if g.index == 0 { 1 } else { 0 }),
                    errors: Some(LinkErrors {
                        recovery: if flaky(l) { recovery } else { 0 },
                        ..LinkErrors::default()
                    }),
                    nvlink5: None,
                })
                .collect();
        }
        s.gpu_pairs[0] = pair(0, 1, pair01);
        s
    }

    fn healthy() -> Snapshot {
        board(true, 0, PairStatus::Ok)
    }

    /// Feeds `scans` (second, board) to a ledger, every 10 s unless said.
    fn ledger(scans: &[(u64, Snapshot)]) -> JobLinks {
        let mut l = JobLinks::default();
        for (t, s) in scans {
            l.feed_judged(&s.gpus, &s.gpu_pairs, &HashSet::new(), at(*t), true);
        }
        l
    }

    fn every_10s(until: u64, board_at: impl Fn(u64) -> Snapshot) -> Vec<(u64, Snapshot)> {
        (0..=until / 10)
            .map(|i| (i * 10, board_at(i * 10)))
            .collect()
    }

    fn over(l: &JobLinks, gpus: &[u32], from: u64, to: u64) -> HangLinks {
        let asked = Asked {
            gpus,
            ledger: Some(l),
        };
        links_over(Some((at(from), at(to))), &asked)
    }

    #[test]
    fn a_link_that_went_down_during_the_hang_is_the_culprit() {
        let l = ledger(&every_10s(120, |t| board(t < 60, 0, PairStatus::Ok)));
        let h = over(&l, &[0, 1], 5, 100);
        assert_eq!(h.verdict, HangVerdict::Culprit, "{h:#?}");
        assert_eq!(h.gpus, vec![1]);
        assert_eq!((h.watched, h.why_not), (Watched::Whole, None));
        assert_eq!(h.links, 4);
        assert_eq!(h.events.len(), 1, "{h:#?}");
        let e = &h.events[0];
        assert_eq!((e.gpu, e.link, e.peer.as_str()), (1, 1, "gpu:0"));
        assert_eq!(
            (e.at.as_str(), e.went),
            ("2026-11-18T11:07:40Z", LinkWent::Down)
        );
        assert_eq!(h.changed[0].went_down, 1);
        // Another job on GPU 2 alone: its links were clean.
        assert_eq!(over(&l, &[2], 5, 100).verdict, HangVerdict::Clean);
    }

    #[test]
    fn every_link_still_over_a_window_watched_whole_is_clean() {
        let l = ledger(&every_10s(120, |_| healthy()));
        let h = over(&l, &[0, 1], 5, 100);
        assert_eq!(h.verdict, HangVerdict::Clean, "{h:#?}");
        assert!(h.events.is_empty() && h.changed.is_empty() && h.pairs.is_empty());
        assert_eq!(
            (h.from.as_deref(), h.until.as_deref()),
            (Some("2026-11-18T11:06:45Z"), Some("2026-11-18T11:08:20Z"))
        );
    }

    #[test]
    fn a_window_the_agent_did_not_watch_is_never_clean() {
        // It started 50 s in: nothing moved from then, but the first part was not seen.
        let l = ledger(&every_10s(120, |_| healthy())[5..]);
        let h = over(&l, &[0, 1], 5, 100);
        assert_eq!(h.verdict, HangVerdict::Unknown, "{h:#?}");
        assert_eq!(
            (h.watched, h.why_not),
            (Watched::Partly, Some(NotWatched::StartedLater))
        );
        assert_eq!(h.from.as_deref(), Some("2026-11-18T11:07:30Z"));
        // A hang that ended before the agent's first scan: none of it.
        let h = over(&l, &[0, 1], 0, 40);
        assert_eq!(
            (h.verdict, h.watched, h.why_not),
            (
                HangVerdict::Unknown,
                Watched::No,
                Some(NotWatched::StartedLater)
            )
        );
        // No GPUs known, no NVML sample, no duration.
        assert_eq!(over(&l, &[], 60, 100).why_not, Some(NotWatched::NoGpus));
        let asked = Asked {
            gpus: &[0],
            ledger: None,
        };
        assert_eq!(
            links_over(Some((at(60), at(100))), &asked).why_not,
            Some(NotWatched::NoNvml)
        );
        assert_eq!(
            links_over(None, &asked).why_not,
            Some(NotWatched::WindowUnknown)
        );
        // GPUs the ledger lists no link of (a PCIe board).
        assert_eq!(over(&l, &[5], 60, 100).why_not, Some(NotWatched::NoLinks));
    }

    #[test]
    fn a_restart_in_the_window_leaves_it_partly_watched() {
        let scans = every_10s(120, |_| healthy());
        let mut l = ledger(&scans[..5]);
        // serve stopped at 40 s and started again at 60 s from its checkpoint.
        let mut l2 = JobLinks::restore(
            serde_json::from_value(serde_json::to_value(l.save()).unwrap()).unwrap(),
        )
        .unwrap();
        for (t, s) in &scans[6..] {
            l2.feed_judged(&s.gpus, &s.gpu_pairs, &HashSet::new(), at(*t), true);
        }
        let h = over(&l2, &[0, 1], 5, 100);
        assert_eq!(
            (h.verdict, h.watched, h.why_not),
            (HangVerdict::Unknown, Watched::Partly, Some(NotWatched::Gap)),
            "{h:#?}"
        );
        // Within one run it is whole.
        l.feed_judged(&scans[5].1.gpus, &[], &HashSet::new(), at(50), true);
        assert_eq!(over(&l, &[0, 1], 5, 45).watched, Watched::Whole);
    }

    #[test]
    fn a_link_down_before_the_collective_began_is_the_culprit_and_says_since_when() {
        let l = ledger(&every_10s(120, |t| board(t < 20, 0, PairStatus::Ok)));
        let h = over(&l, &[0, 1], 35, 100);
        assert_eq!(
            (h.verdict, h.gpus.as_slice()),
            (HangVerdict::Culprit, &[1][..])
        );
        assert!(h.events.is_empty(), "{h:#?}");
        let d = &h.down_at_start[0];
        assert_eq!((d.gpu, d.link), (1, 1));
        assert_eq!(d.since.as_deref(), Some("2026-11-18T11:07:00Z"));
    }

    #[test]
    fn errors_that_grew_without_a_drop_make_a_suspect_and_a_pair_that_went_down_a_culprit() {
        let l = ledger(&every_10s(120, |t| board(true, t / 10, PairStatus::Ok)));
        let h = over(&l, &[0, 1], 35, 100);
        assert_eq!(
            (h.verdict, h.gpus.as_slice()),
            (HangVerdict::Suspect, &[1][..])
        );
        assert_eq!(
            h.changed[0].recovery,
            Some(7),
            "from 3 at 30 s to 10 at 100 s"
        );
        // The pair judge's verdict alone (a P2P status lost, no link flip): down is the culprit.
        let l = ledger(&every_10s(120, |t| {
            board(
                true,
                0,
                if t >= 60 {
                    PairStatus::Down
                } else {
                    PairStatus::Ok
                },
            )
        }));
        let h = over(&l, &[0, 1], 35, 100);
        assert_eq!(
            (h.verdict, h.gpus.as_slice()),
            (HangVerdict::Culprit, &[0, 1][..])
        );
        assert_eq!(h.pairs[0].at, "2026-11-18T11:07:40Z");
        assert_eq!(
            h.pairs[0].reason.as_deref(),
            Some("links of GPU 1 are inactive")
        );
        // Already down before it began.
        let h = over(&l, &[0, 1], 75, 100);
        assert_eq!(h.verdict, HangVerdict::Culprit);
        assert_eq!(h.pairs[0].at, "2026-11-18T11:07:40Z");
    }

    #[test]
    fn a_link_not_read_at_the_end_is_not_called_clean() {
        let l = ledger(&every_10s(120, |t| {
            let mut s = healthy();
            if t >= 90 {
                s.gpus[1].links[0].errors = None;
            }
            s
        }));
        let h = over(&l, &[0, 1], 5, 100);
        assert_eq!(
            (h.verdict, h.watched, h.unread),
            (HangVerdict::Unknown, Watched::Whole, 1)
        );
    }

    #[test]
    fn the_history_is_bounded_and_says_where_it_was_cut() {
        let scans: Vec<(u64, Snapshot)> = (0..=300)
            .map(|t| (t, board(true, t, PairStatus::Ok)))
            .collect();
        let l = ledger(&scans);
        let key = l
            .history
            .marks
            .keys()
            .find(|k| k.1 == 1 && l.last[*k].gpu == 1)
            .unwrap()
            .clone();
        assert_eq!(l.history.marks[&key].len(), LINK_MARKS);
        assert!(l.history.cut.contains_key(&key));
        // A window from before the oldest kept mark of that link: not whole.
        let h = over(&l, &[1], 10, 290);
        assert_eq!(
            (h.watched, h.why_not),
            (Watched::Partly, Some(NotWatched::Gap))
        );
        // The other links never changed: one mark each.
        assert_eq!(l.history.marks.values().filter(|m| m.len() == 1).count(), 5);
    }

    #[test]
    fn check_reading_serves_checkpoint_judges_the_same() {
        let l = ledger(&every_10s(120, |t| board(t < 60, t / 30, PairStatus::Ok)));
        let saved = serde_json::to_value(l.save()).unwrap();
        let mut back = JobLinks::restore(serde_json::from_value(saved).unwrap()).unwrap();
        // check feeds its own sample later, without baselines.
        let s = healthy();
        back.feed_judged(&s.gpus, &s.gpu_pairs, &HashSet::new(), at(600), false);
        assert_eq!(over(&back, &[0, 1], 5, 100), over(&l, &[0, 1], 5, 100));
    }
}

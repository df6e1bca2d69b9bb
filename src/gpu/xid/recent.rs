//! Pure: which XIDs matter now. Any XID is a finding (and one Event series) while its count
//! grew within [`XID_LASTS`]; one whose catalogue action is fatal (`catalogue.rs` gives the
//! action, [`XidAction::is_fatal`] says which are) keeps `GpuFault` True for the hold time
//! ([`FatalXids`]).
//!
//! [`XidAction::is_fatal`]: crate::model::XidAction::is_fatal

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::catalogue;
use crate::model::{Finding, FindingKind, HeldXid, Subject};
use crate::text;

/// How long after its last increase an XID stays a finding (and one Event series).
pub const XID_LASTS: Duration = Duration::from_secs(600);

/// Pure: which XIDs were counted within the last [`XID_LASTS`].
#[derive(Debug, Default)]
pub struct RecentXids {
    /// Per (GPU index, XID): the count last seen and when it last grew.
    seen: BTreeMap<(u32, u64), (u64, Instant)>,
}

impl RecentXids {
    /// A `gpu_xid` finding for each XID whose count grew within [`XID_LASTS`] of `now`.
    pub fn findings(&mut self, counts: &BTreeMap<(u32, u64), u64>, now: Instant) -> Vec<Finding> {
        let mut out = Vec::new();
        for (&(gpu, xid), &count) in counts {
            let seen = self.seen.entry((gpu, xid)).or_insert((0, now));
            if count > seen.0 {
                *seen = (count, now);
            }
            if now.duration_since(seen.1) < XID_LASTS {
                out.push(Finding::new(
                    FindingKind::GpuXid,
                    Subject::Xid { gpu, xid },
                    text::xid(gpu, xid, count, catalogue::lookup(xid)),
                ));
            }
        }
        out
    }
}

/// Pure: which tallies of the kernel log's other GPU facts (NVLink training failures, SXIDs,
/// IOMMU faults) grew within the last [`XID_LASTS`], per key: the facts the GPU verdicts tell now.
#[derive(Debug)]
pub struct Recent<K> {
    seen: BTreeMap<K, (u64, Instant)>,
}

impl<K> Default for Recent<K> {
    fn default() -> Self {
        Recent {
            seen: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Recent<K> {
    /// Whether `key`'s tally, `count` now, grew within [`XID_LASTS`] of `now`.
    pub fn lasts(&mut self, key: &K, count: u64, now: Instant) -> bool {
        let seen = self.seen.entry(key.clone()).or_insert((0, now));
        if count > seen.0 {
            *seen = (count, now);
        }
        now.saturating_duration_since(seen.1) < XID_LASTS
    }
}

/// Occurrences of one XID remembered within the hold (the message says "N times").
const TIMES_KEPT: usize = 64;

/// One fatal XID on one GPU: the count last seen and when it grew, within the hold.
#[derive(Debug, Default)]
struct Seen {
    count: u64,
    at: VecDeque<Instant>,
    /// Carried over a restart: the new process's counts start at 0, so its absence from them
    /// is no sign that NVML's history started over.
    resumed: bool,
}

/// The fatal XIDs (a GPU reset, a node reboot or the vendor) seen within `hold`, per GPU key:
/// its UUID (NVML may number the GPUs otherwise after a restart), or its PCI address where NVML
/// does not list it (`#<index>` only for what an older agent saved, until the index is known).
#[derive(Debug)]
pub struct FatalXids {
    hold: Duration,
    seen: BTreeMap<(String, u64), Seen>,
}

/// One held fatal XID as a restart carries it: how long before the save each occurrence
/// within the hold was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldAges {
    /// The GPU's key ([`FatalXids`]).
    pub gpu: String,
    pub xid: u64,
    pub ages: Vec<Duration>,
}

/// One fatal XID within the hold on the GPU with key `gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub gpu: String,
    pub xid: HeldXid,
}

impl FatalXids {
    pub fn new(hold: Duration) -> FatalXids {
        FatalXids {
            hold,
            seen: BTreeMap::new(),
        }
    }

    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// Keys carried as `#<index>` (an older agent's) take the key `keys` gives that index.
    pub fn rekey(&mut self, keys: &BTreeMap<u32, String>) {
        let old: Vec<(String, u64)> = self
            .seen
            .keys()
            .filter(|(k, _)| k.starts_with('#'))
            .cloned()
            .collect();
        for (k, xid) in old {
            let index = k[1..].parse::<u32>().ok();
            if let Some(key) = index.and_then(|i| keys.get(&i)) {
                if let Some(seen) = self.seen.remove(&(k, xid)) {
                    self.seen.entry((key.clone(), xid)).or_insert(seen);
                }
            }
        }
    }

    /// Counts (GPU key, XID, count) that grew are occurrences now; a count that went down, or
    /// vanished, means the XID history started over (NVML loaded afresh: a driver reload, a
    /// reboot): forgotten.
    pub fn observe(&mut self, xids: &[(String, u64, u64)], now: Instant) {
        let counts: BTreeMap<(String, u64), u64> = xids
            .iter()
            .filter(|x| catalogue::is_fatal(x.1))
            .map(|x| ((x.0.clone(), x.1), x.2))
            .collect();
        self.seen
            .retain(|k, seen| counts.get(k).map_or(seen.resumed, |&c| c >= seen.count));
        for (key, &count) in &counts {
            let seen = self.seen.entry(key.clone()).or_default();
            let grew = count.saturating_sub(seen.count);
            for _ in 0..grew.min(TIMES_KEPT as u64) {
                seen.at.push_back(now);
            }
            while seen.at.len() > TIMES_KEPT {
                seen.at.pop_front();
            }
            seen.count = count;
        }
        for seen in self.seen.values_mut() {
            while seen
                .at
                .front()
                .is_some_and(|t| now.duration_since(*t) >= self.hold)
            {
                seen.at.pop_front();
            }
        }
        // A carried one whose hold has run out and that no count names: nothing left of it.
        self.seen
            .retain(|k, seen| !(seen.resumed && seen.at.is_empty() && !counts.contains_key(k)));
    }

    /// What a restart carries: the occurrences within the hold, as ages at `now`.
    pub fn ages(&self, now: Instant) -> Vec<HeldAges> {
        self.seen
            .iter()
            .filter(|(_, seen)| !seen.at.is_empty())
            .map(|((gpu, xid), seen)| HeldAges {
                gpu: gpu.clone(),
                xid: *xid,
                ages: seen.at.iter().map(|t| now.duration_since(*t)).collect(),
            })
            .collect()
    }

    /// Takes up what [`FatalXids::ages`] gave before a restart (ages as of `now`): those
    /// still within the hold are held again, for what is left of it. Only fatal XIDs are.
    pub fn resume(&mut self, held: Vec<HeldAges>, now: Instant) {
        let hold = self.hold;
        for h in held.into_iter().filter(|h| catalogue::is_fatal(h.xid)) {
            let mut ages: Vec<Duration> = h.ages.into_iter().filter(|a| *a < hold).collect();
            ages.sort_unstable_by(|a, b| b.cmp(a));
            let at: VecDeque<Instant> = ages
                .iter()
                .rev()
                .take(TIMES_KEPT)
                .rev()
                .filter_map(|a| now.checked_sub(*a))
                .collect();
            if at.is_empty() {
                continue;
            }
            self.seen.insert(
                (h.gpu, h.xid),
                Seen {
                    count: 0,
                    at,
                    resumed: true,
                },
            );
        }
    }

    /// Those within the hold at `now`, the one whose action goes furthest (a reboot before a
    /// reset) first.
    pub fn held(&self, now: Instant) -> Vec<Held> {
        let mut out: Vec<Held> = self
            .seen
            .iter()
            .filter_map(|((gpu, xid), seen)| {
                let last = *seen.at.back()?;
                Some(Held {
                    gpu: gpu.clone(),
                    xid: HeldXid {
                        xid: *xid,
                        action: catalogue::lookup(*xid)?.action,
                        times: seen.at.len(),
                        left: self
                            .hold
                            .saturating_sub(now.saturating_duration_since(last)),
                    },
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (std::cmp::Reverse(a.xid.action), &a.gpu, a.xid.xid).cmp(&(
                std::cmp::Reverse(b.xid.action),
                &b.gpu,
                b.xid.xid,
            ))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xid_is_a_finding_until_it_has_been_quiet_for_its_time() {
        let mut recent = RecentXids::default();
        let t0 = Instant::now();
        let mut counts = BTreeMap::from([((7, 79), 1)]);
        let first = recent.findings(&counts, t0);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].subject, Subject::Xid { gpu: 7, xid: 79 });
        assert!(
            first[0].message.contains("XID 79 on GPU 7 (1 since"),
            "{}",
            first[0].message
        );
        counts.insert((7, 79), 2);
        // It grew: the time starts again from here.
        let t1 = t0 + Duration::from_secs(300);
        assert_eq!(recent.findings(&counts, t1).len(), 1);
        assert_eq!(
            recent
                .findings(&counts, t1 + XID_LASTS - Duration::from_secs(1))
                .len(),
            1
        );
        assert!(recent.findings(&counts, t1 + XID_LASTS).is_empty());
    }

    fn count(gpu: &str, xid: u64, count: u64) -> (String, u64, u64) {
        (gpu.to_string(), xid, count)
    }

    #[test]
    fn held_xids_carried_over_a_restart_stay_held_for_what_is_left_of_the_hold() {
        let hold = Duration::from_secs(3600);
        let t0 = Instant::now();
        let mut before = FatalXids::new(hold);
        before.observe(&[count("GPU-2", 79, 2), count("GPU-1", 13, 1)], t0);
        let later = t0 + Duration::from_secs(600);
        let carried = before.ages(later);
        assert_eq!(
            carried,
            vec![HeldAges {
                gpu: "GPU-2".into(),
                xid: 79,
                ages: vec![Duration::from_secs(600); 2]
            }],
            "XID 13 is no fault: not held, not carried"
        );
        // The new process: its counts start empty, then count new XIDs from 0.
        let t1 = t0 + Duration::from_secs(10_000);
        let mut after = FatalXids::new(hold);
        after.resume(carried, t1);
        after.observe(&[], t1);
        let held = after.held(t1);
        assert_eq!((held.len(), held[0].xid.xid, held[0].xid.times), (1, 79, 2));
        after.observe(&[count("GPU-2", 79, 1)], t1 + Duration::from_secs(60));
        assert_eq!(
            after.held(t1)[0].xid.times,
            3,
            "a new one adds to those carried"
        );
        // The carried ones leave when their hold runs out (3000 s left), the new one later.
        after.observe(&[count("GPU-2", 79, 1)], t1 + Duration::from_secs(3000));
        assert_eq!(after.held(t1)[0].xid.times, 1);
        after.observe(&[count("GPU-2", 79, 1)], t1 + Duration::from_secs(3660));
        assert!(after.held(t1).is_empty());
    }

    #[test]
    fn a_carried_xid_past_its_hold_or_not_fatal_is_not_resumed() {
        let hold = Duration::from_secs(3600);
        let t = Instant::now() + Duration::from_secs(7200);
        let mut x = FatalXids::new(hold);
        x.resume(
            vec![
                HeldAges {
                    gpu: "GPU-0".into(),
                    xid: 79,
                    ages: vec![hold, hold * 2],
                },
                HeldAges {
                    gpu: "GPU-1".into(),
                    xid: 13,
                    ages: vec![Duration::from_secs(1)],
                },
            ],
            t,
        );
        x.observe(&[], t);
        assert!(x.held(t).is_empty());
        // One that runs out with nothing counting it is forgotten entirely.
        x.resume(
            vec![HeldAges {
                gpu: "GPU-0".into(),
                xid: 48,
                ages: vec![Duration::from_secs(3599)],
            }],
            t,
        );
        x.observe(&[], t);
        assert_eq!(x.held(t).len(), 1);
        x.observe(&[], t + Duration::from_secs(2));
        assert!(x.held(t).is_empty() && x.seen.is_empty());
    }
}

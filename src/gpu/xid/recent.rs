//! Pure: which XIDs matter now. Any XID is a finding (and one Event series) while its count
//! grew within [`XID_LASTS`]; one whose catalogue action is fatal (`catalogue.rs` gives the
//! action, [`XidAction::is_fatal`] says which are) keeps `GpuFault` True for the hold time
//! ([`FatalXids`]).
//!
//! [`XidAction::is_fatal`]: crate::model::XidAction::is_fatal

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::catalogue;
use crate::model::{Finding, FindingKind, Subject, XidCount};
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

/// Occurrences of one XID remembered within the hold (the message says "N times").
const TIMES_KEPT: usize = 64;

/// One fatal XID on one GPU: the count last seen and when it grew, within the hold.
#[derive(Debug, Default)]
struct Seen {
    count: u64,
    at: VecDeque<Instant>,
}

/// The fatal XIDs (a GPU reset, a node reboot or the vendor) seen within `hold`.
#[derive(Debug)]
pub struct FatalXids {
    hold: Duration,
    seen: BTreeMap<(u32, u64), Seen>,
}

/// One fatal XID within the hold: what it calls for, where, and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldXid {
    pub action: crate::model::XidAction,
    pub gpu: u32,
    pub xid: u64,
    pub times: usize,
}

impl FatalXids {
    pub fn new(hold: Duration) -> FatalXids {
        FatalXids {
            hold,
            seen: BTreeMap::new(),
        }
    }

    /// Counts that grew are occurrences now; a count that went down, or vanished, means the
    /// XID history started over (NVML loaded afresh: a driver reload, a reboot): forgotten.
    pub fn observe(&mut self, xids: &[XidCount], now: Instant) {
        let counts: BTreeMap<(u32, u64), u64> = xids
            .iter()
            .filter(|x| catalogue::is_fatal(x.xid))
            .map(|x| ((x.gpu, x.xid), x.count))
            .collect();
        self.seen
            .retain(|k, seen| counts.get(k).is_some_and(|&c| c >= seen.count));
        for (&key, &count) in &counts {
            let seen = self.seen.entry(key).or_default();
            let grew = count.saturating_sub(seen.count);
            for _ in 0..grew.min(TIMES_KEPT as u64) {
                seen.at.push_back(now);
            }
            while seen.at.len() > TIMES_KEPT {
                seen.at.pop_front();
            }
            seen.count = count;
            while seen
                .at
                .front()
                .is_some_and(|t| now.duration_since(*t) >= self.hold)
            {
                seen.at.pop_front();
            }
        }
    }

    /// Those within the hold, the one whose action goes furthest (a reboot before a reset)
    /// first.
    pub fn held(&self) -> Vec<HeldXid> {
        let mut out: Vec<HeldXid> = self
            .seen
            .iter()
            .filter(|(_, seen)| !seen.at.is_empty())
            .filter_map(|(&(gpu, xid), seen)| {
                Some(HeldXid {
                    action: catalogue::lookup(xid)?.action,
                    gpu,
                    xid,
                    times: seen.at.len(),
                })
            })
            .collect();
        out.sort_by_key(|h| (std::cmp::Reverse(h.action), h.gpu, h.xid));
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
}

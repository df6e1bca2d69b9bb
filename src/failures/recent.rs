//! The containers seen in the last minute, for the failures told after their container went,
//! and what each one's /dev/shm held around a moment, for the deaths told after later scans.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use crate::model::{ShmReading, Snapshot};

/// Containers seen in the last minute: a job that dies takes its container (and its /dev/shm)
/// with it, often before the next scan, and the failure is told just after. What it had then,
/// and which host PIDs were its, come from here.
#[derive(Default)]
pub struct RecentReadings {
    by_id: HashMap<String, Kept>,
}

struct Kept {
    reading: ShmReading,
    seen: Instant,
    /// The wall time of the first scan that did not find the container.
    gone_since: Option<SystemTime>,
    /// Its scans' peaks, oldest first, scans in a row with one peak as one run.
    peaks: VecDeque<Run>,
}

/// Scans in a row that found one peak (the highest usage since the scan before, or the usage).
#[derive(Debug, Clone, Copy)]
struct Run {
    first: SystemTime,
    last: SystemTime,
    peak: u64,
}

/// Runs kept per container: a steady /dev/shm is one run; a changing one is its last scans.
const RUNS: usize = 16;
/// How long before the line that tells it a death may have happened: a shell says `Bus error`
/// at once, PyTorch's main process notices its worker's signal within its 5 s status check.
const LINE_LAG: Duration = Duration::from_secs(5);

impl RecentReadings {
    const KEEP: Duration = Duration::from_secs(60);

    /// A scan's readings, finished at `now` (`wall` on the clock failures are stamped with).
    pub fn remember(&mut self, readings: &[ShmReading], now: Instant, wall: SystemTime) {
        for r in readings {
            let peak = r.used_peak_bytes.or(r.used_bytes);
            let k = match self.by_id.entry(r.container_id.clone()) {
                Entry::Occupied(e) => {
                    let k = e.into_mut();
                    (k.reading, k.seen, k.gone_since) = (r.clone(), now, None);
                    k
                }
                Entry::Vacant(e) => e.insert(Kept {
                    reading: r.clone(),
                    seen: now,
                    gone_since: None,
                    peaks: VecDeque::new(),
                }),
            };
            match (k.peaks.back_mut(), peak) {
                (Some(run), Some(p)) if run.peak == p => run.last = wall,
                (_, Some(p)) => {
                    if k.peaks.len() == RUNS {
                        k.peaks.pop_front();
                    }
                    k.peaks.push_back(Run {
                        first: wall,
                        last: wall,
                        peak: p,
                    });
                }
                // A scan that could not read it says nothing of its peak.
                (_, None) => {}
            }
        }
        for k in self.by_id.values_mut() {
            if k.seen != now && k.gone_since.is_none() {
                k.gone_since = Some(wall);
            }
        }
        self.by_id
            .retain(|_, k| now.duration_since(k.seen) < Self::KEEP);
    }

    /// The snapshot with the recently gone containers' last readings after its own.
    pub fn added_to(&self, s: &Snapshot) -> Snapshot {
        let mut out = s.clone();
        for (id, k) in &self.by_id {
            if !s.shm.iter().any(|x| &x.container_id == id) {
                out.shm.push(k.reading.clone());
                if let Some(gone) = k.gone_since {
                    out.gone_since.insert(id.clone(), gone);
                }
            }
        }
        out
    }

    /// The highest /dev/shm usage the scans around `at` saw in the container: from the last scan
    /// before [`LINE_LAG`] ahead of it to the first at or after it (whose peak covers `at`).
    /// `None` when no scan of it is kept. A death told after later scans is judged by these, not
    /// by a later scan that found its /dev/shm already freed (or filled since).
    pub fn peak_around(&self, container_id: &str, at: SystemTime) -> Option<u64> {
        let runs = &self.by_id.get(container_id)?.peaks;
        let from = at.checked_sub(LINE_LAG).unwrap_or(at);
        let start = runs.iter().rposition(|r| r.first < from).unwrap_or(0);
        let end = (runs.iter().position(|r| r.last >= at)).unwrap_or(runs.len().checked_sub(1)?);
        // A wall clock set back can leave the runs out of order: never an empty range's panic.
        runs.range(start..=end.max(start)).map(|r| r.peak).max()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;
    use crate::fixtures;

    #[test]
    fn a_gone_containers_reading_is_added_with_when_a_scan_first_missed_it() {
        let mut recent = RecentReadings::default();
        let t0 = Instant::now();
        let wall = |s| UNIX_EPOCH + Duration::from_secs(1_795_000_000 + s);
        let a = fixtures::shm_reading("aaaa", 64 << 20, 1 << 20);
        let b = fixtures::shm_reading("bbbb", 64 << 20, 1 << 20);
        recent.remember(&[a.clone(), b.clone()], t0, wall(0));
        let scan = |shm| fixtures::scanned("node-a", shm, None);
        assert!(recent
            .added_to(&scan(vec![a.clone(), b.clone()]))
            .gone_since
            .is_empty());
        // Scans at 10 s and 20 s without "aaaa": it was gone from the first of them.
        for secs in [10, 20] {
            recent.remember(
                std::slice::from_ref(&b),
                t0 + Duration::from_secs(secs),
                wall(secs),
            );
        }
        let s = recent.added_to(&scan(vec![b.clone()]));
        assert_eq!(s.shm.len(), 2);
        assert_eq!(s.gone_since.get("aaaa"), Some(&wall(10)));
        assert_eq!(s.gone_since.get("bbbb"), None);
        // A minute after it was last seen, forgotten.
        recent.remember(
            std::slice::from_ref(&b),
            t0 + Duration::from_secs(61),
            wall(61),
        );
        assert_eq!(recent.added_to(&scan(vec![b])).shm.len(), 1);
    }

    #[test]
    fn the_peak_around_a_moment_is_from_the_scan_before_its_lag_to_the_first_after() {
        let mut recent = RecentReadings::default();
        let t0 = Instant::now();
        let wall = |s| UNIX_EPOCH + Duration::from_secs(1_795_000_000 + s);
        let used = |mib: u64| fixtures::shm_reading("c", 64 << 20, mib << 20);
        // Scans each second: 10 MiB to 9 s, 60 MiB at 10 s and 11 s, 0 from 12 s.
        for s in 0..20 {
            let mib = match s {
                0..=9 => 10,
                10 | 11 => 60,
                _ => 0,
            };
            recent.remember(&[used(mib)], t0 + Duration::from_secs(s), wall(s));
        }
        let around = |s| recent.peak_around("c", wall(s)).map(|b| b >> 20);
        assert_eq!(around(11), Some(60));
        // A line at 16 s: the scan before 11 s (10 s) to the first at or after 16 s.
        assert_eq!(around(16), Some(60));
        // At 17.5 s the lag begins after 12 s: only freed scans.
        assert_eq!(
            recent
                .peak_around("c", wall(17) + Duration::from_millis(500))
                .map(|b| b >> 20),
            Some(0)
        );
        assert_eq!(around(5), Some(10), "filled after it: not counted");
        assert_eq!(around(100), Some(0), "after the last scan: the last run");
        assert_eq!(recent.peak_around("other", wall(5)), None);
        // A steady /dev/shm is one run; a changing one keeps its last RUNS.
        assert_eq!(recent.by_id["c"].peaks.len(), 3);
        for s in 20..60 {
            recent.remember(&[used(s)], t0 + Duration::from_secs(s), wall(s));
        }
        assert_eq!(recent.by_id["c"].peaks.len(), RUNS);
        // A wall clock set back: no panic, an answer from what is kept.
        recent.remember(&[used(1)], t0 + Duration::from_secs(60), wall(3));
        assert!(recent.peak_around("c", wall(30)).is_some());
    }
}

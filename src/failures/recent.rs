//! The containers seen in the last minute, for the failures told after their container went.

use std::collections::HashMap;
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
}

impl RecentReadings {
    const KEEP: Duration = Duration::from_secs(60);

    /// A scan's readings, finished at `now` (`wall` on the clock failures are stamped with).
    pub fn remember(&mut self, readings: &[ShmReading], now: Instant, wall: SystemTime) {
        for r in readings {
            let kept = Kept {
                reading: r.clone(),
                seen: now,
                gone_since: None,
            };
            self.by_id.insert(r.container_id.clone(), kept);
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
}

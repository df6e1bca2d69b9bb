//! What `serve` remembers of failures: the recent ones (for the snapshot) and a count per
//! container and kind (`shmlink_workload_failures_total`). Bounded: a node that sees thousands
//! of dying containers keeps the newest.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::model::Failure;
use crate::model::{ContainerRef, FindingKind};

/// Failures kept for the snapshot.
const RECENT_MAX: usize = 256;
/// Counters kept; the least recently counted go first past this.
const COUNTS_MAX: usize = 4096;
/// A counter not increased for this long is dropped with its series (the container is gone).
const COUNT_LASTS: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Default)]
pub struct Ledger {
    recent: VecDeque<Failure>,
    counts: HashMap<(ContainerRef, FindingKind), (u64, Instant)>,
}

impl Ledger {
    pub fn record(&mut self, failures: &[Failure], now: Instant) {
        for f in failures {
            let entry = self
                .counts
                .entry((f.container_ref(), f.kind))
                .or_insert((0, now));
            *entry = (entry.0 + 1, now);
            self.recent.push_back(f.clone());
        }
        while self.recent.len() > RECENT_MAX {
            self.recent.pop_front();
        }
        self.counts
            .retain(|_, (_, at)| now.duration_since(*at) < COUNT_LASTS);
        if self.counts.len() > COUNTS_MAX {
            let mut by_age: Vec<_> = self.counts.iter().map(|(k, v)| (v.1, k.clone())).collect();
            by_age.sort_by_key(|(at, _)| *at);
            for (_, k) in by_age.into_iter().take(self.counts.len() - COUNTS_MAX) {
                self.counts.remove(&k);
            }
        }
    }

    pub fn recent(&self) -> Vec<Failure> {
        self.recent.iter().cloned().collect()
    }

    pub fn counts(&self) -> Vec<(ContainerRef, FindingKind, u64)> {
        let mut out: Vec<_> = self
            .counts
            .iter()
            .map(|((c, k), (n, _))| (c.clone(), *k, *n))
            .collect();
        out.sort_by_key(|a| (a.0.to_string(), a.1));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn counts_per_container_and_kind_and_keeps_the_newest() {
        let mut l = Ledger::default();
        let t0 = Instant::now();
        let a = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "a", "u-a");
        let b = fixtures::failure(FindingKind::GpuJobCrashed, "ml", "a", "u-a");
        l.record(&[a.clone(), a.clone(), b], t0);
        let counts: Vec<_> = l
            .counts()
            .into_iter()
            .map(|(c, k, n)| (c.to_string(), k, n))
            .collect();
        assert_eq!(
            counts,
            vec![
                (
                    "ml/a/trainer".to_string(),
                    FindingKind::ShmAllocationFailed,
                    2
                ),
                ("ml/a/trainer".to_string(), FindingKind::GpuJobCrashed, 1)
            ]
        );
        for _ in 0..RECENT_MAX {
            l.record(std::slice::from_ref(&a), t0);
        }
        assert_eq!(l.recent().len(), RECENT_MAX);
        // A day without a repeat: the counter goes with its container.
        l.record(&[], t0 + COUNT_LASTS);
        assert!(l.counts().is_empty());
    }
}

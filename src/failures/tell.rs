//! The scan thread's side of the failures: what the watcher found, correlated with what was
//! known then (the last snapshot plus the containers gone since), logged and counted; the
//! snapshot carries the recent ones and the counts.

use std::time::Instant;

use super::correlate::{correlate, Known};
use super::detect::DeathRules;
use super::ledger::Ledger;
use super::recent::RecentReadings;
use super::same::SameDeath;
use crate::kube::podresources::GpuHolders;
use crate::kube::pods::PodIndex;
use crate::model::{Detected, Failure, Snapshot};

pub struct Teller {
    ledger: Ledger,
    recent: RecentReadings,
    same: SameDeath,
    rules: DeathRules,
}

impl Teller {
    pub fn new(rules: DeathRules) -> Teller {
        Teller {
            ledger: Ledger::default(),
            recent: RecentReadings::default(),
            same: SameDeath::default(),
            rules,
        }
    }

    /// A fresh scan: it carries the failures told so far, and its containers are remembered
    /// for the failures told after they are gone.
    pub fn after_scan(&mut self, snapshot: &mut Snapshot, now: Instant) {
        snapshot.failures = self.ledger.recent();
        snapshot.failure_counts = self.ledger.counts();
        self.recent.remember(&snapshot.shm, now);
    }

    /// Tells each failure with what was known, logs and counts it; returns them, and `last`
    /// carrying them (so /metrics counts them before the next scan).
    pub fn tell(
        &mut self,
        found: &[Detected],
        last: Option<&Snapshot>,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
        now: Instant,
    ) -> (Vec<Failure>, Option<Snapshot>) {
        let with_recent = last.map(|s| self.recent.added_to(s));
        let known = Known {
            snapshot: with_recent.as_ref(),
            pods,
            holders,
            rules: self.rules,
        };
        let failures = self
            .same
            .keep_new(found.iter().filter_map(|d| correlate(d, known)).collect());
        for f in &failures {
            tracing::warn!(kind = f.kind.as_str(), "{}", f.message);
        }
        self.ledger.record(&failures, now);
        let next = last.map(|last| {
            let mut next = last.clone();
            next.failures = self.ledger.recent();
            next.failure_counts = self.ledger.counts();
            next
        });
        (failures, next)
    }
}

//! The scan thread's side of the failures: what the watcher found, correlated with what was
//! known then (the last snapshot plus the containers gone since), logged and counted; the
//! snapshot carries the recent ones and the counts.

use std::collections::hash_map::{Entry, HashMap};
use std::time::{Duration, Instant};

use super::correlate::{correlate, Known};
use super::detect::DeathRules;
use super::ledger::Ledger;
use super::recent::RecentReadings;
use super::same::SameDeath;
use crate::kube::podresources::GpuHolders;
use crate::kube::pods::PodIndex;
use crate::model::{ContainerRef, Detected, Failure, FindingKind, Snapshot};

/// A container's repeats of one kind of failure are logged at most this often, counted in
/// between: a pod printing its failure in a loop must not flood the agent's own log.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Containers and kinds remembered for that; past this the quiet ones are forgotten.
const SAID_MAX: usize = 4096;

/// When each container's failure of each kind was last logged, and its repeats since.
#[derive(Default)]
struct Said(HashMap<(ContainerRef, FindingKind), (Instant, u64)>);

impl Said {
    /// Whether to log a failure of `kind` of `container` now: `Some(n)` with the `n` repeats
    /// not logged since the last time.
    fn say(&mut self, container: ContainerRef, kind: FindingKind, now: Instant) -> Option<u64> {
        if self.0.len() >= SAID_MAX {
            self.0
                .retain(|_, (at, _)| now.duration_since(*at) < LOG_EVERY);
        }
        match self.0.entry((container, kind)) {
            Entry::Vacant(e) => {
                e.insert((now, 0));
                Some(0)
            }
            Entry::Occupied(mut e) => {
                let (at, repeats) = e.get_mut();
                if now.duration_since(*at) < LOG_EVERY {
                    *repeats += 1;
                    return None;
                }
                let more = std::mem::take(repeats);
                *at = now;
                Some(more)
            }
        }
    }
}

pub struct Teller {
    said: Said,
    ledger: Ledger,
    recent: RecentReadings,
    same: SameDeath,
    rules: DeathRules,
}

impl Teller {
    pub fn new(rules: DeathRules) -> Teller {
        Teller {
            said: Said::default(),
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
            match self.said.say(f.container_ref(), f.kind, now) {
                Some(0) => tracing::warn!(kind = f.kind.as_str(), "{}", f.message),
                Some(more) => tracing::warn!(
                    kind = f.kind.as_str(),
                    repeats = more,
                    "{} (and {more} more times since it was last logged)",
                    f.message
                ),
                None => {}
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_repeated_in_a_loop_is_logged_once_a_minute_with_its_count() {
        let say = |said: &mut Said, pod: &str, at: Instant| {
            let container = ContainerRef {
                namespace: Some("ml".into()),
                pod: Some(pod.into()),
                pod_uid: None,
                container: Some("trainer".into()),
                container_id: String::new(),
            };
            said.say(container, FindingKind::ShmAllocationFailed, at)
        };
        let t0 = Instant::now();
        let mut said = Said::default();
        assert_eq!(say(&mut said, "flood", t0), Some(0));
        // 50 s of repeats: none logged; another Pod's first is.
        for i in 1..=500 {
            let at = t0 + Duration::from_millis(i * 100);
            assert_eq!(say(&mut said, "flood", at), None);
        }
        assert_eq!(say(&mut said, "other", t0), Some(0));
        assert_eq!(
            say(&mut said, "flood", t0 + LOG_EVERY),
            Some(500),
            "the next one says how many were not logged"
        );
        assert_eq!(say(&mut said, "flood", t0 + LOG_EVERY), None);
    }
}

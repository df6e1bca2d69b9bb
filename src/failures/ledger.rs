//! What `serve` remembers and says of the failures the pipeline told: the recent ones (for the
//! snapshot), a count per container and kind (`shmlink_workload_failures_total`), and a line in
//! the agent's log (a container's repeats of a kind once a minute). Bounded: a node that sees
//! thousands of dying containers keeps the newest.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::model::{ContainerRef, Failure, FindingKind, Snapshot};

/// Failures kept for the snapshot.
const RECENT_MAX: usize = 256;
/// Counters kept; the least recently counted go first past this.
const COUNTS_MAX: usize = 4096;
/// A counter not increased for this long is dropped with its series (the container is gone).
const COUNT_LASTS: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
pub struct Ledger {
    recent: VecDeque<Failure>,
    counts: HashMap<(ContainerRef, FindingKind), (u64, Instant)>,
    /// Each counted container's image (the fleet groups deaths by it).
    images: HashMap<ContainerRef, String>,
    said: Said,
}

impl Ledger {
    /// Logs, counts and keeps the failures just told.
    pub fn record(&mut self, failures: &[Failure], now: Instant) {
        for f in failures {
            match self.said.say(f.placed.clone(), f.kind, now) {
                Some(0) => tracing::warn!(kind = f.kind.as_str(), "{}", f.message),
                Some(more) => tracing::warn!(
                    kind = f.kind.as_str(),
                    repeats = more,
                    "{} (and {more} more times since it was last logged)",
                    f.message
                ),
                None => {}
            }
            let entry = self
                .counts
                .entry((f.placed.clone(), f.kind))
                .or_insert((0, now));
            *entry = (entry.0 + 1, now);
            if let Some(image) = &f.image {
                self.images.insert(f.placed.clone(), image.clone());
            }
            self.recent.push_back(f.clone());
        }
        while self.recent.len() > RECENT_MAX {
            self.recent.pop_front();
        }
        self.counts
            .retain(|_, (_, at)| now.duration_since(*at) < COUNT_LASTS);
        if self.counts.len() > COUNTS_MAX {
            // A container no Pod or runtime record names (an ID from a kernel report, of a
            // cgroup gone or never this node's) goes first: a flood of such IDs never pushes a
            // known container's counter out.
            let mut by_age: Vec<_> = self
                .counts
                .iter()
                .map(|(k, v)| (is_named(&k.0), v.1, k.clone()))
                .collect();
            by_age.sort_by_key(|(named, at, _)| (*named, *at));
            for (_, _, k) in by_age.into_iter().take(self.counts.len() - COUNTS_MAX) {
                self.counts.remove(&k);
            }
        }
        if !self.images.is_empty() {
            let counted: std::collections::HashSet<&ContainerRef> =
                self.counts.keys().map(|(c, _)| c).collect();
            self.images.retain(|c, _| counted.contains(c));
        }
    }

    /// The snapshot carries the failures told so far, the counts and the counted containers'
    /// images.
    pub fn fill(&self, snapshot: &mut Snapshot) {
        snapshot.failures = self.recent();
        snapshot.failure_counts = self.counts();
        snapshot.failure_images = self.images();
    }

    /// Each counted container with its image, sorted.
    pub fn images(&self) -> Vec<(ContainerRef, String)> {
        let mut out: Vec<(ContainerRef, String)> = self
            .images
            .iter()
            .map(|(c, image)| (c.clone(), image.clone()))
            .collect();
        out.sort_by_key(|(c, image)| (c.to_string(), c.container_id.clone(), image.clone()));
        out
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

/// Whether a Pod (its cache or the scan) or a runtime record names the container.
fn is_named(c: &ContainerRef) -> bool {
    c.pod.is_some() || c.container.is_some()
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn a_counted_containers_image_is_kept_as_long_as_its_count() {
        let mut l = Ledger::default();
        let t0 = Instant::now();
        let mut a = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "a", "u-a");
        a.placed.container_id = Some("c-a".into());
        a.image = Some("nvcr.io/nvidia/pytorch:24.05-py3".into());
        let mut b = fixtures::failure(FindingKind::ShmBusError, "ml", "b", "u-b");
        b.placed.container_id = Some("c-b".into());
        l.record(&[a, b], t0);
        let images: Vec<(String, String)> = l
            .images()
            .into_iter()
            .map(|(c, image)| (c.container_id.unwrap_or_default(), image))
            .collect();
        assert_eq!(
            images,
            [(
                "c-a".to_string(),
                "nvcr.io/nvidia/pytorch:24.05-py3".to_string()
            )]
        );
        // A day later with nothing new, the count goes and its image with it.
        let mut c = fixtures::failure(FindingKind::ShmBusError, "ml", "c", "u-c");
        c.placed.container_id = Some("c-c".into());
        l.record(&[c], t0 + COUNT_LASTS);
        assert_eq!(l.images(), []);
    }

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

    /// OOM kills of IDs no Pod names, more than the counters kept and newer than the known
    /// ones: the known containers' counters stay.
    #[test]
    fn ids_no_pod_names_never_push_a_known_counter_out() {
        let mut l = Ledger::default();
        let t0 = Instant::now();
        let known: Vec<Failure> = (0..100)
            .map(|i| fixtures::failure(FindingKind::ShmOomKilled, "ml", &format!("p{i}"), "u"))
            .collect();
        l.record(&known, t0);
        let stranger = |i: usize| {
            let mut f = fixtures::failure(FindingKind::WorkloadOomKilled, "", "", "");
            f.placed = crate::model::ContainerRef {
                container_id: Some(format!("{i:064x}")),
                ..Default::default()
            };
            f
        };
        for i in 0..COUNTS_MAX + 500 {
            l.record(&[stranger(i)], t0 + Duration::from_millis(i as u64 + 1));
        }
        let counts = l.counts();
        assert_eq!(counts.len(), COUNTS_MAX);
        let named = counts.iter().filter(|(c, _, _)| c.pod.is_some()).count();
        assert_eq!(named, 100);
    }

    #[test]
    fn a_failure_repeated_in_a_loop_is_logged_once_a_minute_with_its_count() {
        let say = |said: &mut Said, pod: &str, at: Instant| {
            let container = ContainerRef {
                namespace: Some("ml".into()),
                pod: Some(pod.into()),
                pod_uid: None,
                container: Some("trainer".into()),
                container_id: None,
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

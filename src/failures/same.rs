//! One death, told once. Several sources can tell the same death: the kernel's OOM report and
//! kubelet's (or Docker's) `OOMKilled` of the same container; PyTorch's bus-error line and the
//! container's exit status 135. The first told stands (the kernel's report comes first and has
//! the split); a later one of the same kind of death, from another source, about the same
//! container, within [`WINDOW`], is the same death and is dropped.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::model::{Failure, FailureSource, FindingKind};

/// How far apart two sources' times of one death may be: the kernel's record is stamped at the
/// kill, kubelet's `finishedAt` when the runtime saw the exit, a log line when it was written.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Deaths remembered at most (the oldest go first).
const KEPT: usize = 1024;

/// What kind of death a failure is, for telling two sources' accounts apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    Oom,
    Bus,
}

fn death(f: &Failure) -> Option<Death> {
    match f.kind {
        FindingKind::ShmOomKilled | FindingKind::WorkloadOomKilled => Some(Death::Oom),
        FindingKind::ShmBusError | FindingKind::WorkloadBusError => Some(Death::Bus),
        // PyTorch's "killed by signal: Bus error", a shell's "Bus error (core dumped)".
        FindingKind::ShmAllocationFailed
            if f.evidence.to_ascii_lowercase().contains("bus error") =>
        {
            Some(Death::Bus)
        }
        _ => None,
    }
}

struct Told {
    death: Death,
    source: FailureSource,
    at: Option<SystemTime>,
    container_id: Option<String>,
    pod_uid: Option<String>,
    container: Option<String>,
}

impl Told {
    /// The same container: by ID where both name it (a restarted container has a new one), else
    /// by Pod UID and container name.
    fn same_container(&self, f: &Failure) -> bool {
        match (&self.container_id, &f.container_id) {
            (Some(a), Some(b)) if a == b => true,
            _ => {
                self.pod_uid.is_some()
                    && self.container.is_some()
                    && self.pod_uid == f.pod_uid
                    && self.container == f.container
                    && !ids_differ(self.container_id.as_deref(), f.container_id.as_deref())
            }
        }
    }
}

/// Both IDs known and different: two instances of the container (a restart), two deaths.
fn ids_differ(a: Option<&str>, b: Option<&str>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a != b)
}

/// The deaths told lately.
#[derive(Default)]
pub struct SameDeath {
    told: VecDeque<Told>,
}

impl SameDeath {
    /// Whether `f` is news: not a death another source already told. Remembers it when it is.
    pub fn is_new(&mut self, f: &Failure) -> bool {
        let Some(death) = death(f) else { return true };
        let at = parse_rfc3339(&f.at);
        let repeat = self.told.iter().any(|t| {
            t.death == death && t.source != f.source && t.same_container(f) && near(t.at, at)
        });
        if repeat {
            return false;
        }
        self.told.push_back(Told {
            death,
            source: f.source,
            at,
            container_id: f.container_id.clone(),
            pod_uid: f.pod_uid.clone(),
            container: f.container.clone(),
        });
        while self.told.len() > KEPT {
            self.told.pop_front();
        }
        true
    }

    /// The failures that are news, in order.
    pub fn keep_new(&mut self, failures: Vec<Failure>) -> Vec<Failure> {
        failures.into_iter().filter(|f| self.is_new(f)).collect()
    }
}

fn near(a: Option<SystemTime>, b: Option<SystemTime>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.duration_since(b).unwrap_or_else(|e| e.duration()) <= WINDOW,
        // A time that did not parse cannot tell two deaths apart: the same container suffices.
        _ => true,
    }
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn death_of(
        kind: FindingKind,
        source: FailureSource,
        id: Option<&str>,
        at: &str,
        evidence: &str,
    ) -> Failure {
        let mut f = fixtures::failure(kind, "ml", "trainer-0", "u-1");
        f.source = source;
        f.container_id = id.map(str::to_string);
        f.at = at.to_string();
        f.evidence = evidence.to_string();
        f
    }

    #[test]
    fn the_kernels_oom_kill_and_kubelets_oomkilled_of_one_container_are_one_death() {
        let mut same = SameDeath::default();
        let kernel = death_of(
            FindingKind::ShmOomKilled,
            FailureSource::Kernel,
            Some("aaaa"),
            "2026-11-24T10:00:00.100Z",
            "Memory cgroup out of memory: Killed process 4242 (dd)",
        );
        let kubelet = death_of(
            FindingKind::WorkloadOomKilled,
            FailureSource::PodStatus,
            Some("aaaa"),
            "2026-11-24T10:00:00.900Z",
            "lastState.terminated: OOMKilled",
        );
        assert!(same.is_new(&kernel));
        assert!(!same.is_new(&kubelet), "the same container, the same death");
        // The restart's container dies the same way a minute later: a new death.
        let again = death_of(
            FindingKind::WorkloadOomKilled,
            FailureSource::PodStatus,
            Some("bbbb"),
            "2026-11-24T10:01:30Z",
            "lastState.terminated: OOMKilled",
        );
        assert!(same.is_new(&again));
    }

    #[test]
    fn two_kills_the_kernel_reports_are_two_deaths() {
        let mut same = SameDeath::default();
        let kill = |at: &str| {
            death_of(
                FindingKind::WorkloadOomKilled,
                FailureSource::Kernel,
                Some("aaaa"),
                at,
                "Killed process",
            )
        };
        assert!(same.is_new(&kill("2026-11-24T10:00:00Z")));
        assert!(
            same.is_new(&kill("2026-11-24T10:00:01Z")),
            "two workers killed: one source, two deaths"
        );
    }

    #[test]
    fn pytorchs_bus_error_line_and_exit_status_135_are_one_death() {
        let mut same = SameDeath::default();
        let line = death_of(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            None,
            "2026-11-24T10:00:00Z",
            "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.",
        );
        let status = death_of(
            FindingKind::ShmBusError,
            FailureSource::PodStatus,
            Some("aaaa"),
            "2026-11-24T10:00:02Z",
            "lastState.terminated: exit status 135",
        );
        assert!(same.is_new(&line));
        assert!(!same.is_new(&status));
        // A line that is no bus error does not swallow a bus-error death.
        let mut same = SameDeath::default();
        let enospc = death_of(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            None,
            "2026-11-24T10:00:00Z",
            "No space left on device",
        );
        assert!(same.is_new(&enospc));
        assert!(same.is_new(&status));
    }

    #[test]
    fn another_container_or_a_death_long_before_is_news() {
        let mut same = SameDeath::default();
        let kernel = death_of(
            FindingKind::ShmOomKilled,
            FailureSource::Kernel,
            Some("aaaa"),
            "2026-11-24T10:00:00Z",
            "Killed process",
        );
        assert!(same.is_new(&kernel));
        let mut other = death_of(
            FindingKind::WorkloadOomKilled,
            FailureSource::PodStatus,
            Some("cccc"),
            "2026-11-24T10:00:00Z",
            "OOMKilled",
        );
        other.container = Some("sidecar".into());
        assert!(same.is_new(&other), "another container of the Pod");
        let late = death_of(
            FindingKind::WorkloadOomKilled,
            FailureSource::PodStatus,
            Some("aaaa"),
            "2026-11-24T10:05:00Z",
            "OOMKilled",
        );
        assert!(same.is_new(&late), "minutes apart: not the kernel's kill");
        // Not a death at all: never held back.
        let crash = death_of(
            FindingKind::GpuJobCrashed,
            FailureSource::Kernel,
            Some("aaaa"),
            "2026-11-24T10:05:00Z",
            "segfault",
        );
        assert!(same.is_new(&crash) && same.is_new(&crash));
    }
}

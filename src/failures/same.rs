//! One death, told once. Several sources can tell the same death: the kernel's OOM report and
//! kubelet's (or Docker's) `OOMKilled` of the same container; PyTorch's bus-error line and the
//! container's exit status 135. The first told stands (the kernel's report comes first and has
//! the split); a later one of the same kind of death, from another source, about the same
//! container, within [`WINDOW`], is the same death and is dropped.
//!
//! A hang is one death however many of its container's ranks print their watchdog's line (each
//! twice: logged, then in `terminate`'s `what()`): two whose windows (the collective's start to
//! its timeout) overlap are the same hang.
//!
//! PyTorch's word that a DataLoader worker was killed (`dataloader.rs`) is no failure alone: it is
//! tied to the OOM kill of the same container within the window (and of that worker, where the
//! killed process's PID in the container is known), and told with it. A word that comes after
//! the kill was told in another batch (`serve`'s Event is out) is dropped; one that comes
//! first waits a window for the kill (the memory cgroup's counter is read each scan).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::model::{ContainerRef, Failure, FailureSource, FindingKind};
use crate::text;

/// How far apart two sources' times of one death may be: the kernel's record is stamped at the
/// kill, kubelet's `finishedAt` when the runtime saw the exit, a log line when it was written.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How far apart one fault's own lines are (a DataLoader worker's line and the main process's,
/// a handler's line and then the shell's `Bus error (core dumped)`): a bus-error line within
/// this of another of its container's is the same death.
const FAULT_LINES: Duration = Duration::from_secs(5);
/// Deaths remembered at most (the oldest go first).
const KEPT: usize = 1024;
/// Workers' words waiting for their kill at most.
const WORDS: usize = 256;

/// What kind of death a failure is, for telling two sources' accounts apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    Oom,
    Bus,
    /// A collective that hung until a watchdog ended the job.
    Hang,
}

fn death(f: &Failure) -> Option<Death> {
    match f.kind {
        FindingKind::ShmOomKilled | FindingKind::WorkloadOomKilled => Some(Death::Oom),
        FindingKind::ShmBusError
        | FindingKind::WorkloadBusError
        | FindingKind::BusErrorUnmeasured => Some(Death::Bus),
        FindingKind::GpuCollectiveTimeout => Some(Death::Hang),
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
    at: SystemTime,
    placed: ContainerRef,
    pid_in_container: Option<i32>,
    /// A hang's window: from the start of its collective to its timeout.
    window: Option<(SystemTime, SystemTime)>,
}

impl Told {
    fn of(f: &Failure, death: Death) -> Told {
        Told {
            death,
            source: f.source,
            at: f.at.time(),
            placed: f.placed.clone(),
            pid_in_container: f.pid_in_container,
            window: f
                .hang
                .as_ref()
                .and_then(|h| Some((h.started?.time(), h.timed_out.time()))),
        }
    }

    /// Whether PyTorch's `word` tells this death: an OOM kill another source told, of the same
    /// container, about the same time, and of a worker the word names where the killed
    /// process's PID in the container is known.
    fn is_told_by(&self, word: &Failure) -> bool {
        self.death == Death::Oom
            && self.source != FailureSource::Log
            && self.same_container(word)
            && near(self.at, word.at.time())
            && self
                .pid_in_container
                .is_none_or(|pid| word.worker_pids.contains(&pid))
    }

    /// The same container: by ID where both name it (a restarted container has a new one), else
    /// by Pod UID and container name.
    fn same_container(&self, f: &Failure) -> bool {
        same_container(&self.placed, &f.placed)
    }
}

fn same_container(a: &ContainerRef, b: &ContainerRef) -> bool {
    match (&a.container_id, &b.container_id) {
        (Some(x), Some(y)) if x == y => true,
        _ => {
            a.pod_uid.is_some()
                && a.container.is_some()
                && a.pod_uid == b.pod_uid
                && a.container == b.container
                && !ids_differ(a.container_id.as_deref(), b.container_id.as_deref())
        }
    }
}

/// `check`'s own failures with those `serve` stored over the same window (`--state-dir`): a
/// stored one is added unless `check` read the same itself (the same death by [`SameDeath`]'s
/// rule, or the same kind of the same container, or of the same host process, within
/// [`FAULT_LINES`]). Oldest first. The best-informed account of one death stands: serve's,
/// judged by the reading taken the moment it died, over check's own later re-judgement of it
/// (Docker's exit record or the Pod's status read after the container was gone).
pub fn with_stored(mut told: Vec<Failure>, stored: Vec<Failure>) -> Vec<Failure> {
    let mut same = SameDeath::default();
    for f in &told {
        same.is_new(f);
    }
    let own = told.len();
    for s in stored {
        // serve placed what check, reading after the process was gone, could not: the same
        // account, better told (its container, GPUs and link deltas).
        let better =
            |t: &Failure| placed_later(t, &s) || read_at_the_moment(t, &s) || knew_its_gpus(t, &s);
        if let Some(i) = told[..own].iter().position(better) {
            told[i] = s;
            continue;
        }
        let read_again = told[..own].iter().any(|t| same_account(t, &s));
        if !read_again && same.is_new(&s) {
            told.push(s);
        }
    }
    told.sort_by_key(|f| f.at);
    told
}

/// Two accounts of one failure from the same source read twice (the store and the log, or a
/// log read again after a restart): the same kind and words, of the same container or host
/// process (and the same PID where both name one: two kills the kernel reports are two),
/// moments apart.
fn same_account(a: &Failure, b: &Failure) -> bool {
    a.kind == b.kind
        && a.evidence == b.evidence
        && within(a.at.time(), b.at.time(), FAULT_LINES)
        && (a.pid.is_none() || b.pid.is_none() || a.pid == b.pid)
        && if a.placed.is_placed() {
            same_container(&a.placed, &b.placed)
        } else {
            !b.placed.is_placed() && a.pid == b.pid
        }
}

/// `stored` is `unplaced`'s account (the same kind, line, moment and PID) that serve placed in a
/// container while the process was still there.
fn placed_later(unplaced: &Failure, stored: &Failure) -> bool {
    !unplaced.placed.is_placed()
        && stored.placed.is_placed()
        && unplaced.pid.is_some()
        && unplaced.pid == stored.pid
        && unplaced.kind == stored.kind
        && unplaced.evidence == stored.evidence
        && within(unplaced.at.time(), stored.at.time(), FAULT_LINES)
}

/// `stored` is the same death as `own` (of its container, about the same time) judged by a
/// reading taken at its moment (`memory.source` `tracepoint`), where `own` was not.
fn read_at_the_moment(own: &Failure, stored: &Failure) -> bool {
    let at_moment = |f: &Failure| {
        f.memory
            .is_some_and(|m| m.source == crate::model::MemorySource::Tracepoint)
    };
    let kind = death(own);
    kind.is_some()
        && kind == death(stored)
        && at_moment(stored)
        && !at_moment(own)
        && own.placed.is_placed()
        && same_container(&own.placed, &stored.placed)
        && near(own.at.time(), stored.at.time())
}

/// `stored` is `own`'s failure told better by serve: the same account, told while NVML still
/// listed its process (the GPUs it used, which `check`, reading after the process was gone,
/// cannot know, and so what their links did); or the same hang, judged by serve over its window
/// from a ledger sampled through its end, where `check`'s copy of the ledger (its checkpoint,
/// written at most once a minute while counts move) may end before it.
fn knew_its_gpus(own: &Failure, stored: &Failure) -> bool {
    if own.kind != stored.kind {
        return false;
    }
    if death(own) == Some(Death::Hang) {
        let (a, b) = (Told::of(own, Death::Hang), Told::of(stored, Death::Hang));
        return a.same_container(stored) && one_hang(&a, &b) && !stored.gpus.is_empty();
    }
    own.gpus.is_empty() && !stored.gpus.is_empty() && same_account(own, stored)
}

/// Both IDs known and different: two instances of the container (a restart), two deaths.
fn ids_differ(a: Option<&str>, b: Option<&str>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a != b)
}

/// The deaths told lately, and the workers' words still waiting for theirs.
#[derive(Default)]
pub struct SameDeath {
    told: VecDeque<Told>,
    words: VecDeque<Failure>,
    /// Failures told before a restart: one read again (a position saved before it) is no news.
    before: VecDeque<Failure>,
}

impl SameDeath {
    /// A failure told before the agent restarted (the state store's): the same account read
    /// again, or the same death from another source, is not told again.
    pub fn told_before(&mut self, f: &Failure) {
        self.is_new(f);
        self.before.push_back(f.clone());
        while self.before.len() > KEPT {
            self.before.pop_front();
        }
    }

    /// Whether `f` is news: not a death another source already told, nor a failure told
    /// before the restart read again. Remembers it when it is.
    pub fn is_new(&mut self, f: &Failure) -> bool {
        if self.before.iter().any(|b| same_account(b, f)) {
            return false;
        }
        let Some(death) = death(f) else { return true };
        let told = Told::of(f, death);
        let repeat = self.told.iter().any(|t| {
            t.death == death
                && t.same_container(f)
                && if death == Death::Hang {
                    one_hang(t, &told)
                } else {
                    near(t.at, told.at) && (t.source != f.source || one_faults_lines(t, &told))
                }
        });
        if repeat {
            return false;
        }
        self.told.push_back(told);
        while self.told.len() > KEPT {
            self.told.pop_front();
        }
        true
    }

    /// The failures that are news, in order; a worker's word goes with the kill it tells.
    pub fn keep_new(&mut self, failures: Vec<Failure>) -> Vec<Failure> {
        let (words, deaths): (Vec<_>, Vec<_>) =
            failures.into_iter().partition(Failure::is_workload_word);
        let mut kept: Vec<Failure> = deaths.into_iter().filter(|f| self.is_new(f)).collect();
        self.words.extend(words);
        let now = SystemTime::now();
        let told = &self.told;
        self.words.retain(|word| {
            let at = word.at.time();
            if let Some(kill) = kept
                .iter_mut()
                .find(|f| f.told_by_workload.is_none() && tells(word, f))
            {
                kill.told_by_workload = Some(word.evidence.clone());
                kill.message
                    .push_str(&text::told_by_workload(&word.evidence));
                return false;
            }
            // The kill was told before (in `serve`, its Event is out), or told with an earlier
            // word: the same death.
            let told_before = told.iter().any(|t| t.is_told_by(word));
            // Waits a window for its kill, by the line's own time.
            let fresh = now.duration_since(at).unwrap_or_default() <= WINDOW;
            !told_before && fresh
        });
        while self.words.len() > WORDS {
            self.words.pop_front();
        }
        kept
    }
}

/// Whether PyTorch's `word` tells the OOM kill `kill` (see [`Told::is_told_by`]).
fn tells(word: &Failure, kill: &Failure) -> bool {
    death(kill) == Some(Death::Oom) && Told::of(kill, Death::Oom).is_told_by(word)
}

/// Two lines of one container's log about one fault, moments apart: a DataLoader worker's
/// line and the main process's that it was killed, a handler's and a shell's. Other sources
/// count each kill (two OOM kills the kernel reports are two deaths).
fn one_faults_lines(earlier: &Told, line: &Told) -> bool {
    earlier.source == FailureSource::Log
        && line.source == FailureSource::Log
        && within(earlier.at, line.at, FAULT_LINES)
}

/// Two lines of one hang: their windows overlap (every rank waits in the same collective);
/// without windows, moments apart.
fn one_hang(a: &Told, b: &Told) -> bool {
    match (a.window, b.window) {
        (Some((a0, a1)), Some((b0, b1))) => a0 <= b1 && b0 <= a1,
        _ => within(a.at, b.at, FAULT_LINES),
    }
}

fn near(a: SystemTime, b: SystemTime) -> bool {
    within(a, b, WINDOW)
}

fn within(a: SystemTime, b: SystemTime, window: Duration) -> bool {
    a.duration_since(b).unwrap_or_else(|e| e.duration()) <= window
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::model::Stamp;

    fn death_of(
        kind: FindingKind,
        source: FailureSource,
        id: Option<&str>,
        at: &str,
        evidence: &str,
    ) -> Failure {
        let mut f = fixtures::failure(kind, "ml", "trainer-0", "u-1");
        f.source = source;
        f.placed.container_id = id.map(str::to_string);
        f.at = Stamp::parse(at).unwrap();
        f.evidence = evidence.to_string();
        f
    }

    #[test]
    fn one_faults_lines_are_one_death_and_a_later_fault_is_another() {
        let mut same = SameDeath::default();
        let line = |at: &str, evidence: &str| {
            death_of(
                FindingKind::ShmBusError,
                FailureSource::Log,
                None,
                at,
                evidence,
            )
        };
        let worker = death_of(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            None,
            "2026-11-24T10:00:00.000Z",
            "ERROR: Unexpected bus error encountered in worker.",
        );
        assert!(same.is_new(&worker));
        // The handler's and the shell's lines of that fault.
        assert!(!same.is_new(&line(
            "2026-11-24T10:00:00.200Z",
            "Fatal Python error: Bus error"
        )));
        assert!(!same.is_new(&line("2026-11-24T10:00:01.000Z", "Bus error (core dumped)")));
        // Half a minute on, the job's next attempt died too: another death.
        assert!(same.is_new(&line("2026-11-24T10:00:30.000Z", "Bus error (core dumped)")));
        // The worker's line of that second fault, and the main process's that the worker was
        // killed: one death with the shell's line.
        let second = death_of(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            None,
            "2026-11-24T10:00:30.100Z",
            "ERROR: Unexpected bus error encountered in worker.",
        );
        assert!(!same.is_new(&second));
        let main = death_of(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            None,
            "2026-11-24T10:00:30.100016Z",
            "RuntimeError: DataLoader worker (pid 3527) is killed by signal: Bus error.",
        );
        assert!(!same.is_new(&main));
        // The exit status 135 of the container that printed them: the same death.
        let exit = death_of(
            FindingKind::ShmBusError,
            FailureSource::PodStatus,
            None,
            "2026-11-24T10:00:31.000Z",
            "exit 135",
        );
        assert!(!same.is_new(&exit));
    }

    /// A rank's watchdog line: its window from `started` to `at`.
    fn hang(id: &str, started: &str, at: &str, rank: u32) -> Failure {
        let mut f = death_of(
            FindingKind::GpuCollectiveTimeout,
            FailureSource::Log,
            Some(id),
            at,
            &format!("[Rank {rank}] Watchdog caught collective operation timeout: ..."),
        );
        f.hang = Some(crate::model::Hang {
            said_by: crate::model::HangSaidBy::PytorchWatchdog,
            op: Some("ALLREDUCE".into()),
            seq: Some(7),
            rank: Some(rank),
            process_group: None,
            timeout_ms: Some(600_000),
            ran_for_ms: None,
            started: Some(Stamp::parse(started).unwrap()),
            timed_out: Stamp::parse(at).unwrap(),
            links: crate::model::HangLinks {
                verdict: crate::model::HangVerdict::Unknown,
                gpus: Vec::new(),
                watched: crate::model::Watched::No,
                why_not: Some(crate::model::NotWatched::NoGpus),
                from: None,
                until: None,
                links: 0,
                unread: 0,
                events: Vec::new(),
                down_at_start: Vec::new(),
                changed: Vec::new(),
                pairs: Vec::new(),
            },
        });
        f
    }

    #[test]
    fn every_ranks_watchdog_line_of_one_hang_is_one_death_and_the_next_hang_another() {
        let mut same = SameDeath::default();
        // Rank 0 timed out first; rank 1, which entered the collective 40 s later, after it;
        // each line again in terminate's what().
        let r0 = hang("c1", "2026-11-24T10:00:00Z", "2026-11-24T10:10:00Z", 0);
        let r1 = hang("c1", "2026-11-24T10:00:40Z", "2026-11-24T10:10:40Z", 1);
        assert!(same.is_new(&r0));
        assert!(!same.is_new(&r0.clone()), "what() repeats it");
        assert!(!same.is_new(&r1), "another rank of the same hang");
        // The restarted container hangs again: another death.
        let again = hang("c2", "2026-11-24T10:12:00Z", "2026-11-24T10:22:00Z", 0);
        assert!(same.is_new(&again));
        // The same container hanging in a later collective (a job that caught the error and
        // went on): its window does not overlap.
        let later = hang("c2", "2026-11-24T10:23:00Z", "2026-11-24T10:33:00Z", 0);
        assert!(same.is_new(&later));
        // Another container of the Pod in the same hang is its own death.
        let mut other = hang("c3", "2026-11-24T10:00:00Z", "2026-11-24T10:10:00Z", 4);
        other.placed.container = Some("rank4".into());
        assert!(same.is_new(&other));
    }

    #[test]
    fn a_dataloader_workers_line_and_the_main_processs_are_one_death() {
        let mut same = SameDeath::default();
        let line = |at: &str, evidence: &str| {
            death_of(
                FindingKind::ShmAllocationFailed,
                FailureSource::Log,
                None,
                at,
                evidence,
            )
        };
        assert!(same.is_new(&line(
            "2026-11-24T10:00:00.000000Z",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by \
             insufficient shared memory (shm)."
        )));
        assert!(!same.is_new(&line(
            "2026-11-24T10:00:00.000016Z",
            "RuntimeError: DataLoader worker (pid 3527) is killed by signal: Bus error."
        )));
        // Another container's worker dying at that moment is its own death.
        let mut other = line(
            "2026-11-24T10:00:00.000020Z",
            "ERROR: Unexpected bus error encountered in worker.",
        );
        other.placed.container = Some("evaluator".into());
        assert!(same.is_new(&other));
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
        other.placed.container = Some("sidecar".into());
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

    /// An RFC 3339 time `secs` after now (the words wait by their lines' own time).
    fn now_plus(secs: i64) -> String {
        let now = k8s_openapi::jiff::Timestamp::now();
        (now + k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string()
    }

    fn word(at: &str, pids: &[i32]) -> Failure {
        let mut w = death_of(
            FindingKind::WorkloadOomKilled,
            FailureSource::Log,
            None,
            at,
            "RuntimeError: DataLoader worker (pid 57) is killed by signal: Killed.",
        );
        w.worker_pids = pids.to_vec();
        w
    }

    fn kill(source: FailureSource, at: &str, pid_in_container: Option<i32>) -> Failure {
        let mut k = death_of(
            FindingKind::WorkloadOomKilled,
            source,
            Some("aaaa"),
            at,
            "Memory cgroup out of memory: Killed process 16790 (pt_data_worker)",
        );
        k.pid_in_container = pid_in_container;
        k
    }

    #[test]
    fn pytorchs_word_goes_with_the_kernels_kill_of_that_worker() {
        let mut same = SameDeath::default();
        let at = now_plus(0);
        let told = same.keep_new(vec![
            kill(FailureSource::Kernel, &at, Some(57)),
            word(&now_plus(1), &[57]),
        ]);
        assert_eq!(told.len(), 1, "one death: {told:?}");
        let line = "RuntimeError: DataLoader worker (pid 57) is killed by signal: Killed.";
        assert_eq!(told[0].told_by_workload.as_deref(), Some(line));
        assert!(told[0]
            .message
            .ends_with(&format!("The workload told it too: {line}")));
        // A second word of the same kill later: the same death, nothing new.
        assert!(same.keep_new(vec![word(&now_plus(2), &[57])]).is_empty());
    }

    #[test]
    fn a_word_before_the_counters_kill_waits_for_it() {
        let mut same = SameDeath::default();
        assert!(
            same.keep_new(vec![word(&now_plus(0), &[57])]).is_empty(),
            "alone, a SIGKILL from anyone: no failure"
        );
        let told = same.keep_new(vec![kill(FailureSource::MemoryCgroup, &now_plus(4), None)]);
        assert_eq!(told.len(), 1);
        assert!(told[0].told_by_workload.is_some(), "tied when it came");
        // Used once.
        let again = same.keep_new(vec![kill(FailureSource::MemoryCgroup, &now_plus(9), None)]);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].told_by_workload, None);
    }

    #[test]
    fn a_word_of_another_worker_container_or_time_is_not_tied() {
        let mut same = SameDeath::default();
        let at = now_plus(0);
        // The kernel killed the worker that is 99 in the container; PyTorch speaks of 57.
        let told = same.keep_new(vec![
            kill(FailureSource::Kernel, &at, Some(99)),
            word(&at, &[57]),
        ]);
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].told_by_workload, None);

        let mut same = SameDeath::default();
        let mut other = word(&at, &[57]);
        other.placed.container = Some("sidecar".into());
        let told = same.keep_new(vec![kill(FailureSource::Kernel, &at, None), other]);
        assert_eq!(told[0].told_by_workload, None, "another container's line");

        let mut same = SameDeath::default();
        let told = same.keep_new(vec![
            kill(FailureSource::Kernel, &at, None),
            word(&now_plus(-300), &[57]),
        ]);
        assert_eq!(told[0].told_by_workload, None, "minutes apart");
        assert!(same.words.is_empty(), "an old word does not wait");
    }

    #[test]
    fn a_word_after_a_kill_told_in_an_earlier_batch_is_dropped() {
        let mut same = SameDeath::default();
        let at = now_plus(0);
        assert_eq!(
            same.keep_new(vec![kill(FailureSource::Kernel, &at, None)])
                .len(),
            1
        );
        assert!(same.keep_new(vec![word(&at, &[57])]).is_empty());
        assert!(
            same.words.is_empty(),
            "its kill's Event is out: not kept waiting"
        );
    }
}

#[cfg(test)]
mod stored_tests {
    use super::*;
    use crate::fixtures;
    use crate::model::Stamp;

    fn at(kind: FindingKind, source: FailureSource, id: Option<&str>, at: &str) -> Failure {
        let mut f = fixtures::failure(kind, "ml", "trainer-0", "u-1");
        f.source = source;
        f.placed.container_id = id.map(str::to_string);
        f.at = Stamp::parse(at).unwrap();
        f
    }

    #[test]
    fn a_stored_failure_check_read_again_is_one_and_the_others_are_added_oldest_first() {
        let line = at(
            FindingKind::ShmAllocationFailed,
            FailureSource::Log,
            Some("c1"),
            "2026-11-27T10:00:00.000Z",
        );
        let kill = at(
            FindingKind::ShmOomKilled,
            FailureSource::Kernel,
            Some("c1"),
            "2026-11-27T10:05:00.000Z",
        );
        // The log line serve stored, and check read back (same time to the millisecond or a
        // few seconds off where the clock conversion differs).
        let mut stored_line = line.clone();
        stored_line.at = Stamp::parse("2026-11-27T10:00:01.500Z").unwrap();
        stored_line.found_late = true;
        // kubelet's OOMKilled for the kernel's kill: the same death from another source.
        let runtime = at(
            FindingKind::ShmOomKilled,
            FailureSource::PodStatus,
            Some("c1"),
            "2026-11-27T10:05:02.000Z",
        );
        // A death whose log rotated away: only the store has it.
        let gone = at(
            FindingKind::ShmBusError,
            FailureSource::Log,
            Some("c0"),
            "2026-11-27T09:00:00.000Z",
        );
        let merged = with_stored(
            vec![line.clone(), kill.clone()],
            vec![gone.clone(), stored_line, runtime],
        );
        assert_eq!(merged, vec![gone, line, kill]);
    }

    #[test]
    fn serves_account_read_at_the_moment_stands_over_checks_later_rejudgement() {
        use crate::model::{MemorySource, MemorySplit};
        let split = |source| MemorySplit {
            limit_bytes: None,
            usage_bytes: None,
            shm_bytes: Some(64 << 20),
            anon_bytes: None,
            source,
        };
        // check read Docker's record after the container was gone: no reading at the moment.
        let mut own = at(
            FindingKind::BusErrorUnmeasured,
            FailureSource::Docker,
            Some("c1"),
            "2026-11-27T10:00:01.000Z",
        );
        own.memory = Some(split(MemorySource::Docker));
        // serve read /dev/shm the moment it died.
        let mut stored = at(
            FindingKind::ShmBusError,
            FailureSource::Tracepoint,
            Some("c1"),
            "2026-11-27T10:00:00.300Z",
        );
        stored.memory = Some(split(MemorySource::Tracepoint));
        let merged = with_stored(vec![own.clone()], vec![stored.clone()]);
        assert_eq!(merged, vec![stored.clone()], "serve's stands");
        // Not over another container's death, nor one minutes away, nor without the moment.
        let mut other = stored.clone();
        other.placed.container_id = Some("c2".into());
        assert_eq!(with_stored(vec![own.clone()], vec![other]).len(), 2);
        let mut later = stored.clone();
        later.at = Stamp::parse("2026-11-27T10:05:00.000Z").unwrap();
        assert_eq!(with_stored(vec![own.clone()], vec![later]).len(), 2);
        let mut unread = stored.clone();
        unread.memory = Some(split(MemorySource::Docker));
        assert_eq!(with_stored(vec![own.clone()], vec![unread]), vec![own]);
    }

    #[test]
    fn two_deaths_of_one_kind_minutes_apart_or_in_another_container_stay_two() {
        let first = at(
            FindingKind::ShmBusError,
            FailureSource::Log,
            Some("c1"),
            "2026-11-27T10:00:00.000Z",
        );
        let mut later = first.clone();
        later.at = Stamp::parse("2026-11-27T10:02:00.000Z").unwrap();
        let mut other = first.clone();
        other.placed.container_id = Some("c2".into());
        let merged = with_stored(vec![first.clone()], vec![later.clone(), other.clone()]);
        assert_eq!(merged.len(), 3, "{merged:#?}");
        // A host process's crash: by PID.
        let mut host = at(
            FindingKind::GpuJobCrashed,
            FailureSource::Kernel,
            None,
            "2026-11-27T10:00:00.000Z",
        );
        host.placed.pod_uid = None;
        host.placed.container = None;
        host.pid = Some(7);
        let mut other_pid = host.clone();
        other_pid.pid = Some(8);
        let merged = with_stored(vec![host.clone()], vec![host.clone(), other_pid.clone()]);
        assert_eq!(merged.len(), 2);
        // check read the crash after its process was gone; serve had placed it: one failure,
        // serve's, with its container.
        let mut placed = host.clone();
        placed.placed.container_id = Some("c9".into());
        placed.placed.pod_uid = Some("u-9".into());
        let merged = with_stored(vec![host.clone()], vec![placed.clone()]);
        assert_eq!(merged, vec![placed.clone()]);
        // Another PID is another crash, placed or not.
        let merged = with_stored(vec![other_pid], vec![placed]);
        assert_eq!(merged.len(), 2);
    }

    #[test]
    fn serves_account_that_knew_the_gpus_stands_for_checks_own() {
        let own = at(
            FindingKind::GpuCollectiveTimeout,
            FailureSource::Log,
            Some("c1"),
            "2026-11-27T10:10:00.000Z",
        );
        let mut stored = own.clone();
        stored.gpus = vec![5, 7];
        stored.message = "... GPU 7's links went down ...".into();
        assert_eq!(
            with_stored(vec![own.clone()], vec![stored.clone()]),
            vec![stored]
        );
        // Neither knew them: check's own stands, once.
        assert_eq!(
            with_stored(vec![own.clone()], vec![own.clone()]),
            vec![own.clone()]
        );
        // A hang check placed on its GPUs too: serve's, judged over a ledger sampled through
        // the hang's end, stands.
        let mut placed = own.clone();
        placed.gpus = vec![5, 7];
        placed.message = "... not known clean ...".into();
        let mut judged = placed.clone();
        judged.message = "... GPU 7's links went down ...".into();
        assert_eq!(
            with_stored(vec![placed], vec![judged.clone()]),
            vec![judged]
        );
        // Not so for other kinds: check's own account, GPUs known, stands.
        let mut crash = own.clone();
        crash.kind = FindingKind::GpuEccUncorrectable;
        crash.gpus = vec![7];
        let mut stored_crash = crash.clone();
        stored_crash.message = "serve's".into();
        assert_eq!(
            with_stored(vec![crash.clone()], vec![stored_crash]),
            vec![crash]
        );
    }

    #[test]
    fn a_failure_round_trips_through_the_stores_json() {
        let mut f = at(
            FindingKind::ShmOomKilled,
            FailureSource::Kernel,
            Some("c1"),
            "2026-11-27T10:05:00.000Z",
        );
        f.found_late = true;
        f.pid = Some(7104);
        f.pid_in_container = Some(12);
        f.memory = Some(crate::model::MemorySplit {
            limit_bytes: Some(64 << 20),
            usage_bytes: Some(64 << 20),
            shm_bytes: Some(1 << 20),
            anon_bytes: None,
            source: crate::model::MemorySource::KernelLog,
        });
        f.shm = Some(crate::model::ShmThen {
            size_bytes: Some(64 << 20),
            used_bytes: Some(1 << 20),
            peak_bytes: None,
            memory_limit_bytes: Some(64 << 20),
            runtime_default: true,
            host_ipc: false,
        });
        f.gpus = vec![0, 7];
        f.gpus_from = Some(crate::model::GpusFrom::PodResources);
        f.gpu_pairs = vec![crate::model::PairThen {
            gpu: 0,
            peer_gpu: 7,
            status: crate::model::PairStatus::Down,
            reasons: vec!["nvlink_down".into()],
            since: Some("2026-11-27T10:00:00Z".into()),
        }];
        f.told_by_workload = Some("DataLoader worker (pid 12) is killed by signal".into());
        // As the store writes it: with found_late beside the fields.
        let row = crate::state::history::FailureRow::new(&f, true);
        let back: Failure = serde_json::from_str(&row.json).unwrap();
        assert_eq!(back, f);
        let json = serde_json::to_value(&f).unwrap();
        let back: Failure = serde_json::from_value(json).unwrap();
        assert_eq!(back, f);
    }
}

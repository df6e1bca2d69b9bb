//! The one way down of a failure, for `check` and `serve` alike (ARCHITECTURE.md draws it).
//!
//! Every source's account goes in as it is read: a container's log line, a kernel record, an
//! exit status (kubelet's Pod status, Docker's record), the memory cgroups' OOM counters. The
//! [`Pipeline`] alone recognises them (`detect.rs`), names a gone Docker container, merges one
//! death's accounts (`same.rs`), and judges and words each with what the agent knew
//! (`correlate.rs`); out come [`Failure`]s. `serve` feeds it as things happen
//! (`sources::follow`), `check` what it reads back (`sources::read_back`): the same steps in the
//! same order, so the two commands tell one death the same way.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use super::checkpoint::Mark;
use super::correlate::{correlate, Known};
use super::detect::Recogniser;
use super::docker_exits;
use super::oom_counters::OomCounters;
use super::recent::RecentReadings;
use super::same::SameDeath;
use super::signatures::Signatures;
use super::traced::{self, TracedReadings};
use crate::docker_records::{DockerExit, DockerNames};
use crate::host::NsId;
use crate::kernel_log::KmsgRecord;
use crate::kube::podresources::GpuHolders;
use crate::kube::pods::PodIndex;
use crate::logs::LogLine;
use crate::model::{
    ContainerRef, DeathRules, Detected, Failure, FailureSource, FindingKind, Snapshot, TracedDeath,
};

/// Where the failures are told, and how to place a host PID: the same for `check` and `serve`.
#[derive(Debug, Clone)]
pub struct Sources {
    pub pod_log_root: Option<PathBuf>,
    pub docker_root: Option<PathBuf>,
    pub kmsg: Option<PathBuf>,
    /// Where a host PID is placed (`/proc/PID/cgroup`) and a killed process's namespaced PID read.
    pub proc_root: PathBuf,
    /// The host's mount namespace: a process in it is not a container's.
    pub host_mnt: Option<NsId>,
    /// How deaths of memory are judged.
    pub rules: DeathRules,
}

/// How the accounts arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `serve`: as things happen. Where container logs are read, the kernel's OOM kill waits
    /// one round, so that PyTorch's word of the kill (written a moment after it) is told with it.
    Follow,
    /// `check`: read back at once over a window from `since`; accounts before it are read (an
    /// OOM report spans many records) but not told, and a container's failures of one kind are
    /// kept as the first and newest [`KEPT_PER_KIND`] / 2.
    ReadBack { since: SystemTime },
}

/// How long `serve` holds a hang for the first scan after its line (see [`Pipeline::tell`]) at
/// most: a stuck scan thread does not hold it back.
pub const HANG_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A container's failures of one kind that `check` lists at most: the first and the newest (a
/// container printing the same failure for an hour would otherwise hold millions).
pub const KEPT_PER_KIND: usize = 64;

pub struct Pipeline {
    mode: Mode,
    recogniser: Recogniser,
    accounts: Accounts,
    /// The kernel's OOM kills of the last round, told with this round's accounts (Follow).
    held_kills: Vec<Detected>,
    /// Whether a kill waits a round: following, with container logs to read.
    hold_kills: bool,
    /// Hangs waiting for a scan after their line, since when (Follow).
    held_hangs: Vec<(Detected, Instant)>,
    docker: Option<DockerNames>,
    same: SameDeath,
    recent: RecentReadings,
    oom_counters: Option<OomCounters>,
    rules: DeathRules,
    /// The readings traced deaths carried, lent to the other accounts of those deaths.
    traced: TracedReadings,
    /// serve started again from a checkpoint at this time: deaths from before it were found
    /// late (`found_late`).
    resumed_at: Option<SystemTime>,
    /// serve: where the source being read is ([`Pipeline::reading`]); the accounts taken in
    /// are numbered (`Detected::read`), the last so far, and where each pending one was read.
    reading: Option<Mark>,
    numbered: u64,
    marks: HashMap<u64, Mark>,
}

impl Pipeline {
    pub fn new(settings: &Sources, mode: Mode) -> Pipeline {
        Pipeline {
            mode,
            recogniser: Recogniser::new(
                settings.proc_root.clone(),
                settings.host_mnt,
                settings.rules.oom_shm_share,
            ),
            accounts: Accounts::new(match mode {
                Mode::Follow => None,
                Mode::ReadBack { .. } => Some(KEPT_PER_KIND),
            }),
            held_kills: Vec::new(),
            held_hangs: Vec::new(),
            hold_kills: mode == Mode::Follow
                && (settings.pod_log_root.is_some() || settings.docker_root.is_some()),
            docker: settings
                .docker_root
                .clone()
                .map(|root| DockerNames::new(Some(root))),
            same: SameDeath::default(),
            recent: RecentReadings::default(),
            oom_counters: None,
            rules: settings.rules,
            traced: TracedReadings::default(),
            resumed_at: None,
            reading: None,
            numbered: 0,
            marks: HashMap::new(),
        }
    }

    /// serve: the accounts taken in from now on were read at `mark` (None: by no source that
    /// can be read again, a tracepoint).
    pub fn reading(&mut self, mark: Option<Mark>) {
        self.reading = mark;
    }

    /// Where the accounts still pending were read: what a checkpoint must not pass.
    pub fn pending_marks(&self) -> Vec<Mark> {
        self.pending_reads()
            .filter_map(|n| self.marks.get(&n).cloned())
            .collect()
    }

    /// The numbers of the accounts still pending.
    fn pending_reads(&self) -> impl Iterator<Item = u64> + '_ {
        self.accounts
            .order
            .iter()
            .chain(&self.held_kills)
            .chain(self.held_hangs.iter().map(|(d, _)| d))
            .map(|d| d.read)
            .filter(|&n| n > 0)
    }

    /// serve started again at `at` from a checkpoint: what happened before `at` and is told
    /// now happened while the agent was down.
    pub fn resumed(&mut self, at: SystemTime) {
        self.resumed_at = Some(at);
    }

    /// The deaths the last runs told lately (the state store's): another source's account of
    /// one of them after the restart (kubelet's `OOMKilled` a second after the kernel's kill)
    /// is the same death, not a second one.
    pub fn resume_told(&mut self, told: &[Failure]) {
        for f in told {
            self.same.told_before(f);
        }
    }

    /// OOM kills told from the memory cgroups' counters, read by each scan (`serve` without
    /// the kernel log).
    pub fn with_oom_counters(mut self, counters: OomCounters) -> Pipeline {
        self.oom_counters = Some(counters);
        self
    }

    /// The question a source asks of a raw line before it decodes it (one automaton pass), of
    /// a copy, so that it can ask while each kept line is handed to [`Pipeline::log_line`].
    pub fn candidates(&self) -> Signatures {
        self.recogniser.candidates()
    }

    /// A container's log line: only ever about that container.
    pub fn log_line(&mut self, line: &LogLine) {
        if let Some(d) = self.recogniser.log_line(line) {
            self.account(d);
        }
    }

    /// A kernel record, every one in order (an OOM report spans many).
    pub fn kernel_record(&mut self, record: &KmsgRecord, at: SystemTime) {
        if let Some(d) = self.recogniser.kernel(record, at) {
            self.account(d);
        }
    }

    /// Docker's record of a stopped container: an OOM kill or a SIGBUS is a death.
    pub fn docker_exit(&mut self, exit: &DockerExit) {
        if let Some(d) = docker_exits::detected(exit) {
            self.account(d);
        }
    }

    /// Deaths a source recognised on its own side: kubelet's Pod statuses (`kube::exits`).
    pub fn exits(&mut self, deaths: impl IntoIterator<Item = Detected>) {
        for d in deaths {
            self.account(d);
        }
    }

    /// A death the kernel's tracepoints told, with its reading at the moment (`death_trace`).
    pub fn traced(&mut self, death: &TracedDeath) {
        let Some(d) = traced::detected(death, self.rules) else {
            self.traced.remember_place(death);
            return;
        };
        self.traced.remember(&d);
        // Heard once, never read again: it holds back no position.
        let reading = self.reading.take();
        self.account(d);
        self.reading = reading;
    }

    /// A scan: its containers are remembered for the failures told after they are gone, and
    /// the OOM kills its counters grew by are accounts.
    pub fn after_scan(&mut self, snapshot: &Snapshot, now: Instant) {
        let at = snapshot.taken_at.unwrap_or_else(SystemTime::now);
        self.recent.remember(&snapshot.shm, now, at);
        if let Some(counters) = self.oom_counters.as_mut() {
            let before = counters.counts().cloned().unwrap_or_default();
            for d in counters.after_scan(&snapshot.shm, at) {
                self.reading = d
                    .who
                    .container_id
                    .as_ref()
                    .map(|id| Mark::OomCount(id.clone(), before.get(id).copied().unwrap_or(0)));
                self.account(d);
            }
            self.reading = None;
        }
    }

    /// The memory cgroups' OOM kill counts at the last scan, if they are read.
    pub fn oom_counts(&self) -> Option<HashMap<String, u64>> {
        self.oom_counters.as_ref()?.counts().cloned()
    }

    /// Started again: OOM kills are counted from the counts saved.
    pub fn resume_oom_counts(&mut self, counts: HashMap<String, u64>) {
        if let Some(c) = self.oom_counters.as_mut() {
            c.resume(counts);
        }
    }

    /// Whether a kernel OOM report is being read: a position saved now would cut it.
    pub fn mid_report(&self) -> bool {
        self.recogniser.mid_report()
    }

    /// Whether anything waits to be told.
    pub fn has_pending(&self) -> bool {
        !self.accounts.is_empty() || !self.held_kills.is_empty() || !self.held_hangs.is_empty()
    }

    /// Tells what came in since the last call: each account placed and judged with what was
    /// known (`snapshot`: the last scan, to which the containers gone in the last minute are
    /// added here; this node's Pods; who holds which GPU), one death's accounts told once.
    pub fn tell(
        &mut self,
        snapshot: Option<&Snapshot>,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
    ) -> Vec<Failure> {
        let mut accounts = self.accounts.take();
        if self.hold_kills {
            // A runtime's record of an OOM kill waits with the kernel's: told in one round, the
            // kernel's account (with the memory split) is the one that stands, as in `check`.
            let (kills, rest): (Vec<Detected>, Vec<Detected>) = accounts
                .into_iter()
                .partition(|d| is_kernel_oom_kill(d) || is_runtime_oom_record(d));
            accounts = std::mem::replace(&mut self.held_kills, kills);
            accounts.extend(rest);
        }
        if self.mode == Mode::Follow {
            accounts = self.hangs_ready(accounts, snapshot);
        }
        // A runtime's record after the accounts with numbers: of two that tell one death (the
        // kernel's kill, kubelet's OOMKilled stamped in whole seconds), the first stays.
        accounts.sort_by_key(|d| (is_runtime_record(d), d.at));
        for d in &mut accounts {
            self.traced.place(d);
            self.traced.lend(d);
        }
        if let Some(names) = self.docker.as_mut() {
            for d in &mut accounts {
                name_gone_docker_container(d, names);
            }
        }
        let with_recent = snapshot.map(|s| self.recent.added_to(s));
        let known = Known {
            snapshot: with_recent.as_ref(),
            pods,
            holders,
            rules: self.rules,
            recent: Some(&self.recent),
        };
        let resumed_at = self.resumed_at;
        let failures = accounts
            .iter()
            .filter_map(|d| Some(found_late(d, correlate(d, known)?, resumed_at)))
            .collect();
        // Where the accounts told were read is forgotten: the marks kept are the pending ones'.
        let pending: std::collections::HashSet<u64> = self.pending_reads().collect();
        self.marks.retain(|n, _| pending.contains(n));
        self.same.keep_new(failures)
    }

    /// serve: a hang's window ends at its line, and the scans sample the links every
    /// `--interval`: it waits (at most [`HANG_WAIT`]) until a scan after the line has fed the
    /// ledger, so its window is judged whole, as `check` reading that ledger later judges it.
    /// Without NVML's samples there is nothing to wait for.
    fn hangs_ready(
        &mut self,
        accounts: Vec<Detected>,
        snapshot: Option<&Snapshot>,
    ) -> Vec<Detected> {
        let sampled = snapshot.and_then(|s| s.job_links.sampled_at);
        let now = Instant::now();
        let waiting = std::mem::take(&mut self.held_hangs);
        let mut ready = Vec::new();
        for (d, since) in waiting
            .into_iter()
            .chain(accounts.into_iter().map(|d| (d, now)))
        {
            let early = sampled.is_some_and(|s| s < d.at);
            if d.hang.is_some() && early && now.duration_since(since) < HANG_WAIT {
                self.held_hangs.push((d, since));
            } else {
                ready.push(d);
            }
        }
        ready
    }

    /// What was recognised and not yet told (the field corpus measures recognition alone).
    pub fn take_accounts(&mut self) -> Vec<Detected> {
        let mut out = std::mem::take(&mut self.held_kills);
        out.extend(
            std::mem::take(&mut self.held_hangs)
                .into_iter()
                .map(|(d, _)| d),
        );
        out.extend(self.accounts.take());
        out.sort_by_key(|d| d.at);
        out
    }

    fn account(&mut self, mut d: Detected) {
        if let Mode::ReadBack { since } = self.mode {
            if d.at < since {
                return;
            }
        }
        if let Some(mark) = &self.reading {
            self.numbered += 1;
            d.read = self.numbered;
            self.marks.insert(self.numbered, mark.clone());
        }
        self.accounts.push(d);
    }
}

/// A death from before the agent's restart (`resumed_at`) is marked and says so.
fn found_late(d: &Detected, mut f: Failure, resumed_at: Option<SystemTime>) -> Failure {
    if d.found_late || resumed_at.is_some_and(|at| d.at < at) {
        f.found_late = true;
        f.message.push_str(crate::text::FOUND_LATE);
    }
    f
}

/// The kernel's OOM kill (its log's report or its tracepoint), which PyTorch's word of it
/// follows.
fn is_kernel_oom_kill(d: &Detected) -> bool {
    matches!(d.source, FailureSource::Kernel | FailureSource::Tracepoint) && d.kind.is_oom_kill()
}

/// kubelet's or Docker's `OOMKilled`.
fn is_runtime_oom_record(d: &Detected) -> bool {
    is_runtime_record(d) && d.kind.is_oom_kill()
}

/// kubelet's and Docker's records: no numbers, stamped after the fact.
fn is_runtime_record(d: &Detected) -> bool {
    matches!(d.source, FailureSource::PodStatus | FailureSource::Docker)
}

/// A container gone since has no reading to name it: Docker's record still does.
fn name_gone_docker_container(d: &mut Detected, names: &mut DockerNames) {
    let who = &mut d.who;
    // Named already (a Pod's, or Docker's record), or not a container.
    if who.pod_uid.is_some() || who.container.is_some() {
        return;
    }
    if let Some(c) = who.container_id.as_deref().and_then(|id| names.lookup(id)) {
        who.container = Some(c.name);
    }
}

/// The accounts not yet told; with a bound, at most that many per container and kind: the first
/// half and the newest half, the rest counted and said once.
struct Accounts {
    bound: Option<usize>,
    order: Vec<Detected>,
    by_key: HashMap<(ContainerRef, FindingKind), Kept>,
}

/// One container's accounts of one kind: the first, the newest, and how many were left out.
type Kept = (Vec<Detected>, VecDeque<Detected>, u64);

impl Accounts {
    fn new(bound: Option<usize>) -> Accounts {
        Accounts {
            bound,
            order: Vec::new(),
            by_key: HashMap::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty() && self.by_key.is_empty()
    }

    fn push(&mut self, d: Detected) {
        let Some(bound) = self.bound else {
            self.order.push(d);
            return;
        };
        let (first, newest, left_out) = self.by_key.entry((d.who.clone(), d.kind)).or_default();
        if first.len() < bound / 2 {
            first.push(d);
            return;
        }
        newest.push_back(d);
        if newest.len() > bound / 2 {
            newest.pop_front();
            *left_out += 1;
        }
    }

    fn take(&mut self) -> Vec<Detected> {
        let mut out = std::mem::take(&mut self.order);
        let half = self.bound.unwrap_or(0) / 2;
        for ((who, kind), (first, newest, left_out)) in std::mem::take(&mut self.by_key) {
            if left_out > 0 {
                tracing::warn!(
                    "container {}: {left_out} more {} failures in its log are not listed (the \
                     first {half} and the newest {half} are)",
                    whose(&who),
                    kind.as_str(),
                );
            }
            out.extend(first);
            out.extend(newest);
        }
        out.sort_by_key(|d| d.at);
        out
    }
}

fn whose(who: &ContainerRef) -> String {
    who.name().unwrap_or_else(|| "a process".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(i: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(i)
    }

    fn who(c: &str) -> ContainerRef {
        ContainerRef {
            pod_uid: None,
            container_id: Some(c.into()),
            ..ContainerRef::default()
        }
    }

    #[test]
    fn check_keeps_the_first_and_the_newest_failures_of_a_flooding_container() {
        let mut kept = Accounts::new(Some(KEPT_PER_KIND));
        for i in 0..10_000 {
            let kind = FindingKind::ShmAllocationFailed;
            kept.push(Detected::new(
                who("flood"),
                kind,
                at(i),
                FailureSource::Log,
                "x",
            ));
        }
        kept.push(Detected::new(
            who("quiet"),
            FindingKind::ShmAllocationFailed,
            at(5),
            FailureSource::Log,
            "y",
        ));
        let out = kept.take();
        let flood: Vec<u64> = out
            .iter()
            .filter(|d| d.who == who("flood"))
            .map(|d| {
                d.at.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        let want: Vec<u64> = (0..32).chain(10_000 - 32..10_000).collect();
        assert_eq!(flood, want);
        assert_eq!(out.iter().filter(|d| d.who == who("quiet")).count(), 1);
        assert!(kept.is_empty(), "told once");
    }

    fn settings() -> Sources {
        Sources {
            pod_log_root: None,
            kmsg: None,
            proc_root: PathBuf::from("/nonexistent"),
            host_mnt: None,
            docker_root: None,
            rules: DeathRules::default(),
        }
    }

    fn told(p: &mut Pipeline) -> Vec<(FindingKind, FailureSource)> {
        let holders = GpuHolders::new();
        p.tell(None, None, &holders)
            .iter()
            .map(|f| (f.kind, f.source))
            .collect()
    }

    fn oom_kill(source: FailureSource, secs: u64) -> Detected {
        let mut d = Detected::new(
            who("c1"),
            FindingKind::WorkloadOomKilled,
            at(secs),
            source,
            "killed",
        );
        d.memory = Some(crate::model::MemorySplit {
            limit_bytes: Some(100),
            usage_bytes: Some(100),
            shm_bytes: Some(1),
            anon_bytes: Some(99),
            source: crate::model::MemorySource::KernelLog,
        });
        d
    }

    #[test]
    fn one_death_told_by_the_kernel_and_a_runtime_record_is_the_kernels_in_both_modes() {
        // check reads both at once: the record is sorted after the account with numbers.
        let mut p = Pipeline::new(&settings(), Mode::ReadBack { since: at(0) });
        p.exits([oom_kill(FailureSource::PodStatus, 101)]);
        p.exits([oom_kill(FailureSource::Kernel, 100)]);
        let want = vec![(FindingKind::WorkloadOomKilled, FailureSource::Kernel)];
        assert_eq!(told(&mut p), want);
        assert!(!p.has_pending());
        // serve: the kernel's kill waits one round (for PyTorch's word), kubelet's record comes
        // a second later; one failure, the kernel's.
        let with_logs = Sources {
            pod_log_root: Some(PathBuf::from("/nonexistent")),
            ..settings()
        };
        let mut p = Pipeline::new(&with_logs, Mode::Follow);
        p.exits([oom_kill(FailureSource::Kernel, 100)]);
        assert!(told(&mut p).is_empty(), "held one round");
        assert!(p.has_pending());
        assert_eq!(told(&mut p), want);
        p.exits([oom_kill(FailureSource::PodStatus, 101)]);
        assert!(told(&mut p).is_empty(), "held one round too");
        assert!(told(&mut p).is_empty(), "the same death, told once");
        assert!(!p.has_pending());
        // Docker's record read in the same round as the kernel's kill waits with it: the
        // kernel's account stands, as in check (a race e2e_runtimes::docker met now and then).
        let mut p = Pipeline::new(&with_logs, Mode::Follow);
        p.exits([
            oom_kill(FailureSource::Docker, 101),
            oom_kill(FailureSource::Kernel, 100),
        ]);
        assert!(told(&mut p).is_empty(), "both held one round");
        assert_eq!(told(&mut p), want);
        assert!(!p.has_pending());
        // Without logs to read there is no word to wait for: told at once.
        let mut p = Pipeline::new(&settings(), Mode::Follow);
        p.exits([oom_kill(FailureSource::Kernel, 100)]);
        assert_eq!(told(&mut p), want);
    }

    #[test]
    fn a_death_told_before_a_restart_is_not_told_again_from_another_source() {
        let mut before = Pipeline::new(&settings(), Mode::Follow);
        before.exits([oom_kill(FailureSource::Kernel, 100)]);
        let told_before = before.tell(None, None, &GpuHolders::new());
        assert_eq!(told_before.len(), 1);
        // The next run, with the store's failures, hears kubelet's record of the same kill.
        let mut p = Pipeline::new(&settings(), Mode::Follow);
        p.resumed(at(102));
        p.resume_told(&told_before);
        p.exits([oom_kill(FailureSource::PodStatus, 101)]);
        assert!(
            told(&mut p).is_empty(),
            "the same death, told once across the restart"
        );
        // Without them it would be a second death (the window this closes).
        let mut fresh = Pipeline::new(&settings(), Mode::Follow);
        fresh.resumed(at(102));
        fresh.exits([oom_kill(FailureSource::PodStatus, 101)]);
        assert_eq!(told(&mut fresh).len(), 1);
        // The kernel's own record read again (its position was not saved past it) neither.
        p.exits([oom_kill(FailureSource::Kernel, 100)]);
        assert!(told(&mut p).is_empty(), "a record read again is no news");
        // A later kill of the same container is another death.
        p.exits([oom_kill(FailureSource::PodStatus, 400)]);
        assert_eq!(told(&mut p).len(), 1);
    }

    #[test]
    fn deaths_from_before_a_restart_are_found_late_and_say_so() {
        let mut p = Pipeline::new(&settings(), Mode::Follow);
        p.resumed(at(100));
        p.exits([
            oom_kill(FailureSource::PodStatus, 99),
            Detected {
                who: who("c2"),
                ..oom_kill(FailureSource::PodStatus, 101)
            },
        ]);
        let holders = GpuHolders::new();
        let told = p.tell(None, None, &holders);
        let late: Vec<bool> = told.iter().map(|f| f.found_late).collect();
        assert_eq!(late, [true, false]);
        assert!(told[0].message.ends_with(crate::text::FOUND_LATE));
        assert!(!told[1].message.contains("agent started again"));
        // An account known to be late (an OOM count grown while down) is, whatever its time.
        let mut d = oom_kill(FailureSource::MemoryCgroup, 200);
        d.found_late = true;
        p.exits([d]);
        assert!(p.tell(None, None, &holders)[0].found_late);
        // check never resumes: nothing is late there.
        let mut p = Pipeline::new(&settings(), Mode::ReadBack { since: at(0) });
        p.exits([oom_kill(FailureSource::PodStatus, 99)]);
        assert!(!p.tell(None, None, &holders)[0].found_late);
    }

    #[test]
    fn serve_holds_a_hang_until_a_scan_after_its_line_and_check_never() {
        let hang = |secs| {
            let mut d = Detected::new(
                who("c1"),
                FindingKind::GpuCollectiveTimeout,
                at(secs),
                FailureSource::Log,
                "watchdog",
            );
            d.hang = crate::failures::hang::parse::facts(
                crate::failures::hang::parse::XLA_TERMINATION,
                "Termination timeout of 30 seconds exceeded. Exiting to ensure a consistent \
                 program state.",
            );
            d
        };
        let scanned = |secs| {
            let mut s = Snapshot::default();
            let mut ledger = crate::model::JobLinks::default();
            ledger.feed(&[], &std::collections::HashSet::new(), at(secs), true);
            s.job_links = std::sync::Arc::new(ledger);
            s
        };
        let holders = GpuHolders::new();
        let mut p = Pipeline::new(&settings(), Mode::Follow);
        p.exits([hang(100)]);
        assert!(p.tell(Some(&scanned(99)), None, &holders).is_empty());
        assert!(p.has_pending(), "held for the next scan");
        assert_eq!(p.tell(Some(&scanned(101)), None, &holders).len(), 1);
        assert!(!p.has_pending());
        // Without NVML's samples there is nothing to wait for.
        p.exits([hang(200)]);
        assert_eq!(p.tell(Some(&Snapshot::default()), None, &holders).len(), 1);
        // check has its ledger as it is.
        let mut p = Pipeline::new(&settings(), Mode::ReadBack { since: at(0) });
        p.exits([hang(300)]);
        assert_eq!(p.tell(Some(&scanned(99)), None, &holders).len(), 1);
    }

    #[test]
    fn read_back_tells_nothing_from_before_since() {
        let mut p = Pipeline::new(&settings(), Mode::ReadBack { since: at(50) });
        p.exits([oom_kill(FailureSource::PodStatus, 49)]);
        assert!(!p.has_pending());
        p.exits([oom_kill(FailureSource::PodStatus, 50)]);
        assert_eq!(told(&mut p).len(), 1);
    }

    #[test]
    fn the_marks_kept_are_the_pending_accounts_and_a_traced_death_holds_none() {
        let with_logs = Sources {
            pod_log_root: Some(PathBuf::from("/nonexistent")),
            ..settings()
        };
        let mut p = Pipeline::new(&with_logs, Mode::Follow);
        let mark = |id: &str| Mark::Docker(id.into(), at(1));
        p.reading(Some(mark("kill")));
        p.exits([oom_kill(FailureSource::Kernel, 100)]);
        p.reading(Some(mark("bus")));
        p.exits([Detected::new(
            who("c2"),
            FindingKind::WorkloadBusError,
            at(100),
            FailureSource::Log,
            "Bus error",
        )]);
        p.reading(None);
        assert_eq!(p.pending_marks().len(), 2, "both read, neither told");
        assert_eq!(told(&mut p).len(), 1, "the bus error told, the kill held");
        assert_eq!(p.pending_marks(), [mark("kill")]);
        assert_eq!(p.marks.len(), 1, "the told one's mark forgotten");
        assert_eq!(told(&mut p).len(), 1);
        assert!(p.pending_marks().is_empty() && p.marks.is_empty());
        // Unmarked (check, or a source never read again): held, but holding back nothing.
        p.exits([oom_kill(FailureSource::Kernel, 300)]);
        assert!(told(&mut p).is_empty() && p.has_pending());
        assert!(p.pending_marks().is_empty());
    }

    /// The CI failure of a shell's `Bus error`: the scan after the death found /dev/shm freed
    /// (its creator's resource tracker unlinks it) and the peak sampler had not caught it. The
    /// line is judged by the scans around its moment, not by the last scan alone.
    #[test]
    fn a_bus_error_line_is_judged_by_the_scans_around_its_moment_not_the_last() {
        const MIB: u64 = 1 << 20;
        let line_at = at(1_000);
        let bus_line = || {
            let mut d = Detected::new(
                who("c1"),
                FindingKind::ShmBusError,
                line_at,
                FailureSource::Log,
                "Bus error",
            );
            d.judged = true;
            d
        };
        let reading = |used| crate::fixtures::shm_reading("c1", 64 * MIB, used);
        let holders = GpuHolders::new();
        // Each scan given as (ms from the line, bytes used), in order; the last one is the snapshot
        // the line is told with.
        let tell_after = |scans: &[(i64, u64)]| {
            let mut p = Pipeline::new(&settings(), Mode::Follow);
            let t0 = std::time::Instant::now();
            let mut last = None;
            for (i, &(ms, used)) in scans.iter().enumerate() {
                let wall = if ms < 0 {
                    line_at - Duration::from_millis(ms.unsigned_abs())
                } else {
                    line_at + Duration::from_millis(ms as u64)
                };
                let mut s = crate::fixtures::scanned("n", vec![reading(used)], None);
                s.taken_at = Some(wall);
                p.after_scan(&s, t0 + Duration::from_millis(200 * i as u64));
                last = Some(s);
            }
            p.exits([bus_line()]);
            let told = p.tell(last.as_ref(), None, &holders);
            told.iter().map(|f| f.kind).collect::<Vec<_>>()
        };
        // Full before the death, freed in the two scans after it: /dev/shm's.
        assert_eq!(
            tell_after(&[(-1_000, 60 * MIB), (-200, 60 * MIB), (100, 0), (300, 0)]),
            [FindingKind::ShmBusError]
        );
        // Full 30 s before, empty from 20 s before: not told from the line.
        let long_ago = [
            (-30_000, 60 * MIB),
            (-20_000, 0),
            (-10_000, 0),
            (-200, 0),
            (100, 0),
        ];
        assert!(tell_after(&long_ago).is_empty());
        // Filled after it: not its cause.
        assert!(tell_after(&[(-200, 0), (100, 0), (3_000, 63 * MIB)]).is_empty());
        // Only scans after it (a line read on a start): the first of them.
        assert_eq!(
            tell_after(&[(100, 60 * MIB), (300, 0)]),
            [FindingKind::ShmBusError]
        );
    }
}

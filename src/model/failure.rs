//! A workload's failure: as a source told it ([`Detected`]) and as `check --json`'s `failures[]`
//! tells it ([`Failure`]), with what was known then.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::evidence::{around, printable, redact};
use super::{ContainerRef, FindingKind, GpuLinks, Hang, HangFacts, NamedFrom, PairStatus, Stamp};

/// Longest evidence line kept (the rest is cut on a character boundary).
pub const EVIDENCE_MAX: usize = 512;

/// Where a failure was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureSource {
    /// The container's own output (CRI or Docker json-file log).
    Log,
    /// The kernel log.
    Kernel,
    /// The container's memory cgroup's own counters (its OOM kills).
    MemoryCgroup,
    /// The Pod's status: how kubelet says a container ended (`lastState.terminated`).
    PodStatus,
    /// Docker's record of an exited container (`State` in its config.v2.json).
    Docker,
    /// The kernel's tracepoints, at the moment of the fault or the OOM kill (`death_trace`).
    Tracepoint,
}

/// One failure as a source told it, before correlation.
#[derive(Debug, Clone, PartialEq)]
pub struct Detected {
    /// Whose failure it is, as far as the source says (nothing known: a host process).
    pub who: ContainerRef,
    pub kind: FindingKind,
    pub at: SystemTime,
    pub source: FailureSource,
    /// What of the line says it ([`super::evidence`]): redacted, written out, at most
    /// [`EVIDENCE_MAX`] bytes.
    pub evidence: String,
    /// The host PID and command of a crashing process (kernel).
    pub pid: Option<i32>,
    pub comm: Option<String>,
    /// The library it crashed in (kernel).
    pub library: Option<String>,
    /// The GPUs NCCL names (its CUDA device numbers, in the process).
    pub nccl_gpus: Option<(u32, u32)>,
    /// What the memory was when the kernel killed it (an OOM kill).
    pub memory: Option<MemorySplit>,
    /// How the container ended, as its runtime recorded it (Pod status, Docker).
    pub exit: Option<Exit>,
    /// The killed process's PID in its container's PID namespace, where it could be read
    /// (kernel OOM kills: `NSpid` while the process or its zombie lasts).
    pub pid_in_container: Option<i32>,
    /// Not a failure alone: PyTorch's word that DataLoader workers (these PIDs, in the
    /// container's namespace) were killed, tied to the OOM kill it tells (`failures::same`).
    pub worker_pids: Vec<i32>,
    /// The log row that matched (`failures::signatures`), for texts whose fix is the
    /// program's own.
    pub signature: Option<&'static str>,
    /// The facts the fact tier named it from (`failures::facts`): a line no row matched. None
    /// for a row's match and every other source.
    pub named_from: Option<NamedFrom>,
    /// A line that names a fault but not its cause (a shell's `Bus error (core dumped)`):
    /// told only when the container's /dev/shm was full then (`failures::correlate`).
    pub judged: bool,
    /// The PID belongs to a later process now (a kernel record read long after): nothing read
    /// through it, a scan's reading or NVML's lists, is the crasher's.
    pub pid_taken: bool,
    /// The crashing process's start (ticks since boot) where it was still readable when its
    /// line was read: NVML's history of the PID is its only with the same start.
    pub pid_start: Option<u64>,
    /// The container's /dev/shm read the moment the kernel told its death (a tracepoint):
    /// judged by instead of the last scan's reading.
    pub at_death: Option<Box<super::ShmReading>>,
    /// Known to have happened while the agent was down, though `at` is later (an OOM kill the
    /// first scan after a restart counted: when it happened is not known).
    pub found_late: bool,
    /// What a hang's line said (`gpu_collective_timeout`).
    pub hang: Option<HangFacts>,
    /// serve's number of the account (`failures::pipeline`), 0 unnumbered: while it is
    /// pending, the checkpoint stays before where its source said it.
    pub read: u64,
}

/// Evidence as it is kept: secrets redacted, control and format characters written out, cut.
fn kept(text: &str) -> String {
    super::cut(&printable(&redact(text.trim())), EVIDENCE_MAX)
}

impl Detected {
    /// A failure whose words were matched at `span` of `line`: the evidence is that part with
    /// its bounded context ([`super::evidence::around`]), not the whole line. Every tier that
    /// knows where its words are makes its failure here.
    pub fn matched(
        who: ContainerRef,
        kind: FindingKind,
        at: SystemTime,
        source: FailureSource,
        line: &str,
        span: std::ops::Range<usize>,
    ) -> Detected {
        let mut d = Detected::new(who, kind, at, source, "");
        d.evidence = kept(&around(line, span));
        d
    }

    /// A failure with only what every source knows; the rest is set by the source that knows it.
    pub fn new(
        who: ContainerRef,
        kind: FindingKind,
        at: SystemTime,
        source: FailureSource,
        evidence: &str,
    ) -> Detected {
        Detected {
            who,
            kind,
            at,
            source,
            evidence: kept(evidence),
            pid: None,
            comm: None,
            library: None,
            nccl_gpus: None,
            memory: None,
            exit: None,
            pid_in_container: None,
            worker_pids: Vec::new(),
            signature: None,
            named_from: None,
            judged: false,
            pid_taken: false,
            pid_start: None,
            at_death: None,
            found_late: false,
            hang: None,
            read: 0,
        }
    }
}

/// How a container ended, as kubelet (`state`/`lastState.terminated`) or Docker (`State`)
/// recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The exit status (128 + N for a death by signal N where a shell or the runtime says so).
    pub code: Option<i32>,
    /// The signal, where the runtime reports it apart.
    pub signal: Option<i32>,
    /// The runtime's reason (`OOMKilled`, `Error`), when it gave one.
    pub reason: Option<String>,
}

/// SIGBUS on Linux.
pub const SIGBUS: i32 = 7;

/// The signals the death trace places at their moment (x86-64 and arm64 numbers): SIGABRT,
/// SIGBUS, SIGKILL, SIGSEGV.
pub const FATAL_SIGNALS: [i32; 4] = [6, SIGBUS, 9, 11];

impl Exit {
    /// Died of SIGBUS: exit status 135 (128 + 7) or signal 7.
    pub fn bus_error(&self) -> bool {
        self.signal == Some(SIGBUS) || self.code == Some(128 + SIGBUS)
    }

    /// The runtime says the kernel OOM-killed it (kubelet's and Docker's `OOMKilled`).
    pub fn oom_killed(&self) -> bool {
        self.reason.as_deref() == Some("OOMKilled")
    }

    /// The death of memory this end is, before any reading judges it: `OOMKilled` an OOM kill,
    /// SIGBUS a bus error; any other end (exit 137 alone is a SIGKILL from anyone) none.
    pub fn death(&self) -> Option<FindingKind> {
        if self.oom_killed() {
            Some(FindingKind::WorkloadOomKilled)
        } else if self.bus_error() {
            Some(FindingKind::WorkloadBusError)
        } else {
            None
        }
    }

    /// `exit status 135 (SIGBUS)`, `OOMKilled, exit status 137`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = self.reason.as_deref().filter(|r| !r.is_empty()) {
            parts.push(r.to_string());
        }
        match (self.code, self.signal) {
            (Some(c), _) if c > 128 && c - 128 == SIGBUS => {
                parts.push(format!("exit status {c} (SIGBUS)"))
            }
            (Some(c), _) => parts.push(format!("exit status {c}")),
            (None, Some(SIGBUS)) => parts.push("signal 7 (SIGBUS)".to_string()),
            (None, Some(s)) => parts.push(format!("signal {s}")),
            (None, None) => {}
        }
        parts.join(", ")
    }
}

/// Where a [`MemorySplit`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// The kernel's OOM report: the numbers at the moment of the kill.
    KernelLog,
    /// The memory cgroup's OOM kill counter, its memory.stat read just after the kill.
    MemoryCgroup,
    /// A Pod status saying how the container ended; the memory as the last scan read it.
    PodStatus,
    /// Docker's record of the container; the memory as it was configured.
    Docker,
    /// The memory cgroup read the moment a tracepoint told the death (`death_trace`).
    Tracepoint,
}

/// What a memory cgroup held when it ran out (`failures[].memory`): its limit and usage, and
/// how much of it was shared memory (/dev/shm's tmpfs pages) and the workload's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySplit {
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub shm_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub source: MemorySource,
}

/// The container's /dev/shm at the last scan before the failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmThen {
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    /// The highest usage seen in the scan interval before the failure.
    pub peak_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// On the container runtime's default 64 MiB tmpfs.
    pub runtime_default: bool,
    pub host_ipc: bool,
}

/// A GPU pair the Pod's GPUs make, as the last scan judged it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairThen {
    pub gpu: u32,
    pub peer_gpu: u32,
    pub status: PairStatus,
    pub reasons: Vec<String>,
    /// Since when it has failed (RFC 3339), as the pair judge counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// Where a failure's GPUs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpusFrom {
    /// NVML listed the process itself on them.
    Process,
    /// NVML listed other processes of its container on them.
    Container,
    /// The kubelet's pod-resources: the GPUs its Pod holds.
    PodResources,
}

/// `check --json`'s `failures[]` entry (docs/CONTRACT.md): identity as in `shm`, what was said,
/// and what was known then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Its container as far as it is known (`namespace`, `pod`, `pod_uid`, `container`,
    /// `container_id`: the entry's own fields).
    #[serde(flatten)]
    pub placed: ContainerRef,
    pub image: Option<String>,
    pub kind: FindingKind,
    /// Written out as RFC 3339 UTC.
    pub at: Stamp,
    pub source: FailureSource,
    pub evidence: String,
    pub pid: Option<i32>,
    pub shm: Option<ShmThen>,
    /// The GPUs the process (or its container) used, NVML indices: from NVML's process lists,
    /// else the kubelet's pod-resources (`gpus_from`).
    pub gpus: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_from: Option<GpusFrom>,
    pub gpu_pairs: Vec<PairThen>,
    /// What each link of those GPUs did between the job's start (or the agent's first sight
    /// of it) and its death; null without a baseline (docs/CONTRACT.md, "A job's links").
    #[serde(default)]
    pub gpu_links: Option<GpuLinks>,
    /// Deaths of memory only (OOM kills, bus errors); absent for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySplit>,
    /// The killed process's PID in its container's PID namespace, where it was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_in_container: Option<i32>,
    /// The workload's own word of this death (PyTorch's DataLoader line), tied to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub told_by_workload: Option<String>,
    /// Set on PyTorch's worker-death line before it is tied: the worker PIDs it names. Such a
    /// line is never told alone (`failures::same`).
    #[serde(skip)]
    pub worker_pids: Vec<i32>,
    pub message: String,
    /// The facts the failure was named from when no exact text matched its line, as one line:
    /// the fact tier's (`errno 28 (ENOSPC) on /dev/shm/torch_123 in Python's OSError`) or a
    /// hang's (its operation, sequence number, rank, what it ran for); null for a row's match
    /// and every other source. Absent in a store written before it: read as null.
    #[serde(default)]
    pub named_from: Option<String>,
    /// A hung collective and what the links of its GPUs did over its window
    /// (`gpu_collective_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang: Option<Hang>,
    /// Happened while the agent was down, told when it started again from its checkpoint
    /// (always false in `check`, which reads everything back).
    pub found_late: bool,
}

impl Failure {
    /// PyTorch's word of a worker's death, not a failure of its own.
    pub fn is_workload_word(&self) -> bool {
        !self.worker_pids.is_empty()
    }
}

/// The share of a memory cgroup's usage that /dev/shm pages must reach for its OOM kill to be
/// a /dev/shm failure (`shm_oom_killed`): most of it.
pub const SHM_OOM_SHARE: f64 = 0.5;
/// How full /dev/shm must have been (its peak over its effective limit) for a SIGBUS death to
/// be a /dev/shm failure (`shm_bus_error`): full or nearly.
pub const BUS_ERROR_SHM_RATIO: f64 = 0.9;

/// How deaths of memory are judged: `--oom-shm-share` and `--bus-error-shm-ratio`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeathRules {
    /// [`SHM_OOM_SHARE`] unless set.
    pub oom_shm_share: f64,
    /// [`BUS_ERROR_SHM_RATIO`] unless set.
    pub bus_error_shm_ratio: f64,
}

impl Default for DeathRules {
    fn default() -> Self {
        DeathRules {
            oom_shm_share: SHM_OOM_SHARE,
            bus_error_shm_ratio: BUS_ERROR_SHM_RATIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_in_evidence_are_written_out() {
        let d = Detected::new(
            ContainerRef::default(),
            crate::model::FindingKind::ShmAllocationFailed,
            std::time::SystemTime::UNIX_EPOCH,
            FailureSource::Log,
            "No space left on device: '/dev/shm/x'\u{1b}[2J\u{1b}[H all good\r\u{9b}",
        );
        assert_eq!(
            d.evidence,
            "No space left on device: '/dev/shm/x'\\x1b[2J\\x1b[H all good\\x0d\\x9b"
        );
    }
}

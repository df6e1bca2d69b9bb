//! Pure: what a workload needs, what its container has, the verdict, and the fix for where it
//! runs. No I/O here: `super` (mod.rs) gathers the observations, this module decides.

use serde::Serialize;

use crate::cgroup::CgroupVersion;
use crate::gpu::{PairStatus, PairVerdict};
use crate::units::{docker_size, human_bytes, k8s_quantity, GIB, MIB};

/// Below this much effective /dev/shm a container that sees GPUs gets a warning when no need
/// was given: PyTorch DataLoader workers hand every batch over through /dev/shm and NCCL puts
/// its intra-node buffers there; the runtimes' default 64 MiB runs out at the first real batch.
pub const DEFAULT_GPU_SHM_BYTES: u64 = GIB;

/// One segment of NCCL's SHM transport, which NCCL creates per receiving connection, i.e. per
/// ordered pair of local ranks (one rank per GPU) and channel, when two GPUs talk through host
/// memory (no P2P between them, P2P disabled, or the ranks in different containers). It holds
/// the buffers of NCCL's three protocols and a header:
///
/// - Simple: `NCCL_BUFFSIZE`, default 4 MiB = 4,194,304;
/// - LL128: 120 elements x 640 threads x 8 steps x 8 bytes = 4,915,200;
/// - LL: 8 lines x 512 threads x 8 steps x 16 bytes = 524,288;
/// - the connection header, one 4 KiB page.
///
/// 9,637,888 bytes: the very size NCCL prints in `Error while creating shared memory segment
/// /dev/shm/nccl-XXXXXX (size 9637888)`. The sizing helper counts one segment per ordered GPU
/// pair (one channel); NCCL opens more channels on large boards, so this is a floor, not a
/// ceiling.
pub const NCCL_SHM_SEGMENT_BYTES: u64 = 4_194_304 + 4_915_200 + 524_288 + 4_096;

/// PyTorch's DataLoader default `prefetch_factor`: batches in flight per worker.
pub const DEFAULT_PREFETCH_FACTOR: u64 = 2;

/// What the workload says it needs (the command line, parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeedSpec {
    /// `--min-shm SIZE`.
    MinShm(u64),
    /// `--dataloader-workers N --batch-bytes B [--prefetch-factor P]`.
    Sizing {
        workers: u64,
        prefetch_factor: u64,
        batch_bytes: u64,
    },
    /// Neither: only the GPU default warns.
    Unspecified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NeedSource {
    MinShm,
    Sizing,
    /// No need given, GPUs visible: [`DEFAULT_GPU_SHM_BYTES`], a warning only.
    GpuDefault,
}

/// The /dev/shm the workload needs, with how it was reckoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Need {
    pub source: NeedSource,
    pub bytes: u64,
    /// Falling short fails (exit 1); the GPU default only warns.
    pub enforced: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataloader_workers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_bytes: Option<u64>,
    /// workers x prefetch factor x batch bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataloader_bytes: Option<u64>,
    /// [`NCCL_SHM_SEGMENT_BYTES`] x GPUs x (GPUs - 1), when more than one GPU is visible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_bytes: Option<u64>,
}

/// NCCL's SHM segments for `gpus` local ranks: one per ordered pair (see the constant).
pub fn nccl_bytes(gpus: usize) -> u64 {
    let g = gpus as u64;
    if g < 2 {
        0
    } else {
        NCCL_SHM_SEGMENT_BYTES.saturating_mul(g * (g - 1))
    }
}

/// The need for `spec` with `gpus` GPUs visible; `None` when nothing is asked and no GPU seen.
pub fn need(spec: NeedSpec, gpus: usize) -> Option<Need> {
    let base = |source, bytes, enforced| Need {
        source,
        bytes,
        enforced,
        dataloader_workers: None,
        prefetch_factor: None,
        batch_bytes: None,
        dataloader_bytes: None,
        nccl_bytes: None,
    };
    match spec {
        NeedSpec::MinShm(bytes) => Some(base(NeedSource::MinShm, bytes, true)),
        NeedSpec::Sizing {
            workers,
            prefetch_factor,
            batch_bytes,
        } => {
            let loader = workers
                .saturating_mul(prefetch_factor)
                .saturating_mul(batch_bytes);
            let nccl = (gpus > 1).then(|| nccl_bytes(gpus));
            Some(Need {
                dataloader_workers: Some(workers),
                prefetch_factor: Some(prefetch_factor),
                batch_bytes: Some(batch_bytes),
                dataloader_bytes: Some(loader),
                nccl_bytes: nccl,
                ..base(
                    NeedSource::Sizing,
                    loader.saturating_add(nccl.unwrap_or(0)),
                    true,
                )
            })
        }
        NeedSpec::Unspecified if gpus > 0 => {
            Some(base(NeedSource::GpuDefault, DEFAULT_GPU_SHM_BYTES, false))
        }
        NeedSpec::Unspecified => None,
    }
}

/// Which GPUs the workload will use, as its environment says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelector {
    /// Every GPU NVML lists.
    All,
    /// None at all (`CUDA_VISIBLE_DEVICES=""`, `NVIDIA_VISIBLE_DEVICES=void|none`).
    NoGpus,
    /// Indices or UUIDs (or UUID prefixes, as CUDA takes them), in order.
    List(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectorSource {
    CudaVisibleDevices,
    NvidiaVisibleDevices,
    Nvml,
}

/// `CUDA_VISIBLE_DEVICES` first (what CUDA itself obeys), else `NVIDIA_VISIBLE_DEVICES` (what
/// the NVIDIA container runtime injected), else all of NVML's.
pub fn selector(cuda: Option<&str>, nvidia: Option<&str>) -> (GpuSelector, SelectorSource) {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    };
    if let Some(cuda) = cuda {
        let entries = list(cuda);
        let sel = if entries.is_empty() {
            GpuSelector::NoGpus
        } else {
            GpuSelector::List(entries)
        };
        return (sel, SelectorSource::CudaVisibleDevices);
    }
    if let Some(nvidia) = nvidia {
        let sel = match nvidia.trim() {
            "all" => GpuSelector::All,
            "" | "void" | "none" => GpuSelector::NoGpus,
            other => GpuSelector::List(list(other)),
        };
        return (sel, SelectorSource::NvidiaVisibleDevices);
    }
    (GpuSelector::All, SelectorSource::Nvml)
}

/// One GPU as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// A GPU the workload sees: NVML's index and the ordinal CUDA gives it in the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisibleGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub cuda_ordinal: u32,
}

/// The GPUs `selector` picks out of NVML's, and the entries that name none of them.
///
/// Indices are NVML's, which CUDA's match when `CUDA_DEVICE_ORDER=PCI_BUS_ID` (UUIDs always
/// match). Like CUDA, `CUDA_VISIBLE_DEVICES` stops at the first entry that names no GPU. An
/// `NVIDIA_VISIBLE_DEVICES` list as long as NVML's list is taken as already applied by the
/// container runtime (inside such a container NVML numbers the injected GPUs from 0).
pub fn visible_gpus(
    selector: &GpuSelector,
    source: SelectorSource,
    nvml: &[NvmlGpu],
) -> (Vec<VisibleGpu>, Vec<String>) {
    let pick = |gpus: Vec<&NvmlGpu>| -> Vec<VisibleGpu> {
        gpus.into_iter()
            .enumerate()
            .map(|(i, g)| VisibleGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                cuda_ordinal: i as u32,
            })
            .collect()
    };
    let entries = match selector {
        GpuSelector::All => return (pick(nvml.iter().collect()), Vec::new()),
        GpuSelector::NoGpus => return (Vec::new(), Vec::new()),
        GpuSelector::List(entries) => entries,
    };
    let find = |entry: &str| -> Option<&NvmlGpu> {
        if let Ok(i) = entry.parse::<u32>() {
            return nvml.iter().find(|g| g.index == i);
        }
        let want = entry.to_ascii_lowercase();
        let mut hits = nvml
            .iter()
            .filter(|g| g.uuid.to_ascii_lowercase().starts_with(&want));
        match (hits.next(), hits.next()) {
            (Some(g), None) => Some(g),
            _ => None,
        }
    };
    let mut picked = Vec::new();
    let mut unmatched = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        match find(entry) {
            Some(g) if !picked.iter().any(|p: &&NvmlGpu| p.index == g.index) => picked.push(g),
            Some(_) => {}
            None => {
                if source == SelectorSource::NvidiaVisibleDevices
                    && entries.len() == nvml.len()
                    && entries.iter().all(|e| e.parse::<u32>().is_ok())
                {
                    return (pick(nvml.iter().collect()), Vec::new());
                }
                unmatched.push(entry.clone());
                if source == SelectorSource::CudaVisibleDevices {
                    unmatched.extend(entries[i + 1..].iter().cloned());
                    break;
                }
            }
        }
    }
    (pick(picked), unmatched)
}

/// The pairs among `visible` (both ends visible).
pub fn visible_pairs(all: &[PairVerdict], visible: &[VisibleGpu]) -> Vec<PairVerdict> {
    let seen = |i: u32| visible.iter().any(|g| g.index == i);
    all.iter()
        .filter(|p| seen(p.gpu) && seen(p.peer_gpu))
        .cloned()
        .collect()
}

/// GPUs to avoid so that no pair among the rest fails: repeatedly drop the GPU in the most
/// failing pairs (a broken GPU fails with every peer, so it goes first). Sorted.
pub fn gpus_to_avoid(all: &[PairVerdict]) -> Vec<u32> {
    let mut failing: Vec<(u32, u32)> = all
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .map(|p| (p.gpu, p.peer_gpu))
        .collect();
    let mut avoid = Vec::new();
    while !failing.is_empty() {
        let mut counts = std::collections::BTreeMap::<u32, usize>::new();
        for &(a, b) in &failing {
            *counts.entry(a).or_default() += 1;
            *counts.entry(b).or_default() += 1;
        }
        // Most failing pairs first; on a tie the higher index (the later GPU in a pair).
        let (&worst, _) = counts
            .iter()
            .max_by_key(|&(&gpu, &n)| (n, gpu))
            .expect("failing pairs name GPUs");
        avoid.push(worst);
        failing.retain(|&(a, b)| a != worst && b != worst);
    }
    avoid.sort_unstable();
    avoid
}

/// What the container's /dev/shm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmState {
    /// A file system mounted at /dev/shm.
    Mounted,
    /// A plain directory of the container's root file system: shared memory there lives on
    /// whatever that is (often disk-backed overlay).
    NotMounted,
    /// No /dev/shm at all: `shm_open` fails.
    Absent,
    /// It could not be measured (the message says why).
    Unreadable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShmObs {
    pub path: String,
    pub state: ShmState,
    pub fs_type: Option<String>,
    /// None for a tmpfs without a size limit.
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    /// Free in the file system itself (size - used).
    pub free_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MemObs {
    /// This process's memory cgroup as /proc/self/cgroup names it.
    pub cgroup: Option<String>,
    /// "v1" or "v2".
    pub version: Option<CgroupVersion>,
    /// Whether its files could be read (a cgroup file system mounted in the container).
    pub visible: bool,
    /// Lowest limit of the cgroup and its ancestors visible here (v1: also the kernel's
    /// hierarchical_memory_limit, which covers ancestors mounted out of sight).
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// min over limited levels of limit - usage.
    pub headroom_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The kernel's initial IPC namespace's inode number (`PROC_IPC_INIT_INO`, 0xEFFFFFFF), the
/// same on every kernel: a process whose `/proc/self/ns/ipc` is `ipc:[4026531839]` shares the
/// host's IPC namespace, and so the host's /dev/shm.
pub const INIT_IPC_NS_INODE: u64 = 0xEFFF_FFFF;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpcObs {
    /// This process's IPC namespace inode.
    pub namespace: Option<u64>,
    /// Whether it is the host's; null when that cannot be known.
    pub host: Option<bool>,
    /// How that was decided.
    pub basis: String,
}

/// Host IPC from our IPC namespace inode, and the host's when a hint gives it. /proc/1 is no
/// help inside a container (its PID 1 is the container's own); the initial namespace's fixed
/// inode is, except where the "host" is itself a container (kind, nested runtimes): pass the
/// node's inode then (`--host-ipc-ns`).
pub fn ipc_verdict(own: Option<u64>, hint: Option<u64>) -> IpcObs {
    let (host, basis) = match (own, hint) {
        (None, _) => (None, "/proc/self/ns/ipc is unreadable".to_string()),
        (Some(own), Some(hint)) => (
            Some(own == hint),
            format!("compared with the host's IPC namespace given by --host-ipc-ns ({hint})"),
        ),
        (Some(own), None) if own == INIT_IPC_NS_INODE => (
            Some(true),
            "the kernel's initial IPC namespace (inode 4026531839)".to_string(),
        ),
        (Some(_), None) => (
            Some(false),
            "not the kernel's initial IPC namespace (inode 4026531839); on a node that is itself \
             a container, give the node's with --host-ipc-ns"
                .to_string(),
        ),
    };
    IpcObs {
        namespace: own,
        host,
        basis,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum NvmlState {
    Loaded,
    /// `--no-gpu`.
    Disabled,
    /// It did not load: why.
    Unavailable(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuObs {
    pub nvml: NvmlState,
    /// Whether the library was named with `--nvml-lib` (then failing to load it is an error).
    #[serde(skip)]
    pub explicit_lib: bool,
    /// Signs of an NVIDIA GPU even without NVML (a /dev/nvidia0, a runtime's device list).
    #[serde(skip)]
    pub evidence: Option<String>,
    pub selected_by: SelectorSource,
    pub visible: Vec<VisibleGpu>,
    /// Entries of the selecting variable that name no GPU NVML lists.
    pub unmatched: Vec<String>,
    /// Pairs among the visible GPUs, judged by the same rules as `check`.
    pub pairs: Vec<PairVerdict>,
    /// GPUs of this machine that every healthy choice leaves out (from all of NVML's pairs).
    pub avoid: Vec<u32>,
    /// NVML's GPUs not to avoid, for the fix.
    #[serde(skip)]
    pub healthy: Vec<u32>,
}

/// Where the container runs, for the fix (CONTRACT.md: Kubernetes when
/// `KUBERNETES_SERVICE_HOST` is set, else Docker/other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunsIn {
    Kubernetes,
    Docker,
}

impl RunsIn {
    pub fn detect(kubernetes_service_host: Option<&str>) -> RunsIn {
        match kubernetes_service_host {
            Some(h) if !h.trim().is_empty() => RunsIn::Kubernetes,
            _ => RunsIn::Docker,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warn,
    /// It cannot tell.
    Unknown,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub severity: Severity,
    pub kind: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fit,
    NotFit,
    Unknown,
}

impl Verdict {
    /// 0 fit, 1 not fit, 2 it cannot tell.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Fit => 0,
            Verdict::NotFit => 1,
            Verdict::Unknown => 2,
        }
    }
}

/// Everything `preflight` prints: the `--json` document (README: schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub verdict: Verdict,
    pub exit_code: u8,
    pub runs_in: RunsIn,
    pub shm: ShmObs,
    /// min(tmpfs free, memory headroom): what can still be written before ENOSPC or the OOM
    /// killer.
    pub available_bytes: Option<u64>,
    pub memory: MemObs,
    pub ipc: IpcObs,
    pub gpus: GpuObs,
    pub need: Option<Need>,
    pub problems: Vec<Problem>,
    /// The exact change for where it runs; null when there is nothing to change.
    pub fix: Option<String>,
}

/// Effective available bytes: min(tmpfs free, memory headroom), either alone when the other is
/// unknown (an unlimited tmpfs, no memory limit).
pub fn effective_available(shm: &ShmObs, mem: &MemObs) -> Option<u64> {
    if shm.state != ShmState::Mounted && shm.state != ShmState::NotMounted {
        return None;
    }
    match (shm.free_bytes, mem.headroom_bytes) {
        (Some(free), Some(headroom)) => Some(free.min(headroom)),
        (free, headroom) => free.or(headroom),
    }
}

/// Judges the observations against the need and writes the fix.
pub fn judge(
    runs_in: RunsIn,
    shm: ShmObs,
    memory: MemObs,
    ipc: IpcObs,
    gpus: GpuObs,
    spec: NeedSpec,
) -> Report {
    let need = need(spec, gpus.visible.len());
    let available = effective_available(&shm, &memory);
    let mut problems = Vec::new();
    let mut p = |severity, kind, message: String| {
        problems.push(Problem {
            severity,
            kind,
            message,
        })
    };
    let b = human_bytes;

    // /dev/shm itself.
    let mut shm_short = false; // the tmpfs is too small for the need
    let mut mem_short = false; // the memory limit leaves too little room for the need
    match shm.state {
        ShmState::Absent => {
            shm_short = true;
            p(
                Severity::Fail,
                "shm_absent",
                format!(
                    "nothing at {}: shm_open fails, and with it DataLoader workers and NCCL",
                    shm.path
                ),
            )
        }
        ShmState::Unreadable => p(
            Severity::Unknown,
            "shm_unreadable",
            format!(
                "cannot measure {}: {}",
                shm.path,
                shm.error.as_deref().unwrap_or("unknown error")
            ),
        ),
        ShmState::NotMounted => p(
            Severity::Warn,
            "shm_not_mounted",
            format!(
                "{} is a plain directory of the container's root file system, not a tmpfs: shared \
                 memory there is written to {}",
                shm.path,
                shm.fs_type.as_deref().unwrap_or("that file system")
            ),
        ),
        ShmState::Mounted => {
            if shm.fs_type.as_deref().is_some_and(|t| t != "tmpfs") {
                p(
                    Severity::Warn,
                    "shm_not_tmpfs",
                    format!(
                        "{} is {}, not tmpfs",
                        shm.path,
                        shm.fs_type.as_deref().unwrap_or("?")
                    ),
                );
            }
        }
    }

    if let Some(need) = &need {
        let usable = matches!(shm.state, ShmState::Mounted | ShmState::NotMounted);
        if usable {
            let free_short = shm.free_bytes.is_some_and(|f| f < need.bytes);
            let headroom_short = memory.headroom_bytes.is_some_and(|h| h < need.bytes);
            let severity = if need.enforced {
                Severity::Fail
            } else {
                Severity::Warn
            };
            let why = need_words(need);
            if free_short {
                shm_short = true;
                p(
                    severity,
                    if need.enforced {
                        "shm_too_small"
                    } else {
                        "shm_small_for_gpus"
                    },
                    format!(
                        "{} has {} free ({} size, {} used); {why} needs {}",
                        shm.path,
                        b(shm.free_bytes.unwrap_or(0)),
                        shm.size_bytes.map_or("no".into(), b),
                        b(shm.used_bytes.unwrap_or(0)),
                        b(need.bytes),
                    ),
                );
            }
            if headroom_short {
                mem_short = true;
                p(
                    severity,
                    "memory_too_small",
                    format!(
                        "the memory cgroup has {} of headroom (limit {}, {} in use) and tmpfs pages \
                         count against it: {why} needs {} in {}, so the OOM killer (or a bus error) \
                         comes first",
                        b(memory.headroom_bytes.unwrap_or(0)),
                        memory.limit_bytes.map_or("none".into(), b),
                        memory.usage_bytes.map_or("?".into(), b),
                        b(need.bytes),
                        shm.path,
                    ),
                );
            }
            if available.is_none() && need.enforced {
                p(
                    Severity::Unknown,
                    "shm_unbounded_unknown",
                    format!(
                        "{} has no size limit and no memory limit is visible: cannot tell whether {} fit",
                        shm.path,
                        b(need.bytes)
                    ),
                );
            }
            if need.enforced && !memory.visible {
                p(
                    Severity::Warn,
                    "memory_unknown",
                    format!(
                        "the memory cgroup is not visible ({}): judged by the tmpfs alone",
                        memory
                            .note
                            .as_deref()
                            .unwrap_or("no cgroup file system here")
                    ),
                );
            }
        }
    }

    // A tmpfs larger than the memory limit: its size is an illusion.
    if let (Some(size), Some(limit)) = (shm.size_bytes, memory.limit_bytes) {
        if shm.state == ShmState::Mounted && limit < size && !mem_short {
            p(
                Severity::Warn,
                "memory_below_shm_size",
                format!(
                    "{} is {} but the memory limit is {}: tmpfs pages count against the limit, so \
                     at most {} of it can ever be filled",
                    shm.path,
                    b(size),
                    b(limit),
                    b(memory.headroom_bytes.unwrap_or(limit))
                ),
            );
        }
    }

    // GPUs.
    match &gpus.nvml {
        NvmlState::Unavailable(reason) if gpus.explicit_lib => p(
            Severity::Unknown,
            "nvml_unavailable",
            format!("{reason}: cannot judge the GPUs"),
        ),
        NvmlState::Unavailable(reason) => {
            if let Some(evidence) = &gpus.evidence {
                p(
                    Severity::Warn,
                    "gpu_health_unknown",
                    format!("{evidence} but NVML does not load ({reason}): GPU pairs not checked"),
                );
            }
        }
        _ => {}
    }
    if !gpus.unmatched.is_empty() {
        let var = match gpus.selected_by {
            SelectorSource::CudaVisibleDevices => "CUDA_VISIBLE_DEVICES",
            _ => "NVIDIA_VISIBLE_DEVICES",
        };
        p(
            Severity::Warn,
            "gpu_not_found",
            format!(
                "{var} names {} that NVML does not list{}",
                gpus.unmatched.join(","),
                if gpus.selected_by == SelectorSource::CudaVisibleDevices {
                    " (CUDA ignores it and every entry after it)"
                } else {
                    ""
                }
            ),
        );
    }
    let ordinal = |i: u32| {
        gpus.visible
            .iter()
            .find(|g| g.index == i)
            .map_or(0, |g| g.cuda_ordinal)
    };
    for pair in gpus.pairs.iter().filter(|p| p.status != PairStatus::Ok) {
        let status = match pair.status {
            PairStatus::Down => "down",
            _ => "degraded",
        };
        let reasons = if pair.reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", pair.reasons.join("; "))
        };
        p(
            Severity::Fail,
            "gpu_pair",
            format!(
                "GPU {} <-> GPU {} (cuda:{} <-> cuda:{} in this process) is {status}{reasons}",
                pair.gpu,
                pair.peer_gpu,
                ordinal(pair.gpu),
                ordinal(pair.peer_gpu),
            ),
        );
    }

    let verdict = match problems.iter().map(|p| p.severity).max() {
        Some(Severity::Fail) => Verdict::NotFit,
        Some(Severity::Unknown) => Verdict::Unknown,
        _ => Verdict::Fit,
    };
    let fix = fix_text(
        runs_in,
        &shm,
        &memory,
        &ipc,
        &gpus,
        need.as_ref(),
        shm_short,
        mem_short,
        &problems,
    );
    Report {
        verdict,
        exit_code: verdict.exit_code(),
        runs_in,
        shm,
        available_bytes: available,
        memory,
        ipc,
        gpus,
        need,
        problems,
        fix,
    }
}

fn need_words(need: &Need) -> String {
    match need.source {
        NeedSource::MinShm => "--min-shm".to_string(),
        NeedSource::GpuDefault => format!(
            "a GPU workload (no need given; the default is {})",
            human_bytes(DEFAULT_GPU_SHM_BYTES)
        ),
        NeedSource::Sizing => {
            let mut s = format!(
                "{} DataLoader workers x prefetch {} x {} batches = {}",
                need.dataloader_workers.unwrap_or(0),
                need.prefetch_factor.unwrap_or(0),
                human_bytes(need.batch_bytes.unwrap_or(0)),
                human_bytes(need.dataloader_bytes.unwrap_or(0)),
            );
            if let Some(nccl) = need.nccl_bytes {
                s.push_str(&format!(" + NCCL's SHM segments {}", human_bytes(nccl)));
            }
            s
        }
    }
}

/// The /dev/shm size to ask for: the need, rounded up to whole MiB.
fn target_size(need: Option<&Need>) -> u64 {
    need.map_or(DEFAULT_GPU_SHM_BYTES, |n| n.bytes)
        .div_ceil(MIB)
        .max(1)
        * MIB
}

#[allow(clippy::too_many_arguments)]
fn fix_text(
    runs_in: RunsIn,
    shm: &ShmObs,
    memory: &MemObs,
    ipc: &IpcObs,
    gpus: &GpuObs,
    need: Option<&Need>,
    shm_short: bool,
    mem_short: bool,
    problems: &[Problem],
) -> Option<String> {
    let mut out = String::new();
    let size = target_size(need);
    // The memory limit that leaves room: today's limit plus the /dev/shm the workload will fill
    // (tmpfs pages are charged to it on top of the workload's own memory).
    let memory_to = memory.limit_bytes.map(|l| l.saturating_add(size));
    let memory_matters = mem_short || (shm_short && memory.limit_bytes.is_some());
    if shm_short || mem_short {
        if ipc.host == Some(true) && shm_short {
            out.push_str(&format!(
                "This container shares the host's IPC namespace and so the host's /dev/shm: grow \
                 that one on the node (mount -o remount,size={} /dev/shm), or stop sharing it and \
                 give the container its own as below.\n",
                docker_size(shm.used_bytes.unwrap_or(0).saturating_add(size))
            ));
        }
        match runs_in {
            RunsIn::Kubernetes => {
                out.push_str(
                    "In the Pod spec, mount a memory-backed emptyDir at /dev/shm sized for the need, \
                     and give the container a memory limit with room for it:\n\n",
                );
                out.push_str("spec:\n");
                if shm_short {
                    out.push_str(&format!(
                        "  volumes:\n    - name: dshm\n      emptyDir:\n        medium: Memory\n        \
                         sizeLimit: {}\n",
                        k8s_quantity(size)
                    ));
                }
                out.push_str("  containers:\n    - name: <this container>\n");
                if shm_short {
                    out.push_str("      volumeMounts:\n        - name: dshm\n          mountPath: /dev/shm\n");
                }
                if memory_matters {
                    if let (Some(limit), Some(to)) = (memory.limit_bytes, memory_to) {
                        out.push_str(&format!(
                            "      resources:\n        limits:\n          memory: {}   # today {}, plus the {} of /dev/shm it must hold\n",
                            k8s_quantity(to),
                            k8s_quantity(limit),
                            k8s_quantity(size)
                        ));
                    }
                } else if shm_short && memory.limit_bytes.is_none() {
                    out.push_str(&format!(
                        "      # no memory limit seen; if you set one, add {} to it: tmpfs pages count against it\n",
                        k8s_quantity(size)
                    ));
                }
                if shm_short {
                    out.push_str(
                        "\n(An initContainer sees the emptyDir too: give it the same memory limit \
                         as the container it checks for.)\n",
                    );
                }
            }
            RunsIn::Docker => {
                let mut args = Vec::new();
                if shm_short {
                    args.push(format!("--shm-size={}", docker_size(size)));
                }
                if memory_matters {
                    if let Some(to) = memory_to {
                        args.push(format!("--memory={}", docker_size(to)));
                    }
                }
                out.push_str(&format!("docker run {} ...\n", args.join(" ")));
                if shm_short {
                    out.push_str(
                        "(or --ipc=host to use the host's /dev/shm; with docker compose: shm_size)\n",
                    );
                }
                if memory_matters && memory_to.is_some() {
                    out.push_str(&format!(
                        "tmpfs pages count against --memory: the limit needs room for the {} of /dev/shm on top of the workload's own memory\n",
                        docker_size(size)
                    ));
                }
            }
        }
    }
    let bad_pairs = problems.iter().any(|p| p.kind == "gpu_pair");
    if bad_pairs {
        if !out.is_empty() {
            out.push('\n');
        }
        let avoid = gpus
            .avoid
            .iter()
            .map(|g| format!("GPU {g}"))
            .collect::<Vec<_>>()
            .join(", ");
        let n = gpus.visible.len().max(1);
        let choice: Vec<String> = gpus.healthy.iter().take(n).map(|g| g.to_string()).collect();
        let choice = if choice.len() == n {
            Some(choice.join(","))
        } else {
            None
        };
        match runs_in {
            RunsIn::Kubernetes => {
                out.push_str(&format!(
                    "Avoid {avoid}: the device plugin gave this Pod a GPU whose links fail. Cordon the \
                     node (kubectl cordon <node>) and delete the Pod so it is scheduled elsewhere; \
                     have the GPU reset or replaced before uncordoning (shmlink serve on the node \
                     reports it as GpuLinkDegraded/GpuLinkDown).\n"
                ));
            }
            RunsIn::Docker => {
                out.push_str(&format!("Avoid {avoid}: "));
                match &choice {
                    Some(c) => out.push_str(&format!(
                        "run on GPUs whose pairs are healthy, e.g. docker run --gpus '\"device={c}\"' ... \
                         (or CUDA_VISIBLE_DEVICES={c}).\n"
                    )),
                    None => out.push_str(
                        "too few healthy GPUs are left on this machine for this job; have the GPU reset or replaced.\n",
                    ),
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The report for a person.
pub fn render_text(r: &Report) -> String {
    let b = human_bytes;
    let mut out = String::new();
    let verdict = match r.verdict {
        Verdict::Fit => "FIT",
        Verdict::NotFit => "NOT FIT",
        Verdict::Unknown => "CANNOT TELL",
    };
    let runs_in = match r.runs_in {
        RunsIn::Kubernetes => "Kubernetes",
        RunsIn::Docker => "Docker/other",
    };
    out.push_str(&format!(
        "shmlink preflight: {verdict} (runs in {runs_in})\n"
    ));
    let shm = match r.shm.state {
        ShmState::Absent => "absent".to_string(),
        ShmState::Unreadable => "unreadable".to_string(),
        state => format!(
            "{}{} {}, {} used, {} free{}",
            r.shm.fs_type.as_deref().unwrap_or("?"),
            if state == ShmState::NotMounted {
                " (not a mount)"
            } else {
                ""
            },
            r.shm.size_bytes.map_or("unlimited".into(), b),
            r.shm.used_bytes.map_or("?".into(), b),
            r.shm.free_bytes.map_or("?".into(), b),
            r.available_bytes
                .map_or(String::new(), |a| format!("; {} available", b(a))),
        ),
    };
    out.push_str(&format!("  {:<8} {shm}\n", r.shm.path));
    let mem = if r.memory.visible {
        format!(
            "limit {}, {} in use, headroom {}{}",
            r.memory.limit_bytes.map_or("none".into(), b),
            r.memory.usage_bytes.map_or("?".into(), b),
            r.memory.headroom_bytes.map_or("unbounded".into(), b),
            r.memory
                .version
                .map_or(String::new(), |v| format!(" (cgroup {v})")),
        )
    } else {
        format!(
            "not visible{}",
            r.memory
                .note
                .as_deref()
                .map_or(String::new(), |n| format!(" ({n})"))
        )
    };
    out.push_str(&format!("  {:<8} {mem}\n", "memory"));
    let ipc = match (r.ipc.host, r.ipc.namespace) {
        (Some(true), _) => "the host's IPC namespace (and /dev/shm)".to_string(),
        (Some(false), Some(ns)) => format!("private (ipc:[{ns}])"),
        _ => "unknown".to_string(),
    };
    out.push_str(&format!("  {:<8} {ipc}\n", "ipc"));
    let gpus = match &r.gpus.nvml {
        NvmlState::Disabled => "not checked (--no-gpu)".to_string(),
        NvmlState::Unavailable(_) if r.gpus.visible.is_empty() => "none (NVML not loaded)".into(),
        _ if r.gpus.visible.is_empty() => "none visible".to_string(),
        _ => {
            let list: Vec<String> = r.gpus.visible.iter().map(|g| g.index.to_string()).collect();
            let bad = r
                .gpus
                .pairs
                .iter()
                .filter(|p| p.status != PairStatus::Ok)
                .count();
            let source = match r.gpus.selected_by {
                SelectorSource::CudaVisibleDevices => "CUDA_VISIBLE_DEVICES",
                SelectorSource::NvidiaVisibleDevices => "NVIDIA_VISIBLE_DEVICES",
                SelectorSource::Nvml => "all of NVML's",
            };
            format!(
                "{} ({source}): {} of {} pairs healthy",
                list.join(","),
                r.gpus.pairs.len() - bad,
                r.gpus.pairs.len()
            )
        }
    };
    out.push_str(&format!("  {:<8} {gpus}\n", "gpus"));
    let need = match &r.need {
        None => "none given".to_string(),
        Some(n) => format!("{} ({})", b(n.bytes), need_words(n)),
    };
    out.push_str(&format!("  {:<8} {need}\n", "need"));
    if !r.problems.is_empty() {
        out.push('\n');
        for p in &r.problems {
            let tag = match p.severity {
                Severity::Fail => "FAIL",
                Severity::Unknown => "UNKNOWN",
                Severity::Warn => "WARN",
            };
            out.push_str(&format!("{tag} {}: {}\n", p.kind, p.message));
        }
    }
    if let Some(fix) = &r.fix {
        out.push_str(&format!("\nFix ({runs_in}):\n"));
        for line in fix.lines() {
            if line.is_empty() {
                out.push('\n');
            } else {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

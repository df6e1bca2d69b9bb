//! What preflight can find wrong, as data: a problem's kind and how much it weighs.

use serde::Serialize;

/// How much a problem weighs (its JSON `severity`); the worst one decides the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    Warn,
    /// It cannot tell.
    Unknown,
    Fail,
}

/// What a problem is about; JSON and the text report name it in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// Nothing at /dev/shm.
    ShmAbsent,
    /// /dev/shm could not be measured.
    ShmUnreadable,
    /// /dev/shm is a plain directory, not a mount.
    ShmNotMounted,
    /// /dev/shm is mounted, but not a tmpfs.
    ShmNotTmpfs,
    /// Too little free in /dev/shm for the need given.
    ShmTooSmall,
    /// Too little free in /dev/shm for the GPU default (a warning).
    ShmSmallForGpus,
    /// Too little memory cgroup headroom for the need.
    MemoryTooSmall,
    /// Neither /dev/shm nor the memory cgroup has a visible bound.
    ShmUnboundedUnknown,
    /// The memory cgroup is not visible.
    MemoryUnknown,
    /// The memory limit is below the tmpfs size.
    MemoryBelowShmSize,
    /// NVML, named with --nvml-lib, did not load.
    NvmlUnavailable,
    /// Signs of a GPU, but NVML did not load.
    GpuHealthUnknown,
    /// The selecting variable names a GPU NVML does not list.
    GpuNotFound,
    /// A pair of visible GPUs is down or degraded.
    GpuPair,
    /// `--p2p`: the pair probe could not run (no libcuda, the driver did not start).
    P2pProbeUnavailable,
}

impl ProblemKind {
    /// The name as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::ShmAbsent => "shm_absent",
            ProblemKind::ShmUnreadable => "shm_unreadable",
            ProblemKind::ShmNotMounted => "shm_not_mounted",
            ProblemKind::ShmNotTmpfs => "shm_not_tmpfs",
            ProblemKind::ShmTooSmall => "shm_too_small",
            ProblemKind::ShmSmallForGpus => "shm_small_for_gpus",
            ProblemKind::MemoryTooSmall => "memory_too_small",
            ProblemKind::ShmUnboundedUnknown => "shm_unbounded_unknown",
            ProblemKind::MemoryUnknown => "memory_unknown",
            ProblemKind::MemoryBelowShmSize => "memory_below_shm_size",
            ProblemKind::NvmlUnavailable => "nvml_unavailable",
            ProblemKind::GpuHealthUnknown => "gpu_health_unknown",
            ProblemKind::GpuNotFound => "gpu_not_found",
            ProblemKind::GpuPair => "gpu_pair",
            ProblemKind::P2pProbeUnavailable => "p2p_probe_unavailable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub severity: Grade,
    pub kind: ProblemKind,
    pub message: String,
    /// The GPU pair (NVML indices) a `gpu_pair` problem is about: the text folds the pairs of
    /// a culprit GPU into one line.
    #[serde(skip)]
    pub pair: Option<(u32, u32)>,
}

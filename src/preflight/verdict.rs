//! Pure: the observations judged against the need: the problems, the verdict and the report.

use serde::Serialize;

use super::fix::fix_text;
use super::gpus::SelectorSource;
use super::need::{need, need_words, Need, NeedSpec};
use super::observe::{
    effective_available, GpuObs, IpcObs, MemObs, NvmlState, RunsIn, ShmObs, ShmState,
};
pub use super::problem::{Grade, Problem, ProblemKind};
use crate::model::PairStatus;
use crate::text;

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

/// Everything `preflight` prints: the `--json` document (schema: docs/commands.md).
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
    let mut found = Found::default();
    shm_problems(&mut found, &shm);
    if let Some(need) = &need {
        need_problems(&mut found, need, &shm, &memory, available);
    }
    memory_below_shm_size(&mut found, &shm, &memory);
    gpu_problems(&mut found, &gpus);

    let Found {
        problems,
        shm_short,
        mem_short,
    } = found;
    let verdict = match problems.iter().map(|p| p.severity).max() {
        Some(Grade::Fail) => Verdict::NotFit,
        Some(Grade::Unknown) => Verdict::Unknown,
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

/// The problems found so far, and what the fix must grow.
#[derive(Default)]
struct Found {
    problems: Vec<Problem>,
    /// The tmpfs is too small for the need (or absent).
    shm_short: bool,
    /// The memory limit leaves too little room for the need.
    mem_short: bool,
}

impl Found {
    fn add(&mut self, severity: Grade, kind: ProblemKind, message: String) {
        self.problems.push(Problem {
            severity,
            kind,
            message,
            pair: None,
        });
    }
}

/// /dev/shm itself: there, measurable, a mount, a tmpfs.
fn shm_problems(found: &mut Found, shm: &ShmObs) {
    match shm.state {
        ShmState::Absent => {
            found.shm_short = true;
            found.add(
                Grade::Fail,
                ProblemKind::ShmAbsent,
                text::preflight_shm_absent(&shm.path),
            )
        }
        ShmState::Unreadable => found.add(
            Grade::Unknown,
            ProblemKind::ShmUnreadable,
            text::preflight_shm_unreadable(&shm.path, shm.error.as_deref()),
        ),
        ShmState::NotMounted => found.add(
            Grade::Warn,
            ProblemKind::ShmNotMounted,
            text::preflight_shm_not_mounted(&shm.path, shm.fs_type.as_deref()),
        ),
        ShmState::Mounted => {
            if shm.fs_type.as_deref().is_some_and(|t| t != "tmpfs") {
                found.add(
                    Grade::Warn,
                    ProblemKind::ShmNotTmpfs,
                    text::preflight_shm_not_tmpfs(&shm.path, shm.fs_type.as_deref()),
                );
            }
        }
    }
}

/// The need against the tmpfs's free space and the memory cgroup's headroom.
fn need_problems(
    found: &mut Found,
    need: &Need,
    shm: &ShmObs,
    memory: &MemObs,
    available: Option<u64>,
) {
    if !matches!(shm.state, ShmState::Mounted | ShmState::NotMounted) {
        return;
    }
    let free_short = shm.free_bytes.is_some_and(|f| f < need.bytes);
    let headroom_short = memory.headroom_bytes.is_some_and(|h| h < need.bytes);
    let severity = if need.enforced {
        Grade::Fail
    } else {
        Grade::Warn
    };
    let why = need_words(need);
    if free_short {
        found.shm_short = true;
        found.add(
            severity,
            if need.enforced {
                ProblemKind::ShmTooSmall
            } else {
                ProblemKind::ShmSmallForGpus
            },
            text::preflight_shm_too_small(
                &shm.path,
                shm.free_bytes,
                shm.size_bytes,
                shm.used_bytes,
                &why,
                need.bytes,
            ),
        );
    }
    if headroom_short {
        found.mem_short = true;
        found.add(
            severity,
            ProblemKind::MemoryTooSmall,
            text::preflight_memory_too_small(
                memory.headroom_bytes,
                memory.limit_bytes,
                memory.usage_bytes,
                &why,
                need.bytes,
                &shm.path,
            ),
        );
    }
    if available.is_none() && need.enforced {
        found.add(
            Grade::Unknown,
            ProblemKind::ShmUnboundedUnknown,
            text::preflight_unbounded_unknown(&shm.path, need.bytes),
        );
    }
    if need.enforced && !memory.visible {
        found.add(
            Grade::Warn,
            ProblemKind::MemoryUnknown,
            text::preflight_memory_unknown(memory.note.as_deref()),
        );
    }
}

/// A tmpfs larger than the memory limit: its size is an illusion (told once: not when the
/// need already found the headroom short).
fn memory_below_shm_size(found: &mut Found, shm: &ShmObs, memory: &MemObs) {
    if let (Some(size), Some(limit)) = (shm.size_bytes, memory.limit_bytes) {
        if shm.state == ShmState::Mounted && limit < size && !found.mem_short {
            found.add(
                Grade::Warn,
                ProblemKind::MemoryBelowShmSize,
                text::preflight_memory_below_shm_size(
                    &shm.path,
                    size,
                    limit,
                    memory.headroom_bytes.unwrap_or(limit),
                ),
            );
        }
    }
}

/// GPUs: NVML, the selecting variable, the pair probe, and the pairs among the visible ones.
fn gpu_problems(found: &mut Found, gpus: &GpuObs) {
    match &gpus.nvml {
        NvmlState::Unavailable(reason) if gpus.explicit_lib => found.add(
            Grade::Unknown,
            ProblemKind::NvmlUnavailable,
            text::preflight_nvml_unavailable(reason),
        ),
        NvmlState::Unavailable(reason) => {
            if let Some(evidence) = &gpus.evidence {
                found.add(
                    Grade::Warn,
                    ProblemKind::GpuHealthUnknown,
                    text::preflight_gpu_health_unknown(evidence, reason),
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
        found.add(
            Grade::Warn,
            ProblemKind::GpuNotFound,
            text::preflight_gpu_not_found(
                var,
                &gpus.unmatched,
                gpus.selected_by == SelectorSource::CudaVisibleDevices,
            ),
        );
    }
    if let Some(e) = &gpus.probe_error {
        found.add(
            Grade::Unknown,
            ProblemKind::P2pProbeUnavailable,
            text::preflight_probe_unavailable(e),
        );
    }
    let ordinal = |i: u32| {
        gpus.visible
            .iter()
            .find(|g| g.index == i)
            .map_or(0, |g| g.cuda_ordinal)
    };
    for pair in gpus.pairs.iter().filter(|p| p.status != PairStatus::Ok) {
        found.add(
            Grade::Fail,
            ProblemKind::GpuPair,
            text::preflight_gpu_pair(
                pair.gpu,
                pair.peer_gpu,
                (ordinal(pair.gpu), ordinal(pair.peer_gpu)),
                text::pair_status(pair.status),
                &pair.reasons,
            ),
        );
        if let Some(p) = found.problems.last_mut() {
            p.pair = Some((pair.gpu, pair.peer_gpu));
        }
    }
}

#[cfg(test)]
mod tests;

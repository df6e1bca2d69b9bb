//! Pure: the observations judged against the need: the problems, the verdict and the report.

use serde::Serialize;

use super::fix::fix_text;
use super::gpus::SelectorSource;
use super::need::{need, need_words, Need, NeedSpec};
use super::observe::{
    effective_available, GpuObs, IpcObs, MemObs, NvmlState, RunsIn, ShmObs, ShmState,
};
pub use super::problem::{Grade, Problem, ProblemKind};
use crate::findings::text;
use crate::model::PairStatus;
use crate::units::human_bytes;

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
                Grade::Fail,
                ProblemKind::ShmAbsent,
                format!(
                    "nothing at {}: shm_open fails, and with it DataLoader workers and NCCL",
                    shm.path
                ),
            )
        }
        ShmState::Unreadable => p(
            Grade::Unknown,
            ProblemKind::ShmUnreadable,
            format!(
                "cannot measure {}: {}",
                shm.path,
                shm.error.as_deref().unwrap_or("unknown error")
            ),
        ),
        ShmState::NotMounted => p(
            Grade::Warn,
            ProblemKind::ShmNotMounted,
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
                    Grade::Warn,
                    ProblemKind::ShmNotTmpfs,
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
                Grade::Fail
            } else {
                Grade::Warn
            };
            let why = need_words(need);
            if free_short {
                shm_short = true;
                p(
                    severity,
                    if need.enforced {
                        ProblemKind::ShmTooSmall
                    } else {
                        ProblemKind::ShmSmallForGpus
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
                    ProblemKind::MemoryTooSmall,
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
                    Grade::Unknown,
                    ProblemKind::ShmUnboundedUnknown,
                    format!(
                        "{} has no size limit and no memory limit is visible: cannot tell whether {} fit",
                        shm.path,
                        b(need.bytes)
                    ),
                );
            }
            if need.enforced && !memory.visible {
                p(
                    Grade::Warn,
                    ProblemKind::MemoryUnknown,
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
                Grade::Warn,
                ProblemKind::MemoryBelowShmSize,
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
            Grade::Unknown,
            ProblemKind::NvmlUnavailable,
            format!("{reason}: cannot judge the GPUs"),
        ),
        NvmlState::Unavailable(reason) => {
            if let Some(evidence) = &gpus.evidence {
                p(
                    Grade::Warn,
                    ProblemKind::GpuHealthUnknown,
                    format!(
                        "{}: GPU pairs not checked",
                        text::nvml_not_loading(evidence, reason)
                    ),
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
            Grade::Warn,
            ProblemKind::GpuNotFound,
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
        let status = text::pair_status(pair.status);
        let reasons = if pair.reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", pair.reasons.join("; "))
        };
        p(
            Grade::Fail,
            ProblemKind::GpuPair,
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

#[cfg(test)]
mod tests;

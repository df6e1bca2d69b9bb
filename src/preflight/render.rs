//! Pure: the report as text for a person (`--json` prints the [`Report`] itself).

use super::gpus::SelectorSource;
use super::need::need_words;
use super::observe::{NvmlState, RunsIn, ShmState};
use super::verdict::{Grade, Report, Verdict};
use crate::model::PairStatus;
use crate::units::human_bytes;

/// The report for a person: the verdict, one row per thing measured, the problems, the fix.
pub fn render_text(r: &Report) -> String {
    let verdict = match r.verdict {
        Verdict::Fit => "FIT",
        Verdict::NotFit => "NOT FIT",
        Verdict::Unknown => "CANNOT TELL",
    };
    let runs_in = match r.runs_in {
        RunsIn::Kubernetes => "Kubernetes",
        RunsIn::Docker => "Docker/other",
    };
    let mut out = format!("shmlink preflight: {verdict} (runs in {runs_in})\n");
    for (name, row) in [
        (r.shm.path.as_str(), shm_row(r)),
        ("memory", memory_row(r)),
        ("ipc", ipc_row(r)),
        ("gpus", gpus_row(r)),
        ("need", need_row(r)),
    ] {
        out.push_str(&format!("  {name:<8} {row}\n"));
    }
    if !r.problems.is_empty() {
        out.push('\n');
        for p in &r.problems {
            let tag = match p.severity {
                Grade::Fail => "FAIL",
                Grade::Unknown => "UNKNOWN",
                Grade::Warn => "WARN",
            };
            out.push_str(&format!("{tag} {}: {}\n", p.kind.as_str(), p.message));
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

fn shm_row(r: &Report) -> String {
    let b = human_bytes;
    match r.shm.state {
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
    }
}

fn memory_row(r: &Report) -> String {
    let b = human_bytes;
    if r.memory.visible {
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
    }
}

fn ipc_row(r: &Report) -> String {
    match (r.ipc.host, r.ipc.namespace) {
        (Some(true), _) => "the host's IPC namespace (and /dev/shm)".to_string(),
        (Some(false), Some(ns)) => format!("private (ipc:[{ns}])"),
        _ => "unknown".to_string(),
    }
}

fn gpus_row(r: &Report) -> String {
    match &r.gpus.nvml {
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
    }
}

fn need_row(r: &Report) -> String {
    match &r.need {
        None => "none given".to_string(),
        Some(n) => format!("{} ({})", human_bytes(n.bytes), need_words(n)),
    }
}

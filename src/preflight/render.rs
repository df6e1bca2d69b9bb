//! Pure: the report as text for a person (`--json` prints the [`Report`] itself).

use super::gpus::SelectorSource;
use super::need::need_words;
use super::observe::{NvmlState, RunsIn, ShmState};
use super::verdict::{Grade, ProblemKind, Report, Verdict};
use crate::model::{PairStatus, Suspect};
use crate::text;
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
        for (severity, kind, message) in problem_lines(r) {
            let tag = match severity {
                Grade::Fail => "FAIL",
                Grade::Unknown => "UNKNOWN",
                Grade::Warn => "WARN",
            };
            out.push_str(&format!("{tag} {}: {message}\n", kind.as_str()));
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

/// The problems as lines: the pairs of a GPU the pair judge blames folded into one line for
/// that GPU (where its first pair was), the other pairs one line each. JSON keeps every pair.
fn problem_lines(r: &Report) -> Vec<(Grade, ProblemKind, String)> {
    let culprit_of = |(a, b): (u32, u32)| r.gpus.culprits.iter().find(|s| s.gpu == a || s.gpu == b);
    let mut told: Vec<u32> = Vec::new();
    let mut lines = Vec::new();
    for p in &r.problems {
        let Some(culprit) = p.pair.and_then(culprit_of) else {
            lines.push((p.severity, p.kind, p.message.clone()));
            continue;
        };
        if !told.contains(&culprit.gpu) {
            told.push(culprit.gpu);
            lines.push((p.severity, p.kind, culprit_line(r, culprit)));
        }
    }
    lines
}

/// One line for a blamed GPU: its failing pairs with the visible GPUs, and the GPUs to keep.
fn culprit_line(r: &Report, culprit: &Suspect) -> String {
    let g = culprit.gpu;
    let failing: Vec<_> = r
        .gpus
        .pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok && (p.gpu == g || p.peer_gpu == g))
        .collect();
    let peers: Vec<u32> = failing
        .iter()
        .map(|p| if p.gpu == g { p.peer_gpu } else { p.gpu })
        .collect();
    let status = if failing.iter().all(|p| p.status == PairStatus::Down) {
        "down"
    } else {
        "down or degraded"
    };
    let blamed = |i: u32| r.gpus.culprits.iter().any(|s| s.gpu == i);
    let keep: Vec<u32> = r
        .gpus
        .visible
        .iter()
        .map(|v| v.index)
        .filter(|&i| !blamed(i))
        .collect();
    let var = match r.gpus.selected_by {
        SelectorSource::NvidiaVisibleDevices => "NVIDIA_VISIBLE_DEVICES",
        _ => "CUDA_VISIBLE_DEVICES",
    };
    text::preflight_gpu_culprit(&text::PreflightCulprit {
        gpu: g,
        cuda: r
            .gpus
            .visible
            .iter()
            .find(|v| v.index == g)
            .map_or(0, |v| v.cuda_ordinal),
        peers: &peers,
        others: r.gpus.visible.len().saturating_sub(1),
        status,
        reasons: &culprit.reasons,
        var,
        keep: &keep,
    })
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

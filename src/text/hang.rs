//! `gpu_collective_timeout`: a collective that hung until a watchdog ended the job, and what the
//! links of its GPUs did over the hang's window, from the start of the collective to the
//! timeout: the link that went down (the culprit), errors that grew (a suspect), every link
//! clean (the ranks), or that the window was not watched (never "clean" then).

use std::time::Duration;

use super::failures::{gpus_named, JobGpus};
use crate::links::job_words::{clock, counted, peer_name};
use crate::model::{
    parse_rfc3339, GpusFrom, Hang, HangLinks, HangSaidBy, HangVerdict, LinkWent, NotWatched,
    PairStatus, Stamp, Watched,
};

/// Links named at most in one sentence; the rest are counted.
const NAMED: usize = 2;

/// The whole message; `evidence` when the hang's facts are missing (never: the rows parse).
pub fn gpu_collective_timeout(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let Some(hang) = job.hang else {
        return format!(
            "A collective of {who} hung until a watchdog ended it at {at}: {evidence}."
        );
    };
    let mut out = head(who, at, hang);
    out.push_str(&used(job));
    out.push_str(". ");
    out.push_str(&links(hang, job.gpus));
    out
}

/// `PyTorch's NCCL watchdog ended ml/trainer-0/main at ...: ALLREDUCE (SeqNum 7, rank 3) ran
/// for 10 min 0 s, past its timeout of 10 min`.
fn head(who: &str, at: &str, h: &Hang) -> String {
    let ms = |v: Option<u64>| v.map(|v| span(Duration::from_millis(v)));
    match h.said_by {
        HangSaidBy::PytorchWatchdog => {
            let mut what = h.op.clone().unwrap_or_else(|| "a collective".into());
            let mut of: Vec<String> = Vec::new();
            if let Some(seq) = h.seq {
                of.push(format!("SeqNum {seq}"));
            }
            if let Some(rank) = h.rank {
                of.push(format!("rank {rank}"));
            }
            if let Some(pg) = &h.process_group {
                of.push(format!("process group {pg}"));
            }
            if !of.is_empty() {
                what.push_str(&format!(" ({})", of.join(", ")));
            }
            let ran = match (ms(h.ran_for_ms), ms(h.timeout_ms)) {
                (Some(r), Some(t)) => format!("ran for {r}, past its timeout of {t}"),
                (None, Some(t)) => format!("ran past its timeout of {t}"),
                (Some(r), None) => format!("ran for {r}"),
                (None, None) => "hung".into(),
            };
            format!("{} ended {who} at {at}: {what} {ran}", h.said_by.name())
        }
        HangSaidBy::PytorchWatchdogStuck => format!(
            "{} ended {who} at {at}: its NCCL watchdog was stuck for {} (a NCCL or CUDA call that \
             never returned, or a thread holding the GIL inside one)",
            h.said_by.name(),
            ms(h.timeout_ms).unwrap_or_else(|| "its timeout".into())
        ),
        HangSaidBy::XlaRendezvous => format!(
            "{} ended {who} at {at}: the devices of a collective did not all arrive within its \
             termination timeout of {} (exit 42)",
            h.said_by.name(),
            ms(h.timeout_ms).unwrap_or_else(|| "?".into())
        ),
        HangSaidBy::HorovodStall => format!(
            "{} shut {who} down at {at}: ranks stalled past {} without submitting a collective's \
             tensors",
            h.said_by.name(),
            ms(h.timeout_ms).unwrap_or_else(|| "its shutdown time".into())
        ),
    }
}

/// `; its container was using GPUs 5 and 7`, or that they are not known.
fn used(job: &JobGpus<'_>) -> String {
    if job.gpus.is_empty() {
        return String::new();
    }
    let list = gpus_named(job.gpus);
    match job.from {
        Some(GpusFrom::Process) => format!("; it was using {list}"),
        Some(GpusFrom::Container) => format!("; its container was using {list}"),
        _ => format!("; its Pod holds {list}"),
    }
}

/// What the links said, and the fix that follows.
fn links(h: &Hang, gpus: &[u32]) -> String {
    let l = &h.links;
    match l.verdict {
        HangVerdict::Culprit => culprit(h),
        HangVerdict::Suspect => format!(
            "No link of its GPUs dropped over the hang's window ({}), but {}: a suspect, not \
             proof. Fix: `shmlink probe --gpus {}` on the node; drain it and reset {} if the \
             probe or the pair judge agrees; restart the job from its checkpoint.",
            window(l),
            suspects(l),
            list_plain(&l.gpus),
            gpus_named(&l.gpus)
        ),
        HangVerdict::Clean => format!(
            "Every link of its GPUs ({}) was clean over the hang's window ({}): no drop, no error, \
             no pair verdict change. Look at the ranks: a CPU-side stall, a data-loader wait, a \
             rank that never reached the collective, or the network to other nodes. Fix: at the \
             next hang, PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) and `py-spy \
             dump` of each rank say which rank stopped where.",
            nvlinks(l.links),
            window(l)
        ),
        HangVerdict::Unknown => format!(
            "{} Fix: `shmlink probe --gpus {}` on the node tells whether a pair of its GPUs fails; \
             at the next hang, PyTorch's flight recorder and `py-spy dump` of each rank.",
            not_known(h, gpus),
            if gpus.is_empty() {
                "<its GPUs>".to_string()
            } else {
                list_plain(gpus)
            }
        ),
    }
}

/// `GPU 7's links went down 9 min into the hang (link 3 to an NVSwitch at 10:09:12 UTC): the
/// culprit, ...`
fn culprit(h: &Hang) -> String {
    let l = &h.links;
    let start = h.started.map(Stamp::time);
    let into = |at: &str| -> Option<String> {
        match (start, parse_rfc3339(at)) {
            (Some(s), Some(t)) => t.duration_since(s).ok().map(span),
            _ => None,
        }
    };
    let mut said: Vec<String> = Vec::new();
    said.extend(went_down(l, &into));
    if let Some(d) = l.down_at_start.first() {
        let since = d
            .since
            .as_deref()
            .map_or(String::new(), |s| format!(", down since {}", clock(s)));
        said.push(format!(
            "GPU {} link {} (to {}) was already down when the collective began{since}",
            d.gpu,
            d.link,
            peer_name(&d.peer)
        ));
    }
    if said.is_empty() {
        if let Some(p) = l.pairs.iter().find(|p| p.status == PairStatus::Down) {
            let when = match into(&p.at) {
                Some(d) => format!("went down {d} into the hang"),
                None => format!("was already down when it began (since {})", clock(&p.at)),
            };
            let why = p
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!(" ({r})"));
            said.push(format!("pair {}-{} {when}{why}", p.gpu, p.peer_gpu));
        }
    }
    let resets: Vec<String> = l
        .gpus
        .iter()
        .map(|g| format!("`nvidia-smi -r -i {g}`"))
        .collect();
    format!(
        "{}: the culprit, the hardware and not the job. Fix: drain the node, reset {} ({}) or \
         replace it, and restart the job from its checkpoint.",
        upper_first(&said.join("; ")),
        gpus_named(&l.gpus),
        resets.join(", ")
    )
}

/// `GPU 7's links went down 9 min into the hang (GPU 7 link 3 to an NVSwitch at 10:09:12
/// UTC)`, when a link of the job's GPUs went down in the window.
fn went_down(l: &HangLinks, into: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let downs: Vec<_> = l
        .events
        .iter()
        .filter(|e| e.went == LinkWent::Down)
        .collect();
    let first = downs.first()?;
    let mut gpus: Vec<u32> = downs.iter().map(|e| e.gpu).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let whose = match gpus.as_slice() {
        [g] => format!("GPU {g}'s links"),
        _ => format!("the links of {}", gpus_named(&gpus)),
    };
    let when = into(&first.at).map_or(String::new(), |d| format!(" {d} into the hang"));
    let named: Vec<String> = downs
        .iter()
        .take(NAMED)
        .map(|e| {
            format!(
                "GPU {} link {} to {} at {}",
                e.gpu,
                e.link,
                peer_name(&e.peer),
                clock(&e.at)
            )
        })
        .collect();
    let more = match downs.len().saturating_sub(NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "{whose} went down{when} ({}{more})",
        named.join(", ")
    ))
}

/// `GPU 7 link 3 (to an NVSwitch) recovery +12` and degraded pairs, a few named.
fn suspects(l: &HangLinks) -> String {
    let mut parts: Vec<String> = l
        .changed
        .iter()
        .take(NAMED)
        .map(|c| {
            format!(
                "GPU {} link {} (to {}) {}",
                c.gpu,
                c.link,
                peer_name(&c.peer),
                counted(c).join(", ")
            )
        })
        .collect();
    if l.changed.len() > NAMED {
        parts.push(format!(
            "{} more links' errors grew",
            l.changed.len() - NAMED
        ));
    }
    for p in l
        .pairs
        .iter()
        .filter(|p| p.status == PairStatus::Degraded)
        .take(NAMED)
    {
        let why = p
            .reason
            .as_deref()
            .map_or(String::new(), |r| format!(" ({r})"));
        parts.push(format!("pair {}-{} was degraded{why}", p.gpu, p.peer_gpu));
    }
    super::and_list(&parts)
}

/// Why the links over the hang are not known, or only partly.
fn not_known(h: &Hang, gpus: &[u32]) -> String {
    let l = &h.links;
    let began = h.started.map(|s| clock(&s.to_string()));
    let whole = match &began {
        Some(b) => format!(
            "the hang's window ({} to {})",
            b.trim_end_matches(" UTC"),
            clock(&h.timed_out.to_string())
        ),
        None => "the hang's window".into(),
    };
    let why = match l.why_not {
        Some(NotWatched::WindowUnknown) => {
            return "When the collective began is not known, so neither is what its links did."
                .into()
        }
        Some(NotWatched::NoGpus) => {
            return "The GPUs it used are not known (NVML listed no process of it, and no kubelet \
                    pod-resources answer): its links cannot be asked."
                .into()
        }
        Some(NotWatched::NoNvml) => {
            return format!("NVML gave no sample of the links over {whole}: not known.")
        }
        Some(NotWatched::NoLinks) => {
            return format!(
                "{} {} no NVLink NVML reports: the links say nothing of it; look at the ranks and \
                 the network.",
                upper_first(&gpus_named(gpus)),
                if gpus.len() == 1 { "has" } else { "have" }
            )
        }
        Some(NotWatched::NoHistory) => {
            return format!(
                "No ledger of the links over {whole} (`check` reads serve's, `--state-dir`): not \
                 known."
            )
        }
        Some(NotWatched::StartedLater) => "the agent started after the collective began",
        Some(NotWatched::Gap) | None => "the agent was not watching for part of it",
    };
    match (l.watched, &l.from, &l.until) {
        (Watched::Partly, Some(f), Some(u)) => format!(
            "The agent watched {} only from {} to {} ({why}): nothing moved then, but the rest was \
             not seen, so its links are not known clean.",
            whole,
            clock(f),
            clock(u)
        ),
        (Watched::Whole, _, _) => format!(
            "Of its GPUs' {}, {} not read at the end of {whole} (NVML did not answer): nothing \
             moved on the others, but not known clean.",
            nvlinks(l.links),
            if l.unread == 1 {
                "1 was".to_string()
            } else {
                format!("{} were", l.unread)
            }
        ),
        _ => format!("The agent did not watch {whole} ({why}): what its links did is not known."),
    }
}

/// `10:00:00 to 10:10:00 UTC`.
fn window(l: &HangLinks) -> String {
    match (&l.from, &l.until) {
        (Some(f), Some(u)) => format!("{} to {}", clock(f).trim_end_matches(" UTC"), clock(u)),
        _ => "?".into(),
    }
}

fn nvlinks(n: u32) -> String {
    if n == 1 {
        "1 NVLink".into()
    } else {
        format!("{n} NVLinks")
    }
}

/// `5,7`: GPUs as `--gpus` takes them.
fn list_plain(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `40 s`, `9 min`, `10 min 3 s`, `1 h 5 min`: a duration as a person says it.
pub fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 if s.is_multiple_of(60) => format!("{} min", s / 60),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ if s % 3600 / 60 == 0 => format!("{} h", s / 3600),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

//! A collective that hung until a watchdog ended the job: what the line said ([`HangFacts`],
//! parsed in `failures::hang`) and what the links of the job's GPUs did over the hang's window
//! ([`Hang`], `check --json`'s `failures[].hang`).

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{GpuLinkDelta, PairStatus, Stamp};

/// Which watchdog said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangSaidBy {
    /// PyTorch's ProcessGroupNCCL watchdog: a collective ran past its timeout.
    PytorchWatchdog,
    /// PyTorch's heartbeat monitor: the watchdog itself was stuck (in a NCCL or CUDA call).
    PytorchWatchdogStuck,
    /// XLA's NCCL rendezvous (JAX, TensorFlow) waited past its termination timeout.
    XlaRendezvous,
    /// Horovod's stall inspector shut the job down: ranks never submitted the tensors.
    HorovodStall,
}

impl HangSaidBy {
    /// How a sentence names it.
    pub const fn name(self) -> &'static str {
        match self {
            HangSaidBy::PytorchWatchdog => "PyTorch's NCCL watchdog",
            HangSaidBy::PytorchWatchdogStuck => "PyTorch's NCCL heartbeat monitor",
            HangSaidBy::XlaRendezvous => "XLA's NCCL rendezvous",
            HangSaidBy::HorovodStall => "Horovod's stall inspector",
        }
    }
}

/// What a hang's line says, as typed as it was printed: the facts the failure is named from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HangFacts {
    pub said_by: HangSaidBy,
    /// The rank that printed it (`[Rank 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`).
    pub rank: Option<u32>,
    /// The process group as PyTorch's prefix names it (`0 (default_pg)`), written out printable.
    pub process_group: Option<String>,
    /// `SeqNum=`: the collective's number in its process group.
    pub seq: Option<u64>,
    /// `OpType=`: `ALLREDUCE`, `_ALLGATHER_BASE`, ...
    pub op: Option<String>,
    pub numel_in: Option<u64>,
    pub numel_out: Option<u64>,
    /// The timeout the program waited for: PyTorch's `Timeout(ms)=`, the heartbeat monitor's,
    /// XLA's termination timeout, Horovod's stall shutdown time.
    pub timeout_ms: Option<u64>,
    /// `ran for N milliseconds`: how long the collective had run when the watchdog saw it.
    pub ran_for_ms: Option<u64>,
}

impl HangFacts {
    /// How long before the line the hang began: what it ran for, else the timeout it waited
    /// (at least that long).
    pub fn duration(&self) -> Option<Duration> {
        self.ran_for_ms
            .or(self.timeout_ms)
            .map(Duration::from_millis)
    }

    /// The window the line itself gives: from the start of the collective to the timeout (the
    /// line's time `at`); None without a duration.
    pub fn window(&self, at: SystemTime) -> Option<(SystemTime, SystemTime)> {
        Some((at.checked_sub(self.duration()?)?, at))
    }

    /// `failures[].named_from`: the facts as one line, e.g. `PyTorch's NCCL watchdog: ALLREDUCE
    /// SeqNum=7 on rank 3 (process group 0 (default_pg)) ran for 600081 ms, Timeout(ms)=600000`.
    pub fn named_from(&self) -> String {
        let mut out = format!("{}:", self.said_by.name());
        if let Some(op) = &self.op {
            out.push_str(&format!(" {op}"));
        }
        if let Some(seq) = self.seq {
            out.push_str(&format!(" SeqNum={seq}"));
        }
        if let Some(rank) = self.rank {
            out.push_str(&format!(" on rank {rank}"));
        }
        if let Some(pg) = &self.process_group {
            out.push_str(&format!(" (process group {pg})"));
        }
        match (self.ran_for_ms, self.timeout_ms) {
            (Some(r), Some(t)) => out.push_str(&format!(" ran for {r} ms, Timeout(ms)={t}")),
            (Some(r), None) => out.push_str(&format!(" ran for {r} ms")),
            (None, Some(t)) => out.push_str(&format!(" waited {t} ms")),
            (None, None) => {}
        }
        out
    }
}

/// `failures[].hang`: the hung collective and what the links of the job's GPUs did over its
/// window (docs/CONTRACT.md, "Hangs").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hang {
    pub said_by: HangSaidBy,
    pub op: Option<String>,
    pub seq: Option<u64>,
    pub rank: Option<u32>,
    pub process_group: Option<String>,
    pub timeout_ms: Option<u64>,
    pub ran_for_ms: Option<u64>,
    /// When the collective began (the line's time less what it ran for, else less the timeout):
    /// RFC 3339; null when the line gives no duration.
    pub started: Option<Stamp>,
    /// When the watchdog gave up (the line's time).
    pub timed_out: Stamp,
    pub links: HangLinks,
}

/// How much of the hang's window the agent watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Watched {
    /// Every moment of it: the links were sampled before it began and through its end.
    Whole,
    /// Only some of it (`from` to `until`).
    Partly,
    /// None of it.
    No,
}

/// Why the window was not (wholly) watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotWatched {
    /// The line gives no duration: when the hang began is not known.
    WindowUnknown,
    /// Which GPUs the job used is not known.
    NoGpus,
    /// No NVML sample of the links (no NVML, or `--no-gpu`).
    NoNvml,
    /// Its GPUs have no NVLink NVML reports.
    NoLinks,
    /// No ledger of the links over time (`check` without serve's store).
    NoHistory,
    /// The agent started (or started again) after the hang began.
    StartedLater,
    /// The agent was not running for part of it (a restart), or its oldest marks of a link
    /// were dropped (the ledger is bounded).
    Gap,
}

/// Which way a link went at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkWent {
    Down,
    Up,
}

/// A link that went down or came up inside the window (seen at the scan at `at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkEvent {
    pub gpu: u32,
    pub link: u32,
    pub peer: String,
    pub at: String,
    pub went: LinkWent,
}

/// A link already down when the collective began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkDownAtStart {
    pub gpu: u32,
    pub link: u32,
    pub peer: String,
    /// When a scan first saw it down, where the ledger still holds it.
    pub since: Option<String>,
}

/// A pair among the job's GPUs whose verdict changed inside the window, or that was failing
/// when it began (`at` then is when it turned, before `started`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairChange {
    pub gpu: u32,
    pub peer_gpu: u32,
    pub status: PairStatus,
    pub at: String,
    /// The pair judge's first reason then.
    pub reason: Option<String>,
}

/// What the links said of the hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangVerdict {
    /// A link of the job's GPUs went down, or a pair among them failed, during the window or
    /// before it began: the hardware.
    Culprit,
    /// Error counters grew over the window, no link dropped and no pair failed: a suspect.
    Suspect,
    /// The whole window watched, every link read, nothing moved: look at the ranks.
    Clean,
    /// Not watched enough to say.
    Unknown,
}

/// `failures[].hang.links`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HangLinks {
    pub verdict: HangVerdict,
    /// The GPUs the verdict names (culprit or suspect), NVML indices.
    pub gpus: Vec<u32>,
    pub watched: Watched,
    pub why_not: Option<NotWatched>,
    /// The part of the window the ledger covers (RFC 3339), null when none.
    pub from: Option<String>,
    pub until: Option<String>,
    /// Links of the job's GPUs, and of those the ones not read at the window's end.
    pub links: u32,
    pub unread: u32,
    pub events: Vec<LinkEvent>,
    pub down_at_start: Vec<LinkDownAtStart>,
    /// Counter growth over the window, links with any (the keys as `gpu_links` has them).
    pub changed: Vec<GpuLinkDelta>,
    pub pairs: Vec<PairChange>,
}

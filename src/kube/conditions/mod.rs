//! This Node's GPU conditions (`GpuLinkDegraded`, `GpuFault`): what systems that repair nodes
//! act on (node-problem-detector's polarity: True = problem).
//!
//! [`desired`] (`decide.rs`) is pure: each snapshot's GPU verdicts in, the two conditions they
//! call for out (the verdicts carry the fatal XIDs' hold). [`ConditionFeed`] hands them from the scan
//! thread to the writer task (`writer.rs`) through a watch channel: the scan thread never waits,
//! and the writer always takes the latest state. The writer patches the Node's status (strategic
//! merge, conditions merged by `type`, field manager `shmlink`) only on a change or a heartbeat,
//! keeps `lastTransitionTime` unless the status flips, retries with capped backoff; with
//! `--taint-on-gpu-fault` it also keeps its own NoSchedule taint (`taint.rs`).

mod decide;
mod taint;
mod writer;

pub use decide::desired;
pub use writer::{spawn_writer, ConditionFeed, WriterSettings};

/// The condition types this agent owns (CONTRACT.md); it never writes any other.
pub const GPU_LINK_DEGRADED: &str = "GpuLinkDegraded";
pub const GPU_FAULT: &str = "GpuFault";

/// A condition's status, as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    /// No NVML on a node whose driver lists GPUs: nothing can be said.
    Unknown,
}

impl Status {
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// One condition as it should be on the Node (times are the writer's business).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: Status,
    /// CamelCase.
    pub reason: String,
    pub message: String,
}

/// Both conditions, as one snapshot calls for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub link: Condition,
    pub fault: Condition,
}

impl Desired {
    pub fn iter(&self) -> [&Condition; 2] {
        [&self.link, &self.fault]
    }
}

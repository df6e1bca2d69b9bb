//! The NVLink ledger as data: what the snapshot carries down to the failures that ask it (the
//! job links ledger, `JobLinks`, and its history, `LinkHistory`) and what a failure says of its
//! links (`GpuLinks`, `failures[].gpu_links`). Plain types: `links::ledger` and
//! `links::history` feed them after each scan, answer what is asked of them and save them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{LinkCounts, LinkLast, LinkTable, PairStatus};

/// One container's watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub since: SystemTime,
    /// The baseline was taken before the container started (the agent was running); false:
    /// at the agent's first sight of it.
    pub since_start: bool,
    pub baseline: Arc<LinkTable>,
    /// When it was last seen running and the totals then; None while it runs.
    pub end: Option<(SystemTime, Arc<LinkTable>)>,
    /// When a scan first found it gone.
    pub gone_at: Option<SystemTime>,
}

/// The ledger: the links' totals, the last sample, each container's watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobLinks {
    pub totals: Arc<LinkTable>,
    pub last: BTreeMap<(String, u32), LinkLast>,
    /// When the last sample was fed (in this process or before a restart).
    pub sampled_at: Option<SystemTime>,
    /// A sample was fed in this process: a container new since then started after it.
    pub fed_here: bool,
    pub containers: HashMap<String, Watch>,
    /// The links and pairs over time, for a window in the past (a hang's).
    pub history: LinkHistory,
}

/// (GPU UUID, link).
pub type LinkKey = (String, u32);
/// (GPU UUID, GPU UUID), the lower NVML index's first.
pub type PairKey = (String, String);

/// A link after a scan that changed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub at: SystemTime,
    pub counts: LinkCounts,
    pub active: bool,
    /// Its counters were read at that scan.
    pub read: bool,
}

/// A pair's verdict from a scan on (until the next mark of that pair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairMark {
    pub at: SystemTime,
    pub pair: PairKey,
    pub status: PairStatus,
    pub reason: Option<String>,
}

/// A stretch of scans by one process: from its first sample to its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub from: SystemTime,
    pub to: SystemTime,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkHistory {
    pub marks: BTreeMap<LinkKey, VecDeque<Mark>>,
    /// Per link, the newest mark dropped: before it the link's totals are not known exactly.
    pub cut: BTreeMap<LinkKey, SystemTime>,
    pub pairs: VecDeque<PairMark>,
    /// Each pair's verdict at the last scan.
    pub pairs_now: BTreeMap<PairKey, PairStatus>,
    /// The newest pair mark dropped.
    pub pairs_cut: Option<SystemTime>,
    pub runs: VecDeque<Run>,
}

/// `failures[].gpu_links` (docs/CONTRACT.md, "A job's links"): times in RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLinks {
    pub since: String,
    pub since_start: bool,
    /// The last sample the deltas include (a scan's; the death came after it).
    pub until: String,
    pub watched: u32,
    #[serde(default)]
    pub unread: u32,
    pub changed: Vec<GpuLinkDelta>,
}

/// One link that did something: the DL keys where the link has the DL counters, the NVLink5
/// keys where it has those, its drops and returns always.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLinkDelta {
    pub gpu: u32,
    pub link: u32,
    pub peer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_flit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_data: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_data: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_successful: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_failed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_events: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<u64>,
    pub went_down: u64,
    pub came_up: u64,
}

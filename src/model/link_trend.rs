//! A link's error counters kept over days (one sample per link per hour, by GPU UUID), and
//! what the trend judge (`links::trend`) made of them: growth per hour, and whether it is steady
//! but slow.

use std::time::SystemTime;

use super::gpu::{GpuReading, Peer};

/// The counters a link's trend is kept for: NVML's DL counters, then the NVLink5 counts.
/// `as_str` is the `counter` label and the store's column name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkCounter {
    Replay,
    Recovery,
    CrcFlit,
    CrcData,
    EccData,
    RecoverySuccessful,
    RecoveryFailed,
    RecoveryEvents,
    Symbol,
    Effective,
}

impl LinkCounter {
    pub const ALL: [LinkCounter; 10] = [
        LinkCounter::Replay,
        LinkCounter::Recovery,
        LinkCounter::CrcFlit,
        LinkCounter::CrcData,
        LinkCounter::EccData,
        LinkCounter::RecoverySuccessful,
        LinkCounter::RecoveryFailed,
        LinkCounter::RecoveryEvents,
        LinkCounter::Symbol,
        LinkCounter::Effective,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            LinkCounter::Replay => "replay",
            LinkCounter::Recovery => "recovery",
            LinkCounter::CrcFlit => "crc_flit",
            LinkCounter::CrcData => "crc_data",
            LinkCounter::EccData => "ecc_data",
            LinkCounter::RecoverySuccessful => "recovery_successful",
            LinkCounter::RecoveryFailed => "recovery_failed",
            LinkCounter::RecoveryEvents => "recovery_events",
            LinkCounter::Symbol => "symbol",
            LinkCounter::Effective => "effective",
        }
    }

    /// Its place in [`LinkSample::counts`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// One link's counters at one moment; a count the link does not answer is None.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSample {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// The GPU's UUID (indices change across reboots and driver reloads; UUIDs do not).
    pub gpu: String,
    pub link: u32,
    /// In [`LinkCounter::ALL`]'s order.
    pub counts: [Option<u64>; 10],
}

impl LinkSample {
    /// Every link of `gpus` that answers any counter, at `at_ms`; GPUs without a UUID or lost
    /// (their counters wait for their return) are left out.
    pub fn of(gpus: &[GpuReading], at_ms: i64) -> Vec<LinkSample> {
        let mut out = Vec::new();
        for g in gpus.iter().filter(|g| !g.uuid.is_empty() && !g.lost) {
            for l in &g.links {
                let mut counts = [None; 10];
                if let Some(e) = l.errors {
                    for (slot, v) in counts.iter_mut().zip(e.values()) {
                        *slot = Some(v);
                    }
                }
                if let Some(e) = l.nvlink5 {
                    for (slot, v) in counts[5..].iter_mut().zip(e.counts()) {
                        *slot = Some(v);
                    }
                }
                if counts.iter().any(Option::is_some) {
                    out.push(LinkSample {
                        at_ms,
                        gpu: g.uuid.clone(),
                        link: l.link,
                        counts,
                    });
                }
            }
        }
        out
    }

    pub fn count(&self, c: LinkCounter) -> Option<u64> {
        self.counts[c.index()]
    }
}

/// One (GPU, link, counter) whose count grew over the kept span.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkTrend {
    /// The GPU's NVML index now.
    pub gpu: u32,
    pub uuid: String,
    pub link: u32,
    /// The link's far end now.
    pub peer: Peer,
    pub counter: LinkCounter,
    /// Growth per hour between the first and the last kept sample (resets not counted).
    pub per_hour: f64,
    /// Set when the growth is steady but slow: since when (the first sample of the steady
    /// run that showed growth).
    pub growing: Option<SteadyGrowth>,
}

/// A steady, slow growth: its start, how much and over how many days.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyGrowth {
    pub since: SystemTime,
    /// Growth since `since` (the first growth of the run included).
    pub growth: u64,
    /// Days of the run on which the counter grew.
    pub days: u32,
    /// `growth` per day between `since` and now.
    pub per_day: f64,
}

//! One NVLink's counts and what a sample said of it: the shared ground of the job-links ledger
//! (`link_ledger.rs`, fed by `links::ledger`) and its history (`links::history`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One link's counts: the DL counters, the NVLink5 ones, and its drops and returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounts {
    pub replay: u64,
    pub recovery: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
    pub ecc_data: u64,
    pub recovery_successful: u64,
    pub recovery_failed: u64,
    pub recovery_events: u64,
    pub symbol: u64,
    pub effective: u64,
    pub went_down: u64,
    pub came_up: u64,
}

impl LinkCounts {
    /// The twelve counts in the order above (how checkpoints keep them).
    pub fn to_array(&self) -> [u64; 12] {
        [
            self.replay,
            self.recovery,
            self.crc_flit,
            self.crc_data,
            self.ecc_data,
            self.recovery_successful,
            self.recovery_failed,
            self.recovery_events,
            self.symbol,
            self.effective,
            self.went_down,
            self.came_up,
        ]
    }

    pub fn from_array(f: [u64; 12]) -> LinkCounts {
        let [replay, recovery, crc_flit, crc_data, ecc_data, recovery_successful, recovery_failed, recovery_events, symbol, effective, went_down, came_up] =
            f;
        LinkCounts {
            replay,
            recovery,
            crc_flit,
            crc_data,
            ecc_data,
            recovery_successful,
            recovery_failed,
            recovery_events,
            symbol,
            effective,
            went_down,
            came_up,
        }
    }

    /// `self` minus `before`, field by field (a field never goes back; 0 if it seems to).
    pub fn since(&self, before: &LinkCounts) -> LinkCounts {
        let (a, b) = (self.to_array(), before.to_array());
        LinkCounts::from_array(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }

    pub fn is_zero(&self) -> bool {
        self.to_array().iter().all(|&v| v == 0)
    }
}

/// A link's totals as of one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkTotal {
    pub counts: LinkCounts,
    /// It has the DL counters / the NVLink5 ones (which keys a person is shown).
    pub dl: bool,
    pub nvlink5: bool,
    /// Its counters were read at that sample (NVML answered for it).
    pub read: bool,
}

/// (GPU UUID, link) -> totals.
pub type LinkTable = BTreeMap<(String, u32), LinkTotal>;

/// What the last sample said of a link, to count the next one's increases from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkLast {
    pub gpu: u32,
    /// As the contract's `peer` label spells it (`gpu:0`, `switch`).
    pub peer: String,
    pub active: bool,
    /// The DL counters then, [replay, recovery, crc_flit, crc_data, ecc_data].
    pub dl: Option<[u64; 5]>,
    /// The NVLink5 counts then, [successful, failed, events, symbol, effective].
    pub nvlink5: Option<[u64; 5]>,
}

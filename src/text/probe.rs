//! The pair probe: why an ordered pair failed or is slow, and the table a person reads.

use std::time::Duration;

use crate::model::{PairProbe, ProbeStatus};

pub fn probe_hung(from: u32, to: u32, after: Duration) -> String {
    format!(
        "the copy GPU {from} -> GPU {to} did not finish within {} s (the probe was ended)",
        after.as_secs()
    )
}

pub fn probe_crashed(from: u32, to: u32, how: &str) -> String {
    format!("copying GPU {from} -> GPU {to} crashed the probe ({how})")
}

pub fn probe_copy_error(from: u32, to: u32, error: &str) -> String {
    format!("copies GPU {from} -> GPU {to} failed: {error}")
}

pub fn probe_corrupted(from: u32, to: u32, at: u64, of: u64) -> String {
    format!("copies GPU {from} -> GPU {to} corrupted: the first wrong byte at offset {at} of {of}")
}

pub fn probe_peer_refused(from: u32, to: u32, nvlink: bool, error: Option<&str>) -> String {
    let why = error.map_or(String::new(), |e| format!(" ({e})"));
    if nvlink {
        format!("peer access GPU {from} -> GPU {to} refused although NVML reports NVLink P2P{why}")
    } else {
        format!(
            "peer access GPU {from} -> GPU {to} refused although NVML reports P2P read and \
             write ok{why}"
        )
    }
}

pub fn probe_slow(from: u32, to: u32, gbps: f64, expected: f64) -> String {
    format!(
        "copies GPU {from} -> GPU {to} ran at {gbps:.1} GB/s, under half of the {expected:.1} \
         GB/s its path carries"
    )
}

pub fn probe_slow_among_like(from: u32, to: u32, gbps: f64, median: f64) -> String {
    format!(
        "copies GPU {from} -> GPU {to} ran at {gbps:.1} GB/s, under half of what like pairs on \
         this board copy ({median:.1} GB/s)"
    )
}

/// A pair verdict's reason from the probe (`serve --p2p-probe-interval`).
pub fn reason_probe(p: &PairProbe) -> String {
    format!("probe: {}", p.reason.as_deref().unwrap_or("not ok"))
}

/// The words under `shmlink probe`'s table (`probe::render` draws its rows, legend and
/// colours): how many pairs in how long, and for each culprit GPU what to do.
pub fn probe_table(pairs: &[PairProbe], culprits: &[u32], took: Duration) -> (String, Vec<String>) {
    let bad = pairs.iter().filter(|p| p.status != ProbeStatus::Ok).count();
    let summary = format!(
        "{} ordered pairs probed in {:.1} s: {} ok, {bad} not.",
        pairs.len(),
        took.as_secs_f64(),
        pairs.len() - bad
    );
    let advice = culprits
        .iter()
        .map(|g| {
            format!(
                "GPU {g} fails with every peer it was probed with: the GPU (or its links), not \
                 the pairs. Drain the node (or keep jobs off GPU {g}) and reset or replace it \
                 (`nvidia-smi -r -i {g}`)."
            )
        })
        .collect();
    (summary, advice)
}

//! The reasons a GPU pair is not ok (`gpu_pairs[].reasons`), one sentence each, as the pair
//! rules (`gpu::pairs`) find them, and the parts of a counter-growth warning.

use std::time::Duration;

use super::{link_list, rate, secs};
use crate::model::{FabricInfo, FabricState, P2pStatus, RecoveryAction, TopologyLevel};

/// Rule 1.
pub fn reason_gpu_lost(g: u32) -> String {
    format!("GPU {g} is lost (fell off the bus)")
}

/// Rule 2: a direct link between the pair.
pub fn reason_link_inactive(link: u32, a: u32, b: u32) -> String {
    format!("link {link} of GPU {a} to GPU {b} is inactive")
}

/// Rule 2: every NVSwitch link of GPU `a` (there are `switch_links`) is inactive.
pub fn reason_switch_links_down(a: u32, switch_links: usize) -> String {
    if switch_links == 1 {
        format!("the only NVSwitch link of GPU {a} is inactive")
    } else {
        format!("all {switch_links} NVSwitch links of GPU {a} are inactive")
    }
}

/// Rule 2: some of them.
pub fn reason_switch_links_some_down(a: u32, down: &[u32], switch_links: usize) -> String {
    format!(
        "{} of {switch_links} NVSwitch links of GPU {a} are inactive ({})",
        down.len(),
        link_list(down)
    )
}

/// Rule 3: DL error counters of GPU `gpu`'s `links` grew past the threshold.
pub fn reason_counter_growth(
    counter: &str,
    gpu: u32,
    links: &[u32],
    total: u64,
    window: Duration,
) -> String {
    format!(
        "NVLink {counter} errors on GPU {gpu} {}: +{total} in the last {} s",
        link_list(links),
        secs(window)
    )
}

/// Rule 3: CRC errors at a rate past the threshold.
pub fn reason_crc_rate(
    gpu: u32,
    links: &[u32],
    total: u64,
    per_sec: f64,
    limit: f64,
    window: Duration,
) -> String {
    format!(
        "NVLink CRC errors on GPU {gpu} {}: +{total} in the last {} s, up to {}/s (degraded at \
         {limit}/s)",
        link_list(links),
        secs(window),
        rate(per_sec)
    )
}

/// Rule 3b: an NVLink5 count (`what`: failed link recoveries, ...) past the threshold.
pub fn reason_nvlink5_count(
    what: &str,
    a: u32,
    link: u32,
    amount: u64,
    window: Duration,
) -> String {
    format!(
        "NVLink {what} on GPU {a} link {link}: +{amount} in the last {} s",
        secs(window)
    )
}

/// Rule 3b: NVLink5 errors at a rate past the threshold.
pub fn reason_nvlink5_rate(
    what: &str,
    a: u32,
    link: u32,
    amount: u64,
    window: Duration,
    per_sec: f64,
    limit: f64,
) -> String {
    format!(
        "NVLink {what} on GPU {a} link {link}: +{amount} in the last {} s, up to {}/s (degrading \
         at {limit}/s)",
        secs(window),
        rate(per_sec)
    )
}

/// Rule 3b: a bit error rate past the threshold.
pub fn reason_ber(what: &str, ber: f64, a: u32, link: u32, limit: f64) -> String {
    format!("NVLink {what} {ber:e} on GPU {a} link {link} (degrading at {limit:e})")
}

/// Rule 3c: NVML asks to drain P2P.
pub fn reason_recovery_drains_p2p(g: u32, action: RecoveryAction) -> String {
    format!(
        "NVML's recovery action for GPU {g} is {}: P2P must be drained",
        action.as_str()
    )
}

/// Rule 3c: the fabric's word on GPU `g` (`problem`: [`fabric_problem`]).
pub fn reason_fabric(g: u32, problem: &str) -> String {
    format!("GPU {g}: {problem}")
}

/// What is wrong with a GPU's fabric registration or health, if anything.
pub fn fabric_problem(f: &FabricInfo) -> Option<String> {
    let mut parts = Vec::new();
    match f.state {
        FabricState::NotStarted => parts.push("its fabric registration has not started".into()),
        FabricState::InProgress => parts.push("its fabric registration is not complete".into()),
        FabricState::Completed if f.status != "success" => {
            parts.push(format!("its fabric registration failed ({})", f.status))
        }
        FabricState::Completed => {}
    }
    if f.degraded_bandwidth == Some(true) {
        parts.push("the fabric reports degraded bandwidth".into());
    }
    if f.route_unhealthy == Some(true) {
        parts.push("the fabric reports an unhealthy route".into());
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Rule 4: a P2P capability (`name`) that was ok and is not.
pub fn reason_p2p_lost(name: &str, status: P2pStatus) -> String {
    format!("P2P {name} was ok and is now {}", status.as_str())
}

/// Rule 5: what fails of read and write; None when both are ok.
pub fn p2p_failing(read: P2pStatus, write: P2pStatus) -> Option<String> {
    match (read, write) {
        (P2pStatus::Ok, P2pStatus::Ok) => None,
        (read, P2pStatus::Ok) => Some(format!("read {}", read.as_str())),
        (P2pStatus::Ok, write) => Some(format!("write {}", write.as_str())),
        (read, write) if read == write => Some(format!("read and write {}", read.as_str())),
        (read, write) => Some(format!(
            "read {} and write {}",
            read.as_str(),
            write.as_str()
        )),
    }
}

/// Rule 5: P2P `failing` while `can` pairs at the same topology level can.
pub fn reason_p2p_unlike_peers(
    failing: &str,
    can: usize,
    topology: Option<TopologyLevel>,
) -> String {
    let level = match topology {
        Some(level) => format!("at topology level {}", level.as_str()),
        None => "of unknown topology".to_string(),
    };
    format!("P2P {failing} while {} {level} can", other_pairs(can))
}

/// Rule 5, on an NVSwitch fabric: P2P over NVLink.
pub fn reason_p2p_nvlink_unlike_peers(status: P2pStatus, can: usize) -> String {
    format!(
        "P2P over NVLink {} while {} on this NVSwitch fabric can",
        status.as_str(),
        other_pairs(can)
    )
}

fn other_pairs(n: usize) -> String {
    if n == 1 {
        "1 other pair".to_string()
    } else {
        format!("{n} other pairs")
    }
}

/// A part of a `gpu_link_errors` warning: `replay +3`.
pub fn growth(what: &str, amount: u64) -> String {
    format!("{what} +{amount}")
}

/// A part of a `gpu_link_errors` warning, with its rate: `CRC +40 (up to 2/s)`.
pub fn growth_at_rate(what: &str, amount: u64, per_sec: f64) -> String {
    format!("{what} +{amount} (up to {}/s)", rate(per_sec))
}

/// One link's parts of a `gpu_link_errors` warning: `link 3 replay +3, CRC +40 (...)`.
pub fn link_growth(link: u32, parts: &[String]) -> String {
    format!("link {link} {}", parts.join(", "))
}

/// The reasons a finding quotes, the rest counted: `...; ... (and 3 more)`.
pub fn some_reasons(distinct: &[&str], max: usize) -> String {
    let shown = distinct.len().min(max);
    let mut text = distinct.get(..shown).unwrap_or_default().join("; ");
    if distinct.len() > shown {
        text.push_str(&format!(" (and {} more)", distinct.len() - shown));
    }
    text
}

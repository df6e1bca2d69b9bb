//! Pure: a snapshot (pair verdicts, GPUs NVML and the driver list, XID counts) -> the two
//! conditions. Fatal XIDs are remembered for the hold time; everything else is as the snapshot
//! says now.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{Condition, Desired, Status, GPU_FAULT, GPU_LINK_DEGRADED};
use crate::findings::text;
use crate::gpu::pci::not_in_nvml;
use crate::gpu::xid::catalogue;
use crate::model::Snapshot;
use crate::model::{PairStatus, PairVerdict, RecoveryAction};

/// A message longer than this is cut: a Node object is read by everything in the cluster.
const MESSAGE_MAX: usize = 1024;
/// Pairs named in a message before "and N more".
const PAIRS_NAMED: usize = 12;
/// Occurrences of one XID remembered within the hold (the message says "N times").
const TIMES_KEPT: usize = 64;

/// One fatal XID on one GPU: the count last seen and when it grew, within the hold.
#[derive(Debug, Default)]
struct Seen {
    count: u64,
    at: VecDeque<Instant>,
}

/// Decides the conditions; remembers fatal XIDs for `hold`.
#[derive(Debug)]
pub struct ConditionJudge {
    hold: Duration,
    xids: BTreeMap<(u32, u64), Seen>,
}

impl ConditionJudge {
    pub fn new(hold: Duration) -> ConditionJudge {
        ConditionJudge {
            hold,
            xids: BTreeMap::new(),
        }
    }

    pub fn decide(&mut self, snapshot: &Snapshot, now: Instant) -> Desired {
        self.observe_xids(snapshot, now);
        if !snapshot.nvml_up {
            return no_nvml(snapshot);
        }
        Desired {
            link: link_condition(&snapshot.gpu_pairs),
            fault: self.fault_condition(snapshot),
        }
    }

    /// Counts that grew are occurrences now; a count that went down, or vanished, means the
    /// XID history started over (NVML loaded afresh: a driver reload, a reboot): forgotten.
    fn observe_xids(&mut self, snapshot: &Snapshot, now: Instant) {
        let counts: BTreeMap<(u32, u64), u64> = snapshot
            .xids
            .iter()
            .filter(|x| catalogue::is_fatal(x.xid))
            .map(|x| ((x.gpu, x.xid), x.count))
            .collect();
        self.xids
            .retain(|k, seen| counts.get(k).is_some_and(|&c| c >= seen.count));
        for (&key, &count) in &counts {
            let seen = self.xids.entry(key).or_default();
            let grew = count.saturating_sub(seen.count);
            for _ in 0..grew.min(TIMES_KEPT as u64) {
                seen.at.push_back(now);
            }
            while seen.at.len() > TIMES_KEPT {
                seen.at.pop_front();
            }
            seen.count = count;
            while seen
                .at
                .front()
                .is_some_and(|t| now.duration_since(*t) >= self.hold)
            {
                seen.at.pop_front();
            }
        }
    }

    fn fault_condition(&self, snapshot: &Snapshot) -> Condition {
        // (reason, sentence), worst first: lost GPUs, missing GPUs, then XIDs by GPU.
        let mut faults: Vec<(String, String)> = Vec::new();
        for g in snapshot.gpus.iter().filter(|g| g.lost) {
            faults.push((
                "GpuLost".into(),
                format!(
                    "GPU {} ({}) is lost: NVML says it fell off the bus; drain the node, then \
                     reset the GPU (`nvidia-smi -r -i {}`) or reboot",
                    g.index, g.pci_bus_id, g.index
                ),
            ));
        }
        let missing = not_in_nvml(&snapshot.driver_gpus, &snapshot.gpus);
        if !missing.is_empty() {
            faults.push((
                "GpuNotInNvml".into(),
                text::gpu_not_in_nvml(&missing, snapshot.driver_gpus.len(), snapshot.gpus.len())
                    .trim_end_matches('.')
                    .to_string(),
            ));
        }
        // NVML's own recovery action, as long as NVML says it (no hold: NVML clears it once
        // done); the one that goes furthest first.
        let mut actions: Vec<(RecoveryAction, u32, &str)> = snapshot
            .gpus
            .iter()
            .filter(|g| !g.lost)
            .filter_map(|g| {
                Some((
                    g.recovery_action.filter(|a| a.is_fault())?,
                    g.index,
                    g.pci_bus_id.as_str(),
                ))
            })
            .collect();
        actions.sort_by_key(|&(action, gpu, _)| (std::cmp::Reverse(action_rank(action)), gpu));
        for (action, gpu, bus) in actions {
            faults.push((
                format!("RecoveryAction{}", camel(action.as_str())),
                text::fault_recovery_action(gpu, bus, action),
            ));
        }
        let hold = humantime::format_duration(self.hold).to_string();
        // The XID whose action goes furthest (a reboot before a reset) names the reason.
        let mut xids: Vec<(crate::model::XidAction, u32, u64, usize)> = self
            .xids
            .iter()
            .filter(|(_, seen)| !seen.at.is_empty())
            .filter_map(|(&(gpu, xid), seen)| {
                Some((catalogue::lookup(xid)?.action, gpu, xid, seen.at.len()))
            })
            .collect();
        xids.sort_by_key(|&(action, gpu, xid, _)| (std::cmp::Reverse(action), gpu, xid));
        for (_, gpu, xid, times) in xids {
            faults.push((
                format!("Xid{xid}"),
                text::fault_xid(gpu, xid, catalogue::lookup(xid), times, &hold),
            ));
        }
        match faults.first() {
            None => Condition {
                type_: GPU_FAULT,
                status: Status::False,
                reason: "NoGpuFault".into(),
                message: format!(
                    "No GPU is lost or missing, NVML asks for no GPU reset or node reboot, and \
                     no XID within the last {hold} calls for a GPU reset, a node reboot or the \
                     vendor."
                ),
            },
            Some((reason, _)) => Condition {
                type_: GPU_FAULT,
                status: Status::True,
                reason: reason.clone(),
                message: cut(faults
                    .iter()
                    .map(|(_, m)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
                    + "."),
            },
        }
    }
}

/// How far a recovery action goes: a reboot before a drain and reset before a reset.
fn action_rank(action: RecoveryAction) -> u8 {
    match action {
        RecoveryAction::NodeReboot => 3,
        RecoveryAction::DrainAndReset => 2,
        RecoveryAction::GpuReset => 1,
        RecoveryAction::None | RecoveryAction::DrainP2p => 0,
    }
}

/// `gpu_reset` -> `GpuReset`.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// NVML is not up: with GPUs the driver lists, nothing can be told (Unknown); without any,
/// there is nothing to be degraded.
fn no_nvml(snapshot: &Snapshot) -> Desired {
    let (status, reason, message) = if snapshot.driver_gpus.is_empty() {
        (
            Status::False,
            "NoGpus",
            "No NVIDIA GPU is listed by the driver on this node.".to_string(),
        )
    } else {
        (
            Status::Unknown,
            "NvmlUnavailable",
            format!(
                "The driver lists {} NVIDIA GPUs but NVML does not load, so GPU health is \
                 unknown: make the driver's libnvidia-ml.so.1 visible to shmlink.",
                snapshot.driver_gpus.len()
            ),
        )
    };
    let make = |type_| Condition {
        type_,
        status,
        reason: reason.into(),
        message: message.clone(),
    };
    Desired {
        link: make(GPU_LINK_DEGRADED),
        fault: make(GPU_FAULT),
    }
}

fn link_condition(pairs: &[PairVerdict]) -> Condition {
    let bad: Vec<&PairVerdict> = pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .collect();
    if bad.is_empty() {
        return Condition {
            type_: GPU_LINK_DEGRADED,
            status: Status::False,
            reason: "GpuPairsHealthy".into(),
            message: format!("All {} GPU pairs are ok.", pairs.len()),
        };
    }
    let down: Vec<&PairVerdict> = bad
        .iter()
        .copied()
        .filter(|p| p.status == PairStatus::Down)
        .collect();
    let degraded: Vec<&PairVerdict> = bad
        .iter()
        .copied()
        .filter(|p| p.status == PairStatus::Degraded)
        .collect();
    let mut parts = Vec::new();
    if !down.is_empty() {
        parts.push(format!("GPU pairs down: {}", name_pairs(&down)));
    }
    if !degraded.is_empty() {
        parts.push(format!("GPU pairs degraded: {}", name_pairs(&degraded)));
    }
    // A GPU in every bad pair is the likely culprit: name it.
    let common: BTreeSet<u32> = bad.iter().fold(
        [bad[0].gpu, bad[0].peer_gpu].into_iter().collect(),
        |acc, p| {
            acc.into_iter()
                .filter(|g| *g == p.gpu || *g == p.peer_gpu)
                .collect()
        },
    );
    let culprit = match (bad.len() > 1, common.iter().next()) {
        (true, Some(g)) => format!(" GPU {g} is in every one of them."),
        _ => String::new(),
    };
    let gpus: BTreeSet<u32> = bad.iter().flat_map(|p| [p.gpu, p.peer_gpu]).collect();
    let first = gpus.iter().next().copied().unwrap_or(0);
    Condition {
        type_: GPU_LINK_DEGRADED,
        status: Status::True,
        reason: if down.is_empty() {
            "GpuPairsDegraded"
        } else {
            "GpuPairsDown"
        }
        .into(),
        message: cut(format!(
            "{}.{culprit} Jobs across these GPUs fail or fall back to slower paths: drain the \
             node, then reset the GPUs named (`nvidia-smi -r -i {first}`) or reboot; replace the \
             GPU or NVSwitch whose links stay down.",
            parts.join("; ")
        )),
    }
}

/// `GPU 0 <-> GPU 1 (links 0, 1 of GPU 0), ...` with at most [`PAIRS_NAMED`] named.
fn name_pairs(pairs: &[&PairVerdict]) -> String {
    let mut named: Vec<String> = pairs
        .iter()
        .take(PAIRS_NAMED)
        .map(|p| {
            let links = if p.links.is_empty() {
                String::new()
            } else {
                let l: Vec<String> = p.links.iter().map(u32::to_string).collect();
                format!(
                    " (link{} {} of GPU {})",
                    if l.len() == 1 { "" } else { "s" },
                    l.join(", "),
                    p.gpu
                )
            };
            format!("GPU {} <-> GPU {}{links}", p.gpu, p.peer_gpu)
        })
        .collect();
    if pairs.len() > PAIRS_NAMED {
        named.push(format!("and {} more", pairs.len() - PAIRS_NAMED));
    }
    named.join(", ")
}

fn cut(mut s: String) -> String {
    if s.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests;

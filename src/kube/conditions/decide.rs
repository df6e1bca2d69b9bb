//! Pure: the two conditions, rendered from the snapshot's GPU verdicts (`gpu::verdict`) and
//! pair verdicts. Nothing is decided here: which GPU is lost, not in NVML, asked to reset by
//! NVML, or holds a fatal XID is the verdict's word.

use super::{Condition, Desired, Status, GPU_FAULT, GPU_LINK_DEGRADED};
use crate::gpu::xid::catalogue;
use crate::model::Snapshot;
use crate::model::{Blame, PairStatus, PairVerdict, RecoveryAction};
use crate::text::{self, ConditionReason};

/// The conditions `snapshot` calls for.
pub fn desired(snapshot: &Snapshot) -> Desired {
    if !snapshot.nvml_up {
        return no_nvml(snapshot);
    }
    Desired {
        link: link_condition(&snapshot.gpu_pairs, &snapshot.gpu_blame),
        fault: fault_condition(snapshot),
    }
}

fn fault_condition(snapshot: &Snapshot) -> Condition {
    let verdicts = &snapshot.gpu_verdicts;
    // (reason, sentence), worst first: lost GPUs, missing GPUs, then XIDs by GPU.
    let mut faults: Vec<(ConditionReason, String)> = Vec::new();
    for v in verdicts.iter().filter(|v| v.lost) {
        faults.push((
            ConditionReason::GpuLost,
            text::fault_gpu_lost(v.gpu.unwrap_or_default(), &v.pci_bus_id),
        ));
    }
    let missing: Vec<String> = verdicts
        .iter()
        .filter(|v| v.not_in_nvml)
        .map(|v| v.pci_bus_id.clone())
        .collect();
    if !missing.is_empty() {
        faults.push((
            ConditionReason::GpuNotInNvml,
            text::gpu_not_in_nvml(&missing, snapshot.driver_gpus.len(), snapshot.gpus.len())
                .trim_end_matches('.')
                .to_string(),
        ));
    }
    // The recovery action that goes furthest first.
    let mut actions: Vec<(RecoveryAction, u32, &str)> = verdicts
        .iter()
        .filter_map(|v| Some((v.recovery_action?, v.gpu?, v.pci_bus_id.as_str())))
        .collect();
    actions.sort_by_key(|&(action, gpu, _)| (std::cmp::Reverse(action_rank(action)), gpu));
    for (action, gpu, bus) in actions {
        faults.push((
            ConditionReason::RecoveryAction(action),
            text::fault_recovery_action(gpu, bus, action),
        ));
    }
    let hold = humantime::format_duration(snapshot.gpu_fault_hold).to_string();
    // The XID whose action goes furthest (a reboot before a reset) names the reason.
    let mut held: Vec<(u32, crate::model::HeldXid)> = verdicts
        .iter()
        .filter_map(|v| Some((v.gpu?, v)))
        .flat_map(|(g, v)| v.held_xids.iter().map(move |h| (g, *h)))
        .collect();
    held.sort_by_key(|(g, h)| (std::cmp::Reverse(h.action), *g, h.xid));
    for (gpu, h) in held {
        faults.push((
            ConditionReason::Xid(h.xid),
            text::fault_xid(gpu, h.xid, catalogue::lookup(h.xid), h.times, &hold),
        ));
    }
    match faults.first() {
        None => Condition {
            type_: GPU_FAULT,
            status: Status::False,
            reason: ConditionReason::NoGpuFault.to_string(),
            message: text::no_gpu_fault(&hold),
        },
        Some((reason, _)) => Condition {
            type_: GPU_FAULT,
            status: Status::True,
            reason: reason.to_string(),
            message: text::gpu_fault(&faults.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>()),
        },
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

/// NVML is not up: with GPUs the driver lists, nothing can be told (Unknown); without any,
/// there is nothing to be degraded.
fn no_nvml(snapshot: &Snapshot) -> Desired {
    let (status, reason, message) = if snapshot.driver_gpus.is_empty() {
        (Status::False, ConditionReason::NoGpus, text::no_gpus())
    } else {
        (
            Status::Unknown,
            ConditionReason::NvmlUnavailable,
            text::gpu_health_unknown(snapshot.driver_gpus.len()),
        )
    };
    let make = |type_| Condition {
        type_,
        status,
        reason: reason.to_string(),
        message: message.clone(),
    };
    Desired {
        link: make(GPU_LINK_DEGRADED),
        fault: make(GPU_FAULT),
    }
}

/// The culprit is the pair judge's (`Snapshot::gpu_blame`), never guessed again here.
fn link_condition(pairs: &[PairVerdict], blame: &Blame) -> Condition {
    let bad: Vec<&PairVerdict> = pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .collect();
    if bad.is_empty() {
        return Condition {
            type_: GPU_LINK_DEGRADED,
            status: Status::False,
            reason: ConditionReason::GpuPairsHealthy.to_string(),
            message: text::pairs_healthy(pairs.len()),
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
    Condition {
        type_: GPU_LINK_DEGRADED,
        status: Status::True,
        reason: if down.is_empty() {
            ConditionReason::GpuPairsDegraded
        } else {
            ConditionReason::GpuPairsDown
        }
        .to_string(),
        message: text::pairs_failing(&down, &degraded, blame),
    }
}

#[cfg(test)]
mod tests;

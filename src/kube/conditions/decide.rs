//! Pure: a snapshot (pair verdicts, GPUs NVML and the driver list, XID counts) -> the two
//! conditions. Fatal XIDs are held for their time (`gpu::xid::judge`); everything else is as the snapshot
//! says now.

use std::time::{Duration, Instant};

use super::{Condition, Desired, Status, GPU_FAULT, GPU_LINK_DEGRADED};
use crate::gpu::pci::not_in_nvml;
use crate::gpu::xid::{catalogue, FatalXids, HeldAges};
use crate::model::Snapshot;
use crate::model::{Blame, PairStatus, PairVerdict, RecoveryAction};
use crate::text::{self, ConditionReason};

/// Decides the conditions; remembers fatal XIDs for `hold`.
#[derive(Debug)]
pub struct ConditionJudge {
    hold: Duration,
    xids: FatalXids,
}

impl ConditionJudge {
    pub fn new(hold: Duration) -> ConditionJudge {
        ConditionJudge {
            hold,
            xids: FatalXids::new(hold),
        }
    }

    /// The fatal XIDs held now, for a restart to carry ([`FatalXids::ages`]).
    pub fn held_ages(&self, now: Instant) -> Vec<HeldAges> {
        self.xids.ages(now)
    }

    /// The fatal XIDs held now (the GPUs a device taint takes out).
    pub fn held_xids(&self) -> Vec<crate::gpu::xid::HeldXid> {
        self.xids.held()
    }

    /// Holds again what a restart carried ([`FatalXids::resume`]).
    pub fn resume_held(&mut self, held: Vec<HeldAges>, now: Instant) {
        self.xids.resume(held, now);
    }

    pub fn decide(&mut self, snapshot: &Snapshot, now: Instant) -> Desired {
        self.xids.observe(&snapshot.xids, now);
        if !snapshot.nvml_up {
            return no_nvml(snapshot);
        }
        Desired {
            link: link_condition(&snapshot.gpu_pairs, &snapshot.gpu_blame),
            fault: self.fault_condition(snapshot),
        }
    }

    fn fault_condition(&self, snapshot: &Snapshot) -> Condition {
        // (reason, sentence), worst first: lost GPUs, missing GPUs, then XIDs by GPU.
        let mut faults: Vec<(ConditionReason, String)> = Vec::new();
        for g in snapshot.gpus.iter().filter(|g| g.lost) {
            faults.push((
                ConditionReason::GpuLost,
                text::fault_gpu_lost(g.index, &g.pci_bus_id),
            ));
        }
        let missing = not_in_nvml(&snapshot.driver_gpus, &snapshot.gpus);
        if !missing.is_empty() {
            faults.push((
                ConditionReason::GpuNotInNvml,
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
                ConditionReason::RecoveryAction(action),
                text::fault_recovery_action(gpu, bus, action),
            ));
        }
        let hold = humantime::format_duration(self.hold).to_string();
        // The XID whose action goes furthest (a reboot before a reset) names the reason.
        for h in self.xids.held() {
            faults.push((
                ConditionReason::Xid(h.xid),
                text::fault_xid(h.gpu, h.xid, catalogue::lookup(h.xid), h.times, &hold),
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
                message: text::gpu_fault(
                    &faults.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>(),
                ),
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

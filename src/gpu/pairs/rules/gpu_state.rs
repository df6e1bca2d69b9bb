//! Rule 3c: what NVML says of a whole GPU. A recovery action that drains P2P (`drain_p2p`,
//! `drain_and_reset`) degrades every pair of the GPU; so does an unhealthy fabric registration
//! on an NVSwitch board, where every pair's traffic crosses the fabric. Both are `Broken`:
//! transfers fail rather than slow down. Their findings (`gpu_recovery_action`,
//! `gpu_fabric_unhealthy`) are made here too, one per GPU.

use std::collections::BTreeMap;

use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::model::RecoveryAction;
use crate::model::{Finding, FindingKind, Subject};
use crate::model::{PairReason, ReasonKind, Weight};
use crate::text;

pub(crate) fn gpu_state_rule(
    board: &Board<'_>,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (&g, gpu) in &board.gpus {
        if gpu.lost {
            continue;
        }
        let mut reasons = Vec::new();
        if let Some(action) = gpu.recovery_action.filter(|a| *a != RecoveryAction::None) {
            if action.drains_p2p() {
                reasons.push(PairReason::new(
                    ReasonKind::RecoveryDrainsP2p,
                    Weight::Broken,
                    text::reason_recovery_drains_p2p(g, action),
                ));
            }
            findings.push(Finding::new(
                FindingKind::GpuRecoveryAction,
                Subject::Gpu(g),
                text::gpu_recovery_action(g, &board.describe(g), action),
            ));
        }
        if let Some(problem) = gpu.fabric.as_ref().and_then(text::fabric_problem) {
            if board.nvswitch {
                reasons.push(PairReason::new(
                    ReasonKind::FabricUnhealthy,
                    Weight::Broken,
                    text::reason_fabric(g, &problem),
                ));
            }
            findings.push(Finding::new(
                FindingKind::GpuFabricUnhealthy,
                Subject::Gpu(g),
                text::gpu_fabric_unhealthy(g, &board.describe(g), &problem, board.nvswitch),
            ));
        }
        for (_, st) in pairs
            .iter_mut()
            .filter(|((a, b), _)| (*a == g || *b == g) && !board.is_lost((*a, *b)))
        {
            for r in &reasons {
                st.push(r.clone().naming(&[g]));
            }
        }
    }
    findings
}

//! The Node's conditions (`GpuLinkDegraded`, `GpuFault`): their reasons and messages, as the
//! systems that repair nodes, and the people who read `kubectl describe node`, see them.

use std::fmt;

use crate::model::{prefix_within, Blame, PairVerdict, RecoveryAction, SuspectBy};

/// A message longer than this is cut: a Node object is read by everything in the cluster.
pub const CONDITION_MESSAGE_MAX: usize = 1024;
/// Pairs named in a message before "and N more".
const PAIRS_NAMED: usize = 12;

/// A condition's `reason` (CamelCase, CONTRACT.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionReason {
    GpuPairsHealthy,
    GpuPairsDegraded,
    GpuPairsDown,
    NoGpuFault,
    GpuLost,
    GpuNotInNvml,
    /// `RecoveryActionGpuReset`, ...: what NVML asks for.
    RecoveryAction(RecoveryAction),
    /// `Xid79`, ...: a fatal XID within its hold.
    Xid(u64),
    /// NVML does not load, the driver lists no GPU.
    NoGpus,
    /// NVML does not load, the driver lists GPUs: Unknown.
    NvmlUnavailable,
}

impl fmt::Display for ConditionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConditionReason::GpuPairsHealthy => f.write_str("GpuPairsHealthy"),
            ConditionReason::GpuPairsDegraded => f.write_str("GpuPairsDegraded"),
            ConditionReason::GpuPairsDown => f.write_str("GpuPairsDown"),
            ConditionReason::NoGpuFault => f.write_str("NoGpuFault"),
            ConditionReason::GpuLost => f.write_str("GpuLost"),
            ConditionReason::GpuNotInNvml => f.write_str("GpuNotInNvml"),
            ConditionReason::RecoveryAction(a) => {
                write!(f, "RecoveryAction{}", camel(a.as_str()))
            }
            ConditionReason::Xid(xid) => write!(f, "Xid{xid}"),
            ConditionReason::NoGpus => f.write_str("NoGpus"),
            ConditionReason::NvmlUnavailable => f.write_str("NvmlUnavailable"),
        }
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

/// `GpuPairsHealthy`.
pub fn pairs_healthy(pairs: usize) -> String {
    format!("All {pairs} GPU pairs are ok.")
}

/// `GpuPairsDown` / `GpuPairsDegraded`: the pairs, the GPUs the pair judge blames (with their
/// reasons), and what to do: only a blamed GPU is ever named for a reset.
pub fn pairs_failing(down: &[&PairVerdict], degraded: &[&PairVerdict], blame: &Blame) -> String {
    let mut parts = Vec::new();
    if !down.is_empty() {
        parts.push(format!("GPU pairs down: {}", name_pairs(down)));
    }
    if !degraded.is_empty() {
        parts.push(format!("GPU pairs degraded: {}", name_pairs(degraded)));
    }
    let gpus: Vec<u32> = blame.suspects.iter().map(|s| s.gpu).collect();
    let resets = gpus
        .iter()
        .map(|g| format!("`nvidia-smi -r -i {g}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let reset = format!(
        "drain the node, then reset {} ({resets}) or reboot; replace a GPU whose links stay down",
        gpu_list(&gpus)
    );
    let (who, todo) = match blame.suspects.first().map(|s| s.by) {
        _ if blame.node_wide => (
            " Every pair of every GPU fails: the node, not one GPU (fabric manager, NVSwitch, \
             platform)."
                .to_string(),
            "drain the node, check `systemctl status nvidia-fabricmanager` and `nvidia-smi \
             nvlink -s`, then reboot it"
                .to_string(),
        ),
        None => (
            String::new(),
            "drain the node and check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p rw`"
                .to_string(),
        ),
        Some(SuspectBy::FailsWithAll) => (
            format!(
                " {} {} with every other GPU ({}).",
                gpu_list(&gpus),
                if gpus.len() == 1 { "fails" } else { "fail" },
                suspect_reasons(blame)
            ),
            reset,
        ),
        Some(SuspectBy::MostPairs) => (
            format!(
                " {} {} in the most of them ({} pairs each; {}).",
                gpu_list(&gpus),
                if gpus.len() == 1 { "is" } else { "are" },
                blame.suspects[0].bad_pairs,
                suspect_reasons(blame)
            ),
            reset,
        ),
        Some(SuspectBy::EitherEnd) => (
            " The failing pairs share no GPU: either end of each may be at fault.".to_string(),
            reset,
        ),
    };
    within_max(format!(
        "{}.{who} Jobs across these GPUs fail or fall back to slower paths: {todo}.",
        parts.join("; ")
    ))
}

/// `GPU 2`, `GPU 2 and GPU 4`, `GPU 1, GPU 2 and GPU 4`.
fn gpu_list(gpus: &[u32]) -> String {
    let named: Vec<String> = gpus.iter().map(|g| format!("GPU {g}")).collect();
    super::and_list(&named)
}

/// Each suspect's first reasons, as `GPU 4: ...; GPU 2: ...`.
fn suspect_reasons(blame: &Blame) -> String {
    blame
        .suspects
        .iter()
        .map(|s| {
            let r: Vec<&str> = s
                .reasons
                .iter()
                .take(2)
                .map(|r| prefix_within(r.as_str(), 160))
                .collect();
            format!("GPU {}: {}", s.gpu, r.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
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

/// One lost GPU in `GpuFault`'s message.
pub fn fault_gpu_lost(gpu: u32, bus: &str) -> String {
    format!(
        "GPU {gpu} ({bus}) is lost: NVML says it fell off the bus; drain the node, then reset \
         the GPU (`nvidia-smi -r -i {gpu}`) or reboot"
    )
}

/// `GpuFault` True: its faults, worst first.
pub fn gpu_fault(faults: &[String]) -> String {
    within_max(faults.join("; ") + ".")
}

/// `NoGpuFault`: `hold` is how long a fatal XID keeps the condition True.
pub fn no_gpu_fault(hold: &str) -> String {
    format!(
        "No GPU is lost or missing, NVML asks for no GPU reset or node reboot, and no XID \
         within the last {hold} calls for a GPU reset, a node reboot or the vendor."
    )
}

/// `NoGpus`.
pub fn no_gpus() -> String {
    "No NVIDIA GPU is listed by the driver on this node.".to_string()
}

/// `NvmlUnavailable`, both conditions Unknown.
pub fn gpu_health_unknown(driver_gpus: usize) -> String {
    format!(
        "The driver lists {driver_gpus} NVIDIA GPUs but NVML does not load, so GPU health is \
         unknown: make the driver's libnvidia-ml.so.1 visible to shmlink."
    )
}

/// At most [`CONDITION_MESSAGE_MAX`] bytes, `...` where it was cut.
fn within_max(s: String) -> String {
    if s.len() <= CONDITION_MESSAGE_MAX {
        return s;
    }
    let mut cut = prefix_within(&s, CONDITION_MESSAGE_MAX - 3).to_string();
    cut.push_str("...");
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_camel_case() {
        assert_eq!(
            ConditionReason::RecoveryAction(RecoveryAction::DrainAndReset).to_string(),
            "RecoveryActionDrainAndReset"
        );
        assert_eq!(ConditionReason::Xid(79).to_string(), "Xid79");
        assert_eq!(ConditionReason::GpuPairsDown.to_string(), "GpuPairsDown");
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(CONDITION_MESSAGE_MAX);
        let cut = gpu_fault(&[long]);
        assert!(cut.len() <= CONDITION_MESSAGE_MAX, "{}", cut.len());
        assert!(cut.ends_with("..."));
    }
}

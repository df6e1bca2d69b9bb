//! What a DeviceTaintRule of the agent says: why its GPU is out (the `shmlink.io/description`
//! annotation and the Node Events' note), and the agent's log lines about rules it cannot make.

use std::time::SystemTime;

use crate::model::{rfc3339, RecoveryAction};

/// A lost GPU.
pub fn taint_gpu_lost(gpu: u32) -> String {
    format!("NVML says GPU {gpu} is lost (fell off the bus)")
}

/// A held XID whose action is a reset, a reboot or the vendor; `what` its meaning.
pub fn taint_xid(gpu: u32, xid: u64, what: &str) -> String {
    format!("XID {xid} ({what}) on GPU {gpu}: it is unusable until reset")
}

/// NVML's recovery action.
pub fn taint_recovery_action(gpu: u32, action: RecoveryAction) -> String {
    format!(
        "NVML's recovery action for GPU {gpu} is {}",
        action.as_str()
    )
}

/// The pair judge's culprit: `all` when every pair of it fails, else it is in the most failing
/// pairs; `down` when a link of them is down rather than degraded.
pub fn taint_culprit(gpu: u32, bad_pairs: usize, all: bool, down: bool) -> String {
    let how = if down { "down" } else { "degraded" };
    if all {
        format!("GPU {gpu} fails with every peer GPU: its {bad_pairs} pairs are {how}")
    } else {
        format!("GPU {gpu} is in more failing pairs than any other GPU: {bad_pairs} pairs {how}")
    }
}

/// The rule's description: why, and since when (to the second).
pub fn taint_description(why: &str, since: SystemTime) -> String {
    let secs = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let since = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    format!("{why}; since {} (shmlink)", rfc3339(since))
}

/// A rule made: the Node Event's note.
pub fn taint_made(rule: &str, device: &str, effect: &str, description: &str) -> String {
    format!("DeviceTaintRule {rule} takes device {device} out (effect {effect}): {description}")
}

/// A rule lifted: the Node Event's note.
pub fn taint_lifted(rule: &str, device: &str, hold: &str) -> String {
    format!("DeviceTaintRule {rule} lifted: device {device} has been healthy for {hold}")
}

/// The cluster serves no DeviceTaintRule (logged once).
pub fn no_taint_api() -> &'static str {
    "the cluster serves no DeviceTaintRule (resource.k8s.io v1 or v1beta2; on 1.36 it needs the \
     DRADeviceTaintRules feature gate and runtime-config): no GPU is taken out by a device \
     taint; the Node condition (and --taint-on-gpu-fault) still say which GPU is bad"
}

/// No ResourceSlice of the node lists the GPU (logged once per GPU).
pub fn no_slice_device(gpu: u32, uuid: &str, node: &str) -> String {
    format!(
        "no ResourceSlice of node {node} lists GPU {gpu} ({uuid}): no DRA driver publishes it \
         (a device-plugin node?), so it is not taken out by a device taint; the Node condition \
         (and --taint-on-gpu-fault) still say it is bad"
    )
}

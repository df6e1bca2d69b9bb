//! One GPU out (`serve --gpu-device-taint`): a DRA `DeviceTaintRule` for each GPU the agent
//! blames, selecting that GPU's device in this node's ResourceSlices, so the scheduler stops
//! giving it to claims (`NoSchedule`), evicts its Pods (`NoExecute`), or only says so (`None`)
//! while the other GPUs of the node go on working.
//!
//! The flow is the Node conditions' (`super::conditions`): on the scan thread a pure judge
//! ([`TaintJudge`], `judge.rs`) turns each snapshot into the GPUs that should be out now
//! ([`Wanted`]: blamed now, or within the hold since last blamed), and [`DeviceTaintFeed`] hands
//! them to a task through a watch channel (the latest state wins; the scan never waits). The task
//! (`task.rs`) finds each GPU's device by UUID in the node's ResourceSlices (`slices.rs`), plans
//! against the rules the agent owns (`rules.rs`, pure: create, update, delete or nothing) and
//! applies the plan through the API version it discovered (`api.rs`). Where the cluster serves
//! no DeviceTaintRule or no slice lists the GPU (device-plugin clusters), it says so once and
//! makes nothing: the Node condition and the optional node taint go on as before.

mod api;
mod judge;
mod rules;
mod slices;
mod task;

pub use judge::{Blamed, TaintJudge, Wanted};
pub use rules::{mig_rule_name, node_label, rule_name};
pub use slices::{DeviceRef, SliceIndex};
pub use task::{spawn_device_taints, DeviceTaintFeed, DeviceTaintSettings};

/// Labels every rule of the agent carries; it touches no rule without both.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "shmlink";
pub const NODE_LABEL: &str = "shmlink.io/node";
/// Why and since when, in a sentence: a rule has no field for it.
pub const DESCRIPTION_ANNOTATION: &str = "shmlink.io/description";

/// What a rule does to the device's users (`spec.taint.effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Effect {
    /// Nothing: visible only (the device-taint controller says what NoExecute would evict).
    None,
    /// No new claim gets the device; its running Pods stay.
    NoSchedule,
    /// As NoSchedule, and the Pods using the device are evicted unless they tolerate it.
    NoExecute,
}

impl Effect {
    pub const ALL: [Effect; 3] = [Effect::None, Effect::NoSchedule, Effect::NoExecute];

    pub const fn as_str(self) -> &'static str {
        match self {
            Effect::None => "None",
            Effect::NoSchedule => "NoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }

    pub fn parse(s: &str) -> Option<Effect> {
        Effect::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

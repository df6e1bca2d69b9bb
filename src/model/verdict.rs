//! One GPU's verdict, made once per scan by `gpu::verdict` and only rendered by everything that
//! tells a GPU's health (Node conditions, device taints, metrics, `check`, `preflight`). Field
//! names are `check --json`'s `gpu_verdicts[]`.

use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

use super::{PcieLink, RecoveryAction, XidAction};

/// A fatal XID (a reset, a reboot, the vendor) held on a GPU for the hold after it was last
/// seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeldXid {
    pub xid: u64,
    #[serde(serialize_with = "action_str")]
    pub action: XidAction,
    /// Occurrences within the hold.
    pub times: usize,
    /// How long it stays held if not seen again.
    #[serde(serialize_with = "secs")]
    pub left: Duration,
}

fn action_str<S: Serializer>(a: &XidAction, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match a {
        XidAction::Ignore => "ignore",
        XidAction::RestartApp => "restart_app",
        XidAction::UpdateSoftware => "update_software",
        XidAction::ResetGpu => "reset_gpu",
        XidAction::RebootNode => "reboot_node",
        XidAction::ContactVendor => "contact_vendor",
    })
}

fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

/// The pair judge's blame on one GPU (`Blame::culprits`): never "either end" of a pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Culprit {
    /// Any of its failing pairs is down (else degraded).
    pub down: bool,
    pub bad_pairs: usize,
    /// It fails with every other GPU.
    pub fails_with_all: bool,
    /// Since when its failing pairs have failed, where the pair judge knows.
    #[serde(skip)]
    pub since: Option<SystemTime>,
}

/// Why a GPU should be out of scheduling, strongest first (the order of the variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutReason {
    Lost,
    Xid(u64),
    RecoveryAction(RecoveryAction),
    NvlinkDown,
    PairDegraded,
}

impl OutReason {
    /// The device taint's value.
    pub fn value(self) -> String {
        match self {
            OutReason::Lost => "gpu-lost".into(),
            OutReason::Xid(x) => format!("xid-{x}"),
            OutReason::RecoveryAction(_) => "recovery-action".into(),
            OutReason::NvlinkDown => "nvlink-down".into(),
            OutReason::PairDegraded => "pair-degraded".into(),
        }
    }
}

/// NVLink links the kernel log says failed to train on a GPU (XID 74 `failed to train link`,
/// XID 136 `Link training failed`), lately.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvlinkTraining {
    /// The links named, lowest first.
    pub links: Vec<u32>,
    /// Failures told since the agent started (`check`: since `--since`).
    pub count: u64,
}

/// An NVSwitch one of a GPU's NVLinks goes to that told a fatal SXID lately.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwitchFatal {
    /// The switch's PCI address, `0000:05:00.0`.
    pub switch: String,
    /// Its fatal SXIDs, lowest first.
    pub sxids: Vec<u64>,
}

/// A GPU's PCIe link trained below what it and its slot allow (`gpu::pairs` rule 7): narrower
/// at any load (lanes do not train down to save power), or of a lower generation while busy
/// (idle links drop their generation to save power).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcieDowntrain {
    /// Now and the most both ends allow; the generations are 0 where only sysfs told the link
    /// (it gives the width alone).
    #[serde(flatten)]
    pub link: PcieLink,
    /// NVML's utilization, when busy enough for a lower generation to count.
    pub busy: Option<u32>,
    /// The width is sysfs's (`current_link_width`, `max_link_width`): NVML gave none, or full.
    pub from_sysfs: bool,
    /// The GPU function's PCI address in sysfs; empty when not found there.
    pub bdf: String,
}

/// One GPU, as this scan judges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuVerdict {
    /// NVML's index; None for a GPU the driver lists and NVML does not.
    pub gpu: Option<u32>,
    /// Empty where NVML does not list it.
    pub uuid: String,
    pub pci_bus_id: String,
    /// NVML: GPU_IS_LOST.
    pub lost: bool,
    /// The driver lists it, NVML does not.
    pub not_in_nvml: bool,
    /// NVML's recovery action, when it asks for a reset or a reboot (no hold: NVML clears it
    /// once done).
    pub recovery_action: Option<RecoveryAction>,
    /// Fatal XIDs within the hold, the one whose action goes furthest first.
    pub held_xids: Vec<HeldXid>,
    /// What is wrong with its fabric registration, if anything.
    pub fabric_problem: Option<String>,
    /// The pair judge's blame, when it names this GPU.
    pub culprit: Option<Culprit>,
    /// Its NVLinks the kernel log says failed to train lately (the XID's evidence: it is held
    /// as any fatal XID is).
    pub nvlink_training: Option<NvlinkTraining>,
    /// The NVSwitches its NVLinks go to that told a fatal SXID lately.
    pub nvswitch_fatal: Vec<SwitchFatal>,
    /// Its PCIe link trained down; None when fine or not known. A fact with its fix: it does
    /// not take the GPU out.
    pub pcie: Option<PcieDowntrain>,
    /// IOMMU page faults the kernel log named it in (since the agent started; `check`: since
    /// `--since`), when one was told lately; else 0. Not a reason to take it out either.
    pub iommu_faults: u64,
    /// Why it should be out of scheduling now, the strongest reason; None: it may stay in.
    pub out: Option<OutReason>,
}

impl GpuVerdict {
    /// Whether it makes `GpuFault` True: lost, not in NVML, a recovery action, a held XID.
    pub fn is_fault(&self) -> bool {
        self.lost
            || self.not_in_nvml
            || self.recovery_action.is_some()
            || !self.held_xids.is_empty()
    }

    /// Whether anything but a held XID puts it out (a held XID carries its own hold).
    pub fn out_besides_xids(&self) -> bool {
        self.lost || self.recovery_action.is_some() || self.culprit.is_some()
    }
}

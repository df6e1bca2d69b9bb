//! Pure: one verdict per GPU, each scan, from what NVML said (lost, its recovery action, its
//! fabric), what the driver lists, the fatal XIDs held, the pair judge's blame and PCIe links
//! trained down, and the kernel log's facts told lately (NVLink training, NVSwitch SXIDs, IOMMU
//! faults). This is the
//! only place a GPU's health is decided: the Node conditions, the device taints, the metrics,
//! `check` and `preflight` render [`GpuVerdict`]s and decide nothing again.

use std::collections::BTreeMap;
use std::time::Instant;

use super::pci::{canonical, not_in_nvml, same_pci_device};
use super::xid::{FatalXids, Held};
use crate::model::{
    Blame, Culprit, Finding, FindingKind, GpuReading, GpuVerdict, NvlinkTraining, OutReason,
    PairStatus, PairVerdict, PcieDowntrain, Subject, SuspectBy, SwitchFatal, SxidCount,
    TrainingCount, XidCount,
};
use crate::text;

/// What one scan knows of the GPUs.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub nvml_up: bool,
    pub gpus: &'a [GpuReading],
    /// The PCI addresses the driver lists.
    pub driver_gpus: &'a [String],
    pub pairs: &'a [PairVerdict],
    pub blame: &'a Blame,
    /// The fatal XIDs within their hold, by GPU key ([`key`]).
    pub held: &'a [Held],
    /// The kernel log's NVLink training failures told lately, by GPU address.
    pub training: &'a [TrainingCount],
    /// The fatal SXIDs told lately, by switch.
    pub fatal_sxids: &'a [SxidCount],
    /// The PCIe links trained down, by GPU index (the pair judge's rule 7).
    pub pcie: &'a BTreeMap<u32, PcieDowntrain>,
    /// IOMMU faults per GPU index, of the GPUs one was told on lately.
    pub iommu: &'a BTreeMap<u32, u64>,
}

/// The key a GPU's held XIDs go by: its UUID, else (NVML does not list it, or gives no UUID)
/// its PCI address (`pci::canonical`), else `#<index>`.
pub fn key(g: &GpuReading) -> String {
    if !g.uuid.is_empty() {
        return g.uuid.clone();
    }
    canonical(&g.pci_bus_id).unwrap_or_else(|| format!("#{}", g.index))
}

/// Each GPU's key by NVML index.
pub fn keys(gpus: &[GpuReading]) -> BTreeMap<u32, String> {
    gpus.iter().map(|g| (g.index, key(g))).collect()
}

/// The held XIDs brought up to date with this scan's counts, keyed by [`key`] (a GPU NVML
/// does not list by its address); those within the hold at `now`.
pub fn hold_xids(
    fatal: &mut FatalXids,
    gpus: &[GpuReading],
    counts: &[XidCount],
    now: Instant,
) -> Vec<Held> {
    let keys = keys(gpus);
    fatal.rekey(&keys);
    let counts: Vec<(String, u64, u64)> = counts
        .iter()
        .map(|x| {
            let key = match x.gpu {
                Some(gpu) => keys.get(&gpu).cloned().unwrap_or_else(|| format!("#{gpu}")),
                None => x.pci_bus_id.clone(),
            };
            (key, x.xid, x.count)
        })
        .collect();
    fatal.observe(&counts, now);
    fatal.held(now)
}

/// The verdicts: NVML's GPUs by index, then those only the driver lists by address. Without
/// NVML nothing is told of any GPU (not healthy either: the outlets say unknown).
pub fn judge(f: &Facts<'_>) -> Vec<GpuVerdict> {
    if !f.nvml_up {
        return Vec::new();
    }
    let mut out: Vec<GpuVerdict> = f.gpus.iter().map(|g| of_nvml_gpu(f, g)).collect();
    out.sort_by_key(|v| v.gpu);
    for pci in not_in_nvml(f.driver_gpus, f.gpus) {
        let key = canonical(&pci).unwrap_or_else(|| pci.clone());
        out.push(GpuVerdict {
            gpu: None,
            uuid: String::new(),
            held_xids: held_on(f.held, &key),
            pci_bus_id: pci,
            lost: false,
            not_in_nvml: true,
            recovery_action: None,
            fabric_problem: None,
            culprit: None,
            nvlink_training: training_on(f.training, &key),
            // NVML gives no links of a GPU it does not list.
            nvswitch_fatal: Vec::new(),
            // NVML's link and the kernel log's IOMMU faults name GPUs by NVML's index.
            pcie: None,
            iommu_faults: 0,
            // No UUID to select its device by: the Node condition tells it.
            out: None,
        });
    }
    out
}

/// The findings of the kernel log's facts in `verdicts` (NVML's GPUs: a finding names a GPU
/// by index), one per GPU and fact.
pub fn kernel_findings(verdicts: &[GpuVerdict]) -> Vec<Finding> {
    let mut out = Vec::new();
    for v in verdicts {
        let Some(g) = v.gpu else { continue };
        if let Some(t) = &v.nvlink_training {
            out.push(Finding::new(
                FindingKind::GpuNvlinkTrainingFailed,
                Subject::Gpu(g),
                text::gpu_nvlink_training_failed(g, &t.links, t.count),
            ));
        }
        if !v.nvswitch_fatal.is_empty() {
            out.push(Finding::new(
                FindingKind::GpuNvswitchFatal,
                Subject::Gpu(g),
                text::gpu_nvswitch_fatal(g, &v.nvswitch_fatal),
            ));
        }
        if v.iommu_faults > 0 {
            out.push(Finding::new(
                FindingKind::GpuIommuFault,
                Subject::Gpu(g),
                text::gpu_iommu_fault(g, v.iommu_faults),
            ));
        }
    }
    out
}

/// The findings of the PCIe links trained down in `verdicts`, one per GPU; `gpus` name them.
pub fn pcie_findings(verdicts: &[GpuVerdict], gpus: &[GpuReading]) -> Vec<Finding> {
    let mut out = Vec::new();
    for v in verdicts {
        let (Some(i), Some(p)) = (v.gpu, &v.pcie) else {
            continue;
        };
        if let Some(g) = gpus.iter().find(|g| g.index == i) {
            out.push(pcie_finding(g, p));
        }
    }
    out
}

/// `gpu_pcie_degraded` of GPU `g`.
pub fn pcie_finding(g: &GpuReading, p: &PcieDowntrain) -> Finding {
    Finding::new(
        FindingKind::GpuPcieDegraded,
        Subject::Gpu(g.index),
        text::gpu_pcie_degraded(g.index, &text::gpu_describe(g), p.link, p.busy, &p.bdf),
    )
}

/// The training failures told on the GPU at `pci`.
fn training_on(training: &[TrainingCount], pci: &str) -> Option<NvlinkTraining> {
    training
        .iter()
        .find(|t| same_pci_device(&t.pci_bus_id, pci))
        .map(|t| NvlinkTraining {
            links: t.links.clone(),
            count: t.count,
        })
}

/// The switches of `g`'s NVLinks that told a fatal SXID: a switch no GPU links to is only
/// counted.
fn switches_fatal(sxids: &[SxidCount], g: &GpuReading) -> Vec<SwitchFatal> {
    let mut out: Vec<SwitchFatal> = Vec::new();
    for s in sxids.iter().filter(|s| s.fatal) {
        if !g.nvswitches.iter().any(|w| same_pci_device(w, &s.switch)) {
            continue;
        }
        match out.iter_mut().find(|f| f.switch == s.switch) {
            Some(f) => f.sxids.push(s.sxid),
            None => out.push(SwitchFatal {
                switch: s.switch.clone(),
                sxids: vec![s.sxid],
            }),
        }
    }
    out
}

fn held_on(held: &[Held], key: &str) -> Vec<crate::model::HeldXid> {
    held.iter()
        .filter(|h| h.gpu == key)
        .map(|h| h.xid)
        .collect()
}

fn of_nvml_gpu(f: &Facts<'_>, g: &GpuReading) -> GpuVerdict {
    // A lost GPU's recovery action is not its fault: being lost is.
    let recovery_action = g.recovery_action.filter(|a| a.is_fault() && !g.lost);
    let held_xids = held_on(f.held, &key(g));
    let culprit = f
        .blame
        .culprits()
        .find(|s| s.gpu == g.index)
        .map(|s| culprit(f.pairs, s.gpu, s.bad_pairs, s.by));
    let out = if g.lost {
        Some(OutReason::Lost)
    } else if let Some(h) = held_xids.iter().find(|h| h.action.is_fatal()) {
        Some(OutReason::Xid(h.xid))
    } else if let Some(a) = recovery_action {
        Some(OutReason::RecoveryAction(a))
    } else {
        culprit.as_ref().map(|c| {
            if c.down {
                OutReason::NvlinkDown
            } else {
                OutReason::PairDegraded
            }
        })
    };
    GpuVerdict {
        gpu: Some(g.index),
        uuid: g.uuid.clone(),
        pci_bus_id: g.pci_bus_id.clone(),
        lost: g.lost,
        not_in_nvml: false,
        recovery_action,
        held_xids,
        fabric_problem: g.fabric.as_ref().and_then(text::fabric_problem),
        culprit,
        nvlink_training: training_on(f.training, &g.pci_bus_id),
        nvswitch_fatal: switches_fatal(f.fatal_sxids, g),
        pcie: f.pcie.get(&g.index).cloned(),
        iommu_faults: f.iommu.get(&g.index).copied().unwrap_or(0),
        out,
    }
}

fn culprit(pairs: &[PairVerdict], gpu: u32, bad_pairs: usize, by: SuspectBy) -> Culprit {
    let failing = pairs
        .iter()
        .filter(|p| (p.gpu == gpu || p.peer_gpu == gpu) && p.status != PairStatus::Ok);
    Culprit {
        down: failing.clone().any(|p| p.status == PairStatus::Down),
        bad_pairs,
        fails_with_all: by == SuspectBy::FailsWithAll,
        since: failing.filter_map(|p| p.since).min(),
    }
}

#[cfg(test)]
mod tests;

//! GPUs, their links and pairs, XIDs and NVML.

use std::time::Duration;

use super::{joined, pair_status, pairs_with, secs};
use crate::model::{
    AerTotals, GpuReading, PairReason, PairStatus, PcieHop, PcieLink, RecoveryAction, Weight,
    XidAction, XidEntry,
};

/// ` (GPU-…, NVIDIA H100, PCI 0000:…)`, with what is known of `g`.
pub fn gpu_describe(g: &GpuReading) -> String {
    let mut parts = Vec::new();
    for (prefix, value) in [("", &g.uuid), ("", &g.name), ("PCI ", &g.pci_bus_id)] {
        if !value.is_empty() {
            parts.push(format!("{prefix}{value}"));
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// `gpu_xid`; `entry`: what the catalogue says of it.
pub fn xid(gpu: u32, xid: u64, count: u64, entry: Option<XidEntry>) -> String {
    let said = match entry {
        Some(e) => format!(
            "{}; NVIDIA's XID catalogue: {}",
            e.what,
            xid_advice(e.action)
        ),
        None => "not in NVIDIA's XID catalogue".to_string(),
    };
    format!("XID {xid} on GPU {gpu} ({count} since the agent started): {said}.")
}

/// What an XID's catalogue action asks of a person.
pub const fn xid_advice(action: XidAction) -> &'static str {
    match action {
        XidAction::Ignore => "no action needed",
        XidAction::RestartApp => "restart the application that hit it",
        XidAction::UpdateSoftware => "update the driver or firmware",
        XidAction::ResetGpu => "drain the node and reset the GPU (or reboot the node)",
        XidAction::RebootNode => "drain and reboot the node",
        XidAction::ContactVendor => "drain the node and contact the hardware vendor",
    }
}

/// One fatal XID in `GpuFault`'s message: `times` seen within `hold` (a repeat escalates, as
/// a fault that comes back after its action calls for the vendor).
pub fn fault_xid(gpu: u32, xid: u64, entry: Option<XidEntry>, times: usize, hold: &str) -> String {
    let (what, advice) = entry.map_or(("unknown", "drain the node"), |e| {
        (e.what, xid_advice(e.action))
    });
    if times > 1 {
        format!(
            "XID {xid} ({what}) seen {times} times on GPU {gpu} within {hold}: it came back, so \
             {advice}, and if it returns after that, replace the GPU or contact the vendor"
        )
    } else {
        format!("XID {xid} ({what}) on GPU {gpu}: {advice}")
    }
}

/// A GPU the driver lists that NVML does not see, by its PCI bus id.
pub fn gpu_not_in_nvml(bus_ids: &[String], driver: usize, nvml: usize) -> String {
    format!(
        "The driver lists {driver} NVIDIA GPUs but NVML sees {nvml}: {} {} missing (fallen off \
         the bus, or failed to initialise). Drain the node, check `dmesg` for Xid 79, then reset \
         or reboot; replace the GPU if it stays missing.",
        bus_ids.join(", "),
        if bus_ids.len() == 1 { "is" } else { "are" }
    )
}

/// The part `check` and `preflight` share when the driver shows GPUs and NVML does not load.
pub fn nvml_not_loading(evidence: &str, reason: &str) -> String {
    format!("{evidence} but NVML does not load ({reason})")
}

/// `nvml_unavailable`.
pub fn nvml_unavailable(evidence: &str, reason: &str) -> String {
    format!(
        "{}: GPU link health is unknown. Make the driver's libnvidia-ml.so.1 visible to shmlink \
         (the NVIDIA container runtime, or --nvml-lib).",
        nvml_not_loading(evidence, reason)
    )
}

/// The note of `GpuLinkRecovered`: `about` is what the failure was about (`GPU 7`).
pub fn gpu_links_recovered(about: &str) -> String {
    format!("{about}: GPU links healthy again")
}

/// `gpu_lost`. `describe`: ` (GPU-…, name, PCI …)`; `down`: the GPUs it no longer reaches.
pub fn gpu_lost(g: u32, describe: &str, down: &[u32]) -> String {
    format!(
        "GPU {g}{describe} is lost: NVML reports it fell off the bus, so every job using it \
         fails{}. Drain the node, check `dmesg` for Xid 79, then reset the GPU \
         (`nvidia-smi -r -i {g}`) or reboot; replace it if it falls off again.",
        if down.is_empty() {
            String::new()
        } else {
            format!(" and its {} are down", pairs_with(down))
        },
    )
}

/// The broken-GPU case: GPU `g` fails with every other GPU.
pub fn gpu_fails_with_all(
    g: u32,
    describe: &str,
    peers: &[u32],
    state: &str,
    reasons: &str,
) -> String {
    format!(
        "GPU {g}{describe} fails with every other GPU: all {} of its pairs ({}) are {state}, so \
         any job that uses GPU {g} together with another GPU can crash or hang in collectives \
         such as all-reduce. Reasons: {reasons}. Drain the node (or keep jobs off GPU {g}) and \
         reset or replace GPU {g}; confirm with `nvidia-smi nvlink -s -i {g}`, `nvidia-smi \
         nvlink -e -i {g}` and `nvidia-smi topo -p2p rw`.",
        peers.len(),
        pairs_with(peers),
    )
}

/// Every pair of every live GPU fails: a node-wide cause.
pub fn all_pairs_fail(pairs: usize, gpus: usize, state: &str, reasons: &str) -> String {
    format!(
        "Every one of the {pairs} pairs of the {gpus} GPUs is {state}, which points at the node \
         rather than one GPU. Reasons: {reasons}. Drain the node; on an NVSwitch system check the \
         fabric manager (`systemctl status nvidia-fabricmanager`), and check `nvidia-smi nvlink \
         -s` and `nvidia-smi topo -p2p rw`."
    )
}

/// One failing pair, with what to do for how badly it fails.
pub fn pair_fails(
    a: u32,
    b: u32,
    status: PairStatus,
    weight: Option<Weight>,
    reasons: &[PairReason],
) -> String {
    let advice = match weight {
        Some(Weight::Down) => {
            "Jobs using these two GPUs together crash or hang at their first collective: drain \
             the node, check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p rw`, then reseat \
             or replace the GPU or its NVLink bridge."
        }
        Some(Weight::Broken) => {
            "Peer-to-peer transfers between them fail or fall back: drain the node, check \
             `nvidia-smi topo -p2p rw` and `nvidia-smi nvlink -s`, then reset or replace the GPU."
        }
        _ => {
            "The link still carries traffic but retries transfers, so jobs slow down: watch \
             `nvidia-smi nvlink -e`, and drain the node to reseat or replace the GPU if the \
             counters keep growing."
        }
    };
    format!(
        "GPU {a} <-> GPU {b} is {}: {}. {advice}",
        pair_status(status),
        joined(reasons)
    )
}

/// `gpu_recovery_action`: what NVML says GPU `g` needs, and what to do.
pub fn gpu_recovery_action(g: u32, describe: &str, action: RecoveryAction) -> String {
    let what = match action {
        RecoveryAction::None => return format!("NVML asks for no recovery action on GPU {g}."),
        RecoveryAction::DrainP2p => {
            "to drain peer-to-peer traffic: its P2P transfers are not safe. Drain the node of multi-GPU jobs; NVML clears the action once the GPU has recovered, else reset it"
        }
        RecoveryAction::GpuReset => {
            "a GPU reset: drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"
        }
        RecoveryAction::DrainAndReset => {
            "to drain peer-to-peer traffic and reset the GPU: drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"
        }
        RecoveryAction::NodeReboot => "a node reboot: drain the node, then reboot it",
    };
    format!(
        "NVML's recovery action for GPU {g}{describe} is {} ({}); jobs on it fail until that is done.",
        action.as_str(),
        what.replace("{g}", &g.to_string()),
    )
}

/// A `GpuFault` sentence for NVML's recovery action on GPU `g` at PCI `bus`.
pub fn fault_recovery_action(g: u32, bus: &str, action: RecoveryAction) -> String {
    let todo = match action {
        RecoveryAction::NodeReboot => "drain the node, then reboot it".to_string(),
        _ => format!("drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"),
    };
    format!(
        "NVML's recovery action for GPU {g} ({bus}) is {}: {todo}",
        action.as_str()
    )
}

/// `gpu_fabric_unhealthy`: GPU `g`'s NVSwitch fabric registration or health. `problem` is
/// [`crate::model::FabricInfo::problem`].
pub fn gpu_fabric_unhealthy(g: u32, describe: &str, problem: &str, nvswitch: bool) -> String {
    format!(
        "GPU {g}{describe}: {problem}{}. Check the fabric manager (`systemctl status nvidia-fabricmanager`, `nvidia-smi -q -i {g} | grep -A4 Fabric`), then reset the GPU or reboot the node if it does not register.",
        if nvswitch {
            ", so its NVLink traffic through the NVSwitches fails or runs slow"
        } else {
            ""
        }
    )
}

/// `gpu_link_errors`: counter growth on GPU `g` that made no pair fail yet.
pub fn link_errors(g: u32, describe: &str, window: Duration, parts: &[String]) -> String {
    format!(
        "NVLink errors on GPU {g}{describe} in the last {} s: {}. No GPU pair fails because of \
         them yet, but a link that keeps counting errors is marginal: watch \
         `nvidia-smi nvlink -e -i {g}` and reseat or replace the GPU or its NVLink \
         bridge if they keep growing.",
        secs(window),
        parts.join("; "),
    )
}

/// Why NVML did not load: from `lib` (None: the system's libnvidia-ml.so.1), and NVML's error.
pub fn nvml_load_failed(lib: Option<&std::path::Path>, error: &dyn std::fmt::Display) -> String {
    match lib {
        Some(lib) => format!("loading NVML from {}: {error}", lib.display()),
        None => format!("loading NVML (libnvidia-ml.so.1): {error}"),
    }
}

/// The evidence of a GPU without NVML: the driver's list at `path`.
pub fn driver_lists_gpus(path: &std::path::Path) -> String {
    format!("{} lists NVIDIA GPUs", path.display())
}

/// The evidence of a GPU without NVML: its device node.
pub const DEV_NVIDIA0_EXISTS: &str = "/dev/nvidia0 exists";

/// `gpu_pcie_degraded`: a GPU's link narrower than it and its slot allow (at any load), or of a
/// lower generation while busy (`busy`: its utilization then). A generation of 0 is not known
/// (the width from sysfs alone).
pub fn gpu_pcie_degraded(
    g: u32,
    describe: &str,
    link: PcieLink,
    busy: Option<u32>,
    bdf: &str,
) -> String {
    let lspci = if bdf.is_empty() {
        String::new()
    } else {
        format!(", `sudo lspci -vv -s {bdf} | grep LnkSta`")
    };
    let gen = |n: u32| {
        if n == 0 {
            String::new()
        } else {
            format!("Gen{n} ")
        }
    };
    let now = format!("{}x{}", gen(link.gen), link.width);
    let most = format!("{}x{}", gen(link.max_gen), link.max_width);
    let when = match busy {
        Some(b) => format!(" while the GPU is busy ({b}% utilized)"),
        None => String::new(),
    };
    let narrow = if link.width < link.max_width {
        format!(
            " Only {} of its {} lanes trained (a link does not drop lanes to save power): host-GPU",
            link.width, link.max_width
        )
    } else {
        " Host-GPU".to_string()
    };
    format!(
        "The PCIe link of GPU {g}{describe} runs at {now}{when}, below the {most} it and its slot \
         allow.{narrow} copies, and P2P over PCIe, get a fraction of the bandwidth. \
         Reseat the GPU (or its riser or cable) and check the slot's link-speed setting in the \
         BIOS; `nvidia-smi -q -i {g} -d PCIE`{lspci} show the link."
    )
}

/// `gpu_iommu_fault`: the IOMMU blocked DMAs of GPU `g`.
pub fn gpu_iommu_fault(g: u32, count: u64) -> String {
    format!(
        "The IOMMU blocked {count} DMA{} of GPU {g} (an IO_PAGE_FAULT naming it in the kernel \
         log): peer-to-peer traffic the IOMMU does not map fails or hangs, a known cause of NCCL \
         P2P hangs. Boot with `iommu=pt` so devices DMA untranslated, or turn off ACS redirect on \
         the PCIe switch ports between the GPUs; `dmesg | grep -e IO_PAGE_FAULT -e DMAR` shows \
         the faults.",
        if count == 1 { "" } else { "s" }
    )
}

/// `gpu_pcie_errors`: AER growth on the GPU and the bridges above it.
pub fn gpu_pcie_errors(
    g: u32,
    describe: &str,
    grown: &[(&PcieHop, AerTotals)],
    window: Duration,
) -> String {
    let parts: Vec<String> = grown
        .iter()
        .map(|(hop, d)| {
            let mut counts = Vec::new();
            for (n, what) in [
                (d.fatal, "fatal"),
                (d.nonfatal, "non-fatal"),
                (d.correctable, "correctable"),
            ] {
                if n > 0 {
                    counts.push(format!("+{n} {what}"));
                }
            }
            let which = if hop.bridge {
                "the bridge above it"
            } else {
                "the GPU"
            };
            format!("{} at {} ({which})", counts.join(", "), hop.bdf)
        })
        .collect();
    let severe = grown.iter().any(|(_, d)| d.fatal + d.nonfatal > 0);
    let advice = if severe {
        "Uncorrectable errors lose or corrupt transfers: drain the node, reseat the GPU and its \
         riser or cable, and have the slot or switch checked if they come back."
    } else {
        "Correctable errors are retried in hardware, so transfers slow down before anything \
         fails; if they keep counting, reseat the GPU and its riser or cable at the next \
         maintenance."
    };
    format!(
        "PCIe AER errors on the path of GPU {g}{describe} in the last {} min: {}. {advice} \
         `sudo lspci -vv -s <device> | grep -A3 UESta` shows the latest.",
        window.as_secs() / 60,
        parts.join("; ")
    )
}

/// A pair's reason: a bridge between the two redirects P2P.
pub fn reason_acs(bdf: &str, ctrl: u16) -> String {
    format!("ACS on PCIe bridge {bdf} redirects P2P to the root complex (ACSCtl {ctrl:#06x})")
}

/// `pcie_acs_enabled`: the bridges, their control words and the GPUs each lies between.
pub fn pcie_acs_enabled(bridges: &[(&str, u16, Vec<u32>)]) -> String {
    let named: Vec<String> = bridges
        .iter()
        .map(|(bdf, ctrl, gpus)| {
            let g: Vec<String> = gpus.iter().map(u32::to_string).collect();
            format!("{bdf} (ACSCtl {ctrl:#06x}, between GPUs {})", g.join(", "))
        })
        .collect();
    let first = bridges.first().map_or("<bridge>", |b| b.0);
    format!(
        "ACS redirects peer-to-peer traffic on PCIe bridges between GPUs: {}. GPU P2P then goes \
         up through the root complex (much slower) or is blocked, and NCCL hangs or crawls. On \
         bare metal, disable IO virtualization (VT-d/IOMMU) in the BIOS, or ACS on these \
         bridges (`sudo setpci -s {first} ECAP_ACS+0x6.w=0000`, lost at reboot); \
         `sudo lspci -vvv | grep ACSCtl` shows them.",
        named.join(", ")
    )
}

/// `gpu_nvlink_training_failed`: the kernel log says GPU `g`'s `links` failed to train.
pub fn gpu_nvlink_training_failed(g: u32, links: &[u32], count: u64) -> String {
    let named: Vec<String> = links.iter().map(u32::to_string).collect();
    format!(
        "NVLink{s} {} of GPU {g} failed to train ({count} time{t} in the kernel log: XID 74 \
         `failed to train link` or XID 136 `Link training failed`): {it} carr{ies} no traffic, \
         so NCCL routes around {it} or hangs. Reset the GPU (`nvidia-smi -r -i {g}`, after \
         draining it); on an NVSwitch system make sure the fabric manager runs (`systemctl \
         status nvidia-fabricmanager`), as it trains the links; if the same links fail again, \
         reseat the GPU's baseboard or NVLink bridge. `nvidia-smi nvlink -s -i {g}` shows the \
         links.",
        named.join(", "),
        s = if links.len() == 1 { "" } else { "s" },
        t = if count == 1 { "" } else { "s" },
        it = if links.len() == 1 { "it" } else { "they" },
        ies = if links.len() == 1 { "ies" } else { "y" },
    )
}

/// `gpu_nvswitch_fatal`: NVSwitches GPU `g`'s NVLinks go to told fatal SXIDs.
pub fn gpu_nvswitch_fatal(g: u32, switches: &[crate::model::SwitchFatal]) -> String {
    let said: Vec<String> = switches
        .iter()
        .map(|s| {
            let sxids: Vec<String> = s.sxids.iter().map(u64::to_string).collect();
            format!("{} (SXID {})", s.switch, sxids.join(", "))
        })
        .collect();
    format!(
        "The NVSwitch{es} {} that NVLinks of GPU {g} go to told a fatal SXID in the kernel log: \
         the fabric through {them} is down for this GPU, and NVLink traffic to its peers fails \
         or hangs. Drain the GPUs linked to {them} and reset the switch{es} with {their} GPUs \
         (`nvidia-smi -r`, with the fabric manager stopped, then started again), or reboot the \
         node; if the same SXID comes back, call the vendor. `dmesg | grep SXid` shows them.",
        said.join(", "),
        es = if switches.len() == 1 { "" } else { "es" },
        them = if switches.len() == 1 { "it" } else { "them" },
        their = if switches.len() == 1 { "its" } else { "their" },
    )
}

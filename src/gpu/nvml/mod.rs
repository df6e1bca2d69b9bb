//! The only module that talks to NVML (the raw symbols in `raw.rs`). Handles are cached at
//! load; every call here is blocking and runs on the scan thread or the XID thread, never on
//! the async runtime.
//!
//! nvml-wrapper is used where it is right. Some calls go through the raw `nvml-wrapper-sys`
//! symbols instead: `remote_device_type` (nvml-wrapper writes the answer into a temporary and
//! always returns Unknown), the DL ECC data counter (no `ErrorCounter` variant), per-link
//! field values (`field_values_for` always sends scopeId 0; the NVLink5 counters and the
//! recovery action go in one call per GPU) and the fabric info (not wrapped). Each raw symbol is
//! checked to be loaded before it is called: an old driver may lack it.

use std::collections::HashMap;
use std::path::Path;

use nvml_wrapper::enum_wrappers::device::{
    P2pCapabilitiesIndex, P2pStatus as NvP2p, TopologyLevel as NvTopology,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use crate::model::{
    GpuProcess, GpuReading, GpuSample, LinkErrors, LinkReading, P2pCaps, P2pStatus, PairSample,
    PcieLink, Peer, PlatformInfo, TopologyLevel,
};

mod raw;

pub use raw::{fabric_info, nvlink_domain, return_name, serial_text};

/// PCI location (domain, bus, device): how a link's remote end is matched to our GPUs.
type PciKey = (u32, u32, u32);

struct CachedGpu {
    index: u32,
    /// None when the handle could not be had (a GPU lost before we started).
    device: Option<Device<'static>>,
    uuid: String,
    name: String,
    pci_bus_id: String,
    /// Read once: neither changes while the driver runs.
    platform: Option<PlatformInfo>,
    vbios: Option<String>,
}

/// A loaded NVML with its device handles.
pub struct NvmlGpus {
    nvml: &'static Nvml,
    gpus: Vec<CachedGpu>,
    by_pci: HashMap<PciKey, u32>,
}

/// What one sample cost, for the scan's self metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct SampleStats {
    pub errors: u64,
    pub calls: u64,
}

impl NvmlGpus {
    /// Loads NVML (the system's library, or `lib`) and caches every device handle.
    pub fn open(lib: Option<&Path>) -> Result<NvmlGpus, NvmlError> {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib.as_os_str());
        }
        // Leaked on purpose: the agent keeps NVML for its whole life, the XID thread shares it,
        // and cached `Device`s borrow it. Dropping would call nvmlShutdown under their feet.
        let nvml: &'static Nvml = Box::leak(Box::new(builder.init()?));
        let count = nvml.device_count()?;
        let mut gpus = Vec::new();
        let mut by_pci = HashMap::new();
        for index in 0..count {
            let gpu = match nvml.device_by_index(index) {
                Ok(device) => {
                    let pci = device.pci_info().ok();
                    if let Some(p) = &pci {
                        by_pci.insert((p.domain, p.bus, p.device), index);
                    }
                    CachedGpu {
                        index,
                        uuid: device.uuid().unwrap_or_default(),
                        name: device.name().unwrap_or_default(),
                        pci_bus_id: pci.map(|p| p.bus_id).unwrap_or_default(),
                        platform: None,
                        vbios: device.vbios_version().ok(),
                        device: Some(device),
                    }
                }
                Err(e) => {
                    tracing::warn!(gpu = index, "no handle for GPU {index}: {e}");
                    CachedGpu {
                        index,
                        device: None,
                        uuid: String::new(),
                        name: String::new(),
                        pci_bus_id: String::new(),
                        platform: None,
                        vbios: None,
                    }
                }
            };
            gpus.push(gpu);
        }
        let mut loaded = NvmlGpus { nvml, gpus, by_pci };
        for i in 0..loaded.gpus.len() {
            let platform = loaded.gpus[i]
                .device
                .as_ref()
                .and_then(|d| loaded.platform(d));
            loaded.gpus[i].platform = platform;
        }
        Ok(loaded)
    }

    pub fn nvml(&self) -> &'static Nvml {
        self.nvml
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// The cached handles, for the XID thread.
    pub fn devices(&self) -> Vec<(u32, Device<'static>)> {
        self.gpus
            .iter()
            .filter_map(|g| {
                let d = g.device.as_ref()?;
                // SAFETY: a copy of a live handle; Device has no destructor of its own.
                Some((g.index, unsafe { Device::new(d.handle(), self.nvml) }))
            })
            .collect()
    }

    /// Free and total bytes of each GPU's memory, where NVML reports them (the probe's size check).
    pub fn memory(&self) -> Vec<(u32, u64, u64)> {
        self.devices()
            .into_iter()
            .filter_map(|(gpu, d)| d.memory_info().ok().map(|m| (gpu, m.free, m.total)))
            .collect()
    }

    /// UUID by index, for the XID thread's reports.
    pub fn uuids(&self) -> Vec<(u32, String)> {
        self.gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect()
    }

    /// One pass over every GPU, link and pair.
    pub fn sample(&self) -> (GpuSample, SampleStats) {
        let mut stats = SampleStats::default();
        let gpus: Vec<GpuReading> = self
            .gpus
            .iter()
            .map(|g| self.read_gpu(g, &mut stats))
            .collect();
        let mut pairs = Vec::new();
        for (i, a) in self.gpus.iter().enumerate() {
            for b in &self.gpus[i + 1..] {
                let both = (gpus[a.index as usize].lost || gpus[b.index as usize].lost)
                    .then_some(())
                    .map_or((a.device.as_ref(), b.device.as_ref()), |_| (None, None));
                pairs.push(match both {
                    (Some(da), Some(db)) => read_pair(a.index, da, b.index, db, &mut stats),
                    _ => PairSample {
                        gpu: a.index,
                        peer_gpu: b.index,
                        p2p: None,
                        topology: None,
                    },
                });
            }
        }
        (
            GpuSample {
                gpus,
                pairs,
                hypervisor: None,
                probes: Vec::new(),
            },
            stats,
        )
    }

    fn read_gpu(&self, g: &CachedGpu, stats: &mut SampleStats) -> GpuReading {
        let mut reading = GpuReading {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            platform: g.platform.clone(),
            vbios: g.vbios.clone(),
            ..GpuReading::default()
        };
        let Some(device) = &g.device else {
            reading.lost = true;
            return reading;
        };
        stats.calls += 1;
        match device.pcie_replay_counter() {
            Ok(n) => reading.pcie_replays = Some(u64::from(n)),
            Err(NvmlError::GpuLost) => {
                reading.lost = true;
                return reading;
            }
            Err(e) => count_unless_unsupported(&e, stats),
        }
        match self.read_links(device, &mut reading.nvswitches, stats) {
            Some(links) => reading.links = links,
            None => {
                reading.lost = true;
                return reading;
            }
        }
        self.read_fields(device, &mut reading, stats);
        reading.fabric = self.fabric(device, stats);
        reading.processes = processes(device, stats);
        reading.pcie_link = pcie_link(device, stats);
        stats.calls += 1;
        reading.utilization_percent = device
            .utilization_rates()
            .map_err(|e| count_unless_unsupported(&e, stats))
            .ok()
            .map(|u| u.gpu);
        reading
    }

    /// Links 0.. until NVML says NOT_SUPPORTED: state, far end, error counters. None: the GPU
    /// is lost.
    fn read_links(
        &self,
        device: &Device<'static>,
        switches: &mut Vec<String>,
        stats: &mut SampleStats,
    ) -> Option<Vec<LinkReading>> {
        let mut links = Vec::new();
        // Cleared at the first link where the DL counter call answers NOT_SUPPORTED and the DL
        // fields do not answer either (an NVLink5 GPU): the other links would say the same.
        let mut dl_counters = true;
        for link in 0..sys::NVML_NVLINK_MAX_LINKS {
            stats.calls += 1;
            let nvlink = device.link_wrapper_for(link);
            let active = match nvlink.is_active() {
                Ok(active) => active,
                // Links are numbered from 0; the first unsupported one ends the list.
                // A library without the NVLink state call has no NVLink view at all.
                Err(
                    NvmlError::NotSupported
                    | NvmlError::InvalidArg
                    | NvmlError::FailedToLoadSymbol(_),
                ) => break,
                Err(NvmlError::GpuLost) => return None,
                Err(_) => {
                    stats.errors += 1;
                    continue;
                }
            };
            let (peer, switch) = self.peer_of(device, link, stats);
            if let Some(pci) = switch.filter(|p| !switches.contains(p)) {
                switches.push(pci);
                switches.sort();
            }
            let errors = if dl_counters {
                let (errors, unsupported) = self.link_errors(device, link, stats);
                dl_counters = !unsupported;
                errors
            } else {
                None
            };
            links.push(LinkReading {
                link,
                active,
                peer,
                errors,
                nvlink5: None,
            });
        }
        Some(links)
    }

    /// The remote end of a link: one of our GPUs by PCI location, else by remote device type;
    /// and a switch's PCI address (`pci::canonical`), where NVML gives it (its SXIDs name it).
    fn peer_of(
        &self,
        device: &Device<'static>,
        link: u32,
        stats: &mut SampleStats,
    ) -> (Peer, Option<String>) {
        stats.calls += 1;
        let remote = match device.link_wrapper_for(link).remote_pci_info() {
            Ok(p) => p,
            Err(_) => return (Peer::Unknown, None),
        };
        if let Some(&index) = self.by_pci.get(&(remote.domain, remote.bus, remote.device)) {
            return (Peer::Gpu(index), None);
        }
        stats.calls += 1;
        match self.remote_device_type(device, link) {
            Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH) => {
                (Peer::Switch, crate::gpu::pci::canonical(&remote.bus_id))
            }
            _ if !remote.bus_id.is_empty() => (Peer::Pci(remote.bus_id), None),
            _ => (Peer::Unknown, None),
        }
    }

    /// The five DL error counters; through field values (scoped to the link) where the counter
    /// call is not supported, as on newer GPUs. The flag: neither path has them on this GPU.
    fn link_errors(
        &self,
        device: &Device<'static>,
        link: u32,
        stats: &mut SampleStats,
    ) -> (Option<LinkErrors>, bool) {
        let nvlink = device.link_wrapper_for(link);
        // Counted one by one: the first that fails (NOT_SUPPORTED on NVLink5) ends the try.
        let mut counter = |kind| {
            stats.calls += 1;
            nvlink.error_counter(kind)
        };
        let direct = (|| {
            Ok::<_, NvmlError>(LinkErrors {
                replay: counter(ErrorCounter::DlReplay)?,
                recovery: counter(ErrorCounter::DlRecovery)?,
                crc_flit: counter(ErrorCounter::DlCrcFlit)?,
                crc_data: counter(ErrorCounter::DlCrcData)?,
                ecc_data: 0,
            })
        })();
        match direct {
            Ok(mut errors) => {
                stats.calls += 1;
                errors.ecc_data = self
                    .raw_error_counter(
                        device,
                        link,
                        sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_ECC_DATA,
                    )
                    .unwrap_or(0);
                (Some(errors), false)
            }
            Err(e) => {
                stats.calls += 1;
                let fields = self.scoped_field_errors(device, link);
                let unsupported = fields.is_none() && matches!(e, NvmlError::NotSupported);
                (fields, unsupported)
            }
        }
    }
}

fn read_pair(
    a: u32,
    da: &Device<'static>,
    b: u32,
    db: &Device<'static>,
    stats: &mut SampleStats,
) -> PairSample {
    let mut status = |cap| {
        stats.calls += 1;
        da.p2p_status(db, cap).map(p2p_status)
    };
    let p2p = (|| {
        Ok::<_, NvmlError>(P2pCaps {
            read: status(P2pCapabilitiesIndex::Read)?,
            write: status(P2pCapabilitiesIndex::Write)?,
            nvlink: status(P2pCapabilitiesIndex::NvLink)?,
            atomics: status(P2pCapabilitiesIndex::Atomics)?,
        })
    })();
    if let Err(e) = &p2p {
        count_unless_unsupported(e, stats);
    }
    stats.calls += 1;
    // SAFETY: a copy of a live handle, used for this one call.
    let other = unsafe { Device::new(db.handle(), da.nvml()) };
    let topology = da.topology_common_ancestor(other).ok().map(topology_level);
    PairSample {
        gpu: a,
        peer_gpu: b,
        p2p: p2p.ok(),
        topology,
    }
}

/// The processes on a GPU: compute and graphics, by the `_v3` calls, else (an older driver
/// without them) the `_v2` ones; a PID in both lists once.
fn processes(device: &Device<'static>, stats: &mut SampleStats) -> Vec<GpuProcess> {
    let mut out: Vec<GpuProcess> = Vec::new();
    let lists = [
        (
            Device::running_compute_processes as fn(&Device<'static>) -> _,
            Device::running_compute_processes_v2 as fn(&Device<'static>) -> _,
        ),
        (
            Device::running_graphics_processes,
            Device::running_graphics_processes_v2,
        ),
    ];
    for (v3, v2) in lists {
        // A symbol the library lacks is no call; a list is a count call, then the list call
        // unless the count is 0.
        let listed = match v3(device) {
            Err(NvmlError::FailedToLoadSymbol(_)) => v2(device),
            other => other,
        };
        stats.calls += match &listed {
            Err(NvmlError::FailedToLoadSymbol(_)) => 0,
            Ok(l) if !l.is_empty() => 2,
            _ => 1,
        };
        let listed: Vec<ProcessInfo> = match listed {
            Ok(l) => l,
            Err(e) => {
                count_unless_unsupported(&e, stats);
                continue;
            }
        };
        for p in listed {
            if out.iter().any(|o| o.pid == p.pid) {
                continue;
            }
            out.push(GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            });
        }
    }
    out
}

/// The PCIe link now and at most; None unless NVML answers all four.
fn pcie_link(device: &Device<'static>, stats: &mut SampleStats) -> Option<PcieLink> {
    let mut read = |call: fn(&Device<'static>) -> Result<u32, NvmlError>| {
        stats.calls += 1;
        call(device)
            .map_err(|e| count_unless_unsupported(&e, stats))
            .ok()
    };
    // The first NOT_SUPPORTED ends it: the others would say the same.
    Some(PcieLink {
        gen: read(Device::current_pcie_link_gen)?,
        max_gen: read(Device::max_pcie_link_gen)?,
        width: read(Device::current_pcie_link_width)?,
        max_width: read(Device::max_pcie_link_width)?,
    })
}

fn count_unless_unsupported(e: &NvmlError, stats: &mut SampleStats) {
    if !matches!(
        e,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)
    ) {
        stats.errors += 1;
    }
}

fn p2p_status(s: NvP2p) -> P2pStatus {
    match s {
        NvP2p::Ok => P2pStatus::Ok,
        NvP2p::ChipsetNotSupported => P2pStatus::ChipsetNotSupported,
        NvP2p::GpuNotSupported => P2pStatus::GpuNotSupported,
        NvP2p::IohTopologyNotSupported => P2pStatus::IohTopologyNotSupported,
        NvP2p::DisabledByRegkey => P2pStatus::DisabledByRegkey,
        NvP2p::NotSupported => P2pStatus::NotSupported,
        NvP2p::Unknown => P2pStatus::Unknown,
    }
}

fn topology_level(t: NvTopology) -> TopologyLevel {
    match t {
        NvTopology::Internal => TopologyLevel::Internal,
        NvTopology::Single => TopologyLevel::Single,
        NvTopology::Multiple => TopologyLevel::Multiple,
        NvTopology::HostBridge => TopologyLevel::Hostbridge,
        NvTopology::Node => TopologyLevel::Node,
        NvTopology::System => TopologyLevel::System,
    }
}

//! The only file that talks to NVML. Handles are cached at load; every call here is blocking
//! and runs on the scan thread or the XID thread, never on the async runtime.
//!
//! nvml-wrapper is used where it is right. Three calls go through the raw `nvml-wrapper-sys`
//! symbols instead: `remote_device_type` (nvml-wrapper writes the answer into a temporary and
//! always returns Unknown), the DL ECC data counter (no `ErrorCounter` variant), and per-link
//! field values (`field_values_for` always sends scopeId 0). Each raw symbol is checked to be
//! loaded before it is called: an old driver may lack it.

use std::collections::HashMap;
use std::path::Path;

use nvml_wrapper::enum_wrappers::device::{
    P2pCapabilitiesIndex, P2pStatus as NvP2p, TopologyLevel as NvTopology,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::{
    GpuReading, GpuSample, LinkErrors, LinkReading, P2pCaps, P2pStatus, PairSample, Peer,
    TopologyLevel,
};

/// PCI location (domain, bus, device): how a link's remote end is matched to our GPUs.
type PciKey = (u32, u32, u32);

struct CachedGpu {
    index: u32,
    /// None when the handle could not be had (a GPU lost before we started).
    device: Option<Device<'static>>,
    uuid: String,
    name: String,
    pci_bus_id: String,
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
                    }
                }
            };
            gpus.push(gpu);
        }
        Ok(NvmlGpus { nvml, gpus, by_pci })
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
        (GpuSample { gpus, pairs }, stats)
    }

    fn read_gpu(&self, g: &CachedGpu, stats: &mut SampleStats) -> GpuReading {
        let mut reading = GpuReading {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            pcie_replays: None,
            lost: false,
            links: Vec::new(),
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
                Err(NvmlError::GpuLost) => {
                    reading.lost = true;
                    reading.links.clear();
                    return reading;
                }
                Err(_) => {
                    stats.errors += 1;
                    continue;
                }
            };
            let peer = self.peer_of(device, link, stats);
            let errors = self.link_errors(device, link, stats);
            reading.links.push(LinkReading {
                link,
                active,
                peer,
                errors,
            });
        }
        reading
    }

    /// The remote end of a link: one of our GPUs by PCI location, else by remote device type.
    fn peer_of(&self, device: &Device<'static>, link: u32, stats: &mut SampleStats) -> Peer {
        stats.calls += 1;
        let remote = match device.link_wrapper_for(link).remote_pci_info() {
            Ok(p) => p,
            Err(_) => return Peer::Unknown,
        };
        if let Some(&index) = self.by_pci.get(&(remote.domain, remote.bus, remote.device)) {
            return Peer::Gpu(index);
        }
        stats.calls += 1;
        match self.remote_device_type(device, link) {
            Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH) => Peer::Switch,
            _ if !remote.bus_id.is_empty() => Peer::Pci(remote.bus_id),
            _ => Peer::Unknown,
        }
    }

    fn remote_device_type(&self, device: &Device<'static>, link: u32) -> Option<u32> {
        let sym = self
            .nvml
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType
            .as_ref()
            .ok()?;
        let mut kind: sys::nvmlIntNvLinkDeviceType_t = 0;
        // SAFETY: the handle is live for the life of the leaked Nvml; `kind` is a valid out pointer.
        let ret = unsafe { sym(device.handle(), link, &mut kind) };
        (ret == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(kind)
    }

    /// The five DL error counters; through field values (scoped to the link) where the counter
    /// call is not supported, as on newer GPUs.
    fn link_errors(
        &self,
        device: &Device<'static>,
        link: u32,
        stats: &mut SampleStats,
    ) -> Option<LinkErrors> {
        let nvlink = device.link_wrapper_for(link);
        stats.calls += 4;
        let direct = (|| {
            Ok::<_, NvmlError>(LinkErrors {
                replay: nvlink.error_counter(ErrorCounter::DlReplay)?,
                recovery: nvlink.error_counter(ErrorCounter::DlRecovery)?,
                crc_flit: nvlink.error_counter(ErrorCounter::DlCrcFlit)?,
                crc_data: nvlink.error_counter(ErrorCounter::DlCrcData)?,
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
                Some(errors)
            }
            Err(_) => {
                stats.calls += 1;
                self.scoped_field_errors(device, link)
            }
        }
    }

    fn raw_error_counter(&self, device: &Device<'static>, link: u32, counter: u32) -> Option<u64> {
        let sym = self
            .nvml
            .lib()
            .nvmlDeviceGetNvLinkErrorCounter
            .as_ref()
            .ok()?;
        let mut value: std::os::raw::c_ulonglong = 0;
        // SAFETY: live handle, valid out pointer.
        let ret = unsafe { sym(device.handle(), link, counter, &mut value) };
        (ret == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(value)
    }

    /// NVML_FI_DEV_NVLINK_ERROR_DL_{REPLAY,RECOVERY,CRC} with scopeId = link.
    fn scoped_field_errors(&self, device: &Device<'static>, link: u32) -> Option<LinkErrors> {
        let sym = self.nvml.lib().nvmlDeviceGetFieldValues.as_ref().ok()?;
        let ids = [
            sys::field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            sys::field_id::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
            sys::field_id::NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        ];
        // SAFETY: nvmlFieldValue_t is plain old data; zeroed is its documented initial state.
        let mut values: [sys::nvmlFieldValue_t; 3] = unsafe { std::mem::zeroed() };
        for (v, id) in values.iter_mut().zip(ids) {
            v.fieldId = id;
            v.scopeId = link;
        }
        // SAFETY: live handle; `values` holds exactly the count passed.
        let ret = unsafe { sym(device.handle(), values.len() as i32, values.as_mut_ptr()) };
        if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
            return None;
        }
        let get = |v: &sys::nvmlFieldValue_t| {
            // SAFETY: these fields are documented as unsigned long long values.
            (v.nvmlReturn == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(unsafe { v.value.ullVal })
        };
        Some(LinkErrors {
            replay: get(&values[0])?,
            recovery: get(&values[1])?,
            // The scoped field counts CRC errors as one figure.
            crc_data: get(&values[2])?,
            crc_flit: 0,
            ecc_data: 0,
        })
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

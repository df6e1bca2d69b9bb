//! The only file that talks to NVML. Handles are cached at load; every call here is blocking
//! and runs on the scan thread or the XID thread, never on the async runtime.
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
    Ber, FabricInfo, FabricState, GpuProcess, GpuReading, GpuSample, LinkErrors, LinkReading,
    Nvlink5Errors, P2pCaps, P2pStatus, PairSample, PcieLink, Peer, RecoveryAction, TopologyLevel,
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
            pcie_replays: None,
            lost: false,
            recovery_action: None,
            fabric: None,
            links: Vec::new(),
            processes: Vec::new(),
            pcie_link: None,
            utilization_percent: None,
            pcie_path: Vec::new(),
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
            let errors = if dl_counters {
                let (errors, unsupported) = self.link_errors(device, link, stats);
                dl_counters = !unsupported;
                errors
            } else {
                None
            };
            reading.links.push(LinkReading {
                link,
                active,
                peer,
                errors,
                nvlink5: None,
            });
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

    /// One nvmlDeviceGetFieldValues for the GPU: its recovery action (scopeId 0) and, per link,
    /// the NVLink5 COUNT fields with scopeId = the link ("NVLink counter field id 201-225: Link
    /// ID needs to be specified in the scopeId field", nvml.h of NVML 13.3, NVIDIA/go-nvml
    /// gen/nvml/nvml.h). Fields a GPU lacks answer NOT_SUPPORTED one by one; a library without
    /// the call leaves everything None. Ids 213-230 are the same in nvml-wrapper's two field-id
    /// numberings (it renumbers 251-273 only).
    fn read_fields(
        &self,
        device: &Device<'static>,
        reading: &mut GpuReading,
        stats: &mut SampleStats,
    ) {
        let Ok(sym) = self.nvml.lib().nvmlDeviceGetFieldValues.as_ref() else {
            return;
        };
        let mut ids: Vec<(u32, u32)> =
            vec![(sys::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)];
        for l in &reading.links {
            ids.extend(NVLINK5_FIELDS.iter().map(|&f| (f, l.link)));
        }
        // SAFETY: nvmlFieldValue_t is plain old data; zeroed is its documented initial state.
        let mut values: Vec<sys::nvmlFieldValue_t> = ids
            .iter()
            .map(|&(id, scope)| {
                let mut v: sys::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                v.fieldId = id;
                v.scopeId = scope;
                v
            })
            .collect();
        stats.calls += 1;
        // SAFETY: live handle; `values` holds exactly the count passed.
        let ret = unsafe { sym(device.handle(), values.len() as i32, values.as_mut_ptr()) };
        match ret {
            sys::nvmlReturn_enum_NVML_SUCCESS => {}
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            | sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => return,
            _ => {
                stats.errors += 1;
                return;
            }
        }
        reading.recovery_action = field_u64(&values[0]).and_then(RecoveryAction::from_nvml);
        for (l, chunk) in reading
            .links
            .iter_mut()
            .zip(values[1..].chunks(NVLINK5_FIELDS.len()))
        {
            let get = |i: usize| chunk.get(i).and_then(field_u64);
            let counts = [get(0), get(1), get(2), get(3), get(4)];
            let (effective_ber, symbol_ber) =
                (get(5).map(Ber::from_raw), get(6).map(Ber::from_raw));
            if counts.iter().all(Option::is_none) && effective_ber.is_none() && symbol_ber.is_none()
            {
                continue;
            }
            let [successful, failed, events, symbol, effective] = counts.map(|c| c.unwrap_or(0));
            l.nvlink5 = Some(Nvlink5Errors {
                recovery_successful: successful,
                recovery_failed: failed,
                recovery_events: events,
                symbol,
                effective,
                effective_ber,
                symbol_ber,
            });
        }
    }

    /// nvmlDeviceGetGpuFabricInfoV with the v2 struct version: drivers that know v3 accept v2,
    /// and v2 already has the health mask (nvml.h: nvmlGpuFabricInfo_v2_t = version, clusterUuid,
    /// status, cliqueId, state, healthMask; v3 adds healthSummary). None where the GPU takes no
    /// part in a fabric (NOT_SUPPORTED, or state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED).
    fn fabric(&self, device: &Device<'static>, stats: &mut SampleStats) -> Option<FabricInfo> {
        let sym = self.nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref().ok()?;
        // SAFETY: plain old data.
        let mut info: sys::nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
        // NVML_STRUCT_VERSION(GpuFabricInfo, 2) = sizeof(nvmlGpuFabricInfo_v2_t) | 2 << 24.
        info.version = std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as u32 | (2 << 24);
        stats.calls += 1;
        // SAFETY: live handle; `info` is at least as large as the version it names.
        let ret = unsafe { sym(device.handle(), &mut info) };
        match ret {
            sys::nvmlReturn_enum_NVML_SUCCESS => {}
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            | sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => return None,
            _ => {
                stats.errors += 1;
                return None;
            }
        }
        fabric_info(u32::from(info.state), info.status, info.healthMask)
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

/// Per link, in this order: recovery successful, failed, all; symbol errors, effective errors;
/// effective BER, symbol BER (field ids 213, 214, 215, 221, 219, 220, 222; 216-218 are
/// deprecated raw BERs and not read).
const NVLINK5_FIELDS: [u32; 7] = [
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
    sys::field_id::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER,
];

/// A field's value as an unsigned integer, whatever integer type NVML gave it; None when the
/// field did not answer.
fn field_u64(v: &sys::nvmlFieldValue_t) -> Option<u64> {
    if v.nvmlReturn != sys::nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: the union member read is the one valueType names.
    unsafe {
        match v.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(u64::from(v.value.uiVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(v.value.ulVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(v.value.ullVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(v.value.sllVal).ok()
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(v.value.siVal).ok(),
            _ => None,
        }
    }
}

/// Pure: the fabric struct's fields -> what the JSON says. Health-mask fields are 2 bits each
/// (NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW 0, _SHIFT_ROUTE_UNHEALTHY 4, width 0x3; values
/// NOT_SUPPORTED 0, TRUE 1, FALSE 2; nvml.h, NVML 13.3).
pub fn fabric_info(state: u32, status: u32, health_mask: u32) -> Option<FabricInfo> {
    let state = match state {
        sys::NVML_GPU_FABRIC_STATE_NOT_STARTED => FabricState::NotStarted,
        sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS => FabricState::InProgress,
        sys::NVML_GPU_FABRIC_STATE_COMPLETED => FabricState::Completed,
        _ => return None,
    };
    let flag = |shift: u32| match (health_mask >> shift) & 0x3 {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    };
    Some(FabricInfo {
        state,
        status: return_name(status),
        degraded_bandwidth: flag(sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW),
        route_unhealthy: flag(sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY),
    })
}

/// nvmlReturn_t in snake case, as the JSON's `fabric.status` names it.
pub fn return_name(code: u32) -> String {
    let name = match code {
        sys::nvmlReturn_enum_NVML_SUCCESS => "success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "invalid_argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "not_supported",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "no_permission",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "not_found",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => "timeout",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "gpu_is_lost",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "reset_required",
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "in_use",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => "not_ready",
        sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN => "unknown",
        other => return format!("error_{other}"),
    };
    name.to_string()
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

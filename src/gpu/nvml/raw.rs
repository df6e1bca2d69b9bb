//! NVML through the raw `nvml-wrapper-sys` symbols, where nvml-wrapper answers wrong or not at
//! all (see `mod.rs`): field values scoped per link (the DL counters on newer GPUs, the NVLink5
//! counters, the recovery action), the DL ECC data counter, the remote device type and the
//! fabric info. Each symbol is checked to be loaded before it is called: an old driver may
//! lack it.

use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings as sys;

use super::{NvmlGpus, SampleStats};
use crate::model::RecoveryAction;
use crate::model::{
    Ber, FabricInfo, FabricState, GpuReading, LinkErrors, Nvlink5Errors, PlatformInfo,
};

impl NvmlGpus {
    /// One nvmlDeviceGetFieldValues for the GPU: its recovery action (scopeId 0) and, per link,
    /// the NVLink5 COUNT fields with scopeId = the link ("NVLink counter field id 201-225: Link
    /// ID needs to be specified in the scopeId field", nvml.h of NVML 13.3, NVIDIA/go-nvml
    /// gen/nvml/nvml.h). Fields a GPU lacks answer NOT_SUPPORTED one by one; a library without
    /// the call leaves everything None. Ids 213-230 are the same in nvml-wrapper's two field-id
    /// numberings (it renumbers 251-273 only).
    pub(super) fn read_fields(
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
    pub(super) fn fabric(
        &self,
        device: &Device<'static>,
        stats: &mut SampleStats,
    ) -> Option<FabricInfo> {
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
        let mut fabric = fabric_info(u32::from(info.state), info.status, info.healthMask)?;
        (fabric.cluster_uuid, fabric.clique_id) = nvlink_domain(&info.clusterUuid, info.cliqueId);
        Some(fabric)
    }

    /// nvmlDeviceGetPlatformInfo with the v2 struct (Blackwell and newer); None where the GPU or
    /// the library does not have it.
    pub(super) fn platform(&self, device: &Device<'static>) -> Option<PlatformInfo> {
        let sym = self.nvml.lib().nvmlDeviceGetPlatformInfo.as_ref().ok()?;
        // SAFETY: plain old data.
        let mut info: sys::nvmlPlatformInfo_v2_t = unsafe { std::mem::zeroed() };
        // NVML_STRUCT_VERSION(PlatformInfo, 2).
        info.version = std::mem::size_of::<sys::nvmlPlatformInfo_v2_t>() as u32 | (2 << 24);
        // SAFETY: live handle; `info` is the struct its version names.
        let ret = unsafe { sym(device.handle(), &mut info) };
        (ret == sys::nvmlReturn_enum_NVML_SUCCESS).then(|| PlatformInfo {
            chassis_serial: serial_text(&info.chassisSerialNumber),
            slot: info.slotNumber,
            tray: info.trayIndex,
            host_id: info.hostId,
            module_id: info.moduleId,
        })
    }

    pub(super) fn remote_device_type(&self, device: &Device<'static>, link: u32) -> Option<u32> {
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

    pub(super) fn raw_error_counter(
        &self,
        device: &Device<'static>,
        link: u32,
        counter: u32,
    ) -> Option<u64> {
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
    pub(super) fn scoped_field_errors(
        &self,
        device: &Device<'static>,
        link: u32,
    ) -> Option<LinkErrors> {
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
        cluster_uuid: None,
        clique_id: None,
    })
}

/// Pure: clusterUuid and cliqueId -> the NVLink domain, as NVIDIA's DRA driver spells the UUID
/// (lower-case `8-4-4-4-12`); none while the UUID is all zero (not registered, or no
/// multi-node fabric).
pub fn nvlink_domain(cluster_uuid: &[u8; 16], clique_id: u32) -> (Option<String>, Option<u32>) {
    if cluster_uuid.iter().all(|&b| b == 0) {
        return (None, None);
    }
    let hex: String = cluster_uuid.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    (Some(uuid), Some(clique_id))
}

/// Pure: the chassis serial's bytes (NUL-padded) as text where they are printable ASCII, else
/// as hex (NVML documents the field as bytes, so a label never gets a control character).
pub fn serial_text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let used = &bytes[..end];
    if used.iter().all(|b| b.is_ascii_graphic()) {
        String::from_utf8_lossy(used).into_owned()
    } else {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
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

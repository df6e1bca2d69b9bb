//! nvmlDeviceGetGpuFabricInfoV: the GPU's NVSwitch fabric registration, NVLink domain and
//! health; nvmlDeviceGetPlatformInfo: where the GPU sits (chassis, slot, tray). Newer drivers
//! only: the legacy library leaves this file out.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, with_gpu, INVALID_ARGUMENT, NOT_SUPPORTED};

/// NVML_STRUCT_VERSION(GpuFabricInfo, 2 or 3): the struct's size | version << 24.
const FABRIC_V2: c_uint = std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as c_uint | (2 << 24);
const FABRIC_V3: c_uint = std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>() as c_uint | (3 << 24);

/// Fills only the fields of the version the caller named: a v2 caller's buffer has no
/// healthSummary. Other versions: ARGUMENT_VERSION_MISMATCH, as NVML answers.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut sys::nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    call(|| {
        if info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the caller's struct starts with its version, whatever the version.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        if version != FABRIC_V2 && version != FABRIC_V3 {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        with_gpu(device, |_, _, gpu| {
            let fabric = gpu.fabric.ok_or(NOT_SUPPORTED)?;
            // SAFETY: every field written exists in the version the caller named.
            unsafe {
                std::ptr::addr_of_mut!((*info).clusterUuid).write(fabric.cluster_uuid);
                std::ptr::addr_of_mut!((*info).status).write(fabric.status);
                std::ptr::addr_of_mut!((*info).cliqueId).write(fabric.clique_id);
                std::ptr::addr_of_mut!((*info).state).write(fabric.state);
                std::ptr::addr_of_mut!((*info).healthMask).write(fabric.health_mask);
                if version == FABRIC_V3 {
                    let summary = if fabric.health_mask & 0x33 == 0x22 {
                        1
                    } else {
                        2
                    };
                    std::ptr::addr_of_mut!((*info).healthSummary).write(summary);
                }
            }
            Ok(())
        })
    })
}

/// NVML_STRUCT_VERSION(PlatformInfo, 2).
const PLATFORM_V2: c_uint = std::mem::size_of::<sys::nvmlPlatformInfo_v2_t>() as c_uint | (2 << 24);

/// Version 2 only (the struct nvml-wrapper-sys calls nvmlPlatformInfo_t); others:
/// ARGUMENT_VERSION_MISMATCH. A GPU without `platform` answers NOT_SUPPORTED, as before
/// Blackwell.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPlatformInfo(
    device: nvmlDevice_t,
    info: *mut sys::nvmlPlatformInfo_t,
) -> nvmlReturn_t {
    call(|| {
        if info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the caller's struct starts with its version.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        if version != PLATFORM_V2 {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        with_gpu(device, |_, _, gpu| {
            let p = gpu.platform.as_ref().ok_or(NOT_SUPPORTED)?;
            let mut serial = [0u8; 16];
            serial[..p.chassis_serial.len()].copy_from_slice(p.chassis_serial.as_bytes());
            // SAFETY: a v2 struct, as its version says.
            unsafe {
                info.write(sys::nvmlPlatformInfo_v2_t {
                    version,
                    ibGuid: [0; 16],
                    chassisSerialNumber: serial,
                    slotNumber: p.slot,
                    trayIndex: p.tray,
                    hostId: p.host_id,
                    peerType: 0,
                    moduleId: p.module_id,
                });
            }
            Ok(())
        })
    })
}

//! One NVLink of a GPU: its state, its far end (PCI location and device type) and its DL error
//! counters (`error_counter_api` "counter" only).

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, out, pci_info, with_link, INVALID_ARGUMENT, NOT_SUPPORTED};
use crate::config::ErrorCounterApi;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut sys::nvmlEnableState_t,
) -> nvmlReturn_t {
    call(|| {
        with_link(device, link, |_, l| {
            let state = if l.active {
                sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
            };
            out(is_active, state)
        })
    })
}

/// A link without `remote_pci_bus_id` answers an all-zero PCI info (empty bus id).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut sys::nvmlPciInfo_t,
) -> nvmlReturn_t {
    call(|| {
        with_link(device, link, |_, l| {
            let info = match &l.remote {
                Some(remote) => pci_info(remote, 0, 0),
                // SAFETY: plain old data, all zero is a valid value.
                None => unsafe { std::mem::zeroed() },
            };
            out(pci, info)
        })
    })
}

#[cfg(not(fake_nvml_legacy))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut sys::nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    call(|| with_link(device, link, |_, l| out(kind, l.remote_type)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: sys::nvmlNvLinkErrorCounter_t,
    value: *mut c_ulonglong,
) -> nvmlReturn_t {
    call(|| {
        with_link(device, link, |gpu, l| {
            if gpu.error_counter_api != ErrorCounterApi::Counter {
                return Err(NOT_SUPPORTED);
            }
            let e = &l.errors;
            let v = match counter {
                sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => e.replay,
                sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => e.recovery,
                sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => e.crc_flit,
                sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA => e.crc_data,
                sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_ECC_DATA => e.ecc_data,
                _ => return Err(INVALID_ARGUMENT),
            };
            out(value, v)
        })
    })
}

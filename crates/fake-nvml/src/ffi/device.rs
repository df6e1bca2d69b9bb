//! Device handles (by index, UUID, PCI bus id; a lost GPU's too) and what a GPU says about
//! itself: index, minor number, name, UUID, PCI info, PCIe replays.

use std::ffi::{c_char, c_uint, CStr};

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{
    call, handle, live, out, out_str, pci_info, with_gpu, Res, INVALID_ARGUMENT, NOT_FOUND,
};
use crate::config::{Gpu, Pci};

/// The handle of the first GPU that `matches`, else NOT_FOUND. A lost GPU is found too.
unsafe fn handle_of(device: *mut nvmlDevice_t, matches: impl Fn(&Gpu) -> bool) -> Res {
    live(|live| {
        let index = live.config.gpus.iter().position(matches).ok_or(NOT_FOUND)?;
        out(device, handle(index))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    call(|| live(|live| out(count, live.config.gpus.len() as c_uint)))
}

/// Succeeds for a lost GPU too: the driver still lists it; calls on the handle fail.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        live(|live| {
            if index as usize >= live.config.gpus.len() {
                return Err(INVALID_ARGUMENT);
            }
            out(device, handle(index as usize))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        if uuid.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let uuid = CStr::from_ptr(uuid).to_bytes();
        handle_of(device, |g| g.uuid.as_bytes() == uuid)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        if pci_bus_id.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let text = CStr::from_ptr(pci_bus_id)
            .to_str()
            .map_err(|_| INVALID_ARGUMENT)?;
        let pci = Pci::parse(text).map_err(|_| INVALID_ARGUMENT)?;
        handle_of(device, |g| g.pci == pci)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, i, _| out(index, i as c_uint)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor_number: *mut c_uint,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, gpu| out(minor_number, gpu.minor_number)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, gpu| out_str(name, length, &gpu.name)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, gpu| out_str(uuid, length, &gpu.uuid)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> nvmlReturn_t {
    call(|| {
        with_gpu(device, |_, _, gpu| {
            out(
                pci,
                pci_info(&gpu.pci, gpu.pci_device_id, gpu.pci_subsystem_id),
            )
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, gpu| out(value, gpu.pcie_replays)))
}

/// Absent `vbios`: NOT_SUPPORTED.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        with_gpu(device, |_, _, gpu| {
            let v = gpu.vbios.as_deref().ok_or(super::NOT_SUPPORTED)?;
            out_str(version, length, v)
        })
    })
}

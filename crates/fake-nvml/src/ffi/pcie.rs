//! The GPU's PCIe link (generation and width, current and maximum) and its utilization rates.
//! Each answers NOT_SUPPORTED when the GPU's config leaves the key out. Old calls: the legacy
//! library has them all.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, out, with_gpu, NOT_SUPPORTED};
use crate::config::PcieLink;

/// One number of the GPU's `pcie_link`.
unsafe fn link(device: nvmlDevice_t, value: *mut c_uint, f: fn(&PcieLink) -> u32) -> nvmlReturn_t {
    call(|| {
        with_gpu(device, |_, _, gpu| {
            let l = gpu.pcie_link.as_ref().ok_or(NOT_SUPPORTED)?;
            out(value, f(l))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    curr_link_gen: *mut c_uint,
) -> nvmlReturn_t {
    link(device, curr_link_gen, |l| l.generation)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    max_link_gen: *mut c_uint,
) -> nvmlReturn_t {
    link(device, max_link_gen, |l| l.max_generation)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    curr_link_width: *mut c_uint,
) -> nvmlReturn_t {
    link(device, curr_link_width, |l| l.width)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    max_link_width: *mut c_uint,
) -> nvmlReturn_t {
    link(device, max_link_width, |l| l.max_width)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut sys::nvmlUtilization_t,
) -> nvmlReturn_t {
    call(|| {
        with_gpu(device, |_, _, gpu| {
            let u = gpu.utilization.ok_or(NOT_SUPPORTED)?;
            out(
                utilization,
                sys::nvmlUtilization_t {
                    gpu: u.gpu,
                    memory: u.memory,
                },
            )
        })
    })
}

//! Running processes: compute ones from the GPU's `processes`, graphics ones never (a node
//! agent's GPUs run no display). `_v3` and `_v2` share one struct; the legacy library has only
//! `_v2`, so a caller's fallback from `_v3` is exercised.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, with_gpu, Res, INSUFFICIENT_SIZE, INVALID_ARGUMENT};
use crate::config::Process;

/// gpuInstanceId / computeInstanceId of a process outside any MIG instance.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// NVML's list contract: `*count` is in/out. With no processes, SUCCESS and 0 whatever was
/// passed; else a NULL `infos` or too small a `*count` gets the count needed and
/// INSUFFICIENT_SIZE (how nvml-wrapper asks for the count); else the list and its length.
unsafe fn out_processes(
    count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
    processes: &[Process],
) -> Res {
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let needed = processes.len() as c_uint;
    if needed > 0 && (infos.is_null() || count.read() < needed) {
        count.write(needed);
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, p) in processes.iter().enumerate() {
        infos.add(i).write(sys::nvmlProcessInfo_t {
            pid: p.pid,
            usedGpuMemory: p.used_memory,
            gpuInstanceId: NO_INSTANCE,
            computeInstanceId: NO_INSTANCE,
        });
    }
    count.write(needed);
    Ok(())
}

unsafe fn compute(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> nvmlReturn_t {
    call(|| {
        with_gpu(device, |_, _, gpu| {
            out_processes(count, infos, &gpu.processes)
        })
    })
}

unsafe fn graphics(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, _| out_processes(count, infos, &[])))
}

#[cfg(not(fake_nvml_legacy))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> nvmlReturn_t {
    compute(device, info_count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    compute(device, info_count, infos)
}

#[cfg(not(fake_nvml_legacy))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> nvmlReturn_t {
    graphics(device, info_count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    graphics(device, info_count, infos)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [Process; 2] = [
        Process {
            pid: 4242,
            used_memory: 1 << 30,
        },
        Process {
            pid: 7,
            used_memory: u64::MAX,
        },
    ];

    fn zeroed() -> sys::nvmlProcessInfo_t {
        // SAFETY: plain old data, all zero is a valid value.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn the_count_protocol() {
        let mut buf = [zeroed(); 4];
        // SAFETY (all calls below): `count` is valid and `buf` holds at least `count` entries.
        unsafe {
            // nvml-wrapper's count call: NULL and 0.
            let mut count: c_uint = 0;
            let none = std::ptr::null_mut();
            assert_eq!(out_processes(&mut count, none, &P), Err(INSUFFICIENT_SIZE));
            assert_eq!(count, 2);
            // A NULL array is too small whatever the count says.
            count = 9;
            assert_eq!(out_processes(&mut count, none, &P), Err(INSUFFICIENT_SIZE));
            assert_eq!(count, 2);
            count = 1;
            assert_eq!(
                out_processes(&mut count, buf.as_mut_ptr(), &P),
                Err(INSUFFICIENT_SIZE)
            );
            assert_eq!((count, buf[0].pid), (2, 0));

            // nvml-wrapper's list call: count + 5 entries; the count written comes back.
            count = 7;
            assert_eq!(out_processes(&mut count, buf.as_mut_ptr(), &P), Ok(()));
            assert_eq!(count, 2);
            assert_eq!((buf[0].pid, buf[0].usedGpuMemory), (4242, 1 << 30));
            assert_eq!((buf[1].pid, buf[1].usedGpuMemory), (7, u64::MAX));
            assert_eq!(
                (buf[1].gpuInstanceId, buf[1].computeInstanceId),
                (NO_INSTANCE, NO_INSTANCE)
            );
            assert_eq!(buf[2].pid, 0);

            // No processes: SUCCESS and 0, NULL array or not.
            count = 0;
            assert_eq!(out_processes(&mut count, none, &[]), Ok(()));
            assert_eq!(count, 0);
            count = 3;
            assert_eq!(out_processes(&mut count, buf.as_mut_ptr(), &[]), Ok(()));
            assert_eq!(count, 0);

            assert_eq!(
                out_processes(std::ptr::null_mut(), none, &P),
                Err(INVALID_ARGUMENT)
            );
        }
    }
}

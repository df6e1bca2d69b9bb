//! The exported NVML symbols, one file per NVML area. Signatures are nvml-wrapper-sys's, so they
//! match what nvml-wrapper loads. Every body runs inside `call`: counted, and a panic becomes
//! NVML_ERROR_UNKNOWN instead of unwinding into C. This file holds what every area shares: the
//! return codes, `call`, the state with the config applied (`live`), handles and out-parameters.
//!
//! Built with `cfg(fake_nvml_legacy)`, `fields` and `fabric` are left out whole and the other
//! areas leave out their newer symbols one by one (README.md, "Exported symbols"). The symbols
//! are exported by `#[no_mangle]`, wherever their module stands: nothing here re-exports them.

// Each function's safety contract is NVML's own for the symbol of the same name.
#![allow(clippy::missing_safety_doc)]

mod device;
mod events;
#[cfg(not(fake_nvml_legacy))]
mod fabric;
#[cfg(not(fake_nvml_legacy))]
mod fields;
mod init;
mod nvlink;
mod pairs;
mod pcie;
mod processes;

use std::ffi::{c_char, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use crate::config::{Config, Gpu, Link, Pci};
use crate::state::{self, Live};

const SUCCESS: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const GPU_IS_LOST: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const UNKNOWN: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

static CALLS: AtomicU64 = AtomicU64::new(0);

type Res<T = ()> = Result<T, nvmlReturn_t>;

/// Counts the call and keeps panics on this side of the FFI boundary.
fn call(f: impl FnOnce() -> Res) -> nvmlReturn_t {
    CALLS.fetch_add(1, Ordering::Relaxed);
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// The initialised state, with the config file's latest version applied.
fn live<T>(f: impl FnOnce(&mut Live) -> Res<T>) -> Res<T> {
    let mut guard = state::lock();
    let live = guard.as_mut().ok_or(UNINITIALIZED)?;
    live.refresh();
    f(live)
}

/// Device handles are index + 1, so that none is NULL.
fn handle(index: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut(index + 1)
}

fn index_of(config: &Config, device: nvmlDevice_t) -> Res<usize> {
    match device.addr() {
        0 => Err(INVALID_ARGUMENT),
        n if n <= config.gpus.len() => Ok(n - 1),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// The GPU behind a handle, for a call on it: a lost GPU answers GPU_IS_LOST to all of them.
fn gpu_of(config: &Config, device: nvmlDevice_t) -> Res<(usize, &Gpu)> {
    let index = index_of(config, device)?;
    let gpu = &config.gpus[index];
    if gpu.lost {
        return Err(GPU_IS_LOST);
    }
    Ok((index, gpu))
}

/// A call on one GPU's handle (see `gpu_of`).
fn with_gpu<T>(device: nvmlDevice_t, f: impl FnOnce(&Config, usize, &Gpu) -> Res<T>) -> Res<T> {
    live(|live| {
        let (index, gpu) = gpu_of(&live.config, device)?;
        f(&live.config, index, gpu)
    })
}

/// One link of a GPU; links past the configured ones are NOT_SUPPORTED, as on a GPU with
/// fewer links than NVML_NVLINK_MAX_LINKS.
fn with_link<T>(
    device: nvmlDevice_t,
    link: c_uint,
    f: impl FnOnce(&Gpu, &Link) -> Res<T>,
) -> Res<T> {
    with_gpu(device, |_, _, gpu| {
        let l = gpu.links.get(link as usize).ok_or(NOT_SUPPORTED)?;
        f(gpu, l)
    })
}

unsafe fn out<T>(ptr: *mut T, value: T) -> Res {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    ptr.write(value);
    Ok(())
}

/// NVML's string out-parameters: NUL-terminated, INSUFFICIENT_SIZE when it does not fit.
unsafe fn out_str(buf: *mut c_char, length: c_uint, s: &str) -> Res {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() >= length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
    buf.add(bytes.len()).write(0);
    Ok(())
}

fn put(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// A GPU's PCI location, or a link's far end, as nvmlPciInfo_t.
fn pci_info(pci: &Pci, device_id: u32, subsystem_id: u32) -> sys::nvmlPciInfo_t {
    let mut info = sys::nvmlPciInfo_t {
        busIdLegacy: [0; sys::NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE as usize],
        domain: pci.domain,
        bus: pci.bus,
        device: pci.device,
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: [0; sys::NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE as usize],
    };
    put(&mut info.busIdLegacy, &pci.bus_id_legacy());
    put(&mut info.busId, &pci.bus_id());
    info
}

// --- Not NVML ------------------------------------------------------------------------------------

/// NVML calls answered since the library was loaded (every exported NVML symbol counts, this one
/// does not): lets a benchmark report the calls a scan made.
#[no_mangle]
pub extern "C" fn fakeNvmlCallCount() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::events::XID_EVENT;
    use super::*;
    use super::{device::*, events::*, init::*, nvlink::*, pcie::*, processes::*};
    use crate::state::CONFIG_ENV;
    use sys::nvmlEventSet_t;

    /// The only test here that touches the library's global state.
    #[test]
    fn raw_calls_without_nvml_wrapper() {
        let dir = std::env::temp_dir().join(format!("fake-nvml-ffi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nvml.json");
        std::fs::write(&path, include_str!("../../presets/nvswitch-8.json")).unwrap();

        let mut count: c_uint = 0;
        // SAFETY (all calls below): valid out pointers and buffers of the stated sizes.
        unsafe {
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
            std::env::remove_var(CONFIG_ENV);
            assert_eq!(nvmlInit_v2(), DRIVER_NOT_LOADED);
            std::env::set_var(CONFIG_ENV, &path);
            let before = fakeNvmlCallCount();
            assert_eq!(nvmlInit_v2(), SUCCESS);
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), SUCCESS);
            assert_eq!(count, 8);
            assert_eq!(fakeNvmlCallCount() - before, 2);

            let mut dev: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(8, &mut dev), INVALID_ARGUMENT);
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(7, &mut dev), SUCCESS);
            let mut index: c_uint = 0;
            assert_eq!(nvmlDeviceGetIndex(dev, &mut index), SUCCESS);
            assert_eq!(index, 7);
            assert_eq!(
                nvmlDeviceGetIndex(std::ptr::null_mut(), &mut index),
                INVALID_ARGUMENT
            );
            assert_eq!(nvmlDeviceGetIndex(handle(8), &mut index), INVALID_ARGUMENT);

            let mut buf = [0 as c_char; 96];
            assert_eq!(nvmlDeviceGetUUID(dev, buf.as_mut_ptr(), 96), SUCCESS);
            let uuid = CStr::from_ptr(buf.as_ptr()).to_str().unwrap().to_string();
            assert!(uuid.starts_with("GPU-"));
            assert_eq!(
                nvmlDeviceGetUUID(dev, buf.as_mut_ptr(), 4),
                INSUFFICIENT_SIZE
            );
            let c_uuid = std::ffi::CString::new(uuid).unwrap();
            let mut by_uuid: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByUUID(c_uuid.as_ptr(), &mut by_uuid),
                SUCCESS
            );
            assert_eq!(by_uuid, dev);
            assert_eq!(
                nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut by_uuid),
                NOT_FOUND
            );
            let mut by_pci: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"0000:db:00.0".as_ptr(), &mut by_pci),
                SUCCESS
            );
            assert_eq!(by_pci, dev);

            let mut pci: sys::nvmlPciInfo_t = std::mem::zeroed();
            assert_eq!(nvmlDeviceGetPciInfo_v3(dev, &mut pci), SUCCESS);
            assert_eq!((pci.domain, pci.bus, pci.device), (0, 0xdb, 0));
            assert_eq!(CStr::from_ptr(pci.busId.as_ptr()), c"00000000:DB:00.0");
            assert_eq!(CStr::from_ptr(pci.busIdLegacy.as_ptr()), c"0000:DB:00.0");

            let mut state = 7;
            assert_eq!(nvmlDeviceGetNvLinkState(dev, 17, &mut state), SUCCESS);
            assert_eq!(state, sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED);
            assert_eq!(nvmlDeviceGetNvLinkState(dev, 18, &mut state), NOT_SUPPORTED);

            assert_eq!(CStr::from_ptr(nvmlErrorString(GPU_IS_LOST)), c"GPU is lost");

            let mut set: nvmlEventSet_t = std::ptr::null_mut();
            assert_eq!(nvmlEventSetCreate(&mut set), SUCCESS);
            assert_eq!(nvmlDeviceRegisterEvents(dev, XID_EVENT, set), SUCCESS);
            assert_eq!(nvmlDeviceRegisterEvents(dev, 1 << 40, set), NOT_SUPPORTED);
            assert_eq!(nvmlEventSetFree(set), SUCCESS);
            assert_eq!(nvmlEventSetFree(set), INVALID_ARGUMENT);

            // The preset has no processes, PCIe link or utilization.
            count = 0;
            let no_infos = std::ptr::null_mut();
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v2(dev, &mut count, no_infos),
                SUCCESS
            );
            assert_eq!(count, 0);
            let mut value: c_uint = 0;
            assert_eq!(
                nvmlDeviceGetCurrPcieLinkGeneration(dev, &mut value),
                NOT_SUPPORTED
            );
            let mut util: sys::nvmlUtilization_t = std::mem::zeroed();
            assert_eq!(nvmlDeviceGetUtilizationRates(dev, &mut util), NOT_SUPPORTED);

            // A new version of the file: the next call answers from it.
            let tmp = dir.join("nvml.json.tmp");
            std::fs::write(
                &tmp,
                r#"{"gpus": [{"name": "G", "uuid": "GPU-0", "pci_bus_id": "0:1:0.0",
                    "processes": [{"pid": 4242, "used_memory": 1024}, {"pid": 7, "used_memory": 0}],
                    "pcie_link": {"gen": 4, "max_gen": 5, "width": 8, "max_width": 16},
                    "utilization": {"gpu": 93, "memory": 41}},
                   {"name": "G", "uuid": "GPU-1", "pci_bus_id": "0:2:0.0", "lost": true,
                    "processes": [{"pid": 1, "used_memory": 1}]}]}"#,
            )
            .unwrap();
            std::fs::rename(&tmp, &path).unwrap();
            let (dev, lost) = (handle(0), handle(1));
            count = 0;
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v2(dev, &mut count, no_infos),
                INSUFFICIENT_SIZE
            );
            assert_eq!(count, 2);
            let mut infos = [std::mem::zeroed::<sys::nvmlProcessInfo_t>(); 7];
            count = 7;
            #[cfg(not(fake_nvml_legacy))]
            {
                assert_eq!(
                    nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut count, infos.as_mut_ptr()),
                    SUCCESS
                );
                assert_eq!((count, infos[1].pid), (2, 7));
                count = 7;
            }
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v2(dev, &mut count, infos.as_mut_ptr()),
                SUCCESS
            );
            assert_eq!(
                (count, infos[0].pid, infos[0].usedGpuMemory),
                (2, 4242, 1024)
            );
            count = 0;
            assert_eq!(
                nvmlDeviceGetGraphicsRunningProcesses_v2(dev, &mut count, no_infos),
                SUCCESS
            );
            assert_eq!(count, 0);
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v2(lost, &mut count, no_infos),
                GPU_IS_LOST
            );
            for (f, want) in [
                (
                    nvmlDeviceGetCurrPcieLinkGeneration as unsafe extern "C" fn(_, _) -> _,
                    4,
                ),
                (nvmlDeviceGetMaxPcieLinkGeneration, 5),
                (nvmlDeviceGetCurrPcieLinkWidth, 8),
                (nvmlDeviceGetMaxPcieLinkWidth, 16),
            ] {
                assert_eq!(f(dev, &mut value), SUCCESS);
                assert_eq!(value, want);
                assert_eq!(f(lost, &mut value), GPU_IS_LOST);
            }
            assert_eq!(nvmlDeviceGetUtilizationRates(dev, &mut util), SUCCESS);
            assert_eq!((util.gpu, util.memory), (93, 41));
            assert_eq!(nvmlDeviceGetUtilizationRates(lost, &mut util), GPU_IS_LOST);

            assert_eq!(nvmlShutdown(), SUCCESS);
            assert_eq!(nvmlShutdown(), UNINITIALIZED);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

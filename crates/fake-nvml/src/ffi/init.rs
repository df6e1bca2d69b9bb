//! Init and shutdown (reference-counted, each init reads the config afresh), error strings, and
//! the system's driver and NVML versions.

use std::ffi::{c_char, c_uint, CStr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use nvml_wrapper_sys::bindings as sys;
use sys::nvmlReturn_t;

use super::{call, live, out_str, Res, CALLS, DRIVER_NOT_LOADED, UNINITIALIZED};
use crate::state::{self, Live, CONFIG_ENV};

/// Reads the file named by FAKE_NVML_CONFIG. Without it (unset, unreadable, malformed) the
/// library behaves like libnvidia-ml.so on a machine without the driver: DRIVER_NOT_LOADED.
fn init() -> Res {
    let path = std::env::var_os(CONFIG_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let Some(path) = path else {
        eprintln!("fake-nvml: nvmlInit: {CONFIG_ENV} is not set");
        return Err(DRIVER_NOT_LOADED);
    };
    let (key, config) = state::read_config(&path).map_err(|e| {
        eprintln!("fake-nvml: nvmlInit: {e}");
        DRIVER_NOT_LOADED
    })?;
    let mut guard = state::lock();
    match guard.as_mut() {
        Some(live) => live.reinit(path, Some(key), config),
        None => *guard = Some(Live::new(path, Some(key), config)),
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    call(init)
}

/// Flags (NO_GPUS, NO_ATTACH) change nothing here.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    call(init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    call(|| {
        let mut guard = state::lock();
        let live = guard.as_mut().ok_or(UNINITIALIZED)?;
        live.init_count -= 1;
        if live.init_count == 0 {
            *guard = None;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    CALLS.fetch_add(1, Ordering::Relaxed);
    error_string(result).as_ptr()
}

fn error_string(result: nvmlReturn_t) -> &'static CStr {
    match result {
        sys::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| live(|live| out_str(version, length, &live.config.driver_version)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| live(|live| out_str(version, length, &live.config.nvml_version)))
}

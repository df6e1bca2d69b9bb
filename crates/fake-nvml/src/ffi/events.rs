//! Events: the types a GPU supports, event sets (create, register, wait, free). Only XIDs ever
//! fire; state.rs decides which XIDs are new and which set gets them.

use std::ffi::c_ulonglong;

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlEventSet_t, nvmlReturn_t};

use super::{call, gpu_of, live, out, with_gpu, INVALID_ARGUMENT, NOT_SUPPORTED};
use crate::config::Gpu;
// Only the wait needs these, and the legacy library has no wait.
#[cfg(not(fake_nvml_legacy))]
use {super::handle, std::ffi::c_uint};

/// The one event type that ever fires.
pub(super) const XID_EVENT: u64 = sys::nvmlEventTypeXidCriticalError as u64;
/// What every GPU says it supports; XIDs unless its config says `"xid_events": false`.
const OTHER_EVENTS: u64 = (sys::nvmlEventTypeSingleBitEccError
    | sys::nvmlEventTypeDoubleBitEccError
    | sys::nvmlEventTypePState
    | sys::nvmlEventTypeClock) as u64;

/// Event set handles are the state's set ids.
fn set_id(set: nvmlEventSet_t) -> usize {
    set.addr()
}

fn supported_events(gpu: &Gpu) -> u64 {
    if gpu.xid_events {
        OTHER_EVENTS | XID_EVENT
    } else {
        OTHER_EVENTS
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> nvmlReturn_t {
    call(|| with_gpu(device, |_, _, gpu| out(event_types, supported_events(gpu))))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    call(|| {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        live(|live| out(set, std::ptr::without_provenance_mut(live.create_set())))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    call(|| {
        live(|live| {
            let (index, gpu) = gpu_of(&live.config, device)?;
            if event_types & !supported_events(gpu) != 0 {
                return Err(NOT_SUPPORTED);
            }
            if live.register(set_id(set), index as u32, event_types) {
                Ok(())
            } else {
                Err(INVALID_ARGUMENT)
            }
        })
    })
}

/// Blocks up to `timeoutms`, looking at the config file every WAIT_STEP. XIDs of a GPU that is
/// lost by now are still delivered (XID 79 is how a GPU announces it fell off the bus).
#[cfg(not(fake_nvml_legacy))]
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    /// How often a blocked wait looks at the config file again.
    const WAIT_STEP: std::time::Duration = std::time::Duration::from_millis(10);
    const TIMEOUT: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
    call(|| {
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(u64::from(timeoutms));
        loop {
            let next = live(|live| {
                let set = live.sets.get_mut(&set_id(set)).ok_or(INVALID_ARGUMENT)?;
                Ok(set.queue.pop_front())
            })?;
            if let Some((gpu, xid)) = next {
                let event = sys::nvmlEventData_t {
                    device: handle(gpu as usize),
                    eventType: XID_EVENT,
                    eventData: xid,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                };
                return out(data, event);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(TIMEOUT);
            }
            std::thread::sleep(left.min(WAIT_STEP));
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    call(|| {
        live(|live| {
            live.sets
                .remove(&set_id(set))
                .map(|_| ())
                .ok_or(INVALID_ARGUMENT)
        })
    })
}

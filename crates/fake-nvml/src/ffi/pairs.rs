//! Calls on a pair of GPUs: P2P status per capability, and the topology level of their common
//! ancestor. Either GPU lost fails the call; a GPU with itself is INVALID_ARGUMENT.

use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, index_of, live, out, Res, GPU_IS_LOST, INVALID_ARGUMENT};
use crate::config::Config;

/// Two handles of the same config; either GPU lost fails the call, as does a GPU with itself.
fn with_pair<T>(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    f: impl FnOnce(&Config, u32, u32) -> Res<T>,
) -> Res<T> {
    live(|live| {
        let config = &live.config;
        let (ia, ib) = (index_of(config, a)?, index_of(config, b)?);
        if config.gpus[ia].lost || config.gpus[ib].lost {
            return Err(GPU_IS_LOST);
        }
        if ia == ib {
            return Err(INVALID_ARGUMENT);
        }
        f(config, ia as u32, ib as u32)
    })
}

#[cfg(not(fake_nvml_legacy))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    p2p_index: sys::nvmlGpuP2PCapsIndex_t,
    p2p_status: *mut sys::nvmlGpuP2PStatus_t,
) -> nvmlReturn_t {
    call(|| {
        with_pair(device1, device2, |config, a, b| {
            let cap = p2p_index as usize;
            if cap >= crate::config::P2P_CAPS {
                return Err(INVALID_ARGUMENT);
            }
            out(p2p_status, config.p2p_status(a, b, cap))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    path_info: *mut sys::nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    call(|| {
        with_pair(device1, device2, |config, a, b| {
            out(path_info, config.topology(a, b))
        })
    })
}

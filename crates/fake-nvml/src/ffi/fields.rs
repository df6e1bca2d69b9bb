//! nvmlDeviceGetFieldValues: NVLink error counters per link and summed, NVLink5 COUNT fields
//! (Blackwell), the GPU recovery action, PCIe replays. Newer drivers only: the legacy library
//! leaves this file out.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;
use sys::field_id as fi;
use sys::{nvmlDevice_t, nvmlReturn_t};

use super::{call, with_gpu, Res, INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS};
use crate::config::{ErrorCounterApi, Gpu, Link};
/// One field of nvmlDeviceGetFieldValues: (value type, value) or the field's error.
fn field(gpu: &Gpu, field_id: u32, scope: u32) -> Res<(u32, sys::nvmlValue_t)> {
    let ull = |v: u64| {
        Ok((
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            sys::nvmlValue_t { ullVal: v },
        ))
    };
    let uint = |v: c_uint| {
        Ok((
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
            sys::nvmlValue_t { uiVal: v },
        ))
    };
    let total = |f: fn(&Link) -> u64| ull(gpu.links.iter().map(f).sum());
    let scoped = |f: fn(&Link) -> u64| match gpu.links.get(scope as usize) {
        Some(l) => ull(f(l)),
        None => Err(NOT_SUPPORTED),
    };
    let nvlink5 = gpu.error_counter_api == ErrorCounterApi::Nvlink5;
    // Blackwell answers the NVLink5 COUNT fields per link (scopeId = link) and not the DL ones.
    let n5 = |f: fn(&Link) -> u64| {
        if nvlink5 {
            scoped(f)
        } else {
            Err(NOT_SUPPORTED)
        }
    };
    let dl = |f: fn(&Link) -> u64| {
        if nvlink5 {
            Err(NOT_SUPPORTED)
        } else {
            scoped(f)
        }
    };
    match field_id {
        fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS => {
            n5(|l| l.nvlink5.recovery_successful)
        }
        fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS => {
            n5(|l| l.nvlink5.recovery_failed)
        }
        fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS => n5(|l| l.nvlink5.recovery_events),
        fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS => n5(|l| l.nvlink5.symbol_errors),
        fi::NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS => n5(|l| l.nvlink5.effective_errors),
        fi::NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER => n5(|l| l.nvlink5.effective_ber),
        fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER => n5(|l| l.nvlink5.symbol_ber),
        // Per GPU: scopeId is not looked at.
        fi::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => {
            gpu.recovery_action.map_or(Err(NOT_SUPPORTED), uint)
        }
        // The per-link DL counters of newer GPUs: scopeId is the link.
        fi::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY => dl(|l| l.errors.replay),
        fi::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY => dl(|l| l.errors.recovery),
        fi::NVML_FI_DEV_NVLINK_ERROR_DL_CRC => dl(|l| l.errors.crc_flit + l.errors.crc_data),
        fi::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => total(|l| l.errors.crc_flit),
        fi::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => total(|l| l.errors.crc_data),
        fi::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => total(|l| l.errors.replay),
        fi::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => total(|l| l.errors.recovery),
        fi::NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL => total(|l| l.errors.ecc_data),
        fi::NVML_FI_DEV_PCIE_REPLAY_COUNTER => ull(u64::from(gpu.pcie_replays)),
        fi::NVML_FI_DEV_NVLINK_LINK_COUNT => uint(gpu.links.len() as c_uint),
        _ => Err(NOT_SUPPORTED),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: std::ffi::c_int,
    values: *mut sys::nvmlFieldValue_t,
) -> nvmlReturn_t {
    call(|| {
        let Ok(count @ 1..) = usize::try_from(values_count) else {
            return Err(INVALID_ARGUMENT);
        };
        if values.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes `values_count` initialised entries.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        with_gpu(device, |_, _, gpu| {
            for v in values.iter_mut() {
                v.timestamp = now;
                v.latencyUsec = 0;
                match field(gpu, v.fieldId, v.scopeId) {
                    Ok((kind, value)) => {
                        v.valueType = kind;
                        v.value = value;
                        v.nvmlReturn = SUCCESS;
                    }
                    Err(code) => v.nvmlReturn = code,
                }
            }
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn value(gpu: &Gpu, id: u32, scope: u32) -> Res<u64> {
        // SAFETY: every field here is served as an integer of the type it names.
        field(gpu, id, scope).map(|(kind, v)| unsafe {
            match kind {
                sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => u64::from(v.uiVal),
                _ => v.ullVal,
            }
        })
    }

    #[test]
    fn nvlink5_fields_are_per_link_and_replace_the_dl_ones() {
        let config = Config::parse(
            r#"{"gpus": [{"name": "B", "uuid": "GPU-0", "pci_bus_id": "0:1:0.0",
                "error_counter_api": "nvlink5", "recovery_action": "drain_p2p",
                "links": [{"nvlink5": {"recovery_failed": 2, "symbol_errors": 9, "symbol_ber": 3e-11}},
                          {"errors": {"replay": 4}, "nvlink5": {"recovery_successful": 5, "effective_errors": 1}}]},
                {"name": "H", "uuid": "GPU-1", "pci_bus_id": "0:2:0.0", "links": [{"errors": {"replay": 4}}]}]}"#,
        )
        .unwrap();
        let (b200, h100) = (&config.gpus[0], &config.gpus[1]);
        for (gpu, id, scope, want) in [
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
                0,
                Ok(2),
            ),
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
                1,
                Ok(0),
            ),
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
                1,
                Ok(5),
            ),
            (b200, fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, 0, Ok(9)),
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
                1,
                Ok(1),
            ),
            // 3e-11: mantissa 3 in bits 8-11, exponent 11 in bits 0-7.
            (b200, fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, 0, Ok(0x30b)),
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
                2,
                Err(NOT_SUPPORTED),
            ),
            (
                b200,
                fi::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                1,
                Err(NOT_SUPPORTED),
            ),
            (b200, fi::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0, Ok(3)),
            // A Hopper-like GPU: DL fields, no NVLink5 ones, no recovery action.
            (h100, fi::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 0, Ok(4)),
            (
                h100,
                fi::NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
                0,
                Err(NOT_SUPPORTED),
            ),
            (
                h100,
                fi::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                0,
                Err(NOT_SUPPORTED),
            ),
        ] {
            assert_eq!(
                value(gpu, id, scope),
                want,
                "{} field {id} link {scope}",
                gpu.name
            );
        }
    }
}

//! The file's words for NVML's values: statuses, fabric states, recovery actions, NVLink remote
//! device types, P2P capabilities and statuses, topology levels. One table each; a word not in
//! its table is an error that lists the words.

use nvml_wrapper_sys::bindings as sys;

use super::P2P_CAPS;

/// Words and the NVML values they stand for, in the order an error lists them. A later word for
/// a value already named is an alias: accepted, not listed.
type Table = [(&'static str, u32)];

fn lookup(what: &str, table: &Table, word: &str) -> Result<u32, String> {
    if let Some(&(_, value)) = table.iter().find(|(w, _)| *w == word) {
        return Ok(value);
    }
    let names: Vec<&str> = table
        .iter()
        .enumerate()
        .filter(|&(i, (_, value))| table[..i].iter().all(|(_, v)| v != value))
        .map(|(_, (w, _))| *w)
        .collect();
    Err(format!(
        "unknown {what} {word:?} (one of: {})",
        names.join(", ")
    ))
}

const NVML_RETURNS: &Table = &[
    ("success", sys::nvmlReturn_enum_NVML_SUCCESS),
    (
        "uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    ),
    (
        "invalid_argument",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    ),
    (
        "not_supported",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    ),
    (
        "no_permission",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
    ),
    ("not_found", sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND),
    ("timeout", sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT),
    ("gpu_is_lost", sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
    (
        "reset_required",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
    ),
    ("in_use", sys::nvmlReturn_enum_NVML_ERROR_IN_USE),
    ("not_ready", sys::nvmlReturn_enum_NVML_ERROR_NOT_READY),
    ("unknown", sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN),
];

/// "success" or an NVML error's name in snake case (`not_supported`, `timeout`, ...).
pub(super) fn nvml_return(s: &str) -> Result<u32, String> {
    lookup("NVML status", NVML_RETURNS, s)
}

/// NVML_GPU_FABRIC_STATE_*.
pub(super) fn fabric_state(s: &str) -> Result<u8, String> {
    const STATES: &Table = &[
        ("not_supported", sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED),
        ("not_started", sys::NVML_GPU_FABRIC_STATE_NOT_STARTED),
        ("in_progress", sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS),
        ("completed", sys::NVML_GPU_FABRIC_STATE_COMPLETED),
    ];
    lookup("fabric state", STATES, s).map(|v| v as u8)
}

/// nvmlDeviceGpuRecoveryAction_t.
pub(super) fn recovery_action(s: &str) -> Result<u32, String> {
    const ACTIONS: &Table = &[
        (
            "none",
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_NONE,
        ),
        (
            "gpu_reset",
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        ),
        (
            "node_reboot",
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
        ),
        (
            "drain_p2p",
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
        ),
        (
            "drain_and_reset",
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
        ),
    ];
    lookup("recovery_action", ACTIONS, s)
}

/// nvmlIntNvLinkDeviceType_t.
pub(super) fn remote_type(s: &str) -> Result<u32, String> {
    const TYPES: &Table = &[
        (
            "gpu",
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
        ),
        (
            "switch",
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH,
        ),
        (
            "ibmnpu",
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU,
        ),
        (
            "unknown",
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
        ),
    ];
    lookup("remote_type", TYPES, s)
}

/// Capability names -> bit set over nvmlGpuP2PCapsIndex_t.
pub(super) fn caps_of(names: &[String]) -> Result<u8, String> {
    const CAPS: &Table = &[
        (
            "read",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ,
        ),
        (
            "write",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_WRITE,
        ),
        (
            "nvlink",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK,
        ),
        (
            "atomics",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_ATOMICS,
        ),
        (
            "prop",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_PROP,
        ),
        (
            "pci",
            1 << sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_PROP,
        ),
        ("all", (1 << P2P_CAPS) - 1),
    ];
    let mut caps = 0u8;
    for name in names {
        caps |= lookup("capability", CAPS, name)? as u8;
    }
    if caps == 0 {
        return Err("empty capability list".into());
    }
    Ok(caps)
}

/// nvmlGpuP2PStatus_t.
pub(super) fn p2p_status(s: &str) -> Result<u32, String> {
    const STATUSES: &Table = &[
        ("ok", sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK),
        (
            "chipset_not_supported",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
        ),
        (
            "gpu_not_supported",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
        ),
        (
            "ioh_topology_not_supported",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
        ),
        (
            "disabled_by_regkey",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_DISABLED_BY_REGKEY,
        ),
        (
            "not_supported",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED,
        ),
        (
            "unknown",
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_UNKNOWN,
        ),
    ];
    lookup("status", STATUSES, s)
}

/// nvmlGpuTopologyLevel_t.
pub(super) fn topology_level(s: &str) -> Result<u32, String> {
    const LEVELS: &Table = &[
        ("internal", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL),
        ("single", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE),
        ("multiple", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE),
        (
            "hostbridge",
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE,
        ),
        ("node", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE),
        // NVML_TOPOLOGY_CPU is the old name of NODE.
        ("cpu", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE),
        ("system", sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM),
    ];
    lookup("topology level", LEVELS, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_map_to_nvml_values_and_aliases_are_not_listed() {
        assert_eq!(
            topology_level("cpu"),
            Ok(sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE)
        );
        assert_eq!(
            topology_level("numa").unwrap_err(),
            "unknown topology level \"numa\" (one of: internal, single, multiple, hostbridge, node, system)"
        );
        assert_eq!(caps_of(&["pci".into()]), caps_of(&["prop".into()]));
        assert_eq!(caps_of(&["all".into()]), Ok(0b1_1111));
        assert_eq!(
            caps_of(&["read".into(), "bogus".into()]).unwrap_err(),
            "unknown capability \"bogus\" (one of: read, write, nvlink, atomics, prop, all)"
        );
        assert_eq!(caps_of(&[]).unwrap_err(), "empty capability list");
        assert_eq!(fabric_state("in_progress"), Ok(2));
        assert_eq!(
            remote_type("nvswitch").unwrap_err(),
            "unknown remote_type \"nvswitch\" (one of: gpu, switch, ibmnpu, unknown)"
        );
    }
}

//! The config: the machine a JSON file describes (README.md documents the schema), in the form
//! the FFI side reads. Everything that can be wrong in a file is rejected while parsing, so the
//! FFI side only ever sees a consistent machine.
//!
//! `raw` is the file as written (unknown keys are errors), `validate` turns it into these types,
//! `names` holds the file's words for NVML's values. Re-reading the file when it changes is the
//! state's business (state.rs).

mod names;
mod raw;
mod validate;

pub use validate::pack_ber;

use std::collections::BTreeMap;

use serde::Deserialize;

/// One GPU index pair's P2P capability indices: read, write, nvlink, atomics, prop.
pub const P2P_CAPS: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub driver_version: String,
    pub nvml_version: String,
    pub gpus: Vec<Gpu>,
    /// Status per capability index for pairs no `p2p` entry names.
    pub p2p_default: [u32; P2P_CAPS],
    /// Exceptions, in file order (a later entry wins).
    pub p2p: Vec<P2pRule>,
    pub default_topology: u32,
    /// Exceptions keyed by the unordered pair (lower index first).
    pub topology: BTreeMap<(u32, u32), u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub name: String,
    pub uuid: String,
    pub pci: Pci,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub minor_number: u32,
    pub pcie_replays: u32,
    pub lost: bool,
    pub xids: Vec<u64>,
    pub xid_events: bool,
    pub error_counter_api: ErrorCounterApi,
    /// nvmlDeviceGpuRecoveryAction_t served as NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None:
    /// NOT_SUPPORTED.
    pub recovery_action: Option<u32>,
    /// nvmlDeviceGetGpuFabricInfoV's answer; None: NOT_SUPPORTED.
    pub fabric: Option<Fabric>,
    /// nvmlDeviceGetPlatformInfo's answer; None: NOT_SUPPORTED (before Blackwell).
    pub platform: Option<Platform>,
    /// nvmlDeviceGetVbiosVersion's answer; None: NOT_SUPPORTED.
    pub vbios: Option<String>,
    /// Compute processes, in file order; no pid twice.
    pub processes: Vec<Process>,
    /// The four PCIe link calls' answers; None: NOT_SUPPORTED.
    pub pcie_link: Option<PcieLink>,
    /// nvmlDeviceGetUtilizationRates's answer; None: NOT_SUPPORTED.
    pub utilization: Option<Utilization>,
    pub links: Vec<Link>,
}

/// One process with a compute context on the GPU (nvmlProcessInfo_t without MIG instances).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// As the host sees it: NVML reports host pids, not a container's.
    pub pid: u32,
    /// Bytes; u64::MAX is NVML_VALUE_NOT_AVAILABLE.
    pub used_memory: u64,
}

/// The PCIe link, current and maximum; validate.rs checks gen <= max_gen, width <= max_width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieLink {
    #[serde(rename = "gen")]
    pub generation: u32,
    #[serde(rename = "max_gen")]
    pub max_generation: u32,
    pub width: u32,
    pub max_width: u32,
}

/// Percentages, 0-100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// The GPU's fabric registration, as nvmlGpuFabricInfo_v2/v3_t carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fabric {
    /// NVML_GPU_FABRIC_STATE_*
    pub state: u8,
    /// nvmlReturn_t
    pub status: u32,
    /// NVML_GPU_FABRIC_HEALTH_MASK_* (degraded bandwidth and route unhealthy set, TRUE or FALSE).
    pub health_mask: u32,
    /// The NVLink domain: the cluster's UUID (16 bytes) and the clique within it.
    pub cluster_uuid: [u8; 16],
    pub clique_id: u32,
}

/// Where the GPU sits, as nvmlPlatformInfo_v2_t carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// At most 16 bytes, NUL-padded in the struct.
    pub chassis_serial: String,
    pub slot: u8,
    pub tray: u8,
    pub host_id: u8,
    pub module_id: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCounterApi {
    /// nvmlDeviceGetNvLinkErrorCounter answers (Volta to Hopper).
    Counter,
    /// nvmlDeviceGetNvLinkErrorCounter is NOT_SUPPORTED; only the scoped field values answer.
    FieldValues,
    /// Blackwell: the DL counters (the counter call and the DL fields) are NOT_SUPPORTED; each
    /// link answers the NVLink5 COUNT fields (213-222) instead.
    Nvlink5,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub active: bool,
    pub remote: Option<Pci>,
    /// nvmlIntNvLinkDeviceType_t
    pub remote_type: u32,
    pub errors: LinkErrors,
    pub nvlink5: Nvlink5,
}

/// The NVLink5 COUNT fields of one link; BERs already in NVML's packed form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Nvlink5 {
    pub recovery_successful: u64,
    pub recovery_failed: u64,
    pub recovery_events: u64,
    pub symbol_errors: u64,
    pub effective_errors: u64,
    pub effective_ber: u64,
    pub symbol_ber: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkErrors {
    pub replay: u64,
    pub recovery: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
    pub ecc_data: u64,
}

/// A PCI location, with NVML's two spellings of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pci {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl Pci {
    /// "00000000:18:00.0" or "0000:18:00.0", hex, any case.
    pub fn parse(s: &str) -> Result<Pci, String> {
        let bad = || format!("bad PCI bus id {s:?} (want e.g. \"00000000:18:00.0\")");
        let (domain, rest) = s.split_once(':').ok_or_else(bad)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |part: &str, max_len: usize, max: u32| {
            if part.is_empty() || part.len() > max_len {
                return Err(bad());
            }
            u32::from_str_radix(part, 16)
                .ok()
                .filter(|v| *v <= max)
                .ok_or_else(bad)
        };
        Ok(Pci {
            domain: hex(domain, 8, u32::MAX)?,
            bus: hex(bus, 2, 0xff)?,
            device: hex(device, 2, 0x1f)?,
            function: hex(function, 1, 7)?,
        })
    }

    /// nvmlPciInfo_t.busId: "%08X:%02X:%02X.%X".
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// nvmlPciInfo_t.busIdLegacy: "%04X:%02X:%02X.%X".
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pRule {
    /// Lower index first: a rule covers both directions.
    pub pair: (u32, u32),
    /// Bit i set: applies to capability index i.
    pub caps: u8,
    pub status: u32,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let raw: raw::RawConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        raw.validate()
    }

    /// nvmlDeviceGetP2PStatus for (a, b), either order.
    pub fn p2p_status(&self, a: u32, b: u32, cap: usize) -> u32 {
        let pair = (a.min(b), a.max(b));
        self.p2p
            .iter()
            .rev()
            .find(|r| r.pair == pair && r.caps & (1 << cap) != 0)
            .map_or(self.p2p_default[cap], |r| r.status)
    }

    /// nvmlDeviceGetTopologyCommonAncestor for (a, b), either order.
    pub fn topology(&self, a: u32, b: u32) -> u32 {
        self.topology
            .get(&(a.min(b), a.max(b)))
            .copied()
            .unwrap_or(self.default_topology)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings as sys;

    const OK: u32 = sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK;
    const NS: u32 = sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED;

    fn gpus(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    r#"{{"name": "G", "uuid": "GPU-{i}", "pci_bus_id": "00000000:{:02X}:00.0"}}"#,
                    i + 1
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn the_briefs_example_parses() {
        let cfg = Config::parse(
            r#"{"driver_version": "550.54.15",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0",
                          "pcie_replays": 0, "lost": false, "xids": [],
                          "links": [{"active": true, "remote_pci_bus_id": "00000000:2A:00.0", "remote_type": "gpu",
                                     "errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0, "ecc_data": 0}}]},
                         {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-b", "pci_bus_id": "00000000:2a:00.0"}],
                "p2p": [{"gpu": 0, "peer_gpu": 1, "capability": "read", "status": "not_supported"}]}"#,
        )
        .unwrap();
        assert_eq!(cfg.gpus.len(), 2);
        assert_eq!(cfg.gpus[1].pci.bus_id(), "00000000:2A:00.0");
        assert_eq!(cfg.gpus[1].pci.bus_id_legacy(), "0000:2A:00.0");
        assert_eq!(cfg.gpus[1].minor_number, 1);
        assert_eq!(cfg.nvml_version, "12.550.54.15");
        assert_eq!(
            cfg.default_topology,
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
        );
        let link = &cfg.gpus[0].links[0];
        assert_eq!(link.remote.as_ref().unwrap().bus, 0x2a);
        assert_eq!(
            link.remote_type,
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
        );
    }

    #[test]
    fn p2p_exceptions_cover_both_directions_and_only_their_capability() {
        let cfg = Config::parse(&format!(
            r#"{{"gpus": [{}],
                "p2p": [{{"gpu": 3, "peer_gpu": 1, "capability": "read", "status": "not_supported"}},
                        {{"gpu": 0, "peer_gpu": 2, "capability": ["write", "atomics"], "status": "disabled_by_regkey"}},
                        {{"gpu": 0, "peer_gpu": 2, "capability": "atomics", "status": "unknown"}}]}}"#,
            gpus(4)
        ))
        .unwrap();
        assert_eq!(cfg.p2p_status(1, 3, 0), NS);
        assert_eq!(cfg.p2p_status(3, 1, 0), NS);
        assert_eq!(cfg.p2p_status(1, 3, 1), OK);
        assert_eq!(cfg.p2p_status(1, 2, 0), OK);
        assert_eq!(
            cfg.p2p_status(2, 0, 1),
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_DISABLED_BY_REGKEY
        );
        // The later entry wins.
        assert_eq!(
            cfg.p2p_status(0, 2, 3),
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_UNKNOWN
        );
    }

    #[test]
    fn p2p_default_and_capability_less_rules() {
        let cfg = Config::parse(&format!(
            r#"{{"gpus": [{}], "p2p_default": {{"nvlink": "not_supported", "prop": "not_supported"}},
                "p2p": [{{"gpu": 0, "peer_gpu": 1, "status": "chipset_not_supported"}}]}}"#,
            gpus(3)
        ))
        .unwrap();
        assert_eq!(cfg.p2p_status(1, 2, 0), OK);
        assert_eq!(cfg.p2p_status(1, 2, 2), NS);
        assert_eq!(cfg.p2p_status(1, 2, 4), NS);
        for cap in 0..P2P_CAPS {
            assert_eq!(
                cfg.p2p_status(1, 0, cap),
                sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
            );
        }
    }

    #[test]
    fn topology_exceptions_and_default() {
        let cfg = Config::parse(&format!(
            r#"{{"gpus": [{}], "default_topology": "system",
                "topology": [{{"gpu": 1, "peer_gpu": 0, "level": "single"}}]}}"#,
            gpus(3)
        ))
        .unwrap();
        assert_eq!(
            cfg.topology(0, 1),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        );
        assert_eq!(
            cfg.topology(1, 0),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        );
        assert_eq!(
            cfg.topology(0, 2),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
        );
    }

    #[test]
    fn presets_parse() {
        for (name, text, gpus, links) in [
            ("pcie-8", include_str!("../../presets/pcie-8.json"), 8, 0),
            (
                "nvlink-mesh-4",
                include_str!("../../presets/nvlink-mesh-4.json"),
                4,
                12,
            ),
            (
                "nvswitch-8",
                include_str!("../../presets/nvswitch-8.json"),
                8,
                18,
            ),
            ("b200-8", include_str!("../../presets/b200-8.json"), 8, 18),
        ] {
            let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.gpus.len(), gpus, "{name}");
            for g in &cfg.gpus {
                assert_eq!(g.links.len(), links, "{name} {}", g.uuid);
            }
            let mut uuids: Vec<&str> = cfg.gpus.iter().map(|g| g.uuid.as_str()).collect();
            uuids.sort_unstable();
            uuids.dedup();
            assert_eq!(uuids.len(), gpus, "{name}: UUIDs must be unique");
        }
    }
}

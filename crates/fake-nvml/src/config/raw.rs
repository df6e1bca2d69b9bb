//! The file as written: serde's view of the JSON, with the defaults of keys left out. Every
//! struct refuses unknown keys (a typo should not silently mean "default"); validate.rs turns it
//! into a `Config`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ErrorCounterApi, LinkErrors, PcieLink, Process, Utilization};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    #[allow(dead_code)] // free text for people reading a preset
    description: Option<String>,
    #[serde(default = "default_driver")]
    pub(super) driver_version: String,
    #[serde(default)]
    pub(super) nvml_version: Option<String>,
    #[serde(default)]
    pub(super) gpus: Vec<RawGpu>,
    #[serde(default)]
    pub(super) p2p_default: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) p2p: Vec<RawP2p>,
    #[serde(default = "default_topology")]
    pub(super) default_topology: String,
    #[serde(default)]
    pub(super) topology: Vec<RawTopology>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpu {
    pub(super) name: String,
    pub(super) uuid: String,
    pub(super) pci_bus_id: String,
    #[serde(default)]
    pub(super) pci_device_id: Option<Number>,
    #[serde(default)]
    pub(super) pci_subsystem_id: Option<Number>,
    #[serde(default)]
    pub(super) minor_number: Option<u32>,
    #[serde(default)]
    pub(super) pcie_replays: u64,
    #[serde(default)]
    pub(super) lost: bool,
    #[serde(default)]
    pub(super) xids: Vec<u64>,
    #[serde(default = "yes")]
    pub(super) xid_events: bool,
    #[serde(default = "default_api")]
    pub(super) error_counter_api: ErrorCounterApi,
    #[serde(default)]
    pub(super) recovery_action: Option<String>,
    #[serde(default)]
    pub(super) fabric: Option<RawFabric>,
    #[serde(default)]
    pub(super) platform: Option<RawPlatform>,
    #[serde(default)]
    pub(super) vbios: Option<String>,
    #[serde(default)]
    pub(super) processes: Vec<Process>,
    #[serde(default)]
    pub(super) pcie_link: Option<PcieLink>,
    #[serde(default)]
    pub(super) utilization: Option<Utilization>,
    #[serde(default)]
    pub(super) links: Vec<RawLink>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFabric {
    pub(super) state: String,
    #[serde(default = "success")]
    pub(super) status: String,
    #[serde(default)]
    pub(super) degraded_bandwidth: bool,
    #[serde(default)]
    pub(super) route_unhealthy: bool,
    #[serde(default)]
    pub(super) cluster_uuid: Option<String>,
    #[serde(default)]
    pub(super) clique_id: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlatform {
    #[serde(default)]
    pub(super) chassis_serial: String,
    #[serde(default)]
    pub(super) slot: u8,
    #[serde(default)]
    pub(super) tray: u8,
    #[serde(default)]
    pub(super) host_id: u8,
    #[serde(default)]
    pub(super) module_id: u8,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    #[serde(default = "yes")]
    pub(super) active: bool,
    #[serde(default)]
    pub(super) remote_pci_bus_id: Option<String>,
    #[serde(default)]
    pub(super) remote_type: Option<String>,
    #[serde(default)]
    pub(super) errors: LinkErrors,
    #[serde(default)]
    pub(super) nvlink5: RawNvlink5,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawNvlink5 {
    pub(super) recovery_successful: u64,
    pub(super) recovery_failed: u64,
    pub(super) recovery_events: u64,
    pub(super) symbol_errors: u64,
    pub(super) effective_errors: u64,
    pub(super) effective_ber: f64,
    pub(super) symbol_ber: f64,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawP2p {
    pub(super) gpu: u32,
    pub(super) peer_gpu: u32,
    /// Absent: every capability.
    #[serde(default)]
    pub(super) capability: Option<OneOrMany>,
    pub(super) status: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTopology {
    pub(super) gpu: u32,
    pub(super) peer_gpu: u32,
    pub(super) level: String,
}

/// A number, or a string "0x..." for hardware ids that read better in hex.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Number {
    Int(u32),
    Text(String),
}

impl Number {
    fn value(&self) -> Result<u32, String> {
        match self {
            Number::Int(v) => Ok(*v),
            Number::Text(s) => s
                .strip_prefix("0x")
                .or_else(|| s.strip_prefix("0X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad number {s:?} (want an integer or \"0x...\")")),
        }
    }
}

/// An id left out is 0.
pub(super) fn number(n: &Option<Number>) -> Result<u32, String> {
    n.as_ref().map_or(Ok(0), Number::value)
}

fn default_driver() -> String {
    "550.54.15".into()
}

fn default_topology() -> String {
    "node".into()
}

fn yes() -> bool {
    true
}

fn success() -> String {
    "success".into()
}

fn default_api() -> ErrorCounterApi {
    ErrorCounterApi::Counter
}

//! GPU readings (what NVML said) and pair verdicts (what the judge made of them). Field names
//! are `check --json`'s.

use serde::{Serialize, Serializer};

use super::{PairReason, Severity};

/// The far end of an NVLink, as the contract's `peer` label spells it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// One of this machine's GPUs, by NVML index.
    Gpu(u32),
    Switch,
    /// Some other PCI device, by bus id.
    Pci(String),
    Unknown,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Gpu(i) => write!(f, "gpu:{i}"),
            Peer::Switch => f.write_str("switch"),
            Peer::Pci(bus) => write!(f, "pci:{bus}"),
            Peer::Unknown => f.write_str("unknown"),
        }
    }
}

impl Serialize for Peer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// NVLink error counters of one link (NVML's DL replay, recovery, CRC flit, CRC data, ECC data).
/// Read back too: a restart carries the windows the pair judge measures growth over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LinkErrors {
    pub replay: u64,
    pub recovery: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
    pub ecc_data: u64,
}

impl LinkErrors {
    /// [replay, recovery, crc_flit, crc_data, ecc_data]: the order the link ledgers and the
    /// trend's counters list them in.
    pub fn values(&self) -> [u64; 5] {
        [
            self.replay,
            self.recovery,
            self.crc_flit,
            self.crc_data,
            self.ecc_data,
        ]
    }
}

/// A bit error rate as NVML packs it in NVML_FI_DEV_NVLINK_COUNT_{EFFECTIVE,SYMBOL}_BER: bits
/// 0-7 the exponent, bits 8-11 the mantissa (nvml.h, "NVLink Effective BER", macro
/// NVML_NVLINK_ERROR_COUNTER_BER_GET, NVML 13.3 as copied in NVIDIA/go-nvml gen/nvml/nvml.h); the
/// rate is mantissa x 10^-exponent (NVIDIA/DCGM, DcgmNs::Utils::NvmlBerParser). 15e-255, the
/// largest encoding, is how a link with no errors measured reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ber {
    pub mantissa: u8,
    pub exponent: u8,
}

impl Ber {
    pub fn from_raw(raw: u64) -> Ber {
        Ber {
            mantissa: ((raw >> 8) & 0xf) as u8,
            exponent: (raw & 0xff) as u8,
        }
    }

    pub fn raw(self) -> u64 {
        (u64::from(self.mantissa & 0xf) << 8) | u64::from(self.exponent)
    }

    pub fn value(self) -> f64 {
        f64::from(self.mantissa) * 10f64.powi(-i32::from(self.exponent))
    }
}

impl Serialize for Ber {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.value())
    }
}

/// The NVLink5 COUNT fields of one link (NVML field ids 213-222 with scopeId = link), read
/// where the DL counters answer NOT_SUPPORTED (Blackwell). A count a GPU does not answer reads
/// 0; a BER it does not answer is None.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Nvlink5Errors {
    pub recovery_successful: u64,
    pub recovery_failed: u64,
    pub recovery_events: u64,
    pub symbol: u64,
    pub effective: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_ber: Option<Ber>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol_ber: Option<Ber>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkReading {
    pub link: u32,
    pub active: bool,
    pub peer: Peer,
    /// The DL counters; None when NVML could not read them.
    pub errors: Option<LinkErrors>,
    /// The NVLink5 counters; None on GPUs without them.
    pub nvlink5: Option<Nvlink5Errors>,
}

impl Nvlink5Errors {
    /// [recovery_successful, recovery_failed, recovery_events, symbol, effective] (the BERs are
    /// rates, not counts).
    pub fn counts(&self) -> [u64; 5] {
        [
            self.recovery_successful,
            self.recovery_failed,
            self.recovery_events,
            self.symbol,
            self.effective,
        ]
    }
}

/// `errors` in the JSON carries whichever counters the link has (both on a GPU that answers
/// both); null when it has none.
impl Serialize for LinkReading {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let errors = match (self.errors, self.nvlink5) {
            (None, None) => serde_json::Value::Null,
            (dl, n5) => {
                let mut map = serde_json::Map::new();
                for part in [dl.map(serde_json::to_value), n5.map(serde_json::to_value)]
                    .into_iter()
                    .flatten()
                {
                    if let Ok(serde_json::Value::Object(o)) = part {
                        map.extend(o);
                    }
                }
                serde_json::Value::Object(map)
            }
        };
        let mut st = s.serialize_struct("LinkReading", 4)?;
        st.serialize_field("link", &self.link)?;
        st.serialize_field("active", &self.active)?;
        st.serialize_field("peer", &self.peer)?;
        st.serialize_field("errors", &errors)?;
        st.end()
    }
}

/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230), nvmlDeviceGpuRecoveryAction_t: what NVML
/// says the GPU needs (nvml.h, NVML 13.3, NVIDIA/go-nvml gen/nvml/nvml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

impl RecoveryAction {
    /// NVML's value; None for values this agent does not know (e.g. 5, RECOVER_IMEX_DOMAIN,
    /// from NVML 13.x), which are treated as not answered.
    pub fn from_nvml(v: u64) -> Option<RecoveryAction> {
        Some(match v {
            0 => RecoveryAction::None,
            1 => RecoveryAction::GpuReset,
            2 => RecoveryAction::NodeReboot,
            3 => RecoveryAction::DrainP2p,
            4 => RecoveryAction::DrainAndReset,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryAction::None => "none",
            RecoveryAction::GpuReset => "gpu_reset",
            RecoveryAction::NodeReboot => "node_reboot",
            RecoveryAction::DrainP2p => "drain_p2p",
            RecoveryAction::DrainAndReset => "drain_and_reset",
        }
    }

    /// P2P traffic to and from the GPU must stop: its pairs are degraded.
    pub fn drains_p2p(self) -> bool {
        matches!(
            self,
            RecoveryAction::DrainP2p | RecoveryAction::DrainAndReset
        )
    }

    /// A GPU reset or a reboot: a fault of the GPU (the `GpuFault` condition).
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            RecoveryAction::GpuReset | RecoveryAction::NodeReboot | RecoveryAction::DrainAndReset
        )
    }
}

/// nvmlGpuFabricState_t (NVML_GPU_FABRIC_STATE_*): the GPU's registration with the NVSwitch
/// fabric (fabric manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricState {
    NotStarted,
    InProgress,
    Completed,
}

/// nvmlDeviceGetGpuFabricInfoV's answer, for a GPU that takes part in a fabric. `status` is
/// NVML's return code of the registration ("success" or the error's snake-case name), only
/// meaningful once `state` is completed. The health-mask flags are None where the GPU does not
/// report them (NVML_GPU_FABRIC_HEALTH_MASK_*_NOT_SUPPORTED).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricInfo {
    pub state: FabricState,
    pub status: String,
    pub degraded_bandwidth: Option<bool>,
    pub route_unhealthy: Option<bool>,
    /// The NVLink domain: the fabric cluster's UUID (lower-case `8-4-4-4-12`) and the clique
    /// within it; both None while NVML's clusterUuid is all zero (not registered yet, or no
    /// multi-node fabric). The fleet rules group faults by the pair.
    pub cluster_uuid: Option<String>,
    pub clique_id: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
    pub pcie_replays: Option<u64>,
    /// NVML answered GPU_IS_LOST: the GPU fell off the bus.
    pub lost: bool,
    /// NVML's recovery action; absent when NVML does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<RecoveryAction>,
    /// Fabric registration and health; absent on GPUs without fabric registration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricInfo>,
    /// Where the GPU sits (chassis, slot, tray); absent before Blackwell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<super::PlatformInfo>,
    /// Its VBIOS version; absent where NVML does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    pub links: Vec<LinkReading>,
    /// The PCI addresses (`0000:05:00.0`) of the NVSwitches its NVLinks go to (NVML's remote
    /// PCI info of its links to a switch), lowest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nvswitches: Vec<String>,
    /// The processes using it (NVML's running compute and graphics processes), host PIDs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
    /// Its PCIe link as trained now and at most; absent where NVML does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_link: Option<PcieLink>,
    /// How busy it was over NVML's last sample period, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<u32>,
    /// Its PCI functions from the GPU up to its root port, as sysfs shows them (the GPU
    /// first); empty where sysfs does not list it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pcie_path: Vec<PcieHop>,
}

/// One PCI function on a GPU's way up to its root port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcieHop {
    /// `0000:1c:00.0`, as sysfs names it.
    pub bdf: String,
    /// A PCI-to-PCI bridge (a switch port or a root port); the GPU is not.
    pub bridge: bool,
    /// Its AER counters' totals; absent where it has no AER files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aer: Option<AerTotals>,
    pub acs: AcsState,
    /// sysfs `current_link_width` and `max_link_width`: lanes trained and lanes both ends allow
    /// (absent where sysfs has no such files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_width: Option<(u32, u32)>,
}

/// A device's AER error counts since boot (sysfs `aer_dev_*`, their `TOTAL_ERR_*` lines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AerTotals {
    pub correctable: u64,
    pub nonfatal: u64,
    pub fatal: u64,
}

/// A bridge's Access Control Services, from its config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AcsState {
    /// The extended config space could not be read (it takes CAP_SYS_ADMIN), or not a bridge.
    Unknown,
    /// No ACS capability.
    Absent,
    /// The ACS control register (`ECAP_ACS+6`).
    Control(u16),
}

impl AcsState {
    /// P2P Request Redirect, P2P Completion Redirect, P2P Egress Control: the bits that send
    /// peer-to-peer traffic up to the root complex (or block it), as the kernel's P2PDMA
    /// check counts them.
    pub const REDIRECT_BITS: u16 = 0x0004 | 0x0008 | 0x0020;

    /// Whether it redirects peer-to-peer traffic.
    pub fn redirects(self) -> bool {
        matches!(self, AcsState::Control(c) if c & Self::REDIRECT_BITS != 0)
    }
}

/// A process NVML lists on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    /// In the host's PID namespace (NVML's view); the agent runs with the host's.
    pub pid: u32,
    /// Absent where NVML cannot say (no permission, MIG).
    pub used_memory_bytes: Option<u64>,
}

/// A GPU's PCIe link: generation and width now, and the most the GPU and its slot allow
/// (nvmlDeviceGetMaxPcieLinkGeneration is the device's and the system's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PcieLink {
    pub gen: u32,
    pub max_gen: u32,
    pub width: u32,
    pub max_width: u32,
}

/// nvmlGpuP2PStatus_t, in the contract's snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum P2pStatus {
    Ok,
    ChipsetNotSupported,
    GpuNotSupported,
    IohTopologyNotSupported,
    DisabledByRegkey,
    NotSupported,
    Unknown,
}

impl P2pStatus {
    /// The contract's snake-case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            P2pStatus::Ok => "ok",
            P2pStatus::ChipsetNotSupported => "chipset_not_supported",
            P2pStatus::GpuNotSupported => "gpu_not_supported",
            P2pStatus::IohTopologyNotSupported => "ioh_topology_not_supported",
            P2pStatus::DisabledByRegkey => "disabled_by_regkey",
            P2pStatus::NotSupported => "not_supported",
            P2pStatus::Unknown => "unknown",
        }
    }
}

/// P2P status per capability (nvmlDeviceGetP2PStatus with read, write, nvlink, atomics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct P2pCaps {
    pub read: P2pStatus,
    pub write: P2pStatus,
    pub nvlink: P2pStatus,
    pub atomics: P2pStatus,
}

impl P2pCaps {
    pub fn iter(&self) -> [(&'static str, P2pStatus); 4] {
        [
            ("read", self.read),
            ("write", self.write),
            ("nvlink", self.nvlink),
            ("atomics", self.atomics),
        ]
    }
}

/// nvmlGpuTopologyLevel_t: the closest common ancestor of two GPUs, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyLevel {
    Internal,
    Single,
    Multiple,
    Hostbridge,
    Node,
    System,
}

impl TopologyLevel {
    /// The snake-case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyLevel::Internal => "internal",
            TopologyLevel::Single => "single",
            TopologyLevel::Multiple => "multiple",
            TopologyLevel::Hostbridge => "hostbridge",
            TopologyLevel::Node => "node",
            TopologyLevel::System => "system",
        }
    }
}

/// What NVML says of one unordered GPU pair in one scan (`gpu < peer_gpu`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairSample {
    pub gpu: u32,
    pub peer_gpu: u32,
    /// None when the P2P query itself failed (e.g. a lost GPU).
    pub p2p: Option<P2pCaps>,
    pub topology: Option<TopologyLevel>,
}

/// One scan of every GPU and pair, before any verdict.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    pub gpus: Vec<GpuReading>,
    pub pairs: Vec<PairSample>,
    /// The hypervisor this machine runs under, where it says (a VM's PCIe bridges are
    /// emulated: their ACS says nothing of the host's).
    pub hypervisor: Option<String>,
    /// The pair probe's last results (`serve --p2p-probe-interval`), ordered pairs.
    pub probes: Vec<PairProbe>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairStatus {
    Ok,
    Degraded,
    Down,
}

/// The pair probe's verdict on one ordered pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    Ok,
    Degraded,
    Failed,
}

impl ProbeStatus {
    /// What the verdict weighs on its pair: copies that failed (an error, corrupted bytes, a
    /// hang, a crash, peer access refused where NVML says P2P works) break transfers; copies
    /// under half of what they should carry slow jobs down.
    pub fn weight(self) -> Option<Weight> {
        match self {
            ProbeStatus::Ok => None,
            ProbeStatus::Degraded => Some(Weight::Errors),
            ProbeStatus::Failed => Some(Weight::Broken),
        }
    }
}

/// What copies from one GPU to another did (`shmlink probe --json`'s `pairs[]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairProbe {
    /// NVML indices.
    pub from_gpu: u32,
    pub to_gpu: u32,
    pub status: ProbeStatus,
    /// Peer access could be enabled.
    pub peer_access: bool,
    /// The bytes read back were the bytes sent.
    pub verified: bool,
    /// The sized copy, GB/s (10^9 bytes per second), as CUDA's events timed it.
    pub gbps: Option<f64>,
    /// What the pair's own path carries, GB/s, as NVML describes it; null when unknown.
    pub expected_gbps: Option<f64>,
    /// Why it is not ok, for people.
    pub reason: Option<String>,
}

/// Which GPUs the failing pairs point at: the pair judge's word (`gpu::pairs`), which every text
/// that tells a person what to reset takes, so that none names a GPU that is not at fault.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blame {
    /// The most to blame first; empty when no pair fails or when `node_wide`.
    pub suspects: Vec<Suspect>,
    /// Every pair of every GPU fails: the node (fabric, platform, driver), not one GPU.
    pub node_wide: bool,
}

impl Blame {
    /// The GPUs it names as culprits: not "either end" of pairs that share no GPU (those are
    /// told pair by pair), nor any when every GPU fails (`suspects` is empty then: the node's
    /// fault). Every command that names a GPU to take out takes these.
    pub fn culprits(&self) -> impl Iterator<Item = &Suspect> {
        self.suspects
            .iter()
            .filter(|s| s.by != SuspectBy::EitherEnd)
    }
}

/// One GPU the failing pairs point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspect {
    pub gpu: u32,
    /// How many of its pairs fail.
    pub bad_pairs: usize,
    pub by: SuspectBy,
    /// Its pairs' reasons that name it (with their link numbers), else all of its pairs'.
    pub reasons: Vec<PairReason>,
}

/// Why a GPU is a suspect, surest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SuspectBy {
    /// All of its pairs fail, with three GPUs or more: the broken-GPU case.
    FailsWithAll,
    /// It is in more failing pairs than any other GPU (two or more).
    MostPairs,
    /// Failing pairs share no GPU: either end of each may be at fault.
    EitherEnd,
}

/// The verdict on one GPU pair: the contract's `gpu_pairs` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairVerdict {
    pub gpu: u32,
    pub peer_gpu: u32,
    pub status: PairStatus,
    /// Absent when the query failed.
    pub p2p: Option<P2pCaps>,
    pub topology: Option<TopologyLevel>,
    /// Links of `gpu` that lead directly to `peer_gpu` (empty on NVSwitch and PCIe boards).
    pub links: Vec<u32>,
    /// Written out as their words.
    pub reasons: Vec<PairReason>,
    /// Since when the pair has failed without a break (by the agent's clock; None while ok).
    #[serde(skip)]
    pub since: Option<std::time::SystemTime>,
}

/// How bad one reason is. The pair's status is the worst of its reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weight {
    /// Error counters over threshold: the link still carries traffic (NVLink retries replays
    /// and CRC failures in hardware), so jobs slow down rather than crash; DCGM's health watch
    /// calls this a warning. Degraded, Warning.
    Errors,
    /// P2P lost or failing where its neighbours work, some NVSwitch links inactive: transfers
    /// between the pair fail or fall back, which is what crashed the all-reduce. Degraded,
    /// Critical.
    Broken,
    /// An inactive direct link, all switch links inactive, a lost GPU. Down, Critical.
    Down,
}

impl Weight {
    pub fn status(self) -> PairStatus {
        match self {
            Weight::Errors | Weight::Broken => PairStatus::Degraded,
            Weight::Down => PairStatus::Down,
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Weight::Errors => Severity::Warning,
            Weight::Broken | Weight::Down => Severity::Critical,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serialized_names() {
        assert_eq!(
            P2pStatus::IohTopologyNotSupported.as_str(),
            "ioh_topology_not_supported"
        );
        for status in [
            P2pStatus::Ok,
            P2pStatus::ChipsetNotSupported,
            P2pStatus::GpuNotSupported,
            P2pStatus::IohTopologyNotSupported,
            P2pStatus::DisabledByRegkey,
            P2pStatus::NotSupported,
            P2pStatus::Unknown,
        ] {
            let json = serde_json::to_string(&status).expect("json");
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        for level in [
            TopologyLevel::Internal,
            TopologyLevel::Single,
            TopologyLevel::Multiple,
            TopologyLevel::Hostbridge,
            TopologyLevel::Node,
            TopologyLevel::System,
        ] {
            let json = serde_json::to_string(&level).expect("json");
            assert_eq!(json, format!("\"{}\"", level.as_str()));
        }
    }
}

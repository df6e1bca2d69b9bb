//! The result of one scan: immutable once built, shared behind an `Arc`. Field names are the
//! JSON of `shmlink check --json` (see CONTRACT.md), so they are part of the user-facing
//! contract.

use serde::Serialize;

use super::{
    Blame, Blind, ContainerRef, Failure, Finding, FindingKind, GpuReading, GpuUsers, GpuVerdict,
    JobLinks, NodeInfo, NvmlState, PairProbe, PairVerdict, Severity, ShmReading, Sight,
};

/// NVSwitch SXIDs of one kind on one switch, as the kernel log told them (`check --json`'s
/// `sxids[]`, `shmlink_nvswitch_sxid_errors_total`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SxidCount {
    /// The switch's PCI address, `0000:05:00.0`.
    pub switch: String,
    pub sxid: u64,
    pub count: u64,
    /// The driver called it Fatal (to the fabric), not Non-fatal or Correctable.
    pub fatal: bool,
}

/// NVLink training failures the kernel log told on one GPU (XIDs 74 and 136 naming links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainingCount {
    /// The GPU's PCI address, `0000:18:00.0` (NVML may not list it).
    pub pci_bus_id: String,
    /// The links named, lowest first.
    pub links: Vec<u32>,
    pub count: u64,
}

/// XID errors of one kind on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XidCount {
    /// NVML's index; None for a GPU NVML does not list (the kernel log named it by address).
    pub gpu: Option<u32>,
    /// `0000:29:00.0`; empty where not known.
    pub pci_bus_id: String,
    pub xid: u64,
    pub count: u64,
}

impl XidCount {
    /// `count` XIDs `xid` on NVML's GPU `gpu` (its address not said).
    pub fn on(gpu: u32, xid: u64, count: u64) -> XidCount {
        XidCount {
            gpu: Some(gpu),
            pci_bus_id: String::new(),
            xid,
            count,
        }
    }
    /// The GPU as the metrics' `gpu` label names it: its index, else its PCI address.
    pub fn gpu_label(&self) -> String {
        self.gpu
            .map_or_else(|| self.pci_bus_id.clone(), |g| g.to_string())
    }
}

/// One scan of the machine.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub node: String,
    pub shm: Vec<ShmReading>,
    /// Each Pod sandbox's /dev/shm on the host (containerd, CRI-O), which every container of the
    /// Pod shares and which outlives them: `pod_uid` set, `container` null, `container_id` the
    /// sandbox's. Not containers, so not in `shm`.
    pub sandbox_shm: Vec<ShmReading>,
    /// Filled by the GPU collector; empty when no NVML is loaded.
    pub gpus: Vec<GpuReading>,
    pub gpu_pairs: Vec<PairVerdict>,
    /// One verdict per GPU (`gpu::verdict`): what every outlet that tells a GPU's health renders.
    pub gpu_verdicts: Vec<GpuVerdict>,
    /// How long a fatal XID holds (`--gpu-fault-hold`), for the words that say so.
    #[serde(skip)]
    pub gpu_fault_hold: std::time::Duration,
    /// Which GPUs the failing pairs point at: the pair judge's word, for every text that says
    /// what to reset.
    #[serde(skip)]
    pub gpu_blame: Blame,
    /// Which processes (and containers) used which GPUs lately.
    #[serde(skip)]
    pub gpu_users: GpuUsers,
    /// What each NVLink did while each container ran (serve's ledger; `check`'s only from
    /// serve's checkpoint): a failure's `gpu_links`.
    #[serde(skip)]
    pub job_links: std::sync::Arc<JobLinks>,
    /// The pair probe's last results (`serve --p2p-probe-interval`).
    #[serde(skip)]
    pub gpu_probes: Vec<PairProbe>,
    /// XID errors since the agent started.
    pub xids: Vec<XidCount>,
    /// Lines of the kernel log that read as XIDs without NVML's word (a fatal XID NVML did not
    /// confirm, a lookalike): evidence, never an XID (`gpu::xid::kernel`).
    #[serde(skip)]
    pub xids_unconfirmed: Vec<XidCount>,
    /// IOMMU page faults the kernel log named each GPU in (by index), since the agent started.
    #[serde(skip)]
    pub iommu_faults: std::collections::BTreeMap<u32, u64>,
    /// NVSwitch SXIDs the kernel log told since the agent started, by switch and SXID.
    pub sxids: Vec<SxidCount>,
    pub findings: Vec<Finding>,
    /// What the workloads' logs and the kernel said recently.
    pub failures: Vec<Failure>,
    /// NVML's state: loaded, the library tried, why it did not load.
    pub nvml: NvmlState,
    /// The driver, fabric manager and kernel the node runs (the fleet's correlation keys).
    pub node_info: NodeInfo,
    /// Why the scan could not see everything (empty when it did): never "all healthy" then.
    pub blind: Vec<Blind>,
    /// What the shm scan could look into, counted (how many it could not read).
    pub sight: Sight,
    /// Failures counted since the agent started, per container and kind
    /// (`shmlink_workload_failures_total`).
    #[serde(skip)]
    pub failure_counts: Vec<(ContainerRef, FindingKind, u64)>,
    /// The image of each container counted there: where the fleet finds which images die
    /// (`shmlink_workload_image_info`).
    #[serde(skip)]
    pub failure_images: Vec<(ContainerRef, String)>,
    /// Whether NVML is loaded and answering (`shmlink_nvml_up`).
    #[serde(skip)]
    pub nvml_up: bool,
    /// The PCI bus ids of the NVIDIA GPUs the driver lists (`/proc/driver/nvidia/gpus`),
    /// whether or not NVML loads (`shmlink_gpu_devices`); empty without a driver.
    #[serde(skip)]
    pub driver_gpus: Vec<String>,
    /// When the scan finished.
    #[serde(skip)]
    pub taken_at: Option<std::time::SystemTime>,
    /// Containers gone from the scan whose last readings were added after its own (for the
    /// failures told after their container went), with when a scan first found each gone: a
    /// later crash with its measured PID is another process's (the PID was reused).
    #[serde(skip)]
    pub gone_since: std::collections::HashMap<String, std::time::SystemTime>,
    /// Each link counter that grew over the days kept (`links::trend`), the steady ones marked.
    #[serde(skip)]
    pub link_trends: Vec<super::LinkTrend>,
}

impl Snapshot {
    pub fn worst_severity(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }

    /// The reasons this scan measured nothing (check exits 2, serve is not ready).
    pub fn blind_totally(&self) -> impl Iterator<Item = Blind> + '_ {
        self.blind.iter().copied().filter(|b| b.is_total())
    }
}

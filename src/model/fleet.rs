//! What places a GPU and a node among the fleet's: the keys the fleet rules group faults by
//! (the NVLink domain is `FabricInfo`'s), read where the driver has them.

use serde::{Deserialize, Serialize};

use super::{GpuReading, Snapshot};

/// nvmlDeviceGetPlatformInfo's answer (Blackwell and newer): where the GPU sits. Read once at
/// load: it does not change while the driver runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlatformInfo {
    /// The chassis (rack) serial number: its text where it is printable ASCII, else hex.
    pub chassis_serial: String,
    /// The slot in the chassis (switch trays counted), the compute tray, the host within the
    /// slot and the GPU within the host, as NVML numbers them.
    pub slot: u8,
    pub tray: u8,
    pub host_id: u8,
    pub module_id: u8,
}

/// What the node runs, for the fleet's correlation (`shmlink_node_info`, `check --json`'s
/// `node_info`): each None where it could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The NVIDIA driver, as NVML says (`nvmlSystemGetDriverVersion`).
    pub driver: Option<String>,
    /// The fabric manager's version while one runs on the node (found under the proc root):
    /// the driver's, since the fabric manager refuses to run against any other.
    pub fabric_manager: Option<String>,
    /// The running kernel's release (`uname -r`).
    pub kernel: Option<String>,
}

/// One GPU's fleet keys as `serve` answers them on `/api/v1/gpus` (what `shmlink fleet` groups
/// by): each empty where unknown, as on `shmlink_gpu_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuKeys {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub lost: bool,
    pub cluster_uuid: Option<String>,
    pub clique_id: Option<u32>,
    pub chassis_serial: Option<String>,
    pub slot: Option<u8>,
    pub tray: Option<u8>,
    pub vbios: Option<String>,
}

impl GpuKeys {
    pub fn of(g: &GpuReading) -> GpuKeys {
        let fabric = g.fabric.as_ref();
        let platform = g.platform.as_ref();
        GpuKeys {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            lost: g.lost,
            cluster_uuid: fabric.and_then(|f| f.cluster_uuid.clone()),
            clique_id: fabric.and_then(|f| f.clique_id),
            chassis_serial: platform.map(|p| p.chassis_serial.clone()),
            slot: platform.map(|p| p.slot),
            tray: platform.map(|p| p.tray),
            vbios: g.vbios.clone(),
        }
    }

    /// The NVLink domain as NVIDIA's GPU feature discovery labels a node with it
    /// (`nvidia.com/gpu.clique`): `<cluster UUID>.<clique ID>`.
    pub fn domain(&self) -> Option<String> {
        Some(format!(
            "{}.{}",
            self.cluster_uuid.as_ref()?,
            self.clique_id?
        ))
    }
}

/// `/api/v1/gpus`: the node, what it runs and its GPUs' keys, from the last scan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeKeys {
    pub node: String,
    pub node_info: NodeInfo,
    pub gpus: Vec<GpuKeys>,
}

impl NodeKeys {
    pub fn of(s: &Snapshot) -> NodeKeys {
        NodeKeys {
            node: s.node.clone(),
            node_info: s.node_info.clone(),
            gpus: s.gpus.iter().map(GpuKeys::of).collect(),
        }
    }
}

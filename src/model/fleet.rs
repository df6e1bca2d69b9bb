//! What places a GPU and a node among the fleet's: the keys the fleet rules group faults by
//! (the NVLink domain is `FabricInfo`'s), read where the driver has them.

use serde::Serialize;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// The NVIDIA driver, as NVML says (`nvmlSystemGetDriverVersion`).
    pub driver: Option<String>,
    /// The fabric manager's version while one runs on the node (found under the proc root):
    /// the driver's, since the fabric manager refuses to run against any other.
    pub fabric_manager: Option<String>,
    /// The running kernel's release (`uname -r`).
    pub kernel: Option<String>,
}

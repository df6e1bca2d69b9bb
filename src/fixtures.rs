//! Test builders shared by the unit tests and tests/ (as controller-rs keeps its fixtures): one
//! way to make a reading, so a new field is added in one place.

use crate::findings::{shm_findings, Thresholds};
use crate::gpu::GpuReading;
use crate::kube::pods::PodIndex;
use crate::snapshot::{ShmReading, ShmStatus, Snapshot};

pub const MIB: u64 = 1 << 20;

/// A container on a `size`-byte tmpfs with `used` bytes in it, no memory limit, no names.
pub fn shm_reading(container_id: &str, size: u64, used: u64) -> ShmReading {
    ShmReading {
        namespace: None,
        pod: None,
        pod_uid: None,
        container: None,
        container_id: container_id.into(),
        pid: 1,
        cgroup: format!("/x/{container_id}"),
        host_ipc: false,
        mounted: true,
        fs_type: Some("tmpfs".into()),
        size_bytes: Some(size),
        used_bytes: Some(used),
        available_bytes: Some(size.saturating_sub(used)),
        memory_limit_bytes: None,
        memory_shmem_bytes: None,
        status: ShmStatus::Ok,
    }
}

/// The same reading, named as the Pod cache names it.
pub fn in_pod(
    mut r: ShmReading,
    namespace: &str,
    pod: &str,
    pod_uid: &str,
    container: &str,
) -> ShmReading {
    r.namespace = Some(namespace.into());
    r.pod = Some(pod.into());
    r.pod_uid = Some(pod_uid.into());
    r.container = Some(container.into());
    r
}

/// An H100 with no links, as NVML lists it.
pub fn gpu_reading(index: u32) -> GpuReading {
    GpuReading {
        index,
        uuid: format!("GPU-{index}"),
        name: "H100".into(),
        pci_bus_id: String::new(),
        pcie_replays: Some(0),
        lost: false,
        links: Vec::new(),
    }
}

/// A snapshot as a scan makes it from these readings: statuses set and shm findings made with
/// the default thresholds (and the Pod cache, when given).
pub fn scanned(node: &str, mut shm: Vec<ShmReading>, pods: Option<&PodIndex>) -> Snapshot {
    let findings = shm_findings(&mut shm, &Thresholds::default(), pods);
    Snapshot {
        node: node.into(),
        shm,
        findings,
        ..Snapshot::default()
    }
}

//! The /dev/shm gauges of each container the scan measured, and the container labels every
//! container series carries.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::model::ShmReading;

use super::gauge;

/// The labels of a container's series in the contract's order, "" where unknown; of anything
/// with a container's fields (a reading, the container a failure was placed in).
macro_rules! container_labels {
    ($c:expr) => {
        [
            ("namespace", $c.namespace.as_deref().unwrap_or("")),
            ("pod", $c.pod.as_deref().unwrap_or("")),
            ("container", $c.container.as_deref().unwrap_or("")),
            ("container_id", $c.container_id.as_str()),
            ("pod_uid", $c.pod_uid.as_deref().unwrap_or("")),
        ]
    };
}
pub(super) use container_labels;

type ShmValue = fn(&ShmReading) -> Option<u64>;

const SHM_GAUGES: [(&str, &str, ShmValue); 7] = [
    (
        "shmlink_shm_size_bytes",
        "tmpfs size of the container's /dev/shm (absent when unlimited)",
        |r| r.size_bytes,
    ),
    (
        "shmlink_shm_used_bytes",
        "Bytes used in the container's /dev/shm (statvfs)",
        |r| r.used_bytes,
    ),
    (
        "shmlink_shm_used_peak_bytes",
        "Highest bytes used in the container's /dev/shm since the previous scan",
        |r| r.used_peak_bytes,
    ),
    (
        "shmlink_shm_available_bytes",
        "Bytes that can still be written: min(tmpfs free, memory cgroup headroom)",
        |r| r.available_bytes,
    ),
    (
        "shmlink_shm_memory_limit_bytes",
        "Lowest memory limit of the cgroup the container's tmpfs pages are charged to",
        |r| r.memory_limit_bytes,
    ),
    (
        "shmlink_shm_host_ipc",
        "1 when the container shares the host's IPC namespace",
        |r| Some(u64::from(r.host_ipc)),
    ),
    (
        "shmlink_shm_mounted",
        "1 when the container has a /dev/shm mount (no series when it could not be measured)",
        |r| r.mounted.map(u64::from),
    ),
];

/// The `shmlink_shm_*` gauges: a series where the reading has the value.
pub(super) fn encode(encoder: &mut DescriptorEncoder, readings: &[ShmReading]) -> fmt::Result {
    for (name, help, value) in SHM_GAUGES {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for r in readings {
            if let Some(v) = value(r) {
                gauge(&mut metric, &container_labels!(r), v)?;
            }
        }
    }
    Ok(())
}

//! One container's /dev/shm as a scan found it.

use serde::Serialize;

use super::ContainerRef;

/// Fullness of one /dev/shm against its effective limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmStatus {
    Ok,
    Warning,
    Critical,
}

impl ShmStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ShmStatus::Ok => "ok",
            ShmStatus::Warning => "warning",
            ShmStatus::Critical => "critical",
        }
    }
}

/// One container's /dev/shm, as found by a scan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShmReading {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    pub container: Option<String>,
    pub container_id: String,
    /// The process the container was measured through (one of its processes).
    pub pid: i32,
    /// The container's cgroup, relative to the hierarchy it was found in.
    pub cgroup: String,
    pub host_ipc: bool,
    /// False when the container has no /dev/shm mount; the numbers are then null. Null when
    /// /dev/shm could not be measured (`error` says why): unknown, never "not mounted".
    pub mounted: Option<bool>,
    /// File system type of the /dev/shm mount (`tmpfs` normally).
    pub fs_type: Option<String>,
    /// tmpfs size; null for a tmpfs with no size limit.
    pub size_bytes: Option<u64>,
    /// Bytes in use per statvfs (counts unlinked files still held open); null when the tmpfs
    /// has no size limit, since statvfs then reports no block counts.
    pub used_bytes: Option<u64>,
    /// Effective: min(tmpfs free, memory-cgroup headroom).
    pub available_bytes: Option<u64>,
    /// Lowest memory limit of the container's cgroup and its ancestors.
    pub memory_limit_bytes: Option<u64>,
    /// Shared memory charged to the container's memory cgroup (memory.stat), when readable.
    pub memory_shmem_bytes: Option<u64>,
    /// The container's processes its memory cgroup counted as OOM-killed, when read (`serve`
    /// without the kernel log).
    #[serde(skip)]
    pub memory_oom_kills: Option<u64>,
    /// The highest `used_bytes` seen since the previous scan (sampled between scans while the
    /// container is half full or growing); the scan's own reading at least.
    pub used_peak_bytes: Option<u64>,
    /// The container's image, where its runtime's record says (Docker).
    pub image: Option<String>,
    pub status: ShmStatus,
    /// Why /dev/shm could not be measured (permission, I/O, a system call the kernel lacks);
    /// null when it was.
    pub error: Option<String>,
    /// Files its /dev/shm held that were written before it started (looked at while it is
    /// young); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leftovers: Option<Leftovers>,
}

/// What a container found in its /dev/shm when it started (`shm::leftovers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leftovers {
    /// Regular files written before it started.
    pub count: u64,
    /// What they hold in memory.
    pub bytes: u64,
    /// The largest, by name, with what each holds.
    pub largest: Vec<(String, u64)>,
    /// The listing stopped at its bound (entries or time): there may be more.
    pub truncated: bool,
}

impl ShmReading {
    /// used / (used + available): the fullness the thresholds apply to.
    pub fn fullness(&self) -> Option<f64> {
        let used = self.used_bytes?;
        let limit = used.checked_add(self.available_bytes?)?;
        (limit > 0).then(|| used as f64 / limit as f64)
    }

    /// `namespace/pod/container` when known, else the pod UID or container ID: how a person
    /// names this container in findings.
    pub fn subject(&self) -> String {
        ContainerRef::of(self).to_string()
    }
}

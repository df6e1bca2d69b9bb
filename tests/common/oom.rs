//! Containers the real kernel OOM-kills in a 64 MiB memory cgroup: once for /dev/shm pages (a
//! 1 GiB tmpfs emptyDir filled past the limit), once for the workload's own memory. The killed
//! process is `dd`; the container's shell goes on.

use super::{Container, ContainerSpec, HostTmpfs, Shm};

pub const LIMIT: u64 = 64 << 20;

/// The emptyDir fix gone wrong: /dev/shm is `volume` (1 GiB), the memory limit 64 MiB; tmpfs
/// pages are charged to the writer's memory cgroup, so the kernel kills when they reach it.
pub fn shm_past_the_limit(pod_uid: &str, id: &str, volume: &HostTmpfs) -> Container {
    let dd = "dd if=/dev/zero of=/dev/shm/batch bs=1M count=200";
    in_the_limit(pod_uid, id, dd, Shm::Bind(volume.path.clone()))
}

/// The workload's own memory: dd's 200 MiB buffer in a 64 MiB cgroup.
pub fn own_memory_past_the_limit(pod_uid: &str, id: &str) -> Container {
    let dd = "dd if=/dev/zero of=/dev/null bs=200M count=1";
    in_the_limit(pod_uid, id, dd, Shm::default())
}

/// `dd`, then a long sleep, in a Pod's container under the 64 MiB limit.
fn in_the_limit(pod_uid: &str, id: &str, dd: &str, shm: Shm) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(pod_uid.to_string()),
        id: Some(id.to_string()),
        args: vec!["sh".into(), "-c".into(), format!("{dd}; sleep 3600")],
        shm,
        memory_limit: Some(LIMIT as i64),
        ..ContainerSpec::default()
    })
}

/// The container's main process is the one killed (`dd` as its init, its 200 MiB buffer
/// in the 64 MiB cgroup): the container ends with it, exit status 137, as kubelet's
/// `OOMKilled` records.
pub fn main_process_past_the_limit(pod_uid: &str, id: &str) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(pod_uid.to_string()),
        id: Some(id.to_string()),
        args: ["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"]
            .iter()
            .map(|a| a.to_string())
            .collect(),
        memory_limit: Some(LIMIT as i64),
        ..ContainerSpec::default()
    })
}

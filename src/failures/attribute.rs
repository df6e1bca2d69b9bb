//! Whose failure a line is: a log file's path names its container; the kernel names a host
//! PID, placed through `/proc/PID/cgroup`.
//!
//! The kernel logs a segfault while it delivers the signal, before the process has exited; the
//! watcher reads the kernel log every 200 ms and looks the PID up at once, so the process is
//! normally still there (a CUDA process takes far longer to tear down). When it is already
//! gone the failure is kept as the host PID's, unplaced, and counted; a PID seen again later is
//! never guessed at, since the kernel reuses them.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::cgroup::path::{parse_cgroup_path, CgroupIdentity};
use crate::cgroup::proc::identity_of_process;
use crate::host::{read_ns, NsId};
use crate::model::ContainerRef;

/// The container of host process `pid`: its memory cgroup's pod UID and container ID, when it
/// lives in a mount namespace other than the host's (`host_mnt`).
pub fn who_is_pid(proc_root: &Path, pid: i32, host_mnt: Option<NsId>) -> ContainerRef {
    let pid_dir = pid.to_string();
    if let (Some(host), Ok(own)) = (host_mnt, read_ns(proc_root, &pid_dir, "mnt")) {
        if own == host {
            return ContainerRef::default();
        }
    }
    let Ok(text) = std::fs::read_to_string(proc_root.join(&pid_dir).join("cgroup")) else {
        return ContainerRef::default();
    };
    who_of_cgroup_file(&text)
}

/// What host process `pid` is now to a kernel record at `at` that names it as `comm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidNow {
    /// Started before the record (a second of slack between the two clocks), with that name.
    Same,
    /// No such process now.
    Gone,
    /// Another process has the PID: started after the record, or named otherwise. Nothing
    /// read through the PID (its cgroup, a scan's reading of it) is the crasher's.
    Taken,
}

/// `check --since` reads records from long ago, and the kernel reuses PIDs: a process started
/// after the record is another one, never blamed for it.
pub fn pid_now(proc_root: &Path, pid: i32, comm: &str, at: SystemTime) -> PidNow {
    let Some(start) = crate::procfs::stat::started(proc_root, pid) else {
        return PidNow::Gone;
    };
    if start > at + Duration::from_secs(1) {
        return PidNow::Taken;
    }
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm")) {
        Ok(name) if name.trim_end_matches('\n') == comm => PidNow::Same,
        Ok(_) => PidNow::Taken,
        Err(_) => PidNow::Gone,
    }
}

/// Pure: the container a `/proc/PID/cgroup` text places its process in.
pub fn who_of_cgroup_file(text: &str) -> ContainerRef {
    identity_of_process(text).map_or(ContainerRef::default(), who_is)
}

/// Pure: the container a memory cgroup's path names (the kernel's OOM report names the cgroup,
/// which outlives its processes).
pub fn who_is_cgroup(path: &str) -> ContainerRef {
    parse_cgroup_path(path).map_or(ContainerRef::default(), who_is)
}

fn who_is(id: CgroupIdentity) -> ContainerRef {
    ContainerRef::by_id(&id.container_id, id.pod_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

    /// This test process, by its real /proc: a record from before it started is not its, nor
    /// one that names another comm.
    #[test]
    fn a_process_started_after_the_record_or_named_otherwise_is_not_the_crasher() {
        let proc = Path::new("/proc");
        let pid = std::process::id() as i32;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        let comm = comm.trim_end();
        let now = SystemTime::now();
        assert_eq!(pid_now(proc, pid, comm, now), PidNow::Same);
        assert_eq!(pid_now(proc, pid, "python3-other", now), PidNow::Taken);
        let long_ago = now - Duration::from_secs(30 * 24 * 3600);
        assert_eq!(
            pid_now(proc, pid, comm, long_ago),
            PidNow::Taken,
            "the PID was reused"
        );
        assert_eq!(pid_now(proc, i32::MAX, comm, now), PidNow::Gone);
    }

    #[test]
    fn a_kubelet_cgroup_names_pod_and_container_on_v1_and_v2() {
        let v1 = format!(
            "12:memory:/kubepods/burstable/pod0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80/{CID}\n\
             0::/\n"
        );
        let v2 = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b6c1c55_3c0e_4a8e_9a51_2c1f3f6d7e80.slice/cri-containerd-{CID}.scope\n"
        );
        for text in [v1, v2] {
            assert_eq!(
                who_of_cgroup_file(&text),
                ContainerRef {
                    pod_uid: Some("0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80".into()),
                    container_id: Some(CID.into()),
                    ..ContainerRef::default()
                },
                "{text}"
            );
        }
    }

    #[test]
    fn a_host_process_or_garbage_is_no_container() {
        assert_eq!(who_of_cgroup_file("0::/\n"), ContainerRef::default());
        assert_eq!(who_of_cgroup_file("garbage"), ContainerRef::default());
        assert_eq!(who_of_cgroup_file(""), ContainerRef::default());
    }

    #[test]
    fn a_vanished_pid_is_unplaced() {
        assert_eq!(
            who_is_pid(Path::new("/proc"), i32::MAX, None),
            ContainerRef::default()
        );
    }

    #[test]
    fn the_agent_itself_in_the_hosts_namespace_is_no_container() {
        let proc = Path::new("/proc");
        let own = read_ns(proc, "self", "mnt").ok();
        assert_eq!(
            who_is_pid(proc, std::process::id() as i32, own),
            ContainerRef::default()
        );
    }
}

//! Each scan's process lists into the history of GPU users ([`GpuUsers`]): a process new to it
//! is placed in its container through `/proc/PID/cgroup`, and told from a later process with
//! its PID by its start time and command (`/proc/PID/stat`). A process no longer listed is
//! looked for each scan until it is found gone: a crash told after that is not its.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::SystemTime;

use crate::cgroup::path::CgroupIdentity;
use crate::cgroup::proc::identity_of_process;
use crate::model::{ContainerRef, GpuReading, GpuUsers};
use crate::procfs::stat::{comm, start_ticks};

/// One scan's lists; `proc_root` is the host's /proc.
pub fn observe(users: &mut GpuUsers, proc_root: &Path, gpus: &[GpuReading], now: SystemTime) {
    let mut listed: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for g in gpus {
        for p in &g.processes {
            listed.entry(p.pid).or_default().insert(g.index);
        }
    }
    users.begin_scan();
    for (pid, on) in listed {
        let dir = proc_root.join(pid.to_string());
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        users.seen(pid, start_ticks(&stat), comm(&stat), on, now, || {
            let text = std::fs::read_to_string(dir.join("cgroup")).ok()?;
            container_of(&text)
        });
    }
    for (pid, start) in users.unlisted() {
        let now_start = i32::try_from(pid)
            .ok()
            .and_then(|p| crate::procfs::stat::start_ticks_of(proc_root, p));
        if now_start.is_none() || now_start != start {
            users.gone(pid, start, now);
        }
    }
    users.prune(now);
}

/// Pure: the container a `/proc/PID/cgroup` text places its process in; None for a host
/// process.
fn container_of(proc_cgroup: &str) -> Option<ContainerRef> {
    identity_of_process(proc_cgroup)
        .filter(CgroupIdentity::is_surely_a_container)
        .map(|id| ContainerRef::by_id(&id.container_id, id.pod_uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::gpu_reading;
    use crate::model::GpuProcess;
    use std::time::Duration;

    const UID: &str = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
    const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

    /// A /proc with process `pid` (started at `start` ticks), in the container's cgroup or the
    /// host's.
    fn process(root: &Path, pid: u32, start: u64, in_container: bool) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"),
        )
        .unwrap();
        let cgroup = if in_container {
            format!("12:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/\n")
        } else {
            "12:memory:/system.slice/sshd.service\n0::/\n".to_string()
        };
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn on(gpus: &[(u32, &[u32])]) -> Vec<GpuReading> {
        gpus.iter()
            .map(|&(g, pids)| GpuReading {
                processes: pids
                    .iter()
                    .map(|&pid| GpuProcess {
                        pid,
                        used_memory_bytes: Some(1 << 30),
                    })
                    .collect(),
                ..gpu_reading(g)
            })
            .collect()
    }

    #[test]
    fn processes_are_placed_in_their_containers_and_a_reused_pid_anew() {
        let proc = tempfile::tempdir().unwrap();
        process(proc.path(), 4242, 100, true);
        process(proc.path(), 77, 5, false);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut users = GpuUsers::default();
        observe(
            &mut users,
            proc.path(),
            &on(&[(5, &[4242]), (7, &[4242, 77]), (0, &[])]),
            t0,
        );
        assert_eq!(users.gpus_of_pid(4242), vec![5, 7]);
        assert_eq!(users.gpus_of_container(CID), vec![5, 7]);
        assert_eq!(
            users
                .container_of_pid(4242)
                .and_then(|c| c.pod_uid.as_deref()),
            Some(UID)
        );
        assert_eq!(users.container_of_pid(77), None, "a host process");
        // Gone from /proc and NVML: still known.
        std::fs::remove_dir_all(proc.path().join("4242")).unwrap();
        observe(
            &mut users,
            proc.path(),
            &on(&[(7, &[77])]),
            t0 + Duration::from_secs(10),
        );
        assert_eq!(users.gpus_of_pid(4242), vec![5, 7]);
        // Found gone at 10 s: a python crash with its PID at 5 s may be its, at 15 s is not.
        let crash = |secs| crate::model::Crasher {
            pid: 4242,
            comm: Some("python"),
            start: None,
            at: t0 + Duration::from_secs(secs),
        };
        assert_eq!(users.gpus_of_crasher(&crash(5)), vec![5, 7]);
        assert!(users.gpus_of_crasher(&crash(15)).is_empty());
        // A host process started later got PID 4242.
        process(proc.path(), 4242, 900, false);
        observe(
            &mut users,
            proc.path(),
            &on(&[(1, &[4242])]),
            t0 + Duration::from_secs(20),
        );
        assert_eq!(users.gpus_of_pid(4242), vec![1]);
        assert!(users.gpus_of_container(CID).is_empty());
    }

    #[test]
    fn odd_cgroup_files_place_nothing() {
        assert_eq!(container_of(""), None);
        assert_eq!(container_of("garbage"), None);
        assert_eq!(container_of("0::/\n"), None);
    }
}

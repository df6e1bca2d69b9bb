//! One process's /dev/shm measured the moment the kernel tells its death (`death_trace`): the
//! same open beneath its root, deadline and reading as a scan's, for one PID.

use std::path::Path;

use super::deadline::Measurer;
use super::look::{build_reading, Look};
use super::statfs::{self, OpenShmError};
use crate::cgroup::memory::MemoryReading;
use crate::cgroup::path::CgroupIdentity;
use crate::model::ShmReading;

/// The reading of `pid`'s /dev/shm now; `None` when the process (or its root) is gone.
pub fn measure_pid(
    measurer: &mut Measurer,
    proc_root: &Path,
    pid: i32,
    cgroup_rel: &str,
    identity: Option<CgroupIdentity>,
    memory: MemoryReading,
) -> Option<ShmReading> {
    let root = match statfs::open_container_root(proc_root, pid) {
        Ok(root) => root,
        Err(OpenShmError::Absent(_)) => return None,
        Err(e) => {
            return Some(reading(
                identity,
                pid,
                cgroup_rel,
                Look::Unmeasured(e.to_string()),
                memory,
            ))
        }
    };
    let look = match measurer.open_and_measure(root) {
        Ok(Ok((_, stat))) if stat.is_mount_root != Some(false) => Look::Mounted(stat, None),
        Ok(Ok(_)) | Ok(Err(OpenShmError::Absent(_))) => Look::NotMounted,
        Ok(Err(e)) => Look::Unmeasured(e.to_string()),
        Err(why) => Look::Unmeasured(format!("/dev/shm did not answer: {why:?}")),
    };
    Some(reading(identity, pid, cgroup_rel, look, memory))
}

fn reading(
    identity: Option<CgroupIdentity>,
    pid: i32,
    rel: &str,
    look: Look,
    memory: MemoryReading,
) -> ShmReading {
    let id = identity
        .as_ref()
        .map_or_else(String::new, |i| i.container_id.clone());
    build_reading(identity, id, pid, rel, false, look, memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process's own /dev/shm, by the real /proc: measured like a scan's.
    #[test]
    fn a_live_process_is_measured_and_a_gone_one_is_none() {
        let mut m = Measurer::default();
        let me = std::process::id() as i32;
        let r = measure_pid(
            &mut m,
            Path::new("/proc"),
            me,
            "/x",
            None,
            MemoryReading::default(),
        );
        let r = r.expect("this process stands");
        assert_eq!(r.pid, me);
        assert!(r.mounted.is_some());
        let gone = measure_pid(
            &mut m,
            Path::new("/proc"),
            i32::MAX,
            "/x",
            None,
            MemoryReading::default(),
        );
        assert!(gone.is_none());
    }
}

//! One process's /dev/shm measured the moment the kernel tells its death (`death_trace`): the
//! same open beneath its root, deadline, type check (only a tmpfs is asked) and reading as a
//! scan's, for one PID.

use std::path::Path;

use super::deadline::Measurer;
use super::look::{build_reading, Look};
use super::mounts::shm_line;
use super::statfs::{self, OpenShmError};
use super::trusted::{open_shm, Trusted};
use crate::cgroup::memory::MemoryReading;
use crate::cgroup::path::CgroupIdentity;
use crate::model::ShmReading;
use crate::procfs::kfile::FileReader;

/// The reading of `pid`'s /dev/shm now; `None` when the process (or its root) is gone.
pub fn measure_pid(
    measurer: &mut Measurer,
    proc_root: &Path,
    pid: i32,
    cgroup_rel: &str,
    identity: Option<CgroupIdentity>,
    memory: MemoryReading,
) -> Option<ShmReading> {
    look_now(measurer, proc_root, pid).map(|m| m.reading(identity, pid, cgroup_rel, memory))
}

/// What a process's /dev/shm was when looked at, before its container is known: the race with
/// a dying process is its /dev/shm's, so it is looked at first and named after.
pub struct Looked(Look);

impl Looked {
    /// Whether the numbers were read.
    pub fn measured(&self) -> bool {
        matches!(self.0, Look::Mounted(..))
    }

    /// The reading, named by the container the cgroup (read after) says it is.
    pub fn reading(
        self,
        identity: Option<CgroupIdentity>,
        pid: i32,
        rel: &str,
        memory: MemoryReading,
    ) -> ShmReading {
        let id = identity
            .as_ref()
            .map_or_else(String::new, |i| i.container_id.clone());
        build_reading(identity, id, pid, rel, false, self.0, memory)
    }
}

/// `pid`'s /dev/shm now; `None` when the process (or its root) is gone.
pub fn look_now(measurer: &mut Measurer, proc_root: &Path, pid: i32) -> Option<Looked> {
    let root = match statfs::open_container_root(proc_root, pid) {
        Ok(root) => root,
        Err(OpenShmError::Absent(_)) => return None,
        Err(e) => return Some(Looked(Look::Unmeasured(e.to_string()))),
    };
    let path = proc_root.join(pid.to_string()).join("mountinfo");
    let mut files = FileReader::default();
    let walked = open_shm(measurer, &mut files, &path, root, &mut Trusted::default());
    let look = match walked {
        Ok(Ok((_, id))) if id.is_mount_root == Some(false) => Look::NotMounted,
        Ok(Ok((fd, id))) => match shm_line(&mut files, &path, id.mount_id) {
            Ok((Some(e), _)) if statfs::is_measured_type(&e.fs_type) => {
                match statfs::measure_tmpfs(&fd, id) {
                    Ok(stat) => Look::Mounted(stat, Some(e)),
                    Err(e) => Look::Unmeasured(e.to_string()),
                }
            }
            Ok((Some(e), _)) => Look::Foreign(e.fs_type),
            Ok((None, _)) if id.is_mount_root.is_none() => Look::NotMounted,
            Ok((None, _)) => Look::Unmeasured("/dev/shm's mount is not in mountinfo".into()),
            Err(e) => Look::Unmeasured(format!("reading mountinfo: {e}")),
        },
        Ok(Err(OpenShmError::Absent(_))) => Look::NotMounted,
        Ok(Err(e)) => Look::Unmeasured(e.to_string()),
        Err(why) => Look::Unmeasured(format!("/dev/shm did not open: {why:?}")),
    };
    Some(Looked(look))
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

//! Looking at one container's /dev/shm: its root opened, the directory measured where a
//! deadline can end it, what it held from before (a young container), and the reading built
//! from what was found.

use std::time::SystemTime;

use super::deadline::Unanswered;
use super::statfs::{self, OpenShmError, ShmStat};
use super::{leftovers, ShmScan, ShmScanner};
use crate::cgroup::memory::MemoryReading;
use crate::cgroup::path::CgroupIdentity;
use crate::host::NsId;
use crate::model::{short_id, Leftovers, ShmReading, ShmStatus};
use crate::procfs::mountinfo::MountEntry;

/// What a container whose /dev/shm hangs is told.
const HUNG: &str = "/dev/shm did not answer statfs within 2 s (a FUSE or network file system \
                    that hangs?): not measured, and not asked again";
const TOO_MANY_STUCK: &str = "not measured: too many /dev/shm mounts of other containers hang";
/// Hung containers remembered at most.
const HUNG_KEPT: usize = 4096;

/// What looking at a container's /dev/shm found.
#[derive(Debug)]
pub(super) enum Look {
    Mounted(ShmStat, Option<MountEntry>),
    /// Nothing mounted there: a plain directory, nothing at all, or a symlink (not followed).
    NotMounted,
    /// It could not be looked at (the error is counted): never taken for "not mounted".
    Unmeasured(String),
}

impl ShmScanner {
    /// statvfs of /dev/shm with the mount's details; `None` when the process is gone. For a
    /// container started at `young` (recently), what its /dev/shm held from before goes to
    /// `inherited`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stat_shm(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        container_id: &str,
        young: Option<SystemTime>,
        inherited: &mut Option<Leftovers>,
        out: &mut ShmScan,
    ) -> Option<Look> {
        let root = match statfs::open_container_root(&self.proc_root, pid) {
            Ok(root) => root,
            Err(OpenShmError::Absent(_)) => return None,
            Err(e) => {
                let denied = matches!(&e, OpenShmError::Io(io) if super::is_denied(io));
                self.unreadable(out, "container root", rel, &e, denied);
                return Some(Look::Unmeasured(format!(
                    "opening the container's root: {e}"
                )));
            }
        };
        if self.hung.contains(container_id) {
            return Some(Look::Unmeasured(HUNG.into()));
        }
        let opened = match self.measurer.open_and_measure(root) {
            Ok(answer) => answer,
            Err(why) => return Some(self.unanswered(container_id, why, out)),
        };
        let stat = match opened {
            Ok((fd, stat)) => {
                // Only a tmpfs mounted there that holds something is worth a listing.
                if let Some(start) = young.filter(|_| {
                    stat.is_tmpfs
                        && stat.is_mount_root != Some(false)
                        && stat.used_bytes() != Some(0)
                }) {
                    match leftovers::list(&fd) {
                        Ok((entries, truncated)) => {
                            *inherited = leftovers::inherited(&entries, start, truncated);
                        }
                        Err(e) => self.error(out, "listing /dev/shm", rel, &e),
                    }
                }
                stat
            }
            Err(e) => return Some(self.not_opened(e, rel, container_id, out)),
        };
        self.mounted(pid, mnt, stat, rel, out)
    }

    /// /dev/shm did not answer in time (a hung one is not asked again).
    fn unanswered(&mut self, container_id: &str, why: Unanswered, out: &mut ShmScan) -> Look {
        if why == Unanswered::Hung && self.hung.len() < HUNG_KEPT {
            self.hung.insert(container_id.to_string());
        }
        let told = match why {
            Unanswered::Hung => HUNG,
            Unanswered::TooManyStuck => TOO_MANY_STUCK,
        };
        self.warn_once(
            format!("hung {container_id}"),
            format_args!("container {}: {told}", short_id(container_id)),
        );
        out.errors += 1;
        Look::Unmeasured(told.into())
    }

    /// /dev/shm could not be opened: nothing there, a symlink (not followed), or an error.
    fn not_opened(
        &mut self,
        e: OpenShmError,
        rel: &str,
        container_id: &str,
        out: &mut ShmScan,
    ) -> Look {
        match e {
            OpenShmError::Absent(_) => Look::NotMounted,
            OpenShmError::Symlink => {
                self.warn_once(
                    format!("symlink {rel}"),
                    format_args!(
                        "container {}: /dev/shm is reached through a symlink; not followed, reported as not mounted",
                        short_id(container_id)
                    ),
                );
                Look::NotMounted
            }
            e => {
                // Could not look (EPERM, I/O, a call the kernel lacks): never "not mounted".
                self.error(out, "statvfs /dev/shm", rel, &e);
                Look::Unmeasured(format!("measuring /dev/shm: {e}"))
            }
        }
    }

    /// Whether a mount is at the measured /dev/shm, and its type: from statx and statfs when
    /// they tell, else from mountinfo. `None` when the process is gone.
    fn mounted(
        &mut self,
        pid: i32,
        mnt: NsId,
        stat: ShmStat,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Look> {
        if stat.is_mount_root == Some(false) {
            // A plain directory on the container's root file system: nothing is mounted there.
            return Some(Look::NotMounted);
        }
        if stat.is_tmpfs && stat.is_mount_root == Some(true) {
            // statx says a mount is there and statfs that it is a tmpfs: mountinfo, the most
            // expensive file of a scan, would only repeat the type.
            return Some(Look::Mounted(stat, None));
        }
        let entry = match self.mount_entry(pid, mnt, &stat, rel, out)? {
            Ok(entry) => entry,
            // statx said a mount is there: only its type is missing.
            Err(_) if stat.is_mount_root == Some(true) => None,
            Err(e) => return Some(Look::Unmeasured(format!("reading mountinfo: {e}"))),
        };
        match (&entry, stat.is_mount_root) {
            // Without statx, mountinfo alone tells whether something is mounted at /dev/shm.
            (None, None) => Some(Look::NotMounted),
            _ => Some(Look::Mounted(stat, entry)),
        }
    }
}

pub(super) fn build_reading(
    identity: Option<CgroupIdentity>,
    container_id: String,
    pid: i32,
    rel: &str,
    host_ipc: bool,
    shm: Look,
    memory: MemoryReading,
) -> ShmReading {
    let (mounted, fs_type, size, used, tmpfs_free) = match &shm {
        Look::Mounted(stat, entry) => (
            Some(true),
            entry
                .as_ref()
                .map(|e| e.fs_type.clone())
                .or_else(|| stat.is_tmpfs.then(|| "tmpfs".to_string())),
            stat.size_bytes(),
            stat.used_bytes(),
            stat.size_bytes().map(|_| stat.free_bytes),
        ),
        Look::NotMounted => (Some(false), None, None, None, None),
        Look::Unmeasured(_) => (None, None, None, None, None),
    };
    let available = if mounted == Some(true) {
        match (tmpfs_free, memory.headroom_bytes) {
            (Some(free), Some(headroom)) => Some(free.min(headroom)),
            (free, headroom) => free.or(headroom),
        }
    } else {
        None
    };
    ShmReading {
        namespace: None,
        pod: None,
        pod_uid: identity.as_ref().and_then(|i| i.pod_uid.clone()),
        container: None,
        container_id,
        pid,
        cgroup: rel.to_string(),
        host_ipc,
        mounted,
        fs_type,
        size_bytes: size,
        used_bytes: used,
        available_bytes: available,
        memory_limit_bytes: memory.limit_bytes,
        memory_shmem_bytes: memory.shmem_bytes,
        memory_oom_kills: memory.oom_kills,
        used_peak_bytes: used,
        image: None,
        status: ShmStatus::Ok,
        error: match shm {
            Look::Unmeasured(e) => Some(e),
            _ => None,
        },
        leftovers: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::mounts::tests::stat;

    fn reading(look: Look) -> ShmReading {
        build_reading(
            None,
            "c".into(),
            1,
            "/x/c",
            false,
            look,
            MemoryReading::default(),
        )
    }

    #[test]
    fn could_not_look_is_unknown_with_its_error_never_not_mounted() {
        let r = reading(Look::Unmeasured(
            "measuring /dev/shm: Operation not permitted".into(),
        ));
        assert_eq!(r.mounted, None);
        assert_eq!(r.size_bytes, None);
        assert_eq!(r.available_bytes, None);
        assert!(r.error.as_deref().unwrap().contains("not permitted"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["mounted"], serde_json::Value::Null);

        let r = reading(Look::NotMounted);
        assert_eq!((r.mounted, r.error), (Some(false), None));
        let r = reading(Look::Mounted(stat(Some(1), None, true), None));
        assert_eq!(r.mounted, Some(true));
        assert_eq!(r.size_bytes, Some(64 << 20));
        assert_eq!(r.used_bytes, Some(4 << 20));
        assert_eq!(r.fs_type.as_deref(), Some("tmpfs"));
    }
}

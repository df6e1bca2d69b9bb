//! Looking at one container's /dev/shm: its root opened, the directory measured where a
//! deadline can end it, what it held from before (a young container), and the reading built
//! from what was found.

use super::deadline::Unanswered;
use super::statfs::{self, OpenShmError, ShmStat};
use super::trusted::Walked;
use super::{ShmScan, ShmScanner};
use crate::cgroup::memory::MemoryReading;
use crate::cgroup::path::CgroupIdentity;
use crate::host::NsId;
use crate::model::{printable, short_id, Leftovers, ShmReading, ShmStatus};
use crate::procfs::mountinfo::MountEntry;

/// What a container whose /dev/shm could not even be opened in time is told.
const HUNG: &str = "opening /dev/shm did not finish within 2 s (a FUSE or network file system \
                    on the way that hangs?): not measured, and not asked again";
const TOO_MANY_STUCK: &str =
    "not measured: opening the /dev/shm of too many other containers hangs";
/// Hung containers remembered at most.
const HUNG_KEPT: usize = 4096;

/// What looking at a container's /dev/shm found.
#[derive(Debug)]
pub(super) enum Look {
    Mounted(ShmStat, Option<MountEntry>),
    /// Nothing mounted there: a plain directory, nothing at all, or a symlink (not followed).
    NotMounted,
    /// A mount of this type, not tmpfs: never asked (a FUSE or network file system may never
    /// answer), reported unmeasured with its type.
    Foreign(String),
    /// It could not be looked at (the error is counted): never taken for "not mounted".
    Unmeasured(String),
}

/// Pure: what a container whose /dev/shm is a `fs_type` mount is told.
pub(super) fn foreign_text(fs_type: &str) -> String {
    format!(
        "/dev/shm is a {} mount, not tmpfs: not measured (only a tmpfs is asked; a FUSE or \
         network file system may never answer)",
        printable(fs_type)
    )
}

impl ShmScanner {
    /// statvfs of /dev/shm with the mount's details; `None` when the process is gone. When a
    /// tmpfs is measured, what it held from before the container (not the host's, `host_ipc`)
    /// goes to `inherited` ([`ShmScanner::inherited`]); it is left `None` otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stat_shm(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        container_id: &str,
        host_ipc: bool,
        inherited: &mut Option<Option<Leftovers>>,
        out: &mut ShmScan,
    ) -> Option<Look> {
        // Twice at most: a container whose mounts changed between the walk and its mountinfo
        // (being set up: its root pivoted) is looked at again from its root as it is now.
        let mut moving = None;
        for _ in 0..2 {
            match self.look_once(pid, mnt, rel, container_id, host_ipc, inherited, out) {
                Some(Err(e @ OpenShmError::Moving(_))) => moving = Some(e),
                Some(Err(e)) => return Some(self.not_opened(e, rel, container_id, out)),
                Some(Ok(look)) => return Some(look),
                None => return None,
            }
        }
        moving.map(|e| self.not_opened(e, rel, container_id, out))
    }

    /// One look at the container's /dev/shm; `Err` when it could not be opened.
    #[allow(clippy::too_many_arguments)]
    fn look_once(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        container_id: &str,
        host_ipc: bool,
        inherited: &mut Option<Option<Leftovers>>,
        out: &mut ShmScan,
    ) -> Option<Result<Look, OpenShmError>> {
        let root = match statfs::open_container_root(&self.proc_root, pid) {
            Ok(root) => root,
            Err(OpenShmError::Absent(_)) => return None,
            Err(e) => {
                let denied = matches!(&e, OpenShmError::Io(io) if super::is_denied(io));
                self.unreadable(out, "container root", rel, &e, denied);
                return Some(Ok(Look::Unmeasured(format!(
                    "opening the container's root: {e}"
                ))));
            }
        };
        if self.hung.contains(container_id) {
            return Some(Ok(Look::Unmeasured(HUNG.into())));
        }
        let mountinfo = self.proc_root.join(pid.to_string()).join("mountinfo");
        let walked = super::trusted::walk(
            &mut self.measurer,
            &mut self.files,
            &mountinfo,
            root,
            self.trusted.entry((mnt, pid)).or_default(),
        );
        let Walked {
            fd,
            id,
            line,
            dev_born,
        } = match walked {
            Ok(Ok(walked)) => walked,
            Ok(Err(e)) => return Some(Err(e)),
            Err(why) => return Some(Ok(self.unanswered(container_id, why, out))),
        };
        if id.is_mount_root == Some(false) {
            // A plain directory on the container's root file system: nothing is mounted there.
            return Some(Ok(Look::NotMounted));
        }
        let entry = match self.mount_entry((pid, mnt), id, line, rel, out)? {
            Ok(Some(entry)) => entry,
            // Without statx, mountinfo alone tells whether something is mounted at /dev/shm.
            Ok(None) if id.is_mount_root.is_none() => return Some(Ok(Look::NotMounted)),
            // A mount is at /dev/shm but mountinfo, read after, has no line for it: the
            // container's mounts changed in between (set up or torn down), as `trusted` finds
            // of a root or /dev: looked at again from its root as it is now (`stat_shm`).
            Ok(None) => return Some(Err(OpenShmError::Moving("/dev/shm"))),
            Err(e) => return Some(Ok(Look::Unmeasured(format!("reading mountinfo: {e}")))),
        };
        if !statfs::is_measured_type(&entry.fs_type) {
            self.warn_once(
                format!("foreign {container_id}"),
                format_args!(
                    "container {}: {}",
                    short_id(container_id),
                    foreign_text(&entry.fs_type)
                ),
            );
            return Some(Ok(Look::Foreign(entry.fs_type)));
        }
        let stat = match statfs::measure_tmpfs(&fd, id) {
            Ok(stat) => stat,
            Err(e) => {
                self.error(out, "statvfs /dev/shm", rel, &e);
                return Some(Ok(Look::Unmeasured(format!("measuring /dev/shm: {e}"))));
            }
        };
        if !host_ipc {
            let shm = (&fd, id, stat.used_bytes());
            *inherited = Some(self.inherited(shm, (pid, container_id), dev_born, rel, out));
        }
        Some(Ok(Look::Mounted(stat, Some(entry))))
    }

    /// /dev/shm did not open in time (a hung one is not asked again).
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
            OpenShmError::Untrusted { dir, fs_type } => {
                let e = OpenShmError::Untrusted { dir, fs_type };
                self.warn_once(
                    format!("untrusted {container_id}"),
                    format_args!("container {}: {e}", short_id(container_id)),
                );
                Look::Unmeasured(e.to_string())
            }
            e => {
                // Could not look (EPERM, I/O, a call the kernel lacks): never "not mounted".
                self.error(out, "statvfs /dev/shm", rel, &e);
                Look::Unmeasured(format!("measuring /dev/shm: {e}"))
            }
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
        Look::Foreign(fs_type) => (Some(true), Some(printable(fs_type)), None, None, None),
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
            Look::Foreign(fs_type) => Some(foreign_text(&fs_type)),
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
        let r = reading(Look::Mounted(stat(Some(1), true), None));
        assert_eq!(r.mounted, Some(true));
        assert_eq!(r.size_bytes, Some(64 << 20));
        assert_eq!(r.used_bytes, Some(4 << 20));
        assert_eq!(r.fs_type.as_deref(), Some("tmpfs"));
    }

    #[test]
    fn a_foreign_mount_is_mounted_with_its_type_and_unmeasured_never_healthy() {
        let r = reading(Look::Foreign("fuse.\x1b[2Jhung".into()));
        assert_eq!(r.mounted, Some(true));
        assert_eq!(r.fs_type.as_deref(), Some("fuse.\\x1b[2Jhung"));
        assert_eq!(
            (r.size_bytes, r.used_bytes, r.available_bytes),
            (None, None, None)
        );
        let error = r.error.unwrap();
        assert!(
            error.contains("is a fuse.\\x1b[2Jhung mount, not tmpfs: not measured"),
            "{error}"
        );
        assert!(!error.contains('\x1b'));
    }
}

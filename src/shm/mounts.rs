//! The mountinfo line of a container's /dev/shm, cached per mount namespace: mountinfo, the
//! most expensive file of a scan, is read again only when the mount at /dev/shm changes.

use super::statfs::ShmStat;
use super::{is_vanished, ShmScan, ShmScanner};
use crate::host::NsId;
use crate::procfs::mountinfo::{self, MountEntry};

/// mountinfo read at most per container, and its longest line: a mount point and a root of
/// PATH_MAX each, and their options, fit.
const MOUNTINFO_MAX: usize = 4 << 20;
const MOUNTINFO_LINE_MAX: usize = 16 << 10;

/// The /dev/shm mount last seen in a mount namespace, so mountinfo is re-read only when the
/// mount at /dev/shm changes (its statx mount ID differs), not on every scan.
#[derive(Debug, Clone)]
pub(super) struct CachedMount {
    key: Option<MountKey>,
    entry: Option<MountEntry>,
}

/// What tells one mount at /dev/shm from another between scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MountKey {
    /// statx's mount ID.
    Id(u64),
    /// Without statx: the handle's device (a tmpfs instance has a device of its own).
    Dev(u32, u32),
}

fn mount_key(stat: &ShmStat) -> Option<MountKey> {
    stat.mount_id
        .map(MountKey::Id)
        .or(stat.dev.map(|(major, minor)| MountKey::Dev(major, minor)))
}

/// Whether a mountinfo line is the mount the handle is on: by statx's mount ID, else (no statx)
/// by device for a tmpfs, whose device is its own and always the one mountinfo prints.
fn same_mount(stat: &ShmStat, e: &MountEntry) -> bool {
    match (stat.mount_id, stat.dev) {
        (Some(id), _) => id == e.mount_id,
        (None, Some(dev)) if stat.is_tmpfs => dev == (e.major, e.minor),
        _ => true,
    }
}

impl ShmScanner {
    /// The /dev/shm line of the process's mountinfo, from the cache when the mount is unchanged
    /// (same statx mount ID; without statx, the same device). `None`: the process is gone;
    /// `Err`: mountinfo could not be read (counted).
    pub(super) fn mount_entry(
        &mut self,
        pid: i32,
        mnt: NsId,
        stat: &ShmStat,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Result<Option<MountEntry>, String>> {
        let key = mount_key(stat);
        if let Some(cached) = self.mounts.get(&mnt) {
            if key.is_some() && cached.key == key {
                return Some(Ok(cached.entry.clone()));
            }
        }
        let path = self.proc_root.join(pid.to_string()).join("mountinfo");
        // Streamed, a line at a time, bounded: a pod can make its mountinfo tens of MiB. The
        // topmost /dev/shm line is the last; with statx's mount ID the one measured ends it.
        let mut entry: Option<MountEntry> = None;
        let read = self.files.for_each_line(
            rustix::fs::CWD,
            &path,
            MOUNTINFO_MAX,
            MOUNTINFO_LINE_MAX,
            |line| {
                // Bytes, not UTF-8: one mount point with odd bytes elsewhere must not hide it.
                let Some(e) = mountinfo::find_mount(&String::from_utf8_lossy(line), "/dev/shm")
                else {
                    return true;
                };
                // The line must describe the mount we measured, not one stacked elsewhere.
                if same_mount(stat, &e) {
                    let exact = stat.mount_id.is_some();
                    entry = Some(e);
                    return !exact;
                }
                true
            },
        );
        match read {
            Ok(true) => self.warn_once(
                format!("mountinfo cut {rel}"),
                format_args!(
                    "container {rel}: mountinfo is over {} MiB: read no further",
                    MOUNTINFO_MAX >> 20
                ),
            ),
            Ok(false) => {}
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "mountinfo", rel, &e);
                return Some(Err(e.to_string()));
            }
        }
        self.mounts.insert(
            mnt,
            CachedMount {
                key,
                entry: entry.clone(),
            },
        );
        Some(Ok(entry))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A 64 MiB /dev/shm with 4 MiB used.
    pub(in crate::shm) fn stat(
        mount_id: Option<u64>,
        dev: Option<(u32, u32)>,
        is_tmpfs: bool,
    ) -> ShmStat {
        ShmStat {
            mount_id,
            is_mount_root: mount_id.map(|_| true),
            dev,
            is_tmpfs,
            total_bytes: 64 << 20,
            free_bytes: 60 << 20,
        }
    }

    fn entry(mount_id: u64, major: u32, minor: u32) -> MountEntry {
        let line = format!("{mount_id} 1 {major}:{minor} / /dev/shm rw - tmpfs shm rw,size=65536k");
        mountinfo::find_mount(&line, "/dev/shm").unwrap()
    }

    #[test]
    fn without_statx_the_mountinfo_line_is_matched_by_device() {
        let e = entry(42, 0, 77);
        assert!(same_mount(&stat(Some(42), None, true), &e));
        assert!(!same_mount(&stat(Some(41), None, true), &e));
        assert!(same_mount(&stat(None, Some((0, 77)), true), &e));
        assert!(!same_mount(&stat(None, Some((0, 78)), true), &e));
        // Not a tmpfs (btrfs subvolumes report other devices): the topmost mount stands.
        assert!(same_mount(&stat(None, Some((0, 78)), false), &e));
        assert_eq!(
            mount_key(&stat(None, Some((0, 77)), true)),
            Some(MountKey::Dev(0, 77))
        );
        assert_eq!(
            mount_key(&stat(Some(42), None, true)),
            Some(MountKey::Id(42))
        );
    }
}

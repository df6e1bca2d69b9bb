//! The mountinfo line of a container's /dev/shm, cached per process and mount namespace
//! (`super::Viewer`): mountinfo, the most expensive file of a scan, is read again only when the
//! mount at /dev/shm changes.

use std::io;
use std::path::Path;

use super::statfs::{Identity, MountKey};
use super::{is_vanished, ShmScan, ShmScanner};
use crate::host::NsId;
use crate::procfs::kfile::FileReader;
use crate::procfs::mountinfo::{self, MountEntry};

/// mountinfo read at most per container, and its longest line: a mount point and a root of
/// PATH_MAX each, and their options, fit.
const MOUNTINFO_MAX: usize = 4 << 20;
const MOUNTINFO_LINE_MAX: usize = 16 << 10;

/// The /dev/shm mount last seen by a process in its mount namespace, so mountinfo is re-read only when the
/// mount at /dev/shm changes (its mount ID differs), not on every scan.
#[derive(Debug, Clone)]
pub(super) struct CachedMount {
    /// The ID and birth time of the mount (`MountKey`): a new mount at a reused ID is read again.
    key: MountKey,
    entry: Option<MountEntry>,
}

/// The `/dev/shm` line of the mountinfo at `path` whose mount ID is `mount_id` (the mount the
/// handle is on: none when /dev/shm is a plain directory of another mount), streamed a line at
/// a time and bounded (a pod can make its mountinfo tens of MiB); with whether it was cut.
pub(super) fn shm_line(
    files: &mut FileReader,
    path: &Path,
    mount_id: u64,
) -> io::Result<(Option<MountEntry>, bool)> {
    line_of(files, path, mount_id, |line| {
        mountinfo::find_mount(line, "/dev/shm")
    })
}

/// The file system type of the mount `mount_id` by the mountinfo at `path` (any mount point),
/// streamed and bounded as [`shm_line`]; with whether it was cut before the line was found.
pub(super) fn type_of(
    files: &mut FileReader,
    path: &Path,
    mount_id: u64,
) -> io::Result<(Option<String>, bool)> {
    line_of(files, path, mount_id, |line| {
        mountinfo::parse_line(line).map(|e| e.fs_type)
    })
}

/// What `read` makes of the line of mount `mount_id` in the mountinfo at `path`, streamed a line
/// at a time and bounded; with whether the file was cut before it was found.
fn line_of<T>(
    files: &mut FileReader,
    path: &Path,
    mount_id: u64,
    read: impl Fn(&str) -> Option<T>,
) -> io::Result<(Option<T>, bool)> {
    let mut found = None;
    let cut = files.for_each_line(
        rustix::fs::CWD,
        path,
        MOUNTINFO_MAX,
        MOUNTINFO_LINE_MAX,
        |line| {
            // A cheap test first: the ID leads the line.
            let id = line.split(|&b| b == b' ').next();
            if id.and_then(|id| std::str::from_utf8(id).ok()?.parse::<u64>().ok()) != Some(mount_id)
            {
                return true;
            }
            // Bytes, not UTF-8: one mount point with odd bytes elsewhere must not hide it.
            found = read(&String::from_utf8_lossy(line));
            false
        },
    )?;
    let cut = cut && found.is_none();
    Ok((found, cut))
}

impl ShmScanner {
    /// The /dev/shm line of the process's mountinfo for the mount the handle is on, from the
    /// cache when the mount is unchanged (same mount ID). `None`: the process is gone; `Err`:
    /// mountinfo could not be read (counted).
    pub(super) fn mount_entry(
        &mut self,
        pid: i32,
        mnt: NsId,
        id: Identity,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Result<Option<MountEntry>, String>> {
        if let Some(cached) = self.mounts.get(&(mnt, pid)) {
            if cached.key == id.key() {
                return Some(Ok(cached.entry.clone()));
            }
        }
        let path = self.proc_root.join(pid.to_string()).join("mountinfo");
        let entry = match shm_line(&mut self.files, &path, id.mount_id) {
            Ok((entry, cut)) => {
                if cut {
                    self.warn_once(
                        format!("mountinfo cut {rel}"),
                        format_args!(
                            "container {rel}: mountinfo is over {} MiB: read no further",
                            MOUNTINFO_MAX >> 20
                        ),
                    );
                    // Not found in what was read: unknown, not "not mounted".
                    return Some(Err("its mount is past the part of mountinfo read".into()));
                }
                entry
            }
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "mountinfo", rel, &e);
                return Some(Err(e.to_string()));
            }
        };
        let cached = CachedMount {
            key: id.key(),
            entry: entry.clone(),
        };
        self.mounts.insert((mnt, pid), cached);
        Some(Ok(entry))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::shm::statfs::ShmStat;

    /// A 64 MiB /dev/shm with 4 MiB used.
    pub(in crate::shm) fn stat(mount_id: Option<u64>, is_tmpfs: bool) -> ShmStat {
        ShmStat {
            mount_id,
            is_mount_root: mount_id.map(|_| true),
            dev: None,
            is_tmpfs,
            total_bytes: 64 << 20,
            free_bytes: 60 << 20,
        }
    }

    #[test]
    fn the_line_is_the_one_of_the_handles_mount_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mountinfo");
        std::fs::write(
            &path,
            "20 1 0:30 / / rw - overlay overlay rw\n\
             31 20 0:40 / /dev rw - tmpfs tmpfs rw\n\
             42 31 0:77 / /dev/shm rw - tmpfs shm rw,size=65536k\n\
             43 42 0:78 / /dev/shm rw - fuse hung rw,user_id=0\n\
             430 42 0:79 / /dev/shm/nccl-x rw - fuse hung rw\n",
        )
        .unwrap();
        let mut files = FileReader::default();
        let found = |files: &mut FileReader, id| shm_line(files, &path, id).unwrap();
        let (fuse, cut) = found(&mut files, 43);
        assert!(!cut);
        assert_eq!(fuse.map(|e| e.fs_type).as_deref(), Some("fuse"));
        assert_eq!(found(&mut files, 42).0.unwrap().fs_type, "tmpfs");
        // /dev's own mount (a plain directory at /dev/shm), another mount point, no such ID.
        assert_eq!(found(&mut files, 31).0, None);
        assert_eq!(found(&mut files, 430).0, None);
        assert_eq!(found(&mut files, 4).0, None);
    }
}

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
    let ([line], cut) = lines_of(files, path, [Some(mount_id)])?;
    Ok(as_shm_line(line, cut))
}

/// Pure: what [`lines_of`] found of a mount, as its /dev/shm line: the entry if its mount point
/// is /dev/shm, and whether mountinfo was cut before the line was found.
pub(super) fn as_shm_line(
    line: Option<Option<MountEntry>>,
    cut: bool,
) -> (Option<MountEntry>, bool) {
    let cut = cut && line.is_none();
    (line.flatten().filter(|e| e.mount_point == "/dev/shm"), cut)
}

/// The lines of the mounts `ids` (`None`: nothing wanted there) in the mountinfo at `path`, in
/// one pass, streamed and bounded: `Some` where a line of that ID was found (its entry `None`
/// when the line is malformed); with whether the file was cut before all were found.
pub(super) fn lines_of<const N: usize>(
    files: &mut FileReader,
    path: &Path,
    ids: [Option<u64>; N],
) -> io::Result<([Option<Option<MountEntry>>; N], bool)> {
    let mut found: [Option<Option<MountEntry>>; N] = std::array::from_fn(|_| None);
    let mut left = ids.iter().filter(|id| id.is_some()).count();
    if left == 0 {
        return Ok((found, false));
    }
    let cut = files.for_each_line(
        rustix::fs::CWD,
        path,
        MOUNTINFO_MAX,
        MOUNTINFO_LINE_MAX,
        |line| {
            // A cheap test first: the ID leads the line.
            let id = line.split(|&b| b == b' ').next();
            let Some(id) = id.and_then(|id| std::str::from_utf8(id).ok()?.parse::<u64>().ok())
            else {
                return true;
            };
            for (i, wanted) in ids.iter().enumerate() {
                if *wanted == Some(id) && found[i].is_none() {
                    // Bytes, not UTF-8: one mount point with odd bytes elsewhere must not hide it.
                    found[i] = Some(mountinfo::parse_line(&String::from_utf8_lossy(line)));
                    left -= 1;
                }
            }
            left > 0
        },
    )?;
    Ok((found, cut && left > 0))
}

impl ShmScanner {
    /// The /dev/shm line of the process's mountinfo for the mount the handle is on, from the
    /// cache when the mount is unchanged (same mount ID), else the line the walk read after it
    /// opened the handle (`read`), else read now. `None`: the process is gone; `Err`:
    /// mountinfo could not be read (counted).
    pub(super) fn mount_entry(
        &mut self,
        (pid, mnt): (i32, NsId),
        id: Identity,
        read: Option<(Option<MountEntry>, bool)>,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Result<Option<MountEntry>, String>> {
        if let Some(cached) = self.mounts.get(&(mnt, pid)) {
            if cached.key == id.key() {
                return Some(Ok(cached.entry.clone()));
            }
        }
        let path = self.proc_root.join(pid.to_string()).join("mountinfo");
        let read = match read {
            Some(line) => Ok(line),
            None => shm_line(&mut self.files, &path, id.mount_id),
        };
        let entry = match read {
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
    fn several_mounts_lines_are_found_in_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mountinfo");
        std::fs::write(
            &path,
            "20 1 0:30 / / rw - overlay overlay rw\n\
             31 20 0:40 / /dev rw - tmpfs tmpfs rw\n\
             33 31 0:41 a line cut short\n\
             42 31 0:77 / /dev/shm rw - tmpfs shm rw,size=65536k\n",
        )
        .unwrap();
        let mut files = FileReader::default();
        let ([root, dev, shm, none, cut_short, again], cut) = lines_of(
            &mut files,
            &path,
            [Some(20), Some(31), Some(42), Some(7), Some(33), Some(20)],
        )
        .unwrap();
        assert!(!cut);
        assert_eq!(root.flatten().unwrap().fs_type, "overlay");
        assert_eq!(again.flatten().unwrap().fs_type, "overlay", "asked twice");
        assert_eq!(dev.clone().flatten().unwrap().mount_point, "/dev");
        assert_eq!(none, None, "no such line");
        assert_eq!(cut_short, Some(None), "a line, but malformed");
        let (line, cut) = as_shm_line(shm, false);
        assert_eq!((line.unwrap().source.as_str(), cut), ("shm", false));
        // /dev's line is no /dev/shm line; a line not found in a file cut short is unknown.
        assert_eq!(as_shm_line(dev, true), (None, false));
        assert_eq!(as_shm_line(None, true), (None, true));
        assert_eq!(
            lines_of(&mut files, &path, [None]).unwrap(),
            ([None], false)
        );
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

//! The walk from a container's root to its /dev/shm, one component at a time, each lookup made
//! only in a directory whose file system is trusted to answer it.
//!
//! Looking a name up is a call to the file system of the directory looked in: a FUSE at the
//! container's /dev makes the lookup of `shm` a FUSE request, and a process whose root is a
//! FUSE (a chroot or pivot_root into one, which an unprivileged user namespace allows) makes
//! the lookup of `dev` one. A server that read such a request and never answers holds the
//! caller past SIGKILL, so no deadline ends it and the agent would never be reaped. So before
//! each lookup the directory's mount is told without a call to its file system (a statx that
//! does not sync, [`statfs::identify`]) and its type taken from the process's mountinfo, and
//! a type not on the short list below is never looked in: the container is "not measured",
//! with the type, as a foreign /dev/shm is. The mount IDs found trusted are kept (per
//! process and mount namespace by the scan, `super::Viewer`), so mountinfo is read again only
//! when a mount changes.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::SystemTime;

use super::deadline::{Measurer, Unanswered};
use super::mounts;
use super::statfs::{self, Identity, MountKey, OpenShmError};
use crate::procfs::kfile::FileReader;
use crate::procfs::mountinfo::MountEntry;

/// File systems a container's root may be on and still be looked in: the local ones container
/// runtimes give a rootfs (overlay by containerd, CRI-O and Docker; ext4, xfs or btrfs by the
/// devmapper, native and btrfs snapshotters or a host directory; zfs by its snapshotter; tmpfs
/// for a root in memory; rootfs and ramfs on a node that runs from its initramfs, as diskless
/// and LinuxKit-style nodes do). Each answers a lookup from its page cache or local disk. Never a
/// FUSE (`fuse`, `fuse.*`, `fuseblk`, rootless `fuse-overlayfs` too), nor a network one
/// (nfs, cifs, smb3, 9p, ceph, virtiofs): those call out to a server that may never answer.
pub const ROOT_TYPES: &[&str] = &[
    "overlay", "ext4", "ext3", "ext2", "xfs", "btrfs", "zfs", "tmpfs", "rootfs", "ramfs",
];
/// File systems a container's /dev may be on when it is a mount of its own: the tmpfs every
/// runtime mounts there, or the host's devtmpfs (a privileged Pod's). A /dev that is a plain
/// directory of the root's mount is as trusted as the root.
pub const DEV_TYPES: &[&str] = &["tmpfs", "devtmpfs"];

/// The root and /dev mounts already found trusted (their [`MountKey`]s: an ID alone is handed
/// to the next mount once freed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trusted {
    root: Option<MountKey>,
    dev: Option<MountKey>,
    /// Whether that /dev is a tmpfs (the runtime's, made with the container), not the host's
    /// devtmpfs.
    dev_tmpfs: bool,
}

/// Pure: whether a lookup may be made in a directory at `dir` ("/" or "/dev") on a mount of
/// `fs_type`.
pub fn is_trusted(dir: &str, fs_type: &str) -> bool {
    match dir {
        "/" => ROOT_TYPES.contains(&fs_type),
        _ => DEV_TYPES.contains(&fs_type),
    }
}

/// What the walk found: the handle of /dev/shm and its mount, and, when the walk read
/// mountinfo after opening it, that mount's /dev/shm line ([`mounts::as_shm_line`]), which the
/// caller need not read again.
pub struct Walked {
    pub fd: OwnedFd,
    pub id: Identity,
    pub line: Option<(Option<MountEntry>, bool)>,
    /// When the container's /dev was made, where it is a tmpfs mount of its own that keeps a
    /// birth time: the runtime makes one for each container it starts (a restart too), so this
    /// is when the container started, read with no call more ([`dev_born`]).
    pub dev_born: Option<SystemTime>,
}

/// [`walk`], for callers that read /dev/shm's line themselves.
pub fn open_shm(
    measurer: &mut Measurer,
    files: &mut FileReader,
    mountinfo: &Path,
    root: OwnedFd,
    trusted: &mut Trusted,
) -> Result<Result<(OwnedFd, Identity), OpenShmError>, Unanswered> {
    walk(measurer, files, mountinfo, root, trusted).map(|w| w.map(|w| (w.fd, w.id)))
}

/// Opens `dev/shm` beneath the container's `root` (the handle of `/proc/PID/root`), looking in
/// the root and in /dev only when their mounts are of a trusted type by the mountinfo at
/// `mountinfo`. `trusted` keeps the mounts found trusted for the next call. The answer is the
/// handle of /dev/shm and its mount, as [`Measurer::open_and_identify_at`] gives; an untrusted
/// root or /dev is [`OpenShmError::Untrusted`].
///
/// Each lookup is asked of the kernel's caches first ([`statfs::open_child_cached`]: it cannot
/// reach a file system, so it is made on this thread, trusted or not); only what they do not
/// hold is looked up on the measurer's worker within its deadline, and only in a directory
/// already found trusted. The checks owed are then made in the walk's order (the root, then
/// /dev) on one read of mountinfo, after every handle they are about was opened: an open
/// handle keeps its mount, so no other mount can hold its ID when mountinfo is read.
pub fn walk(
    measurer: &mut Measurer,
    files: &mut FileReader,
    mountinfo: &Path,
    root: OwnedFd,
    trusted: &mut Trusted,
) -> Result<Result<Walked, OpenShmError>, Unanswered> {
    let root_key = match statfs::identify(&root) {
        Ok(id) => id.key(),
        Err(e) => return Ok(Err(OpenShmError::Io(e))),
    };
    if trusted.root != Some(root_key) {
        *trusted = Trusted::default();
    }
    let mut owed = Owed {
        root: (trusted.root != Some(root_key)).then_some(root_key),
        dev: None,
    };
    let dev = match statfs::open_child_cached(&root, "dev") {
        Some(dev) => dev,
        None => {
            if let Err(e) = owed.settle(files, mountinfo, trusted, None) {
                return Ok(Err(e));
            }
            measurer.open_child(root, "dev")?
        }
    };
    let (dev, dev_id) = match dev {
        Ok(opened) => opened,
        // The root's verdict first, as when the root is looked in only once trusted.
        Err(e) => {
            return Ok(Err(owed
                .settle(files, mountinfo, trusted, None)
                .err()
                .unwrap_or(e)))
        }
    };
    if dev_id.mount_id != root_key.id && trusted.dev != Some(dev_id.key()) {
        owed.dev = Some(dev_id.key());
    }
    let shm = match statfs::open_child_cached(&dev, "shm") {
        Some(shm) => shm,
        None => {
            if let Err(e) = owed.settle(files, mountinfo, trusted, None) {
                return Ok(Err(e));
            }
            let opened = measurer.open_child(dev, "shm")?;
            let dev_born = dev_born(root_key, &dev_id, trusted);
            return Ok(opened.map(|(fd, id)| Walked {
                fd,
                id,
                line: None,
                dev_born,
            }));
        }
    };
    let (fd, id) = match shm {
        Ok(opened) => opened,
        Err(e) => {
            return Ok(Err(owed
                .settle(files, mountinfo, trusted, None)
                .err()
                .unwrap_or(e)))
        }
    };
    match owed.settle(files, mountinfo, trusted, Some(id.mount_id)) {
        Ok(line) => Ok(Ok(Walked {
            fd,
            id,
            line,
            dev_born: dev_born(root_key, &dev_id, trusted),
        })),
        Err(e) => Ok(Err(e)),
    }
}

/// Pure: the birth of the container's /dev (`dev`, beneath the root `root`) when it is a tmpfs
/// mount of its own, found trusted; `None` for a /dev on the root's file system (an image's
/// directory, born with the image) or the host's devtmpfs (born at boot), neither of which
/// says when the container started.
fn dev_born(root: MountKey, dev: &Identity, trusted: &Trusted) -> Option<SystemTime> {
    let own = dev.mount_id != root.id && dev.is_mount_root == Some(true);
    dev.born_at().filter(|_| own && trusted.dev_tmpfs)
}

/// The trust checks a walk still owes: the root's mount, then /dev's.
struct Owed {
    root: Option<MountKey>,
    dev: Option<MountKey>,
}

impl Owed {
    /// Makes the checks owed, in order, on one read of mountinfo (none when none is owed), which
    /// also gives the /dev/shm line of mount `shm` when asked; each mount found trusted is kept.
    fn settle(
        &mut self,
        files: &mut FileReader,
        mountinfo: &Path,
        trusted: &mut Trusted,
        shm: Option<u64>,
    ) -> Result<Option<(Option<MountEntry>, bool)>, OpenShmError> {
        if self.root.is_none() && self.dev.is_none() {
            return Ok(None);
        }
        let ids = [self.root.map(|k| k.id), self.dev.map(|k| k.id), shm];
        let ([root, dev, line], cut) =
            mounts::lines_of(files, mountinfo, ids).map_err(statfs::classify)?;
        if let Some(key) = self.root.take() {
            judge(root, cut, "/")?;
            trusted.root = Some(key);
        }
        if let Some(key) = self.dev.take() {
            trusted.dev_tmpfs = judge(dev, cut, "/dev")? == "tmpfs";
            trusted.dev = Some(key);
        }
        Ok(shm.map(|_| mounts::as_shm_line(line, cut)))
    }
}

/// Pure: whether a mount whose mountinfo line is `line` (see [`mounts::lines_of`]) may be
/// looked in at `dir`; its type when it may.
fn judge(
    line: Option<Option<MountEntry>>,
    cut: bool,
    dir: &'static str,
) -> Result<String, OpenShmError> {
    match (line.map(|l| l.map(|e| e.fs_type)), cut) {
        (Some(Some(t)), _) if is_trusted(dir, &t) => Ok(t),
        (Some(Some(fs_type)), _) => Err(OpenShmError::Untrusted { dir, fs_type }),
        (Some(None), _) | (None, false) => Err(OpenShmError::Moving(dir)),
        (None, true) => Err(OpenShmError::Io(std::io::Error::other(format!(
            "the mount of the container's {dir} is not in the part of mountinfo read"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{Mode, OFlags};

    #[test]
    fn only_local_roots_and_memory_devs_are_looked_in() {
        for t in ["overlay", "ext4", "xfs", "btrfs", "zfs", "tmpfs"] {
            assert!(is_trusted("/", t), "{t}");
        }
        for t in ["tmpfs", "devtmpfs"] {
            assert!(is_trusted("/dev", t), "{t}");
        }
        for t in [
            "fuse",
            "fuse.sshfs",
            "fuseblk",
            "fuse.fuse-overlayfs",
            "nfs",
            "nfs4",
            "cifs",
            "smb3",
            "9p",
            "ceph",
            "virtiofs",
            "",
        ] {
            assert!(!is_trusted("/", t), "{t}");
            assert!(!is_trusted("/dev", t), "{t}");
        }
        assert!(!is_trusted("/dev", "overlay"));
    }

    fn slash() -> OwnedFd {
        rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    /// This process's mountinfo with the type of mount `id` replaced by `fs_type`.
    fn mountinfo_with(dir: &Path, id: u64, fs_type: &str) -> std::path::PathBuf {
        let real = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let text: String = real
            .lines()
            .map(|l| {
                let e = crate::procfs::mountinfo::parse_line(l).unwrap();
                if e.mount_id == id {
                    l.replacen(&format!(" - {} ", e.fs_type), &format!(" - {fs_type} "), 1)
                } else {
                    l.to_string()
                }
            })
            .map(|l| l + "\n")
            .collect();
        let path = dir.join("mountinfo");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_hosts_dev_shm_is_reached_and_an_untrusted_root_or_dev_stops_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, mut files) = (Measurer::default(), FileReader::default());
        let root_id = statfs::identify(&slash()).unwrap().mount_id;
        let dev = statfs::open_child(&slash(), "dev").unwrap().1.mount_id;
        let real = Path::new("/proc/self/mountinfo");
        let mut trusted = Trusted::default();
        let (_, shm) = open_shm(&mut m, &mut files, real, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert_eq!(shm.is_mount_root, Some(true), "the host's /dev/shm");
        let root_key = statfs::identify(&slash()).unwrap().key();
        assert_eq!(trusted.root, Some(root_key));
        // Trusted mounts are not looked up again: a mountinfo that says nothing still passes.
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        assert!(open_shm(&mut m, &mut files, &empty, slash(), &mut trusted)
            .unwrap()
            .is_ok());
        // The same mount ID born at another time is another mount (the ID was handed on):
        // looked up in mountinfo again, which says nothing of it, so not looked in.
        let mut reused = Trusted {
            root: Some(MountKey {
                born: Some((1, 0)),
                ..root_key
            }),
            ..Trusted::default()
        };
        assert_ne!(reused.root, Some(root_key));
        assert!(
            open_shm(&mut m, &mut files, &empty, slash(), &mut reused)
                .unwrap()
                .is_err(),
            "a reused ID is checked again"
        );

        let fuse_root = mountinfo_with(dir.path(), root_id, "fuse");
        match open_shm(
            &mut m,
            &mut files,
            &fuse_root,
            slash(),
            &mut Trusted::default(),
        ) {
            Ok(Err(OpenShmError::Untrusted { dir: "/", fs_type })) => assert_eq!(fs_type, "fuse"),
            other => panic!("{other:?}"),
        }
        if dev != root_id {
            let fuse_dev = mountinfo_with(dir.path(), dev, "fuse.hung");
            match open_shm(
                &mut m,
                &mut files,
                &fuse_dev,
                slash(),
                &mut Trusted::default(),
            ) {
                Ok(Err(e @ OpenShmError::Untrusted { dir: "/dev", .. })) => {
                    assert!(e.to_string().contains("/dev is a fuse.hung mount"), "{e}")
                }
                other => panic!("{other:?}"),
            }
        }
        match open_shm(&mut m, &mut files, &empty, slash(), &mut Trusted::default()) {
            Ok(Err(e @ OpenShmError::Moving("/"))) => {
                assert!(e.to_string().contains("not in any line"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_walk_that_checks_reads_mountinfo_once_and_hands_on_the_shm_line() {
        let (mut m, mut files) = (Measurer::default(), FileReader::default());
        let real = Path::new("/proc/self/mountinfo");
        let mut trusted = Trusted::default();
        // Cold: the root's and /dev's checks were owed; the read made for them gave the line of
        // /dev/shm's mount too, the same as reading it alone.
        let walked = walk(&mut m, &mut files, real, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert!(trusted.root.is_some());
        let alone = mounts::shm_line(&mut files, real, walked.id.mount_id).unwrap();
        assert_eq!(walked.line, Some(alone.clone()));
        assert_eq!(alone.0.map(|e| e.fs_type).as_deref(), Some("tmpfs"));
        // Warm: nothing owed, nothing read (an empty mountinfo would fail any check).
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        let warm = walk(&mut m, &mut files, &empty, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert_eq!((warm.id, warm.line), (walked.id, None));
    }

    #[test]
    fn the_start_is_the_birth_of_a_tmpfs_dev_never_of_a_devtmpfs_or_the_roots_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, mut files) = (Measurer::default(), FileReader::default());
        let root = statfs::identify(&slash()).unwrap();
        let dev = statfs::open_child(&slash(), "dev").unwrap().1;
        assert_ne!(
            dev.mount_id, root.mount_id,
            "this test needs the host's /dev mounted"
        );
        let born = dev.born_at().expect("the kernel keeps a tmpfs's birth");
        // The host's /dev is its devtmpfs, born at boot: no start.
        let real = Path::new("/proc/self/mountinfo");
        let mut trusted = Trusted::default();
        let walked = walk(&mut m, &mut files, real, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert_eq!(walked.dev_born, None);
        // A tmpfs there, as a runtime mounts for each container: its birth is the start, and
        // stays known once trusted (warm: mountinfo is not read again).
        let tmpfs_dev = mountinfo_with(dir.path(), dev.mount_id, "tmpfs");
        let mut trusted = Trusted::default();
        let walked = walk(&mut m, &mut files, &tmpfs_dev, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert_eq!(walked.dev_born, Some(born));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        let warm = walk(&mut m, &mut files, &empty, slash(), &mut trusted)
            .unwrap()
            .unwrap();
        assert_eq!(warm.dev_born, Some(born));
        // A /dev that is a directory of the root's file system (an image's) says nothing.
        let on_root = Identity {
            mount_id: root.mount_id,
            is_mount_root: Some(false),
            ..dev
        };
        assert_eq!(super::dev_born(root.key(), &on_root, &trusted), None);
        assert_eq!(super::dev_born(root.key(), &dev, &trusted), Some(born));
    }

    #[test]
    fn a_child_that_is_a_symlink_or_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let d =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(matches!(
            statfs::open_child(&d, "dev"),
            Err(OpenShmError::Symlink)
        ));
        assert!(matches!(
            statfs::open_child(&d, "file"),
            Err(OpenShmError::Absent(_))
        ));
        assert!(matches!(
            statfs::open_child(&d, "none"),
            Err(OpenShmError::Absent(_))
        ));
        assert!(matches!(
            statfs::open_child(&d, ".."),
            Err(OpenShmError::Io(_))
        ));
        assert!(matches!(
            statfs::open_child(&d, "a/b"),
            Err(OpenShmError::Io(_))
        ));
    }
}

//! Opens a /dev/shm beneath a root without following symlinks, and measures it. A container's
//! is walked a component at a time ([`open_child`], by `super::trusted`), a Pod sandbox's (a
//! path of the host's) opened at once ([`open_beneath`]).
//!
//! `/proc/PID/root/dev/shm` must not be resolved by path: an absolute symlink planted at
//! /dev/shm inside the container would resolve against the *agent's* root, i.e. the host.
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)` on the container's root directory keeps the
//! walk inside the container and refuses every symlink; the numbers come from the open handle.
//! Kernels without openat2 walk `dev`, then `shm`, one component at a time ([`crate::beneath`]).
//!
//! Opening /dev/shm asks nothing of the file system mounted there: the walk looks `shm` up in
//! the directory of `dev` (the container's /dev, a tmpfs), then crosses into the mount on it,
//! which is a move in the mount table, not a call (fs/namei.c `traverse_mounts`); the mounted
//! root is reached that way, never looked up, so its `d_revalidate` (FUSE's `fuse_dentry_revalidate`,
//! which would send a LOOKUP) is not called, and `complete_walk` revalidates only after a jump
//! (a magic link or `..`), through `d_weak_revalidate`, which FUSE does not have. An `O_PATH`
//! open then stops before the file system's `open` (fs/open.c `do_dentry_open`). So a hung
//! FUSE at /dev/shm is safe to open; it is [`identify`]'d without a request, and asked
//! ([`measure`]) only if mountinfo says it is a tmpfs ([`is_measured_type`]).

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};

/// Set for good once statx answered ENOSYS.
static NO_STATX: AtomicBool = AtomicBool::new(false);

/// tmpfs's `f_type` (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// What statvfs says of the directory at /dev/shm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmStat {
    /// The mount's ID (`statx` STATX_MNT_ID), matching the first field of mountinfo.
    pub mount_id: Option<u64>,
    /// Whether /dev/shm is the root of a mount, i.e. something is mounted there.
    pub is_mount_root: Option<bool>,
    /// The handle's device (major, minor), read only by [`measure`] when statx could not say
    /// the above: mountinfo's `major:minor` then tells which mount the handle is on.
    pub dev: Option<(u32, u32)>,
    pub is_tmpfs: bool,
    /// Total bytes; 0 for a tmpfs mounted without a size limit.
    pub total_bytes: u64,
    pub free_bytes: u64,
}

impl ShmStat {
    pub fn size_bytes(&self) -> Option<u64> {
        (self.total_bytes > 0).then_some(self.total_bytes)
    }

    /// Bytes in use; unknown when the file system reports no block counts (unlimited tmpfs).
    pub fn used_bytes(&self) -> Option<u64> {
        (self.total_bytes > 0).then(|| self.total_bytes.saturating_sub(self.free_bytes))
    }
}

/// Why /dev/shm could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum OpenShmError {
    /// The process is gone, or has no such path: not a fault of the agent.
    #[error("no /dev/shm: {0}")]
    Absent(io::Error),
    /// A symlink on the way (`ELOOP` under RESOLVE_NO_SYMLINKS): refused, never followed.
    #[error("/dev/shm is reached through a symlink, which is not followed")]
    Symlink,
    /// The container's root or /dev is on a file system not trusted to answer a lookup (a
    /// FUSE or network one may never answer): what is beneath it is not looked up.
    #[error(
        "the container's {dir} is a {} mount, not a local file system: /dev/shm not measured \
         (a lookup in a FUSE or network file system may never be answered)",
        crate::model::printable(.fs_type)
    )]
    Untrusted { dir: &'static str, fs_type: String },
    /// The mount of the container's root, /dev or /dev/shm is in no line of its mountinfo: its
    /// mounts changed between the two reads (a runtime setting a container up or tearing it down).
    #[error("the mount of the container's {0} is not in any line of its mountinfo (its mounts changed while read)")]
    Moving(&'static str),
    #[error(transparent)]
    Io(io::Error),
}

/// Opens `<proc_root>/<pid>/root`: `Absent` means the process is gone.
pub fn open_container_root(proc_root: &Path, pid: i32) -> Result<OwnedFd, OpenShmError> {
    // Following the /proc/PID/root magic link is the point here: it is the kernel's handle on
    // the container's root directory, not something the container can plant.
    let path = proc_root.join(pid.to_string()).join("root");
    rustix::fs::open(
        &path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| classify(e.into()))
}

/// Opens `rel` beneath `root` as an `O_PATH` handle, confined to `root`, refusing symlinks:
/// openat2 where the kernel has it, else the component-by-component walk.
pub fn open_beneath(root: &OwnedFd, rel: &str) -> Result<OwnedFd, OpenShmError> {
    crate::beneath::open(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(classify_open)
}

/// The fallback walk alone, as kernels without openat2 take it (tests force it with this).
pub fn walk_beneath(root: &OwnedFd, rel: &str) -> Result<OwnedFd, OpenShmError> {
    crate::beneath::walk(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
    )
    .map_err(classify_open)
}

/// Opens the single component `name` in the directory `dir` (`O_PATH`, no symlink followed)
/// and tells what it is and which mount it is on without asking its file system ([`identify`]):
/// the lookup is a call to `dir`'s file system only, so the caller makes sure that one answers.
/// A symlink is `Symlink`; anything but a directory is `Absent`, as openat2 with `O_DIRECTORY`
/// would say.
pub fn open_child(dir: &OwnedFd, name: &str) -> Result<(OwnedFd, Identity), OpenShmError> {
    child(name, |flags| {
        rustix::fs::openat(dir, name, flags, Mode::empty())
    })
}

/// Set for good once openat2 refused `RESOLVE_CACHED` (kernels before 5.12, or no openat2).
static NO_CACHED: AtomicBool = AtomicBool::new(false);

/// [`open_child`] from the kernel's caches alone (`openat2` with `RESOLVE_CACHED`), or `None`
/// when they do not hold the answer. Such a lookup is an RCU walk, which may not sleep: it never
/// calls a file system's `lookup` nor a `d_revalidate` that would ask its server (fs/namei.c
/// fails it with EAGAIN instead: `legitimize_links`, `path_init`), so it cannot hang whatever
/// the directory is on, and needs no worker and no deadline. A container's `dev` and `shm` are
/// mount points, whose dentries the kernel keeps while mounted: almost always cached.
pub fn open_child_cached(
    dir: &OwnedFd,
    name: &str,
) -> Option<Result<(OwnedFd, Identity), OpenShmError>> {
    if NO_CACHED.load(Ordering::Relaxed) {
        return None;
    }
    let mut uncached = false;
    let answer = child(name, |flags| {
        let how = ResolveFlags::CACHED;
        let opened = rustix::fs::openat2(dir, name, flags, Mode::empty(), how);
        match opened {
            Err(rustix::io::Errno::AGAIN) => uncached = true,
            Err(rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                NO_CACHED.store(true, Ordering::Relaxed);
                uncached = true;
            }
            _ => {}
        }
        opened
    });
    (!uncached).then_some(answer)
}

/// `name` opened by `open` (`O_PATH`, no symlink followed) and told apart: a symlink is
/// `Symlink`, anything but a directory `Absent`, as openat2 with `O_DIRECTORY` would say.
fn child(
    name: &str,
    mut open: impl FnMut(OFlags) -> Result<OwnedFd, rustix::io::Errno>,
) -> Result<(OwnedFd, Identity), OpenShmError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(OpenShmError::Io(rustix::io::Errno::INVAL.into()));
    }
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = open(flags).map_err(classify_open)?;
    let id = identify(&fd).map_err(OpenShmError::Io)?;
    match (id.is_symlink, id.is_dir) {
        (Some(true), _) => Err(OpenShmError::Symlink),
        (_, Some(true)) => Ok((fd, id)),
        (_, Some(false)) => Err(classify(rustix::io::Errno::NOTDIR.into())),
        // No statx: O_DIRECTORY tells (a symlink then reads as "not a directory").
        _ => {
            let fd = open(flags | OFlags::DIRECTORY).map_err(classify_open)?;
            Ok((fd, id))
        }
    }
}

/// Both ways answer alike: ELOOP for a symlink, ENOENT/ENOTDIR for nothing there.
fn classify_open(e: rustix::io::Errno) -> OpenShmError {
    match e {
        rustix::io::Errno::LOOP => OpenShmError::Symlink,
        e => classify(e.into()),
    }
}

pub(super) fn classify(e: io::Error) -> OpenShmError {
    match e.raw_os_error() {
        // ESRCH: the process exited; ENOENT/ENOTDIR: nothing at that path.
        Some(libc_errno::ENOENT | libc_errno::ESRCH | libc_errno::ENOTDIR) => {
            OpenShmError::Absent(e)
        }
        _ => OpenShmError::Io(e),
    }
}

/// errno values used above, without a libc dependency.
mod libc_errno {
    pub const ENOENT: i32 = rustix::io::Errno::NOENT.raw_os_error();
    pub const ESRCH: i32 = rustix::io::Errno::SRCH.raw_os_error();
    pub const ENOTDIR: i32 = rustix::io::Errno::NOTDIR.raw_os_error();
}

/// Which mount a handle is on, learned without asking the file system anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The mount's ID, matching the first field of mountinfo.
    pub mount_id: u64,
    /// Whether the handle is the root of its mount (statx's STATX_ATTR_MOUNT_ROOT); `None`
    /// without statx (mountinfo then says whether a mount is at /dev/shm).
    pub is_mount_root: Option<bool>,
    /// Whether the handle is a directory, from the same statx; `None` without statx.
    pub is_dir: Option<bool>,
    /// Whether the handle is a symlink (opened as itself, never followed); `None` without statx.
    pub is_symlink: Option<bool>,
    /// When the handle's inode was made (statx's btime), where the file system keeps one.
    pub born: Option<(i64, u32)>,
}

/// A statx timestamp (seconds and nanoseconds since the epoch) as a time; `None` before the
/// epoch (a file's times are whatever its writer set).
pub fn statx_time(secs: i64, nanos: u32) -> Option<std::time::SystemTime> {
    let since = std::time::Duration::new(u64::try_from(secs).ok()?, nanos);
    std::time::SystemTime::UNIX_EPOCH.checked_add(since)
}

/// A mount told apart without asking its file system: its ID, and when the inode the handle is
/// on was made. The kernel hands a freed mount ID to the next mount at once (lowest first), so
/// a cache keyed by the ID alone would take a FUSE a container mounted where its tmpfs was for
/// that tmpfs, and ask it. A tmpfs keeps a birth time; a FUSE, not asked, has none; and a new
/// tmpfs in the old one's place has another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MountKey {
    pub id: u64,
    pub born: Option<(i64, u32)>,
}

impl Identity {
    /// [`Self::born`] as a time.
    pub fn born_at(&self) -> Option<std::time::SystemTime> {
        let (secs, nanos) = self.born?;
        statx_time(secs, nanos)
    }

    pub fn key(&self) -> MountKey {
        MountKey {
            id: self.mount_id,
            born: self.born,
        }
    }
}

/// The only file system whose statfs and directory listing are asked: tmpfs answers from
/// memory, and it is what a /dev/shm is. Anything else may be a FUSE or network file system
/// whose server never answers, and then the calling thread waits in the kernel for good, past
/// SIGKILL (fs/fuse/dev.c `request_wait_answer`, once the server read the request): no
/// deadline can end that wait, and a process with such a thread is never reaped.
pub fn is_measured_type(fs_type: &str) -> bool {
    fs_type == "tmpfs"
}

/// The mount a handle (an `O_PATH` handle of /dev/shm) is on, without a request to its file
/// system: statx with `AT_STATX_DONT_SYNC` answers from the inode cache (FUSE's getattr then
/// fills in its cached attributes and sends nothing, fs/fuse/dir.c `fuse_update_get_attr`), and
/// only the mount ID is asked, which the VFS fills in itself (fs/stat.c `vfs_statx`). Without
/// statx, the agent's own `fdinfo` says the mount ID (fs/proc/fd.c, no file system call).
pub fn identify(shm: &OwnedFd) -> io::Result<Identity> {
    let stx = if NO_STATX.load(Ordering::Relaxed) {
        Err(rustix::io::Errno::NOSYS)
    } else {
        rustix::fs::statx(
            shm,
            "",
            AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
            // STATX_DONT_SYNC: the birth time too comes from the cached inode, never asked.
            StatxFlags::MNT_ID | StatxFlags::TYPE | StatxFlags::BTIME,
        )
    };
    match stx {
        Ok(stx) if StatxFlags::from_bits_retain(stx.stx_mask).contains(StatxFlags::MNT_ID) => {
            let root = stx
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
            // The type comes from the cached inode as well (it never changes).
            let kind = StatxFlags::from_bits_retain(stx.stx_mask)
                .contains(StatxFlags::TYPE)
                .then(|| FileType::from_raw_mode(u32::from(stx.stx_mode)));
            let born = StatxFlags::from_bits_retain(stx.stx_mask)
                .contains(StatxFlags::BTIME)
                .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec));
            Ok(Identity {
                mount_id: stx.stx_mnt_id,
                is_mount_root: root,
                is_dir: kind.map(|k| k == FileType::Directory),
                is_symlink: kind.map(|k| k == FileType::Symlink),
                born,
            })
        }
        // Kernels before 4.11 have no statx (and seccomp may refuse it): decided once. Before
        // 5.8 statx has no mount ID: fdinfo has (since 3.15).
        Ok(_) => fdinfo_mount_id(shm),
        Err(e) if e == rustix::io::Errno::NOSYS => {
            if !NO_STATX.swap(true, Ordering::Relaxed) {
                tracing::info!("this kernel has no statx: mounts are told by fdinfo and mountinfo");
            }
            fdinfo_mount_id(shm)
        }
        Err(e) => Err(e.into()),
    }
}

/// The mount ID `/proc/thread-self/fdinfo/<fd>` gives of the agent's own descriptor.
fn fdinfo_mount_id(fd: &OwnedFd) -> io::Result<Identity> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/thread-self/fdinfo/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(path)?;
    parse_fdinfo_mount_id(&text)
        .map(|mount_id| Identity {
            mount_id,
            is_mount_root: None,
            is_dir: None,
            is_symlink: None,
            born: None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "fdinfo has no mnt_id"))
}

/// Pure: the `mnt_id:` field of an fdinfo text.
pub fn parse_fdinfo_mount_id(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// statfs of a handle whose mount is already known to be a tmpfs ([`identify`], then its type
/// in mountinfo): the caller asks only then. statfs carries everything statvfs would (statvfs
/// is statfs converted in user space) and the file system type besides, checked again.
pub fn measure_tmpfs(shm: &OwnedFd, id: Identity) -> io::Result<ShmStat> {
    let fs = rustix::fs::fstatfs(shm)?;
    Ok(stat_of(&fs, Some(id.mount_id), id.is_mount_root, None))
}

/// statfs and statx of an open handle, whatever its file system: for `preflight`, which a
/// workload runs on its own /dev/shm (a mount it made itself), never for another container's
/// (the scan asks only a tmpfs: [`identify`], then [`measure_tmpfs`]). Two system calls. statfs carries everything statvfs
/// would (statvfs is statfs converted in user space) and the file system type besides.
pub fn measure(shm: &OwnedFd) -> io::Result<ShmStat> {
    let fs = rustix::fs::fstatfs(shm)?;
    let stx = if NO_STATX.load(Ordering::Relaxed) {
        Err(rustix::io::Errno::NOSYS)
    } else {
        rustix::fs::statx(shm, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
    };
    let (mount_id, is_mount_root) = match stx {
        Ok(stx) => {
            let mount_id = StatxFlags::from_bits_retain(stx.stx_mask)
                .contains(StatxFlags::MNT_ID)
                .then_some(stx.stx_mnt_id);
            let attrs = stx.stx_attributes;
            let root = stx
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| attrs.contains(StatxAttributes::MOUNT_ROOT));
            (mount_id, root)
        }
        // Kernels before 4.11 have no statx (and seccomp may refuse it): decided once, then
        // mountinfo decides, matched by the device below. (Before 5.8 statx has neither the
        // mount ID nor MOUNT_ROOT: the same way.)
        Err(e) => {
            if e == rustix::io::Errno::NOSYS && !NO_STATX.swap(true, Ordering::Relaxed) {
                tracing::info!("this kernel has no statx: mounts are told by mountinfo");
            }
            (None, None)
        }
    };
    let dev = if mount_id.is_none() || is_mount_root.is_none() {
        let st = rustix::fs::fstat(shm)?;
        Some((rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev)))
    } else {
        None
    };
    Ok(stat_of(&fs, mount_id, is_mount_root, dev))
}

/// A statfs answer as the scan keeps it.
fn stat_of(
    fs: &rustix::fs::StatFs,
    mount_id: Option<u64>,
    is_mount_root: Option<bool>,
    dev: Option<(u32, u32)>,
) -> ShmStat {
    // As statvfs computes f_frsize: the fragment size, else the block size.
    #[allow(clippy::unnecessary_cast)] // the field widths differ between targets
    let frsize = if fs.f_frsize > 0 {
        fs.f_frsize as u64
    } else {
        fs.f_bsize as u64
    };
    #[allow(clippy::unnecessary_cast)]
    let (blocks, bfree) = (fs.f_blocks as u64, fs.f_bfree as u64);
    ShmStat {
        mount_id,
        is_mount_root,
        dev,
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        is_tmpfs: fs.f_type as i64 == TMPFS_MAGIC,
        total_bytes: blocks.saturating_mul(frsize),
        free_bytes: bfree.saturating_mul(frsize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statx_times_before_the_epoch_are_none_and_the_largest_is_a_time() {
        use std::time::{Duration, SystemTime};
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_800_000_000, 5);
        assert_eq!(statx_time(1_800_000_000, 5), Some(at));
        assert_eq!(statx_time(-1, 0), None);
        assert!(statx_time(i64::MAX, 999_999_999).is_some());
    }

    #[test]
    fn a_symlink_beneath_the_root_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("dev/shm")).unwrap();
        let root = tmp_root(&dir);
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
    }

    #[test]
    fn a_symlinked_parent_directory_is_refused_too() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("dev")).unwrap();
        let root = tmp_root(&dir);
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
    }

    #[test]
    fn dot_dot_cannot_climb_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev/shm")).unwrap();
        let root = tmp_root(&dir);
        // RESOLVE_IN_ROOT clamps ".." at the root, so this is the root's own dev/shm.
        let fd = open_beneath(&root, "../../../../dev/shm").unwrap();
        let inner = rustix::fs::fstat(&fd).unwrap();
        let expected = rustix::fs::stat(dir.path().join("dev/shm")).unwrap();
        assert_eq!(
            (inner.st_dev, inner.st_ino),
            (expected.st_dev, expected.st_ino)
        );
    }

    #[test]
    fn a_missing_dev_shm_is_absent_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = tmp_root(&dir);
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Absent(_))
        ));
    }

    fn tmp_root(dir: &tempfile::TempDir) -> OwnedFd {
        rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn the_walk_refuses_a_symlinked_dev_or_shm_as_openat2_does() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("dev")).unwrap();
        assert!(matches!(
            walk_beneath(&tmp_root(&dir), "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::os::unix::fs::symlink("/dev/shm", dir.path().join("dev/shm")).unwrap();
        assert!(matches!(
            walk_beneath(&tmp_root(&dir), "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
    }

    #[test]
    fn the_walk_finds_nothing_where_shm_is_a_file_or_dev_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            walk_beneath(&tmp_root(&dir), "dev/shm"),
            Err(OpenShmError::Absent(_))
        ));
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/shm"), b"").unwrap();
        // As openat2 with O_DIRECTORY answers ENOTDIR: nothing usable there.
        assert!(matches!(
            walk_beneath(&tmp_root(&dir), "dev/shm"),
            Err(OpenShmError::Absent(_))
        ));
        assert!(matches!(
            open_beneath(&tmp_root(&dir), "dev/shm"),
            Err(OpenShmError::Absent(_))
        ));
    }

    #[test]
    fn the_walk_refuses_dot_dot_instead_of_clamping_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev/shm")).unwrap();
        match walk_beneath(&tmp_root(&dir), "../../dev/shm") {
            Err(OpenShmError::Io(e)) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(rustix::io::Errno::INVAL.raw_os_error())
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_walk_and_openat2_measure_the_hosts_dev_shm_alike() {
        let root = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let look = |fd: OwnedFd| measure_tmpfs(&fd, identify(&fd).unwrap()).unwrap();
        let walked = look(walk_beneath(&root, "dev/shm").unwrap());
        let opened = look(open_beneath(&root, "dev/shm").unwrap());
        // Same mount, same numbers (a concurrent writer could move free bytes: compare size).
        assert_eq!(walked.mount_id, opened.mount_id);
        assert_eq!(walked.is_mount_root, Some(true));
        assert_eq!(walked.total_bytes, opened.total_bytes);
        assert!(walked.is_tmpfs);
    }

    #[test]
    fn the_hosts_dev_shm_measures_as_a_tmpfs_mount() {
        // /dev/shm is a tmpfs on every Linux machine this runs on (and on CI).
        let root = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let fd = open_beneath(&root, "dev/shm").unwrap();
        let st = measure_tmpfs(&fd, identify(&fd).unwrap()).unwrap();
        assert!(st.is_tmpfs);
        assert_eq!(st.is_mount_root, Some(true));
        let vfs = rustix::fs::statvfs("/dev/shm").unwrap();
        assert_eq!(st.total_bytes, vfs.f_blocks * vfs.f_frsize);
    }

    #[test]
    fn a_lookup_from_the_caches_answers_as_the_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("link")).unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let d = tmp_root(&dir);
        for name in ["dev", "link", "file", "none", ".."] {
            // The plain lookup puts the name in the caches (a negative entry for "none", which
            // a tmpfs drops at once: the cached lookup may then say it does not know).
            let plain = open_child(&d, name);
            let Some(cached) = open_child_cached(&d, name) else {
                assert_eq!(name, "none", "{name} is in the caches");
                continue;
            };
            match (plain, cached) {
                (Ok((_, a)), Ok((_, b))) => assert_eq!(a, b, "{name}"),
                (Err(a), Err(b)) => assert_eq!(
                    std::mem::discriminant(&a),
                    std::mem::discriminant(&b),
                    "{name}: {a} / {b}"
                ),
                (a, b) => panic!("{name}: {a:?} / {b:?}"),
            }
        }
        // The host's /dev and /dev/shm are mount points, which the kernel keeps cached: crossed
        // into from the caches alone, to the same mounts.
        let slash = tmp_root_at("/");
        let (dev, by_cache) = open_child_cached(&slash, "dev").unwrap().unwrap();
        assert_eq!(by_cache, open_child(&slash, "dev").unwrap().1);
        let (_, shm) = open_child_cached(&dev, "shm").unwrap().unwrap();
        assert_eq!(shm, open_child(&dev, "shm").unwrap().1);
        assert_eq!(shm.is_mount_root, Some(true));
    }

    fn tmp_root_at(path: &str) -> OwnedFd {
        rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn only_tmpfs_is_measured() {
        assert!(is_measured_type("tmpfs"));
        for other in [
            "fuse",
            "fuse.sshfs",
            "fuseblk",
            "nfs4",
            "cifs",
            "overlay",
            "ext4",
            "",
        ] {
            assert!(!is_measured_type(other), "{other}");
        }
    }

    #[test]
    fn fdinfo_tells_the_mount_id_as_statx_does() {
        let text = "pos:\t0\nflags:\t012100000\nmnt_id:\t31\nino:\t1\n";
        assert_eq!(parse_fdinfo_mount_id(text), Some(31));
        assert_eq!(parse_fdinfo_mount_id("pos:\t0\n"), None);
        assert_eq!(parse_fdinfo_mount_id("mnt_id:\tx\n"), None);
        let root = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let fd = open_beneath(&root, "dev/shm").unwrap();
        let by_statx = identify(&fd).unwrap();
        assert_eq!(fdinfo_mount_id(&fd).unwrap().mount_id, by_statx.mount_id);
        assert_eq!(by_statx.is_mount_root, Some(true));
    }
}

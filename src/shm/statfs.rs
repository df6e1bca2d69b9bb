//! Opens a container's /dev/shm beneath its root without following symlinks, and measures it.
//!
//! `/proc/PID/root/dev/shm` must not be resolved by path: an absolute symlink planted at
//! /dev/shm inside the container would resolve against the *agent's* root, i.e. the host.
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)` on the container's root directory keeps the
//! walk inside the container and refuses every symlink; the numbers come from the open handle.
//! Kernels without openat2 walk `dev`, then `shm`, one component at a time ([`crate::beneath`]);
//! kernels without statx take the mount's identity from mountinfo (the scan does, by `dev`).

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};

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
    /// The handle's device (major, minor), read only when statx could not say the above:
    /// mountinfo's `major:minor` then tells which mount the handle is on.
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
    Absent(#[source] io::Error),
    /// A symlink on the way (`ELOOP` under RESOLVE_NO_SYMLINKS): refused, never followed.
    #[error("/dev/shm is reached through a symlink, which is not followed")]
    Symlink,
    #[error("{0}")]
    Io(#[source] io::Error),
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

/// Both ways answer alike: ELOOP for a symlink, ENOENT/ENOTDIR for nothing there.
fn classify_open(e: rustix::io::Errno) -> OpenShmError {
    match e {
        rustix::io::Errno::LOOP => OpenShmError::Symlink,
        e => classify(e.into()),
    }
}

fn classify(e: io::Error) -> OpenShmError {
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

/// statfs and statx of an open handle: two system calls. statfs carries everything statvfs
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
    // As statvfs computes f_frsize: the fragment size, else the block size.
    #[allow(clippy::unnecessary_cast)] // the field widths differ between targets
    let frsize = if fs.f_frsize > 0 {
        fs.f_frsize as u64
    } else {
        fs.f_bsize as u64
    };
    #[allow(clippy::unnecessary_cast)]
    let (blocks, bfree) = (fs.f_blocks as u64, fs.f_bfree as u64);
    Ok(ShmStat {
        mount_id,
        is_mount_root,
        dev,
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        is_tmpfs: fs.f_type as i64 == TMPFS_MAGIC,
        total_bytes: blocks.saturating_mul(frsize),
        free_bytes: bfree.saturating_mul(frsize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let walked = measure(&walk_beneath(&root, "dev/shm").unwrap()).unwrap();
        let opened = measure(&open_beneath(&root, "dev/shm").unwrap()).unwrap();
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
        let st = measure(&fd).unwrap();
        assert!(st.is_tmpfs);
        assert_eq!(st.is_mount_root, Some(true));
        let vfs = rustix::fs::statvfs("/dev/shm").unwrap();
        assert_eq!(st.total_bytes, vfs.f_blocks * vfs.f_frsize);
    }
}

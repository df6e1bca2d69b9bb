//! Opens a container's /dev/shm beneath its root without following symlinks, and measures it.
//!
//! `/proc/PID/root/dev/shm` must not be resolved by path: an absolute symlink planted at
//! /dev/shm inside the container would resolve against the *agent's* root, i.e. the host.
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)` on the container's root directory keeps the
//! walk inside the container and refuses every symlink; the numbers come from the open handle.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};

/// tmpfs's `f_type` (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// What statvfs says of the directory at /dev/shm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmStat {
    /// The mount's ID (`statx` STATX_MNT_ID), matching the first field of mountinfo.
    pub mount_id: Option<u64>,
    /// Whether /dev/shm is the root of a mount, i.e. something is mounted there.
    pub is_mount_root: Option<bool>,
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

/// Opens `rel` beneath `root` as an `O_PATH` handle, confined to `root`, refusing symlinks.
pub fn open_beneath(root: &OwnedFd, rel: &str) -> Result<OwnedFd, OpenShmError> {
    rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => OpenShmError::Symlink,
        e => classify(e.into()),
    })
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
    let (mount_id, is_mount_root) =
        match rustix::fs::statx(shm, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID) {
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
            // Kernels before 4.11 have no statx; mountinfo alone then decides.
            Err(_) => (None, None),
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
        let root =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
    }

    #[test]
    fn a_symlinked_parent_directory_is_refused_too() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("dev")).unwrap();
        let root =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Symlink)
        ));
    }

    #[test]
    fn dot_dot_cannot_climb_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev/shm")).unwrap();
        let root =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
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
        let root =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(matches!(
            open_beneath(&root, "dev/shm"),
            Err(OpenShmError::Absent(_))
        ));
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

//! Small kernel files kept open across scans and read again with `pread` at offset 0, which
//! makes kernfs and procfs (seq_file) generate them anew: one call a read where open, read and
//! close are three. `serve` scans the same cgroups every interval, so most of a scan's reads
//! are of files it read the scan before.
//!
//! A file is kept under its directory's identity (device and inode, from the `fstat` the walk
//! makes of each cgroup directory anyway): a cgroup removed and made again under its name is
//! another directory, and its files are opened anew (kernfs also fails a read of a removed
//! cgroup's file with ENODEV, which reopens it). A file not read in a pass is closed at that
//! pass's end ([`KeptFiles::end_pass`]): a gone cgroup's handles are held one scan at most.

use std::collections::HashMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

/// A directory's identity: its device and inode numbers.
pub type DirId = (u64, u64);

struct Kept {
    fd: OwnedFd,
    /// The pass that last read it.
    pass: u64,
    /// When it was last read.
    at: Instant,
}

/// Files kept open by directory and name.
pub struct KeptFiles {
    open: HashMap<(DirId, &'static str), Kept>,
    pass: u64,
    /// Files kept at most (a share of RLIMIT_NOFILE): past it, a file is opened, read, closed.
    budget: usize,
    buf: Vec<u8>,
}

impl Default for KeptFiles {
    fn default() -> Self {
        KeptFiles {
            open: HashMap::new(),
            pass: 0,
            // An eighth each (the scan has two: cgroup.procs, the memory values): the rest stay
            // for the servers, the logs followed (a quarter), /dev/shm handles (an eighth).
            budget: fd_share(8),
            buf: vec![0; 4096],
        }
    }
}

impl KeptFiles {
    /// At most `max` bytes of the file `name` of the directory `at` beneath `dir` (`""`: `dir`
    /// itself), with one read (seq_file hands over whole records). `fresh_within`: a kept handle
    /// read again sooner than this after its last read is not trusted to regenerate the file
    /// (cgroup v1 keeps a cgroup.procs listing a second for the open file that read it) and the
    /// file is opened anew.
    pub fn read_head(
        &mut self,
        (dir, at): (BorrowedFd<'_>, &str),
        dir_id: DirId,
        name: &'static str,
        max: usize,
        fresh_within: Option<Duration>,
    ) -> io::Result<&[u8]> {
        let max = max.min(self.buf.len());
        let now = Instant::now();
        let key = (dir_id, name);
        if let Some(kept) = self.open.get_mut(&key) {
            let stale = fresh_within.is_some_and(|d| now.duration_since(kept.at) < d);
            if !stale {
                if let Ok(n) = pread0(&kept.fd, &mut self.buf[..max]) {
                    kept.pass = self.pass;
                    kept.at = now;
                    return Ok(&self.buf[..n]);
                }
            }
            // Stale, or it failed (ENODEV: the cgroup was removed): opened anew below.
            self.open.remove(&key);
        }
        let fd = rustix::fs::openat(
            dir,
            beneath(at, name),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        let n = pread0(&fd, &mut self.buf[..max])?;
        if self.open.len() < self.budget {
            let pass = self.pass;
            self.open.insert(key, Kept { fd, pass, at: now });
        }
        Ok(&self.buf[..n])
    }

    /// Ends a pass: what it did not read is closed.
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.open.retain(|_, k| k.pass == pass);
        self.pass += 1;
    }

    /// How many files are kept open.
    pub fn kept(&self) -> usize {
        self.open.len()
    }
}

/// The file `name` of the directory `at` beneath an open one (`""`: that one itself).
pub fn beneath(at: &str, name: &str) -> PathBuf {
    Path::new(at).join(name)
}

fn pread0(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::pread(fd, &mut *buf, 0) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A `1/div` share of the descriptors the process may open (its RLIMIT_NOFILE), for handles
/// kept across scans: past it, what would be kept is opened and closed each time.
pub fn fd_share(div: u64) -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    usize::try_from(soft / div.max(1))
        .unwrap_or(usize::MAX)
        .min(65_536)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir(path: &std::path::Path) -> (OwnedFd, DirId) {
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let st = rustix::fs::fstat(&fd).unwrap();
        (fd, (st.st_dev, st.st_ino))
    }

    fn read(kept: &mut KeptFiles, d: &(OwnedFd, DirId), fresh: Option<Duration>) -> String {
        let bytes = kept
            .read_head((d.0.as_fd(), ""), d.1, "memory.max", 64, fresh)
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn a_kept_file_is_read_anew_from_its_start_and_closed_after_a_pass_without_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("memory.max"), "100\n").unwrap();
        let d = dir(tmp.path());
        let mut kept = KeptFiles::default();
        assert_eq!(read(&mut kept, &d, None), "100\n");
        assert_eq!(kept.kept(), 1);
        kept.end_pass();
        // Written in place (as the kernel regenerates it): the kept handle reads it whole.
        std::fs::write(tmp.path().join("memory.max"), "2000\n").unwrap();
        assert_eq!(read(&mut kept, &d, None), "2000\n");
        // Another file put in its place: the kept handle still reads the one it opened, which
        // is what tells it was kept, not opened again.
        std::fs::write(tmp.path().join("new"), "3\n").unwrap();
        std::fs::rename(tmp.path().join("new"), tmp.path().join("memory.max")).unwrap();
        assert_eq!(read(&mut kept, &d, None), "2000\n");
        // Read again too soon for a handle to be trusted: opened anew.
        assert_eq!(read(&mut kept, &d, Some(Duration::from_secs(3600))), "3\n");
        kept.end_pass();
        assert_eq!(kept.kept(), 1);
        // A pass that did not read it closes it.
        kept.end_pass();
        assert_eq!(kept.kept(), 0);
    }

    #[test]
    fn a_directory_made_again_under_its_name_has_its_files_opened_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let cg = tmp.path().join("pod");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("memory.max"), "1\n").unwrap();
        let mut kept = KeptFiles::default();
        let first = dir(&cg);
        assert_eq!(read(&mut kept, &first, None), "1\n");
        // Removed and made again while the old one is still open (its inode cannot be reused).
        std::fs::rename(&cg, tmp.path().join("old")).unwrap();
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("memory.max"), "2\n").unwrap();
        let second = dir(&cg);
        assert_ne!(first.1, second.1);
        assert_eq!(read(&mut kept, &second, None), "2\n");
        assert!(kept
            .read_head((second.0.as_fd(), ""), second.1, "nope", 64, None)
            .is_err());
    }
}

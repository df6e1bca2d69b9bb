//! Reads the small files of cgroupfs and procfs in as few system calls as the kernel allows:
//! open, one read into a reused buffer, close. `std::fs::read_to_string` adds a statx (for a
//! size hint kernfs does not give) and a second read to see the end, i.e. 5 calls where 3 do;
//! over the half-dozen files a container needs, that was a third of a scan's system calls.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// The first read's size: a memory.stat of cgroup v1 (the largest file read per container) is
/// about 1.5 KiB, every other file a line.
const FIRST_READ: usize = 8 * 1024;

/// Reusable read buffers.
pub struct FileReader {
    buf: Vec<u8>,
    /// [`FileReader::for_each_line`]'s, made on its first use and kept: a fresh one per file
    /// was 80 KiB allocated and zeroed for every mountinfo read.
    lines: Vec<u8>,
}

impl Default for FileReader {
    fn default() -> Self {
        FileReader {
            buf: vec![0; FIRST_READ],
            lines: Vec::new(),
        }
    }
}

impl FileReader {
    /// The whole of a file made of one record (a value, memory.stat), `path` relative to
    /// `dir`. A short read is the end: kernfs and procfs hand such a file over whole, since
    /// seq_file fills the reader's buffer up to its size or the end, and a regular file reads
    /// short only at its end. A read that fills the buffer reads on, into a larger one.
    pub fn read(&mut self, dir: impl AsFd, path: impl AsRef<Path>) -> io::Result<&[u8]> {
        let fd = open(dir, path.as_ref())?;
        let mut len = 0;
        loop {
            if len == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = match rustix::io::read(&fd, &mut self.buf[len..]) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            len += n;
            if n == 0 || len < self.buf.len() {
                return Ok(&self.buf[..len]);
            }
        }
    }

    /// Each line of a file of many records (mountinfo), read a chunk at a time through a
    /// buffer that never grows past `CHUNK` + `max_line`: a container can make its mountinfo
    /// tens of MiB (thousands of mounts on long paths). At most `max_total` bytes are read; a
    /// line longer than `max_line` is skipped whole; `f` returns false to stop. Returns whether
    /// the file was cut short by `max_total`.
    pub fn for_each_line(
        &mut self,
        dir: impl AsFd,
        path: impl AsRef<Path>,
        max_total: usize,
        max_line: usize,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> io::Result<bool> {
        const CHUNK: usize = 64 * 1024;
        let fd = open(dir, path.as_ref())?;
        if self.lines.len() != CHUNK + max_line {
            self.lines = vec![0u8; CHUNK + max_line];
        }
        let buf = &mut self.lines;
        let (mut len, mut total, mut skipping) = (0usize, 0usize, false);
        loop {
            if total >= max_total {
                return Ok(true);
            }
            let room = (buf.len() - len).min(max_total - total);
            let n = match rustix::io::read(&fd, &mut buf[len..len + room]) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            total += n;
            let end = len + n;
            let mut start = 0;
            while let Some(nl) = memchr::memchr(b'\n', &buf[start..end]) {
                let line = &buf[start..start + nl];
                start += nl + 1;
                if skipping {
                    skipping = false;
                } else if !f(line) {
                    return Ok(false);
                }
            }
            if n == 0 {
                if start < end && !skipping {
                    f(&buf[start..end]);
                }
                return Ok(false);
            }
            // The rest is the start of a line: kept, unless it is already too long to be one.
            let rest = end - start;
            if rest > max_line {
                skipping = true;
                len = 0;
            } else {
                buf.copy_within(start..end, 0);
                len = rest;
            }
        }
    }

    /// At most the first `max` bytes of a file, with one read: for cgroup.procs, of which only
    /// the first few processes matter. seq_file hands over whole records (lines).
    pub fn read_head(
        &mut self,
        dir: impl AsFd,
        path: impl AsRef<Path>,
        max: usize,
    ) -> io::Result<&[u8]> {
        let fd = open(dir, path.as_ref())?;
        let max = max.min(self.buf.len());
        loop {
            match rustix::io::read(&fd, &mut self.buf[..max]) {
                Ok(n) => return Ok(&self.buf[..n]),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A small kernel file (`/proc/PID/stat`, `/proc/uptime`) read whole into `buf`: open, one
/// read, close. procfs generates such a file whole for a read that can hold it, so a read that
/// does not fill `buf` is the end; `std::fs::read_to_string` adds a statx and grows its buffer
/// from 32 bytes, 8 calls for a stat file.
pub fn read_small<'a>(path: &Path, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
    let fd = open(rustix::fs::CWD, path)?;
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(&buf[..len])
}

/// At most `max` bytes of a kernel attribute file (sysfs, procfs) at `path`, which must be a
/// regular file: under a root option anything may sit at a name, and a FIFO would block the
/// open or the read for ever, a device (a symlink to /dev/zero) read without end. The type is
/// looked at before the open (opening a device may do something) and again on the open file
/// (opened non-blocking, so that a FIFO swapped in between cannot hang it).
pub fn read_attribute(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    let fd = open_regular(path)?;
    let mut buf = vec![0u8; max];
    let mut len = 0;
    while len < max {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// [`read_attribute`] of at most 64 KiB, as text (invalid UTF-8 replaced): for the small text
/// files under `--sys-root` (cgroup controllers, tracefs formats, CPU lists).
pub fn read_attribute_text(path: &Path) -> io::Result<String> {
    let bytes = read_attribute(path, 64 * 1024)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `path` opened for reading if it is a regular file (see [`read_attribute`]).
pub fn open_regular(path: &Path) -> io::Result<rustix::fd::OwnedFd> {
    let regular = |mode: u32| rustix::fs::FileType::from_raw_mode(mode).is_file();
    if !regular(rustix::fs::stat(path)?.st_mode) {
        return Err(not_regular());
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    if !regular(rustix::fs::fstat(&fd)?.st_mode) {
        return Err(not_regular());
    }
    Ok(fd)
}

/// The error of a name that is not a regular file.
pub fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
}

fn open(dir: impl AsFd, path: &Path) -> io::Result<rustix::fd::OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_kernel_file_is_read_whole_in_one_go() {
        let mut buf = [0u8; 4096];
        let stat = read_small(Path::new("/proc/self/stat"), &mut buf).unwrap();
        let text = std::str::from_utf8(stat).unwrap();
        assert!(
            text.starts_with(&format!("{} (", std::process::id())),
            "{text}"
        );
        assert!(text.ends_with('\n'), "whole: {text}");
        // A buffer too small holds the file's start.
        let mut small = [0u8; 8];
        assert_eq!(
            read_small(Path::new("/proc/self/stat"), &mut small)
                .unwrap()
                .len(),
            8
        );
        assert!(read_small(Path::new("/proc/self/none"), &mut buf).is_err());
    }

    #[test]
    fn lines_stream_through_a_bounded_buffer_and_stop_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mountinfo");
        let long = "x".repeat(100_000);
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!("{i} line\n"));
        }
        text.push_str(&long);
        text.push('\n');
        text.push_str("last line");
        std::fs::write(&path, &text).unwrap();
        let mut r = FileReader::default();
        let mut seen = Vec::new();
        let cut = r
            .for_each_line(rustix::fs::CWD, &path, 1 << 20, 16 << 10, |l| {
                seen.push(String::from_utf8_lossy(l).into_owned());
                true
            })
            .unwrap();
        assert!(!cut);
        assert_eq!(
            seen.len(),
            5001,
            "the long line skipped, the unterminated last kept"
        );
        assert_eq!(seen[4999], "4999 line");
        assert_eq!(seen[5000], "last line");
        // A cap: cut short, and said so.
        let mut n = 0;
        let cut = r
            .for_each_line(rustix::fs::CWD, &path, 1000, 16 << 10, |_| {
                n += 1;
                true
            })
            .unwrap();
        assert!(cut && n > 0 && n < 200, "{n}");
        // Stopped by the caller.
        let mut n = 0;
        r.for_each_line(rustix::fs::CWD, &path, 1 << 20, 16 << 10, |_| {
            n += 1;
            n < 3
        })
        .unwrap();
        assert_eq!(n, 3);
        assert!(r.buf.len() <= 8 * 1024, "the shared buffer did not grow");
    }

    /// Issue 36: a FIFO and a symlink to /dev/zero where an attribute should be are refused at
    /// once; a regular file is read up to the cap.
    #[test]
    fn an_attribute_is_a_regular_file_read_to_a_cap() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("aer_dev_fatal");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let zero = dir.path().join("aer_dev_nonfatal");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let started = std::time::Instant::now();
        for bad in [&fifo, &zero, &dir.path().to_path_buf()] {
            let e = read_attribute(bad, 4096).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", bad.display());
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let big = dir.path().join("class");
        std::fs::write(&big, "0x030200\n".repeat(1000)).unwrap();
        assert_eq!(read_attribute(&big, 100).unwrap().len(), 100);
        assert_eq!(read_attribute(&big, 1 << 20).unwrap().len(), 9000);
        assert!(read_attribute(&dir.path().join("none"), 10).is_err());
    }

    #[test]
    fn reads_a_file_whole_whatever_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut reader = FileReader::default();
        for size in [
            0,
            1,
            100,
            FIRST_READ - 1,
            FIRST_READ,
            FIRST_READ + 1,
            5 * FIRST_READ,
        ] {
            let content: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
            std::fs::write(dir.path().join("f"), &content).unwrap();
            let got = reader.read(rustix::fs::CWD, dir.path().join("f")).unwrap();
            assert_eq!(got, &content[..], "size {size}");
        }
    }

    #[test]
    fn reads_relative_to_a_directory_and_reports_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let mut reader = FileReader::default();
        assert_eq!(reader.read(&fd, "memory.max").unwrap(), b"max\n");
        let e = reader.read(&fd, "memory.current").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_file_of_many_records_reads_to_its_end() {
        let mut reader = FileReader::default();
        // mountinfo comes a page at a time; a container with many mounts has several pages.
        let mut lines: Vec<Vec<u8>> = Vec::new();
        reader
            .for_each_line(
                rustix::fs::CWD,
                "/proc/self/mountinfo",
                1 << 20,
                16 << 10,
                |l| {
                    lines.push(l.to_vec());
                    true
                },
            )
            .unwrap();
        // Mounts may come and go meanwhile: whole lines, each a mount, is what must hold.
        assert!(!lines.is_empty());
        assert!(lines.iter().all(|l| l.windows(3).any(|w| w == b" - ")));
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..3 * FIRST_READ + 5)
            .map(|i| b'0' + (i % 10) as u8)
            .collect();
        std::fs::write(dir.path().join("f"), &big).unwrap();
        let mut got = Vec::new();
        reader
            .for_each_line(
                rustix::fs::CWD,
                dir.path().join("f"),
                1 << 20,
                1 << 20,
                |l| {
                    got.extend_from_slice(l);
                    true
                },
            )
            .unwrap();
        assert_eq!(got, big);
    }

    #[test]
    fn the_head_of_a_file_is_at_most_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "1\n22\n333\n").unwrap();
        let mut reader = FileReader::default();
        let path = dir.path().join("cgroup.procs");
        assert_eq!(
            reader.read_head(rustix::fs::CWD, &path, 5).unwrap(),
            b"1\n22\n"
        );
        assert_eq!(
            reader.read_head(rustix::fs::CWD, &path, 4096).unwrap(),
            b"1\n22\n333\n"
        );
    }

    #[test]
    fn proc_and_cgroup_files_read_as_std_reads_them() {
        let mut reader = FileReader::default();
        for path in ["/proc/self/status", "/proc/meminfo", "/proc/self/limits"] {
            let got = reader.read(rustix::fs::CWD, path).unwrap().to_vec();
            let want = std::fs::read(path).unwrap();
            // Counters move between two reads; the shape (lines) does not.
            assert_eq!(
                got.split(|&b| b == b'\n').count(),
                want.split(|&b| b == b'\n').count(),
                "{path}"
            );
        }
    }
}

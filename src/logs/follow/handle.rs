//! One open log file (plain, or gzipped and decompressed): opened without following a symlink,
//! its appends followed through truncation, or read to its end once rotated.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::SystemTime;

use flate2::read::MultiGzDecoder;
use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::split::Splitter;
use super::{file_id, size, FileId, Tally};
use crate::logs::path::Rotation;
use crate::logs::resume::{fingerprint, LogCheckpoint, FINGERPRINT_MAX};

/// A log file as discovery found it.
pub(super) struct Listed {
    pub(super) name: CString,
    pub(super) path: PathBuf,
    pub(super) live: String,
    pub(super) rotation: Rotation,
    pub(super) id: FileId,
    pub(super) mtime: SystemTime,
    /// Its size when listed (a gzipped file's compressed size).
    pub(super) size: u64,
}

/// Decompressed bytes read of one gzipped file at most: a gzip bomb ends here.
const GZ_MAX: u64 = 1 << 30;

/// One open file.
pub(super) struct Handle {
    /// The inode opened, which a rename between listing and opening may have changed.
    pub(super) id: FileId,
    pub(super) path: PathBuf,
    source: Source,
    lines: Splitter,
    /// The offset a restart may read on from: past whole lines, none of them a part of a line
    /// still being joined ([`Handle::mark_safe`]).
    safe: u64,
    /// Its place among the log files open at once ([`super::OpenFiles`]).
    _open: super::OpenSlot,
}

/// Bytes a saved position stays behind for a line whose parts are being joined, at most: a
/// writer that never ends its line must not hold the position for ever.
const JOIN_HOLD_MAX: u64 = 1 << 20;

/// Where reading a newly opened file starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Position {
    At(u64),
    End,
    /// From the first line that begins at or after the offset: the newest part of a file too
    /// large to read whole (check's catch-up).
    LineAt(u64),
    /// A gzipped rotated file, decompressed from its start, at most this many bytes of it.
    Gz(u64),
    /// A gzipped rotated file whose plain self was read to this (decompressed) offset before a
    /// restart (`logs::resume`): decompressed from its start, lines taken past the offset.
    GzAfter(u64),
}

enum Source {
    Plain {
        file: File,
        offset: u64,
    },
    Gz {
        /// Boxed: the decoder's state is large, and most files are plain.
        reader: Box<MultiGzDecoder<File>>,
        read: u64,
        /// Decompressed bytes read at most (a gzip bomb ends here).
        limit: u64,
        /// Decompressed bytes dropped first: read before a restart.
        skip: u64,
    },
}

/// One stream's reading in one poll: the bytes it may still read, the buffer they are read
/// into, the counts, and where their lines go.
pub(super) struct Pass<'a> {
    pub(super) left: u64,
    pub(super) scratch: &'a mut [u8],
    pub(super) tally: &'a mut Tally,
    pub(super) sink: &'a mut dyn FnMut(&[u8], bool),
}

impl Pass<'_> {
    /// `n` bytes were read into the buffer: counted, and those from `from` on cut into lines.
    fn took(&mut self, n: usize, from: usize, lines: &mut Splitter) {
        self.left -= n as u64;
        self.tally.bytes += n as u64;
        lines.feed(&self.scratch[from..n], self.sink);
    }
}

impl Handle {
    /// Opens a listed file without following a symlink; only a regular file is kept.
    pub(super) fn open(
        dir: BorrowedFd<'_>,
        f: &Listed,
        at: Position,
        tally: &mut Tally,
    ) -> Option<Handle> {
        // Thousands of log files (someone writing into the log directories) must not take the
        // descriptors the /dev/shm scan needs.
        let Some(slot) = tally.open.take() else {
            tally.refuse(&f.path);
            return None;
        };
        // O_NONBLOCK: a FIFO swapped in between listing and opening must not block the poll.
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let opened = rustix::fs::openat(dir, f.name.as_c_str(), flags, Mode::empty())
            .and_then(|fd| Ok((rustix::fs::fstat(&fd)?, fd)));
        let (st, file) = match opened {
            // A runtime's log has one name. A second link is someone with write access to the
            // log directory making a host file (a key, a shadow file) read as a pod's log.
            Ok((st, _)) if st.st_nlink > 1 => {
                tally.fail(
                    &f.path,
                    &std::io::Error::other("a hard-linked file: not read as a log"),
                );
                return None;
            }
            Ok((st, fd)) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                (st, File::from(fd))
            }
            Ok(_) | Err(Errno::LOOP) => return None,
            Err(e) => {
                tally.fail(&f.path, &e.into());
                return None;
            }
        };
        tally.files += 1;
        let mut lines = Splitter::default();
        let source = match at {
            Position::At(offset) => Source::Plain { file, offset },
            Position::End => Source::Plain {
                offset: size(&st),
                file,
            },
            // The byte before the offset is read too: a `\n` there means a line starts at it.
            Position::LineAt(offset) if offset > 0 => {
                lines.skip_to_next_line();
                Source::Plain {
                    offset: offset - 1,
                    file,
                }
            }
            Position::LineAt(_) => Source::Plain { file, offset: 0 },
            Position::Gz(limit) => Source::Gz {
                reader: Box::new(MultiGzDecoder::new(file)),
                read: 0,
                limit: limit.min(GZ_MAX),
                skip: 0,
            },
            Position::GzAfter(skip) => Source::Gz {
                reader: Box::new(MultiGzDecoder::new(file)),
                read: 0,
                limit: GZ_MAX,
                skip,
            },
        };
        let safe = match &source {
            Source::Plain { offset, .. } => *offset,
            Source::Gz { .. } => 0,
        };
        Some(Handle {
            id: file_id(&st),
            path: f.path.clone(),
            source,
            lines,
            safe,
            _open: slot,
        })
    }

    /// The offset a plain file was read to (none for a gzipped one).
    pub(super) fn plain_offset(&self) -> Option<u64> {
        match self.source {
            Source::Plain { offset, .. } => Some(offset),
            Source::Gz { .. } => None,
        }
    }

    /// Where a plain file was read to, past whole lines only (the unended last line is read
    /// again on resuming), with its identity; None for a gzipped one or when unreadable.
    pub(super) fn checkpoint(&self) -> Option<LogCheckpoint> {
        let Source::Plain { file, offset } = &self.source else {
            return None;
        };
        let mut head = vec![0; FINGERPRINT_MAX];
        let n = read_at(file, &mut head, 0).ok()?;
        let (fingerprint, fingerprint_len) = fingerprint(&head[..n]);
        Some(LogCheckpoint {
            path: self.path.display().to_string(),
            dev: self.id.0,
            ino: self.id.1,
            fingerprint,
            fingerprint_len,
            offset: self.safe.min(*offset),
        })
    }

    /// After a read: the saved position moves up to the last whole line read, unless `joining`
    /// (the stream's decoder holds parts of a line), for at most [`JOIN_HOLD_MAX`] bytes.
    pub(super) fn mark_safe(&mut self, joining: bool) {
        let Source::Plain { offset, .. } = &self.source else {
            return;
        };
        let read = offset.saturating_sub(self.lines.unended());
        if read < self.safe || !joining || read - self.safe > JOIN_HOLD_MAX {
            self.safe = read;
        }
    }

    /// The bytes not yet read of a plain file, and whether it has no name left (rotated, then
    /// deleted: its disk space is held by this fd alone). None for a gzipped one, or unknown.
    pub(super) fn unread(&self) -> Option<(u64, bool)> {
        let Source::Plain { file, offset } = &self.source else {
            return None;
        };
        let st = rustix::fs::fstat(file).ok()?;
        Some((size(&st).saturating_sub(*offset), st.st_nlink == 0))
    }

    /// Hands over the unfinished last line, if any.
    pub(super) fn finish(&mut self, sink: &mut dyn FnMut(&[u8], bool)) {
        self.lines.finish(sink);
    }

    /// Reads the live file's appends; `Ok(true)` when it was truncated (read again from 0).
    pub(super) fn follow(&mut self, pass: &mut Pass<'_>) -> io::Result<bool> {
        let Source::Plain { file, offset } = &mut self.source else {
            return Ok(false);
        };
        let size = size(&rustix::fs::fstat(&*file)?);
        let truncated = size < *offset;
        if truncated {
            *offset = 0;
            self.lines = Splitter::default();
        }
        while *offset < size && pass.left > 0 {
            let want = (size - *offset)
                .min(pass.left)
                .min(pass.scratch.len() as u64) as usize;
            let n = read_at(file, &mut pass.scratch[..want], *offset)?;
            if n == 0 {
                break;
            }
            *offset += n as u64;
            pass.took(n, 0, &mut self.lines);
        }
        Ok(truncated)
    }

    /// Reads a retired or rotated file towards its end; `Ok(true)` at the end, `Ok(false)` when
    /// the budget ran out first.
    pub(super) fn drain(&mut self, pass: &mut Pass<'_>) -> io::Result<bool> {
        while pass.left > 0 {
            let want = pass.left.min(pass.scratch.len() as u64) as usize;
            let buf = &mut pass.scratch[..want];
            let (n, from) = match &mut self.source {
                Source::Plain { file, offset } => {
                    let n = read_at(file, buf, *offset)?;
                    *offset += n as u64;
                    (n, 0)
                }
                Source::Gz {
                    reader,
                    read,
                    limit,
                    skip,
                } => {
                    if *read >= *limit {
                        tracing::debug!("{}: stopped at {limit} bytes", self.path.display());
                        return Ok(true);
                    }
                    let want = buf
                        .len()
                        .min(usize::try_from(*limit - *read).unwrap_or(usize::MAX));
                    let buf = &mut buf[..want];
                    let n = uninterrupted(|| reader.read(buf))?;
                    let from = skip.saturating_sub(*read).min(n as u64) as usize;
                    *read += n as u64;
                    (n, from)
                }
            };
            if n == 0 {
                return Ok(true);
            }
            pass.took(n, from, &mut self.lines);
        }
        Ok(false)
    }
}

/// The CRC-32 of a listed file's first `len` bytes (`logs::resume`); None when it has fewer or
/// cannot be read.
pub(super) fn head_crc(dir: BorrowedFd<'_>, f: &Listed, len: u32) -> Option<u32> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::openat(dir, f.name.as_c_str(), flags, Mode::empty()).ok()?);
    let mut head = vec![0; len as usize];
    file.read_exact_at(&mut head, 0).ok()?;
    Some(crate::logs::resume::crc(&head))
}

/// The CRC-32 of a gzipped listed file's first `len` decompressed bytes (`logs::resume`).
pub(super) fn gz_head_crc(dir: BorrowedFd<'_>, f: &Listed, len: u32) -> Option<u32> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::openat(dir, f.name.as_c_str(), flags, Mode::empty()).ok()?);
    let mut head = vec![0; len as usize];
    MultiGzDecoder::new(file).read_exact(&mut head).ok()?;
    Some(crate::logs::resume::crc(&head))
}

/// A gzipped file's decompressed size as its trailer says (ISIZE: the last member's, modulo
/// 4 GiB; kubelet and Docker write one member); None when it cannot be read.
pub(super) fn gz_size(dir: BorrowedFd<'_>, f: &Listed) -> Option<u64> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::openat(dir, f.name.as_c_str(), flags, Mode::empty()).ok()?);
    let len = file.metadata().ok().filter(|m| m.is_file())?.len();
    let mut isize = [0u8; 4];
    file.read_exact_at(&mut isize, len.checked_sub(4)?).ok()?;
    Some(u64::from(u32::from_le_bytes(isize)))
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    uninterrupted(|| file.read_at(buf, offset))
}

/// A read, tried again while a signal interrupts it.
fn uninterrupted(mut read: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
    loop {
        match read() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

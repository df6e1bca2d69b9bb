//! One container directory's state (its streams, the files known there) and what a new listing
//! of it makes read, from where.
//!
//! A file is known by (dev, inode): a rename (rotation) is seen as the live name pointing at a
//! new inode, and the old fd is drained to its end before the new file is read; a rotated file
//! whose inode was read already, or was there before we started, is never read again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::SystemTime;

use crate::logs::path::Rotation;
use crate::logs::resume::{resume_at, Listing, LogResume, Resumed};
use crate::logs::{Bucket, Entry, Gate};
use crate::model::ContainerRef;

use super::handle::{gz_head_crc, gz_size, head_crc, Handle, Listed, Position};
use super::newest::keep_newest;
use super::stream::{Format, Out, Stream};
use super::{FileId, Start, Tally, CATCH_UP_BUDGET};

/// One container's log directory (kubelet's `<pod>/<container>`, Docker's `containers/<id>`).
pub(super) struct ContainerDir {
    origin: ContainerRef,
    format: Format,
    /// By live file name (kubelet has one per restart).
    streams: BTreeMap<String, Stream>,
    /// The files here that were read, are being read, or are not to be read; with the offset
    /// a drained plain file was read to.
    known: HashMap<FileId, Option<u64>>,
    /// Listed by the last discovery.
    pub(super) seen: bool,
    /// To be read by the next poll even if nothing is said of it: written to, or left with
    /// bytes unread.
    pub(super) pending: bool,
    /// The rate limit's, made at the first kept line.
    bucket: Option<Bucket>,
}

impl ContainerDir {
    pub(super) fn new(origin: ContainerRef, format: Format) -> ContainerDir {
        ContainerDir {
            origin,
            format,
            streams: BTreeMap::new(),
            known: HashMap::new(),
            seen: false,
            pending: false,
            bucket: None,
        }
    }

    /// Whether it has files still open (to follow or to drain).
    pub(super) fn busy(&self) -> bool {
        !self.streams.is_empty()
    }

    /// Its open files.
    pub(super) fn handles(&self) -> impl Iterator<Item = &Handle> {
        self.streams.values().flat_map(Stream::handles)
    }

    /// The directory is gone: its files are drained, then dropped.
    pub(super) fn retire_all(&mut self) {
        for stream in self.streams.values_mut() {
            stream.retire_current();
        }
    }

    /// Reads what is new in its files, at most `budget` bytes per stream, handing on at most
    /// `kept_left` more lines; whether some may be left (a budget spent, a passing error).
    #[allow(clippy::too_many_arguments)] // one poll's shared state, passed down as it is
    pub(super) fn read(
        &mut self,
        budget: u64,
        keep: &dyn Fn(&[u8]) -> bool,
        gate: &Gate,
        kept_left: &mut u32,
        scratch: &mut [u8],
        tally: &mut Tally,
        emit: &mut dyn FnMut(&ContainerRef, Entry),
    ) -> bool {
        let mut out = Out {
            keep,
            gate,
            kept_left,
            bucket: &mut self.bucket,
            origin: &self.origin,
            emit,
            lines: 0,
            dropped: 0,
        };
        let mut more = false;
        for stream in self.streams.values_mut() {
            more |= stream.read(budget, &mut self.known, scratch, tally, &mut out);
        }
        tally.lines += out.lines;
        tally.dropped += out.dropped;
        self.streams.retain(|_, s| !s.is_empty());
        more
    }

    /// Brings the state up to a new listing of the directory (`fd`).
    pub(super) fn update(
        &mut self,
        mut files: Vec<Listed>,
        fd: BorrowedFd<'_>,
        start: &Start,
        tally: &mut Tally,
    ) {
        keep_newest_live(&mut files, MAX_LIVE);
        // Oldest first: rotated files by their order, then the live one.
        files.sort_by_key(|f| match f.rotation {
            Rotation::Rotated { order, .. } => (0, order),
            Rotation::Live => (1, 0),
        });
        if matches!(start, Start::Since(_)) {
            self.catch_up(&files, fd, start, tally);
            self.remember(&files, start);
            return;
        }
        if let Start::Resume(saved) = start {
            self.resume(&files, fd, saved, tally);
            self.remember(&files, start);
            return;
        }
        let to_read = self.rotated_to_read(&files, start);
        // Live files: a rotation first retires the old fd (drained before anything newer).
        for f in files.iter().filter(|f| f.rotation == Rotation::Live) {
            if let Some(stream) = self.streams.get_mut(&f.live) {
                stream.live_is(f.id);
            }
        }
        for (f, at) in to_read {
            if let Some(handle) = Handle::open(fd, f, at, tally) {
                self.stream(&f.live).queue(handle);
            }
        }
        for f in files.iter().filter(|f| f.rotation == Rotation::Live) {
            let known = self.known.get(&f.id).copied();
            let stream = self.stream(&f.live);
            if stream.is_following() || stream.resume(f.id) {
                continue;
            }
            if let Some(handle) = Handle::open(fd, f, live_from(start, f.mtime, known), tally) {
                stream.follow(handle);
            }
        }
        // Live files that are gone: drained, then dropped.
        for (live, stream) in &mut self.streams {
            if !files
                .iter()
                .any(|f| &f.live == live && f.rotation == Rotation::Live)
            {
                stream.retire_current();
            }
        }
        self.remember(&files, start);
    }

    /// serve's first listing after a restart: each file from its saved position
    /// (`logs::resume`), oldest first.
    fn resume(
        &mut self,
        files: &[Listed],
        fd: BorrowedFd<'_>,
        saved: &LogResume,
        tally: &mut Tally,
    ) {
        let plain_names: HashSet<&Path> = files.iter().map(|f| f.path.as_path()).collect();
        for f in files {
            let gz = matches!(f.rotation, Rotation::Rotated { gz: true, .. });
            let listing = Listing {
                id: f.id,
                size: f.size,
                mtime: f.mtime,
                rotated: f.rotation != Rotation::Live,
                gz,
                plain_twin: gz && plain_names.contains(f.path.with_extension("").as_path()),
            };
            let head = |len| match gz {
                true => gz_head_crc(fd, f, len),
                false => head_crc(fd, f, len),
            };
            let at = match resume_at(&listing, saved, head) {
                Resumed::At(offset) if gz => Position::GzAfter(offset),
                Resumed::At(offset) => Position::At(offset),
                Resumed::Whole => Position::At(0),
                Resumed::Mismatch { written_since } => {
                    tally.mismatch(&f.path, written_since);
                    if written_since {
                        Position::At(0)
                    } else {
                        Position::End
                    }
                }
                Resumed::Skip => Position::End,
            };
            if listing.rotated && at == Position::End {
                continue; // not read
            }
            let Some(handle) = Handle::open(fd, f, at, tally) else {
                continue;
            };
            match f.rotation {
                Rotation::Live => self.stream(&f.live).follow(handle),
                Rotation::Rotated { .. } => self.stream(&f.live).queue(handle),
            }
        }
    }

    /// check's first listing (no file followed yet): each live name's files written since
    /// `since`, oldest first, of which the newest [`CATCH_UP_BUDGET`] bytes are read.
    fn catch_up(&mut self, files: &[Listed], fd: BorrowedFd<'_>, start: &Start, tally: &mut Tally) {
        let mut by_live: BTreeMap<&str, Vec<(&Listed, Position)>> = BTreeMap::new();
        let live = files.iter().filter(|f| f.rotation == Rotation::Live);
        let planned = self
            .rotated_to_read(files, start)
            .into_iter()
            .chain(live.map(|f| (f, live_from(start, f.mtime, None))));
        for (f, at) in planned {
            by_live.entry(f.live.as_str()).or_default().push((f, at));
        }
        for (live, group) in by_live {
            let sized: Vec<(Position, u64)> = group
                .iter()
                .map(|&(f, at)| (at, bytes_from(fd, f, at)))
                .collect();
            let fitted = keep_newest(&sized, CATCH_UP_BUDGET);
            let unread: u64 = fitted.iter().map(|f| f.1).sum();
            if let (true, Some((newest, _))) = (unread > 0, group.last()) {
                tally.not_read(&newest.path, unread);
            }
            for (&(f, _), (at, _)) in group.iter().zip(fitted) {
                let Some(handle) = at.and_then(|at| Handle::open(fd, f, at, tally)) else {
                    continue;
                };
                match f.rotation {
                    Rotation::Live => self.stream(live).follow(handle),
                    Rotation::Rotated { .. } => self.stream(live).queue(handle),
                }
            }
        }
    }

    /// The rotated files of a listing (oldest first) to read, and from where.
    fn rotated_to_read<'f>(
        &self,
        files: &'f [Listed],
        start: &Start,
    ) -> Vec<(&'f Listed, Position)> {
        let plain_names: HashSet<&Path> = files
            .iter()
            .filter(|f| matches!(f.rotation, Rotation::Rotated { gz: false, .. }))
            .map(|f| f.path.as_path())
            .collect();
        let mut to_read = Vec::new();
        for f in files {
            match (f.rotation, start) {
                (Rotation::Rotated { .. }, Start::AtEnd | Start::Resume(_)) => {}
                (Rotation::Rotated { gz, .. }, Start::Since(since)) => {
                    // While kubelet or Docker compresses a file both names exist: the plain
                    // one is complete, the .gz perhaps not yet.
                    let twin = gz && plain_names.contains(f.path.with_extension("").as_path());
                    if f.mtime >= *since && !twin {
                        let at = if gz { Position::Gz(0) } else { Position::At(0) };
                        to_read.push((f, at));
                    }
                }
                (Rotation::Rotated { gz, .. }, Start::New) => {
                    if !gz && !self.known.contains_key(&f.id) {
                        to_read.push((f, Position::At(0)));
                    }
                }
                (Rotation::Live, _) => {}
            }
        }
        to_read
    }

    /// Every rotated file listed was read, is being read, or is not to be read (there before
    /// us, older than `since`, gzipped): none is a candidate again. So is a live file that was
    /// there before us. A new live file that could not be opened (EMFILE) is not: it is read
    /// from its start once it opens. Unlisted files are forgotten, so that the map stays as
    /// small as the directory and a reused inode is not mistaken.
    fn remember(&mut self, files: &[Listed], start: &Start) {
        let old = std::mem::take(&mut self.known);
        let handles = self
            .streams
            .values()
            .flat_map(|s| s.handles().map(|h| h.id));
        let decided = files
            .iter()
            .filter(|f| {
                f.rotation != Rotation::Live
                    || !matches!(start, Start::New)
                    || old.get(&f.id).is_some_and(Option::is_some)
            })
            .map(|f| f.id);
        self.known = decided
            .chain(handles)
            .map(|id| (id, old.get(&id).copied().flatten()))
            .collect();
    }

    fn stream(&mut self, live: &str) -> &mut Stream {
        let format = self.format;
        self.streams
            .entry(live.to_string())
            .or_insert_with(|| Stream::new(format))
    }
}

/// Live names followed per container directory: kubelet writes one per restart and keeps the
/// last few; thousands (someone writing into the log directory) cost only the newest.
const MAX_LIVE: usize = 4;

/// Drops all but the `max` most recently written live names, and the rotations of those
/// dropped.
fn keep_newest_live(files: &mut Vec<Listed>, max: usize) {
    let mut live: Vec<(SystemTime, &str)> = files
        .iter()
        .filter(|f| f.rotation == Rotation::Live)
        .map(|f| (f.mtime, f.live.as_str()))
        .collect();
    if live.len() <= max {
        return;
    }
    live.sort_unstable_by(|a, b| b.cmp(a));
    let kept: HashSet<String> = live[..max].iter().map(|l| l.1.to_string()).collect();
    files.retain(|f| kept.contains(&f.live));
}

/// The bytes a file holds from `at` to its end (a gzipped one's decompressed size, as its
/// trailer says; its compressed size when that cannot be read).
fn bytes_from(fd: BorrowedFd<'_>, f: &Listed, at: Position) -> u64 {
    match at {
        Position::At(offset) | Position::LineAt(offset) => f.size.saturating_sub(offset),
        Position::End => 0,
        Position::Gz(_) | Position::GzAfter(_) => gz_size(fd, f).unwrap_or(f.size),
    }
}

/// Where a live file that no fd follows yet is read from; `known`, whether it is known here
/// and the offset it was read to.
fn live_from(start: &Start, mtime: SystemTime, known: Option<Option<u64>>) -> Position {
    match (start, known) {
        (Start::AtEnd | Start::Resume(_), _) => Position::End,
        (Start::Since(since), _) if mtime < *since => Position::End,
        (Start::Since(_), _) => Position::At(0),
        (Start::New, None) => Position::At(0),
        (Start::New, Some(Some(offset))) => Position::At(offset),
        // Known but never read (there before us): not replayed.
        (Start::New, Some(None)) => Position::End,
    }
}

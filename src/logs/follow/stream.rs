//! One live name's files read in order (rotated fds drained, then the live one) through the
//! format's decoder, and where a container's decoded lines go (the gate, the rate limit).

use std::collections::{HashMap, VecDeque};

use crate::logs::cri::CriJoiner;
use crate::logs::json_file::DockerJoiner;
use crate::logs::{Bucket, Entry, Gate, Pushed};
use crate::model::ContainerRef;

use super::handle::{Handle, Pass};
use super::{FileId, Tally};

/// Rotated fds kept to be drained, per file stream; kubelet rotates at most every 10 s.
const MAX_DRAINING: usize = 8;
/// Unread bytes of deleted files one stream's fds may hold: a writer faster than the reader
/// (whose rotated files the runtime then deletes) would otherwise keep their disk space, which
/// the node believes freed. Past this the oldest are let go, their unread bytes counted.
pub(in crate::logs) const MAX_UNREAD_DELETED: u64 = 64 << 20;

#[derive(Debug, Clone, Copy)]
pub(super) enum Format {
    Cri,
    Docker,
}

/// The files of one live name, oldest first: fds being drained, then the live one.
pub(super) struct Stream {
    decoder: Decoder,
    current: Option<Handle>,
    draining: VecDeque<Handle>,
}

impl Stream {
    pub(super) fn new(format: Format) -> Stream {
        Stream {
            decoder: match format {
                Format::Cri => Decoder::Cri(CriJoiner::default()),
                Format::Docker => Decoder::Docker(DockerJoiner::default()),
            },
            current: None,
            draining: VecDeque::new(),
        }
    }

    pub(super) fn handles(&self) -> impl Iterator<Item = &Handle> {
        self.draining.iter().chain(&self.current)
    }

    /// No fd left, to follow or to drain.
    pub(super) fn is_empty(&self) -> bool {
        self.current.is_none() && self.draining.is_empty()
    }

    /// Whether an fd follows the live file.
    pub(super) fn is_following(&self) -> bool {
        self.current.is_some()
    }

    /// Follows `handle` as the live file.
    pub(super) fn follow(&mut self, handle: Handle) {
        self.current = Some(handle);
    }

    /// The live name now is file `id`: an fd following another file was rotated away.
    pub(super) fn live_is(&mut self, id: FileId) {
        if self.current.as_ref().is_some_and(|h| h.id != id) {
            self.retire_current();
        }
    }

    /// Renamed away and back (kubelet undoes a rotation the runtime refused): the file being
    /// drained goes on from where it was read to, as the live one. Whether it was there.
    pub(super) fn resume(&mut self, id: FileId) -> bool {
        let Some(i) = self.draining.iter().position(|h| h.id == id) else {
            return false;
        };
        self.current = self.draining.remove(i);
        true
    }

    /// The live fd is no longer the live file (renamed or deleted): read it to its end first.
    pub(super) fn retire_current(&mut self) {
        if let Some(handle) = self.current.take() {
            self.queue(handle);
        }
    }

    /// Drained after those queued before; past [`MAX_DRAINING`] the oldest are let go when
    /// read next.
    pub(super) fn queue(&mut self, handle: Handle) {
        self.draining.push_back(handle);
    }

    /// Closes the oldest files being drained past [`MAX_DRAINING`], and the oldest deleted ones
    /// while their unread bytes are more than [`MAX_UNREAD_DELETED`]: what they held is skipped
    /// and counted.
    fn let_go_of_deleted(&mut self, tally: &mut Tally) {
        let unread: Vec<Option<(u64, bool)>> = self.draining.iter().map(Handle::unread).collect();
        let mut deleted: u64 = unread.iter().flatten().filter(|u| u.1).map(|u| u.0).sum();
        let mut over = self.draining.len().saturating_sub(MAX_DRAINING);
        let mut i = 0;
        for left in unread {
            let (bytes, gone) = left.unwrap_or((0, false));
            if over > 0 || (gone && deleted > MAX_UNREAD_DELETED) {
                over = over.saturating_sub(1);
                if gone {
                    deleted -= bytes;
                }
                if let Some(handle) = self.draining.remove(i) {
                    tally.let_go(&handle.path, bytes);
                }
                // A line cut by the skip is not joined with what follows it.
                self.decoder.reset();
            } else {
                i += 1;
            }
        }
    }

    /// Reads up to `budget` bytes: the fds being drained first, then the live one. Whether some
    /// may be left for the next poll. Then each file's saved position moves up to what it was
    /// read to, unless a line's parts are being joined (a restart reads them again whole) and
    /// no line was handed on meanwhile (which a restart must not read again).
    pub(super) fn read(
        &mut self,
        budget: u64,
        known: &mut HashMap<FileId, Option<u64>>,
        scratch: &mut [u8],
        tally: &mut Tally,
        out: &mut Out<'_>,
    ) -> bool {
        let left = *out.kept_left;
        let more = self.read_files(budget, known, scratch, tally, out);
        let joining = self.decoder.is_joining() && *out.kept_left == left;
        for handle in self.draining.iter_mut().chain(&mut self.current) {
            handle.mark_safe(joining);
        }
        more
    }

    fn read_files(
        &mut self,
        budget: u64,
        known: &mut HashMap<FileId, Option<u64>>,
        scratch: &mut [u8],
        tally: &mut Tally,
        out: &mut Out<'_>,
    ) -> bool {
        self.let_go_of_deleted(tally);
        let Stream {
            decoder,
            current,
            draining,
        } = self;
        let mut sink = |line: &[u8], cut: bool| out.take(decoder.push(line, cut, out.keep));
        let mut pass = Pass {
            left: budget,
            scratch,
            tally,
            sink: &mut sink,
        };
        while let Some(handle) = draining.front_mut() {
            match handle.drain(&mut pass) {
                Ok(false) => return true, // budget spent
                Ok(true) => {}
                Err(e) => pass.tally.fail(&handle.path, &e),
            }
            // A rotated file's last line is complete even if the writer died before its `\n`.
            handle.finish(pass.sink);
            if let Some(offset) = handle.plain_offset() {
                known.insert(handle.id, Some(offset));
            }
            draining.pop_front();
        }
        let Some(handle) = current else {
            return false;
        };
        let followed = handle.follow(&mut pass);
        let spent = pass.left == 0;
        match followed {
            Ok(false) => spent,
            Ok(true) => {
                decoder.reset(); // truncated
                spent
            }
            // Kept: a passing error (EIO on a network disk) is tried again next poll.
            Err(e) => {
                pass.tally.fail(&handle.path, &e);
                true
            }
        }
    }
}

/// Where one container's decoded lines go.
pub(super) struct Out<'a> {
    pub(super) keep: &'a dyn Fn(&[u8]) -> bool,
    pub(super) gate: &'a Gate,
    /// Lines this poll may still hand on, across containers.
    pub(super) kept_left: &'a mut u32,
    pub(super) bucket: &'a mut Option<Bucket>,
    pub(super) origin: &'a ContainerRef,
    pub(super) emit: &'a mut dyn FnMut(&ContainerRef, Entry),
    /// Complete lines, kept or not.
    pub(super) lines: u64,
    /// Kept lines the rate limit dropped.
    pub(super) dropped: u64,
}

impl Out<'_> {
    fn take(&mut self, pushed: Pushed) {
        let entry = match pushed {
            Pushed::Nothing => return,
            Pushed::Skipped => {
                self.lines += 1;
                return;
            }
            Pushed::Line(entry) => entry,
        };
        self.lines += 1;
        match self.gate.pass(self.bucket, entry.at) {
            Ok(true) if *self.kept_left > 0 => {
                *self.kept_left -= 1;
                (self.emit)(self.origin, entry);
            }
            Ok(true) | Err(_) => self.dropped += 1,
            Ok(false) => {}
        }
    }
}

enum Decoder {
    Cri(CriJoiner),
    Docker(DockerJoiner),
}

impl Decoder {
    fn push(&mut self, line: &[u8], cut: bool, keep: &dyn Fn(&[u8]) -> bool) -> Pushed {
        match self {
            Decoder::Cri(j) => j.push(line, cut, keep),
            Decoder::Docker(j) => j.push(line, cut, keep),
        }
    }

    fn reset(&mut self) {
        match self {
            Decoder::Cri(j) => j.reset(),
            Decoder::Docker(j) => j.reset(),
        }
    }

    fn is_joining(&self) -> bool {
        match self {
            Decoder::Cri(j) => j.is_joining(),
            Decoder::Docker(j) => j.is_joining(),
        }
    }
}

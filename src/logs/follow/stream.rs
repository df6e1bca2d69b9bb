//! One live name's files read in order (rotated fds drained, then the live one) through the
//! format's decoder, and where a container's decoded lines go (the gate, the rate limit).

use std::collections::{HashMap, VecDeque};

use crate::logs::cri::CriJoiner;
use crate::logs::docker::DockerJoiner;
use crate::logs::{Bucket, Entry, Gate, LogOrigin, Pushed};

use super::handle::{Handle, Pass};
use super::{FileId, Tally};

/// Rotated fds still being drained, per file stream; kubelet rotates at most every 10 s.
const MAX_DRAINING: usize = 8;

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

    pub(super) fn queue(&mut self, handle: Handle) {
        if self.draining.len() >= MAX_DRAINING {
            if let Some(old) = self.draining.pop_front() {
                tracing::debug!(
                    "container log {} rotated faster than read",
                    old.path.display()
                );
            }
        }
        self.draining.push_back(handle);
    }

    /// Reads up to `budget` bytes: the fds being drained first, then the live one. Whether some
    /// may be left for the next poll.
    pub(super) fn read(
        &mut self,
        budget: u64,
        known: &mut HashMap<FileId, Option<u64>>,
        scratch: &mut [u8],
        tally: &mut Tally,
        out: &mut Out<'_>,
    ) -> bool {
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
    pub(super) bucket: &'a mut Option<Bucket>,
    pub(super) origin: &'a LogOrigin,
    pub(super) emit: &'a mut dyn FnMut(&LogOrigin, Entry),
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
            Ok(true) => (self.emit)(self.origin, entry),
            Ok(false) => {}
            Err(_) => self.dropped += 1,
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
}

//! inotify: which container directories were written to since the last poll, and whether a
//! directory that discovery lists changed, so that an idle log file costs nothing between
//! writes (no `fstat` per file per poll, no `fstatat` per directory per second).
//!
//! A watch on a container directory with `IN_MODIFY` reports appends and truncations of every
//! file in it, so one watch per directory covers a container's live and rotated files. What a
//! watch tells only narrows what a poll reads: the reading itself still goes through the fds
//! discovery opened without following symlinks, so a watch on the wrong directory can cost a
//! missed wake-up (the periodic full poll catches it), never a wrong read.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

/// Enough for a few hundred events per read(2); more are read by the next call.
const BUF: usize = 16 * 1024;

/// The most watches the agent adds (a node's pods, their containers and the roots need a few
/// hundred): a directory tree made to hold more (hostPath write access to the log directories)
/// would take the user's whole `fs.inotify.max_user_watches`. Past it, the follower polls every
/// file as it does without inotify, and each directory refused is counted once as an error.
pub const MAX_WATCHES: usize = 8192;

/// What a watch is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Watched {
    /// A root, a pod directory, Docker's `containers`: only entries coming and going matter.
    Tree,
    /// A container's log directory, by the follower's key.
    Container((u8, String)),
}

/// What the events since the last drain said.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// An entry came or went in a directory discovery lists (a new pod, a rotation).
    pub(super) tree: bool,
    /// The kernel's queue overflowed: anything may have changed.
    pub(super) lost: bool,
    /// Container directories whose files were written to (keys, repeats possible).
    pub(super) written: Vec<(u8, String)>,
}

pub(in crate::logs) struct Notifier {
    fd: OwnedFd,
    by_wd: HashMap<i32, Watched>,
    buf: Vec<MaybeUninit<u8>>,
    /// Whether a watch failed since the last [`Notifier::reset_failed`]: the follower then
    /// polls every file as it would without inotify.
    pub(super) failed: bool,
    /// Logged once.
    warned: bool,
    /// [`MAX_WATCHES`], lower in tests.
    max_watches: usize,
}

impl Notifier {
    pub(super) fn new() -> io::Result<Notifier> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        Ok(Notifier {
            fd,
            by_wd: HashMap::new(),
            buf: vec![MaybeUninit::uninit(); BUF],
            failed: false,
            warned: false,
            max_watches: MAX_WATCHES,
        })
    }

    #[cfg(test)]
    pub(in crate::logs) fn set_max_watches(&mut self, max: usize) {
        self.max_watches = max;
    }

    /// Watches the directory at `path` (again: the kernel answers the same wd for the same
    /// directory). Whether it is watched.
    pub(super) fn watch(&mut self, path: &Path, what: Watched) -> bool {
        let mut flags = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW;
        if matches!(what, Watched::Container(_)) {
            flags |= WatchFlags::MODIFY;
        }
        // At the cap, a directory watched already is watched again (the walks repeat); a new
        // one is refused: `MASK_CREATE` tells them apart (EEXIST for one watched).
        let full = self.by_wd.len() >= self.max_watches;
        if full {
            flags |= WatchFlags::MASK_CREATE;
        }
        match inotify::add_watch(&self.fd, path, flags) {
            Ok(wd) if full => {
                let _ = inotify::remove_watch(&self.fd, wd);
                self.refuse(path, Errno::NOSPC, " (the agent's own cap of watches)");
                false
            }
            Ok(wd) => {
                self.by_wd.insert(wd, what);
                true
            }
            Err(Errno::EXIST) if full => true,
            // Gone between the listing and now: the next walk will not list it.
            Err(Errno::NOENT) => true,
            Err(e) => {
                let why = if full {
                    " (the agent's own cap of watches)"
                } else if e == Errno::NOSPC {
                    " (the fs.inotify.max_user_watches limit)"
                } else {
                    ""
                };
                self.refuse(path, e, why);
                false
            }
        }
    }

    /// A directory not watched: the follower polls every file until a walk watches it all.
    fn refuse(&mut self, path: &Path, e: Errno, why: &str) {
        self.failed = true;
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "container logs: cannot watch {}: {e}{why}; polling every log file instead",
                path.display()
            );
        }
    }

    /// A walk starts: a watch that failed before is tried again by it.
    pub(super) fn reset_failed(&mut self) {
        self.failed = false;
    }

    /// Every event queued since the last call.
    pub(super) fn drain(&mut self) -> Changes {
        let mut changes = Changes::default();
        let mut reader = inotify::Reader::new(&self.fd, &mut self.buf);
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(Errno::AGAIN | Errno::INTR) => break,
                Err(e) => {
                    // Not expected of an inotify fd; treat it as lost events.
                    tracing::debug!("container logs: inotify read: {e}");
                    changes.lost = true;
                    break;
                }
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                changes.lost = true;
                continue;
            }
            let structural = flags.intersects(
                ReadFlags::CREATE
                    | ReadFlags::DELETE
                    | ReadFlags::MOVED_FROM
                    | ReadFlags::MOVED_TO
                    | ReadFlags::DELETE_SELF
                    | ReadFlags::MOVE_SELF
                    | ReadFlags::IGNORED
                    | ReadFlags::UNMOUNT,
            );
            let what = if flags.contains(ReadFlags::IGNORED) {
                self.by_wd.remove(&event.wd())
            } else {
                self.by_wd.get(&event.wd()).cloned()
            };
            match what {
                Some(Watched::Tree) => changes.tree |= structural,
                Some(Watched::Container(key)) => {
                    changes.tree |= structural;
                    changes.written.push(key);
                }
                None => {}
            }
        }
        changes
    }

    /// Watches held.
    #[cfg(test)]
    pub(in crate::logs) fn watches(&self) -> usize {
        self.by_wd.len()
    }

    /// Drops the watch on a container directory, as if it had been lost.
    #[cfg(test)]
    pub(in crate::logs) fn forget(&mut self, key: &(u8, String)) {
        let wds: Vec<i32> = self
            .by_wd
            .iter()
            .filter(|(_, w)| **w == Watched::Container(key.clone()))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in wds {
            self.by_wd.remove(&wd);
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }
}

//! The directories a walk listed and their mtimes: while none has changed, discovery stats them
//! instead of listing them anew (a directory's mtime changes with every entry added or renamed).

use std::ffi::CString;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Dir, FileType};

use super::discovery::root_dir;
use super::mtime;

/// How long a directory must have been unchanged before a walk lists it for its listing to be
/// trusted while its mtime stays the same (more than the grain of the kernel's file times).
const STILL: Duration = Duration::from_secs(1);

/// A directory a walk listed, and its mtime then.
struct Stamp {
    /// 0: the pod log root, 1: the Docker root.
    root: u8,
    /// Below the root; empty for the root itself.
    path: CString,
    mtime: SystemTime,
}

#[derive(Default)]
pub(super) struct Stamps {
    /// The directories the last full walk listed, when they had been still for a while: while
    /// none has changed, discovery stats them instead of listing them anew.
    trusted: Option<Vec<Stamp>>,
    /// Collected during a walk; `None` once something makes it unfit to trust.
    walking: Option<Vec<Stamp>>,
}

impl Stamps {
    /// Whether the last walk is trusted and every directory it listed is still there with the
    /// mtime it had then; `roots` are the pod log root and the Docker root.
    pub(super) fn unchanged(&self, roots: [Option<&Path>; 2]) -> bool {
        let Some(stamps) = &self.trusted else {
            return false;
        };
        let mut open: [Option<Dir>; 2] = [None, None];
        stamps.iter().all(|stamp| {
            let i = usize::from(stamp.root);
            if open[i].is_none() {
                let Some(root) = roots[i] else {
                    return false;
                };
                match root_dir(root) {
                    Ok(dir) => open[i] = Some(dir),
                    Err(_) => return false,
                }
            }
            let Some(Ok(fd)) = open[i].as_ref().map(Dir::fd) else {
                return false;
            };
            // Each component below the root was a directory, not a symlink, when the walk
            // opened it, and its parent has not changed since: the path still leads there.
            let st = if stamp.path.is_empty() {
                rustix::fs::fstat(fd)
            } else {
                rustix::fs::statat(fd, stamp.path.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            };
            st.is_ok_and(|st| {
                FileType::from_raw_mode(st.st_mode) == FileType::Directory
                    && mtime(&st) == stamp.mtime
            })
        })
    }

    /// A walk starts.
    pub(super) fn begin(&mut self) {
        self.walking = Some(Vec::new());
    }

    /// Notes a directory the walk listed (`path` relative to root `root`, empty for the root).
    pub(super) fn note(&mut self, root: u8, path: &str, dir: &Dir) {
        let Some(stamps) = self.walking.as_mut() else {
            return;
        };
        let st = dir.fd().and_then(rustix::fs::fstat);
        match (st, CString::new(path)) {
            (Ok(st), Ok(path)) => stamps.push(Stamp {
                root,
                path,
                mtime: mtime(&st),
            }),
            _ => self.walking = None,
        }
    }

    /// Something in this walk may change without a directory's mtime: walk again next time.
    pub(super) fn distrust(&mut self) {
        self.walking = None;
    }

    /// The walk that began at `started` is over.
    pub(super) fn end(&mut self, started: SystemTime) {
        // A directory changed within the clock's grain before the walk may change again with
        // the same mtime: only listings that had been still for a second are trusted.
        let settled = started - STILL;
        self.trusted = self
            .walking
            .take()
            .filter(|stamps| stamps.iter().all(|s| s.mtime < settled));
    }
}

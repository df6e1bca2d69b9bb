//! The I/O: finds the log files under the roots, keeps one fd per file and reads what is new.
//!
//! This file holds the `Follower` the tailer drives (poll, discover) and what they count.
//! `discovery` walks the roots without symlinks, `still` spares it the listing of unchanged
//! directories, `notify` (serve's inotify) tells which directories changed or were written to,
//! `dirs` decides per container directory which file is read from where, `stream` reads one
//! live name's files in order, `handle` is one open file, `split` cuts its lines.

mod dirs;
mod discovery;
mod handle;
pub(super) mod notify;
mod split;
mod still;
mod stream;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::Stat;

use self::dirs::ContainerDir;
use self::notify::Notifier;
use self::still::Stamps;
use super::{Entry, Gate, LogOrigin};

/// Bytes read per file stream per poll, so that one flooding container cannot starve the rest.
const POLL_BUDGET: u64 = 4 << 20;
/// The first poll of `since` reads what is on disk in one go (kubelet keeps 5 × 10 MiB a
/// container by default); this only bounds a runaway.
const CATCH_UP_BUDGET: u64 = 256 << 20;
const CHUNK: usize = 64 * 1024;
/// Distinct failing paths remembered (each logged and counted once).
const MAX_FAILED: usize = 4096;
/// With inotify: every directory is walked and every file read this often anyway, so that a
/// lost event (or a watch on a directory swapped under it) costs at most this much delay.
const SAFETY: Duration = Duration::from_secs(10);

/// How discovery treats a file it has not seen before.
#[derive(Debug, Clone, Copy)]
pub(super) enum Start {
    /// serve's first look: live files from their end, rotated ones never.
    AtEnd,
    /// check's first look: rotated files written at or after the time, in order, then the live
    /// file from its start (from its end if it was last written before the time).
    Since(SystemTime),
    /// Later looks: live files from their start; a rotated file never seen (rotated before we
    /// saw it live) from its start; gzipped ones never (their plain self was read).
    New,
}

/// What was read, and what failed.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub files: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Complete lines read, kept or not.
    pub lines: u64,
    /// Kept lines the rate limit dropped.
    pub dropped: u64,
    failed: HashSet<PathBuf>,
    /// Failures of any path, each time.
    failures: u64,
}

impl Tally {
    /// An unreadable path: counted and logged once. A path that vanished is not an error.
    fn fail(&mut self, path: &Path, e: &io::Error) {
        if e.kind() == io::ErrorKind::NotFound {
            return;
        }
        self.failures += 1;
        if self.failed.len() >= MAX_FAILED {
            self.failed.clear();
        }
        if self.failed.insert(path.to_path_buf()) {
            self.errors += 1;
            tracing::warn!("container logs: cannot read {}: {e}", path.display());
        }
    }
}

pub(super) struct Follower {
    pods: Option<PathBuf>,
    docker: Option<PathBuf>,
    /// Per container directory, by (root: 0 pods / 1 docker, path under the root).
    dirs: BTreeMap<(u8, String), ContainerDir>,
    start: Start,
    gate: Gate,
    last_discovery: Option<Instant>,
    pub(super) rediscover: Duration,
    /// serve's: which directories changed, so that idle files are not looked at.
    notify: Option<Notifier>,
    /// With `notify`: how often everything is walked and read anyway.
    pub(super) safety: Duration,
    last_full: Option<Instant>,
    /// Container directories read (tests count them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) visits: u64,
    /// The directories the last full walk listed, and those of the walk under way.
    still: Stamps,
    /// Full walks done.
    pub(super) walks: u64,
    tally: Tally,
    scratch: Vec<u8>,
}

impl Follower {
    pub fn new(
        pods: Option<PathBuf>,
        docker: Option<PathBuf>,
        start: Start,
        gate: Gate,
    ) -> Follower {
        Follower {
            pods,
            docker,
            dirs: BTreeMap::new(),
            start,
            gate,
            last_discovery: None,
            rediscover: Duration::from_secs(1),
            notify: None,
            safety: SAFETY,
            last_full: None,
            visits: 0,
            still: Stamps::default(),
            walks: 0,
            tally: Tally::default(),
            scratch: vec![0; CHUNK],
        }
    }

    /// Follows with inotify from now on (serve). Without it (no inotify, or its instance
    /// limit reached) every file is polled, as `check` does.
    pub fn notified(&mut self) {
        match Notifier::new() {
            Ok(n) => {
                self.notify = Some(n);
                // The next poll walks (a still tree too), and watches what it lists.
                self.last_discovery = None;
                self.still = Stamps::default();
            }
            Err(e) => tracing::warn!(
                "container logs: no inotify ({e}; fs.inotify.max_user_instances?): polling \
                 every log file instead"
            ),
        }
    }

    /// Whether inotify, not polling, decides what is read.
    #[cfg(test)]
    pub fn is_notified(&self) -> bool {
        self.notify.as_ref().is_some_and(|n| !n.failed)
    }

    #[cfg(test)]
    pub fn notifier(&mut self) -> Option<&mut Notifier> {
        self.notify.as_mut()
    }

    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Container directories held (listed, or with files still being drained).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.dirs.len()
    }

    /// Reads what is new in every file, discovering first when due; `emit` gets each line that
    /// `keep` wants and the gate lets through. With inotify only the directories written to
    /// (or left with bytes unread) are read, and discovery runs when a listed directory changed.
    pub fn poll(&mut self, keep: &dyn Fn(&[u8]) -> bool, emit: &mut dyn FnMut(&LogOrigin, Entry)) {
        let catching_up = matches!(self.start, Start::Since(_));
        let everything = self.prepare();
        let budget = if catching_up {
            CATCH_UP_BUDGET
        } else {
            POLL_BUDGET
        };
        let Follower {
            dirs,
            tally,
            scratch,
            gate,
            visits,
            ..
        } = self;
        for dir in dirs.values_mut().filter(|d| everything || d.pending) {
            *visits += 1;
            dir.pending = dir.read(budget, keep, gate, scratch, tally, &mut *emit);
        }
        dirs.retain(|_, d| d.seen || d.busy());
    }

    /// Discovers when due; whether every directory is to be read (else only those pending).
    fn prepare(&mut self) -> bool {
        let polling = self.notify.as_ref().is_none_or(|n| n.failed);
        if polling {
            if self
                .last_discovery
                .is_none_or(|at| at.elapsed() >= self.rediscover)
            {
                self.discover();
            }
            // Events queued meanwhile only say what is read anyway.
            if let Some(n) = self.notify.as_mut() {
                n.drain();
            }
            return true;
        }
        let changes = self
            .notify
            .as_mut()
            .map(Notifier::drain)
            .unwrap_or_default();
        for key in &changes.written {
            if let Some(dir) = self.dirs.get_mut(key) {
                dir.pending = true;
            }
        }
        let full = changes.lost
            || self.last_discovery.is_none()
            || self.last_full.is_none_or(|at| at.elapsed() >= self.safety);
        if full {
            self.last_full = Some(Instant::now());
        }
        if full || changes.tree {
            self.discover();
            return true; // new files, rotations: read from where discovery left them
        }
        false
    }

    /// Walks the roots at the expected depth and brings every container directory up to date;
    /// unless no directory it would list has changed since the last walk.
    pub fn discover(&mut self) {
        if self
            .still
            .unchanged([self.pods.as_deref(), self.docker.as_deref()])
        {
            self.last_discovery = Some(Instant::now());
            return;
        }
        self.walks += 1;
        if let Some(n) = self.notify.as_mut() {
            n.reset_failed();
        }
        let started = SystemTime::now();
        self.still.begin();
        let failures = self.tally.failures;
        for dir in self.dirs.values_mut() {
            dir.seen = false;
        }
        if let Some(root) = self.pods.clone() {
            self.walk_pods(&root);
        }
        if let Some(root) = self.docker.clone() {
            self.walk_docker(&root);
        }
        if self.tally.failures != failures {
            self.still.distrust(); // a path that failed is tried again by the next walk
        }
        self.still.end(started);
        // A directory that is gone: its files are drained (their fds still read) and dropped.
        for dir in self.dirs.values_mut().filter(|d| !d.seen) {
            dir.retire_all();
        }
        self.start = Start::New;
        self.last_discovery = Some(Instant::now());
    }
}

/// A file by (dev, inode).
type FileId = (u64, u64);

#[allow(clippy::unnecessary_cast)] // the field types differ between architectures
fn file_id(st: &Stat) -> FileId {
    (st.st_dev as u64, st.st_ino as u64)
}

fn size(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

#[allow(clippy::unnecessary_cast)] // the field types differ between architectures
fn mtime(st: &Stat) -> SystemTime {
    let nanos = Duration::from_nanos(st.st_mtime_nsec as u64);
    match u64::try_from(st.st_mtime) {
        Ok(secs) => SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + nanos,
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

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
mod newest;
pub(super) mod notify;
mod split;
mod still;
mod stream;

#[cfg(test)]
pub(in crate::logs) use stream::MAX_UNREAD_DELETED;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::ops::Bound::{Excluded, Unbounded};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::Stat;

use self::dirs::ContainerDir;
use self::notify::Notifier;
use self::still::Stamps;
use super::resume::{LogCheckpoints, LogResume};
use super::{Entry, Gate};
use crate::model::ContainerRef;

/// Bytes read per file stream per poll at most, so that one flooding container cannot starve
/// the rest.
const POLL_BUDGET: u64 = 4 << 20;
/// Bytes read per poll across every container (serve): 16 MiB every 200 ms is 80 MB/s, more
/// than a node's containers log unless some flood; then each directory gets an equal share.
pub(super) const POLL_TOTAL: u64 = 16 << 20;
/// A directory's share never falls below this, however many are to be read.
const MIN_SHARE: u64 = 256 << 10;
/// Kept lines handed on per poll across every container (serve), past the per-container rate
/// limit: what one poll makes of its lines stays bounded however many containers flood. Those
/// past it in the directory being read are dropped and counted; the directories after it wait
/// for the next poll.
pub(super) const KEPT_PER_POLL: u32 = 4096;
/// The first poll of `since` reads what is on disk in one go (kubelet keeps 5 × 10 MiB a
/// container by default); this only bounds a runaway: of a live name's files larger than this,
/// the newest this many bytes are read (`newest`), the older skipped and said.
pub(super) const CATCH_UP_BUDGET: u64 = 256 << 20;
const CHUNK: usize = 64 * 1024;
/// Distinct failing paths remembered (each logged and counted once).
const MAX_FAILED: usize = 4096;
/// With inotify: every directory is walked and every file read this often anyway, so that a
/// lost event (or a watch on a directory swapped under it) costs at most this much delay.
const SAFETY: Duration = Duration::from_secs(10);

/// How discovery treats a file it has not seen before.
#[derive(Debug, Clone)]
pub(super) enum Start {
    /// serve's first look: live files from their end, rotated ones never.
    AtEnd,
    /// check's first look: rotated files written at or after the time, in order, then the live
    /// file from its start (from its end if it was last written before the time).
    Since(SystemTime),
    /// Later looks: live files from their start; a rotated file never seen (rotated before we
    /// saw it live) from its start; gzipped ones never (their plain self was read).
    New,
    /// serve started again: each file from the position saved for it (`logs::resume`).
    Resume(Arc<LogResume>),
}

/// Log files open at once at most, if the descriptor limit allows (a quarter of it otherwise):
/// a node's containers need a few each (the live file, one being drained).
const MAX_OPEN: usize = 8192;

/// How many log files are open, shared by their handles; a new one only while under the cap.
#[derive(Debug, Clone)]
pub(super) struct OpenFiles {
    count: Arc<AtomicUsize>,
    max: usize,
}

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles::new(open_files_allowed())
    }
}

impl OpenFiles {
    pub(super) fn new(max: usize) -> OpenFiles {
        OpenFiles {
            count: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A place for one more open file, given back when dropped; None at the cap.
    fn take(&self) -> Option<OpenSlot> {
        self.count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()?;
        Some(OpenSlot(self.count.clone()))
    }

    #[cfg(test)]
    pub(super) fn open(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// One open log file's place in [`OpenFiles`].
#[derive(Debug)]
pub(super) struct OpenSlot(Arc<AtomicUsize>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// [`MAX_OPEN`], or a quarter of the soft descriptor limit if that is less.
fn open_files_allowed() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let quarter = soft.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
    MAX_OPEN.min(quarter).max(16)
}

/// Whose log `path` is, as a person names it: `namespace/pod/container` for kubelet's files,
/// the container directory otherwise (Docker's, named by its ID).
fn log_owner(path: &Path) -> String {
    let dir = path.parent();
    let pod = dir.and_then(Path::parent);
    match (file_name(pod), file_name(dir)) {
        (Some(pod_dir), Some(container)) => match super::path::pod_origin(pod_dir, container) {
            Some(origin) => origin.name().unwrap_or_default(),
            None => crate::model::printable(&dir.unwrap_or(path).display().to_string()),
        },
        _ => crate::model::printable(&path.display().to_string()),
    }
}

fn file_name(p: Option<&Path>) -> Option<&str> {
    p?.file_name()?.to_str()
}

/// What was read, and what failed.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// The log files open now, and the cap.
    pub(super) open: OpenFiles,
    /// Files not opened for the cap, each counted once as an error.
    refused: u64,
    pub files: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Complete lines read, kept or not.
    pub lines: u64,
    /// Kept lines the rate limits dropped.
    pub dropped: u64,
    /// Bytes of deleted files let go unread ([`stream::MAX_UNREAD_DELETED`]).
    pub skipped: u64,
    /// Bytes check's catch-up did not read: older than a log's newest [`CATCH_UP_BUDGET`].
    pub unread: u64,
    /// The containers whose log was let go unread before (said once each at `warn`).
    let_go_by: HashSet<String>,
    failed: HashSet<PathBuf>,
    /// Failures of any path, each time.
    failures: u64,
    /// Files whose saved position was not trusted on resuming (their inode reused).
    pub mismatched: u64,
}

impl Tally {
    /// A log file not opened: as many are open as allowed.
    fn refuse(&mut self, path: &Path) {
        self.refused += 1;
        if self.refused == 1 {
            tracing::warn!(
                "container logs: {} log files open, the most allowed: {} and any more are not \
                 read (thousands of log files: someone writing into the log directories?)",
                self.open.max,
                path.display()
            );
        }
        self.remember_failed(path);
    }

    /// A deleted file closed with `bytes` unread: said at `warn` the first time for each
    /// container (of at most [`MAX_FAILED`] remembered), naming it, since deaths written in
    /// those bytes are not told; later at `debug`.
    fn let_go(&mut self, path: &Path, bytes: u64) {
        self.skipped += bytes;
        let whose = log_owner(path);
        if self.let_go_by.len() >= MAX_FAILED {
            self.let_go_by.clear();
        }
        if !self.let_go_by.insert(whose.clone()) {
            tracing::debug!("container log {}: {bytes} bytes skipped", path.display());
            return;
        }
        tracing::warn!(
            "log of {whose}: {:.1} MiB unread (written faster than it could be read, then \
             rotated away: {}); deaths told in it may be missed \
             (shmlink_log_bytes_skipped_total counts this and later ones)",
            bytes as f64 / f64::from(1 << 20),
            path.display()
        );
    }

    /// check's catch-up read only the newest [`CATCH_UP_BUDGET`] bytes of a log and its
    /// rotations: said once per log, since it may hide a death older than those bytes.
    fn not_read(&mut self, path: &Path, bytes: u64) {
        self.unread += bytes;
        tracing::warn!(
            "container log {}: {:.1} MiB of it and its rotations not read, older than the \
             newest {} MiB read back (the most read of one log)",
            path.display(),
            bytes as f64 / f64::from(1 << 20),
            CATCH_UP_BUDGET >> 20,
        );
    }

    /// A file's saved position not trusted (resuming): its inode now holds another file.
    fn mismatch(&mut self, path: &Path, written_since: bool) {
        self.mismatched += 1;
        tracing::warn!(
            "container log {}: not the file whose position was saved (its inode reused by \
             another, or truncated and written again): read {}",
            path.display(),
            if written_since {
                "whole, as written since the agent stopped"
            } else {
                "from its end"
            }
        );
    }

    /// An unreadable path: counted and logged once. A path that vanished is not an error.
    fn fail(&mut self, path: &Path, e: &io::Error) {
        if e.kind() == io::ErrorKind::NotFound {
            return;
        }
        if self.remember_failed(path) {
            tracing::warn!("container logs: cannot read {}: {e}", path.display());
        }
    }

    /// Counts a failing path, as an error the first time; whether it was the first.
    pub(super) fn remember_failed(&mut self, path: &Path) -> bool {
        self.failures += 1;
        if self.failed.len() >= MAX_FAILED {
            self.failed.clear();
        }
        let new = self.failed.insert(path.to_path_buf());
        self.errors += u64::from(new);
        new
    }
}

pub(super) struct Follower {
    pods: Option<PathBuf>,
    docker: Option<PathBuf>,
    /// Per container directory, by (root: 0 pods / 1 docker, path under the root).
    dirs: BTreeMap<DirKey, ContainerDir>,
    /// The directory the last poll read last: the next begins after it.
    cursor: Option<DirKey>,
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
            cursor: None,
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

    /// Every open plain file's position, past the whole lines read from it. Taken between
    /// polls, each line before a position was handed to `emit` by a poll that returned.
    pub fn checkpoints(&self) -> LogCheckpoints {
        let files = self
            .dirs
            .values()
            .flat_map(ContainerDir::handles)
            .filter_map(handle::Handle::checkpoint)
            .collect();
        LogCheckpoints {
            at: SystemTime::now(),
            files,
        }
    }

    /// Allows `max` log files open at once (tests: a cap they can reach).
    #[cfg(test)]
    pub fn cap_open_files(&mut self, max: usize) {
        self.tally.open = OpenFiles::new(max);
    }

    /// Container directories held (listed, or with files still being drained).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.dirs.len()
    }

    /// Reads what is new in every file, discovering first when due; `emit` gets each line that
    /// `keep` wants and the gate lets through. With inotify only the directories written to
    /// (or left with bytes unread) are read, and discovery runs when a listed directory changed.
    ///
    /// serve's polls share [`POLL_TOTAL`] bytes and [`KEPT_PER_POLL`] lines between the
    /// directories to be read: once either is spent the rest wait, and the next poll begins
    /// after the last directory this one read. check's first poll reads everything.
    pub fn poll(
        &mut self,
        keep: &dyn Fn(&[u8]) -> bool,
        emit: &mut dyn FnMut(&ContainerRef, Entry),
    ) {
        let catching_up = matches!(self.start, Start::Since(_));
        let everything = self.prepare();
        let Follower {
            dirs,
            tally,
            scratch,
            gate,
            visits,
            cursor,
            ..
        } = self;
        let due = |d: &ContainerDir| everything || d.pending;
        let (share, mut bytes_left, mut kept_left) = if catching_up {
            // Each file's start was planned within the bound; the rest is room for what is
            // appended while they are read.
            (CATCH_UP_BUDGET + POLL_BUDGET, u64::MAX, u32::MAX)
        } else {
            let n = dirs.values().filter(|d| due(d)).count() as u64;
            let share = (POLL_TOTAL / n.max(1)).clamp(MIN_SHARE, POLL_BUDGET);
            (share, POLL_TOTAL, KEPT_PER_POLL)
        };
        let from = cursor.take();
        let after = match &from {
            Some(k) => dirs.range_mut((Excluded(k.clone()), Unbounded)),
            None => dirs.range_mut(..),
        };
        let mut last = None;
        let mut read = |key: &DirKey, dir: &mut ContainerDir| {
            if bytes_left == 0 || kept_left == 0 {
                dir.pending = true; // the next poll begins with it
                return;
            }
            last = Some(key.clone());
            *visits += 1;
            let before = tally.bytes;
            let budget = share.min(bytes_left);
            dir.pending = dir.read(
                budget,
                keep,
                gate,
                &mut kept_left,
                scratch,
                tally,
                &mut *emit,
            );
            bytes_left = bytes_left.saturating_sub(tally.bytes - before);
        };
        for (key, dir) in after.filter(|(_, d)| due(d)) {
            read(key, dir);
        }
        if let Some(k) = &from {
            for (key, dir) in dirs.range_mut(..=k.clone()).filter(|(_, d)| due(d)) {
                read(key, dir);
            }
        }
        *cursor = last;
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

/// A container directory by (root: 0 pods / 1 docker, path under the root).
type DirKey = (u8, String);

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36: a log let go unread is said naming its container, once per container.
    #[test]
    fn a_log_let_go_names_its_container_once() {
        let pod = "/var/log/pods/ml_trainer-0_0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80/worker";
        let file = |f: &str| PathBuf::from(format!("{pod}/{f}"));
        assert_eq!(log_owner(&file("0.log")), "ml/trainer-0/worker");
        let docker = Path::new("/var/lib/docker/containers/abc/abc-json.log");
        assert_eq!(log_owner(docker), "/var/lib/docker/containers/abc");
        assert_eq!(log_owner(Path::new("/a\u{1b}b/x/0.log")), "/a\\x1bb/x");
        let mut tally = Tally::default();
        tally.let_go(&file("0.log.20260101-000000"), 3 << 20);
        tally.let_go(&file("0.log.20260101-000100"), 1 << 20);
        tally.let_go(docker, 5);
        assert_eq!(tally.skipped, (4 << 20) + 5);
        assert_eq!(tally.let_go_by.len(), 2, "one each");
    }
}

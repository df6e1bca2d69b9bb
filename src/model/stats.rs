//! The agent's own counts that its outlets export: how each scan's collectors fared and what
//! the failure sources read.

use std::time::Duration;

/// The collectors named in `shmlink_scan_duration_seconds{collector=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectorName {
    Shm,
    Gpu,
}

impl CollectorName {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectorName::Shm => "shm",
            CollectorName::Gpu => "gpu",
        }
    }
}

/// How one collector fared in one scan.
#[derive(Debug, Clone, Copy)]
pub struct CollectorRun {
    pub collector: CollectorName,
    pub duration: Duration,
    pub errors: u64,
}

/// Cumulative counts since the tailer was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Files opened (live, rotated and gzipped).
    pub files: u64,
    /// Bytes read (gzipped files counted decompressed).
    pub bytes: u64,
    /// Complete lines read, kept or not.
    pub lines: u64,
    /// Kept lines dropped by the rate limits (per container, per poll).
    pub dropped_lines: u64,
    /// Bytes of rotated files let go unread: written faster than read, and deleted or rotated
    /// past the files kept to drain.
    pub skipped_bytes: u64,
    /// Unreadable roots, directories and files, each counted once.
    pub errors: u64,
    /// Saved positions not trusted after a restart: the file's inode holds another file.
    pub resume_mismatches: u64,
}

/// What the sources have read since the watcher started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    pub logs: LogStats,
    /// `None`: the kernel log is off; `Some(false)`: it could not be opened.
    pub kmsg_open: Option<bool>,
    /// Kernel records read.
    pub kmsg_records: u64,
    /// Kernel records overwritten before they were read.
    pub kmsg_lost: u64,
}

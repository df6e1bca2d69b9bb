//! The workloads' own logs, read on the node, so that a finding can say why a workload died in
//! its own words: kubelet's pod log files (CRI format) and Docker's json-file logs.
//!
//! Parsing is pure (`cri`, `json_file`, `path`); `follow` does the I/O (discovery under the roots
//! without symlinks, one fd per file, appends, truncation, rotation, the catch-up of `since`).
//! This file holds the types, the joined-line bound both formats share, and the rate limit.

mod cri;
mod follow;
mod json_file;
mod path;
pub mod resume;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::SystemTime;

/// Bytes kept of one (joined) line; the rest is dropped and the line marked truncated.
pub const MAX_LINE: usize = 64 * 1024;

/// What a truncated line's text ends with, after the first (at most) [`MAX_LINE`] bytes. A text
/// that was not cut is never longer than `MAX_LINE`, so the mark cannot be mistaken.
pub const TRUNCATED_MARK: &str = " [truncated]";

/// One complete line a workload wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Whose log it is: <pod-log-root>/<namespace>_<pod>_<uid>/<container>/<restart>.log
    /// (kubelet's layout) names a Pod's container, not its instance;
    /// <docker-root>/containers/<id>/<id>-json.log (Docker's json-file driver) its ID.
    pub origin: ContainerRef,
    /// The runtime's timestamp of the line (of its first part, for a joined one).
    pub at: SystemTime,
    /// No trailing newline; invalid UTF-8 replaced.
    pub text: String,
}

impl LogLine {
    /// Whether the line was longer than [`MAX_LINE`] and cut (its text ends with
    /// [`TRUNCATED_MARK`]).
    pub fn is_truncated(&self) -> bool {
        self.text.len() > MAX_LINE && self.text.ends_with(TRUNCATED_MARK)
    }
}

/// Where the logs are and how much of them to keep.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    pub pod_log_root: Option<PathBuf>,
    pub docker_root: Option<PathBuf>,
    /// kept lines (those `poll_matching` wants) per second per container; more are dropped and
    /// counted; 0: no limit
    pub max_lines_per_sec: u32,
}

pub use crate::model::LogStats;
use crate::model::{prefix_within, ContainerRef};

/// Follows every container's log files under the roots. serve's (`from_end`) learns from inotify
/// which directories changed or were written to, and reads only those (and everything every 10 s
/// anyway); without inotify, and in `check`, new files are looked for at most once a second and
/// every known file is read on every poll.
pub struct LogTailer {
    follower: follow::Follower,
}

impl LogTailer {
    /// serve: follows from the end of every file that exists now (no replay of old history);
    /// files that appear later are read from their start.
    pub fn from_end(settings: LogSettings) -> LogTailer {
        let mut tailer = LogTailer::new(&settings, follow::Start::AtEnd, None);
        tailer.follower.notified();
        tailer.follower.discover();
        tailer
    }

    /// serve started again: each file from the position `saved` for it (`resume`); those
    /// unseen and written since are read whole, the rest from their end.
    pub fn resume(settings: LogSettings, saved: resume::LogCheckpoints) -> LogTailer {
        let start = follow::Start::Resume(std::sync::Arc::new(resume::LogResume::new(saved)));
        let mut tailer = LogTailer::new(&settings, start, None);
        tailer.follower.notified();
        tailer.follower.discover();
        tailer
    }

    /// Where each open file was read to (whole lines): taken between polls, every line before
    /// it was handed on by a poll that returned.
    pub fn checkpoints(&self) -> resume::LogCheckpoints {
        self.follower.checkpoints()
    }

    /// Files whose saved position was not trusted on resuming.
    pub fn resume_mismatches(&self) -> u64 {
        self.follower.tally().mismatched
    }

    /// check: the first poll returns what was written at or after `since` (including rotated
    /// and gzipped files), later polls follow. Files last modified before `since` are not read.
    pub fn since(settings: LogSettings, since: SystemTime) -> LogTailer {
        LogTailer::new(&settings, follow::Start::Since(since), Some(since))
    }

    fn new(settings: &LogSettings, start: follow::Start, since: Option<SystemTime>) -> LogTailer {
        let gate = Gate {
            since,
            rate: settings.max_lines_per_sec,
        };
        LogTailer {
            follower: follow::Follower::new(
                settings.pod_log_root.clone(),
                settings.docker_root.clone(),
                start,
                gate,
            ),
        }
    }

    /// New complete lines since the last poll, oldest first per file. Blocking file I/O only,
    /// bounded work per call: at most 4 MiB read per file, except on the first poll of `since`,
    /// which reads what is on disk: of a file and its rotations, their newest 256 MiB at most
    /// (the older bytes are not read: [`LogTailer::unread_bytes`]).
    pub fn poll(&mut self) -> Vec<LogLine> {
        self.poll_matching(|_| true)
    }

    /// As [`LogTailer::poll`], keeping only the lines whose raw text (before the lossy UTF-8
    /// conversion) `keep` wants. It is asked first, before a line's time is parsed, a `String`
    /// made or the rate limit consulted, so a line it refuses costs little more than the search
    /// for its end; and a flood of other lines never uses up the rate limit of the ones kept.
    pub fn poll_matching(&mut self, keep: impl Fn(&[u8]) -> bool) -> Vec<LogLine> {
        let mut out = Vec::new();
        self.poll_each(keep, |line| out.push(line));
        out
    }

    /// As [`LogTailer::poll_matching`], handing each kept line to `each` as it is read: the
    /// caller keeps what it makes of a line (a failure's bounded evidence), never the polls'
    /// lines all at once (a flood of 64 KiB lines across many containers).
    pub fn poll_each(&mut self, keep: impl Fn(&[u8]) -> bool, mut each: impl FnMut(LogLine)) {
        self.follower.poll(&keep, &mut |origin, entry| {
            each(LogLine {
                origin: origin.clone(),
                at: entry.at,
                text: entry.text,
            })
        });
    }

    /// Bytes the catch-up of `since` did not read: older than the newest 256 MiB of a log and
    /// its rotations (each such log said once at `warn`).
    pub fn unread_bytes(&self) -> u64 {
        self.follower.tally().unread
    }

    /// Cumulative counts.
    pub fn stats(&self) -> LogStats {
        let tally = self.follower.tally();
        LogStats {
            files: tally.files,
            bytes: tally.bytes,
            lines: tally.lines,
            dropped_lines: tally.dropped,
            skipped_bytes: tally.skipped,
            errors: tally.errors,
            resume_mismatches: tally.mismatched,
        }
    }
}

/// What a decoder made of one line of a file.
#[derive(Debug)]
enum Pushed {
    /// Not a complete line (a part, or garbage).
    Nothing,
    /// A complete line the caller does not want.
    Skipped,
    Line(Entry),
}

impl Pushed {
    #[cfg(test)]
    fn line(self) -> Option<Entry> {
        match self {
            Pushed::Line(entry) => Some(entry),
            _ => None,
        }
    }
}

/// What the kept lines pass before they are handed on: none older than `since`, at most `rate`
/// a second per container (0: no limit).
#[derive(Debug, Clone, Copy)]
struct Gate {
    since: Option<SystemTime>,
    rate: u32,
}

impl Gate {
    /// Whether a kept line goes on; `Err` when the rate limit drops it. `bucket` is the
    /// container's, made at its first line.
    fn pass(&self, bucket: &mut Option<Bucket>, at: SystemTime) -> Result<bool, Dropped> {
        if self.since.is_some_and(|since| at < since) {
            return Ok(false);
        }
        if self.rate == 0 {
            return Ok(true);
        }
        let bucket = bucket.get_or_insert_with(|| Bucket::full(self.rate, at));
        if bucket.admit(self.rate, at) {
            Ok(true)
        } else {
            Err(Dropped)
        }
    }
}

/// A line the rate limit dropped.
#[derive(Debug)]
struct Dropped;

/// A line as a parser completes it, before its origin is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    at: SystemTime,
    text: String,
}

impl Entry {
    /// A line that came whole; `truncated` when the reader kept only its head.
    fn whole(at: SystemTime, bytes: &[u8], truncated: bool) -> Entry {
        let truncated = truncated || bytes.len() > MAX_LINE;
        let bytes = &bytes[..bytes.len().min(MAX_LINE)];
        Entry {
            at,
            text: text_of(bytes, truncated),
        }
    }
}

/// A line arriving in parts (CRI `P` records, Docker's entries without `\n`): at most
/// [`MAX_LINE`] bytes are kept, so a line that never ends costs no more than that.
struct Joined {
    at: SystemTime,
    bytes: Vec<u8>,
    truncated: bool,
}

impl Joined {
    fn new(at: SystemTime) -> Joined {
        Joined {
            at,
            bytes: Vec::new(),
            truncated: false,
        }
    }

    fn push(&mut self, part: &[u8]) {
        if self.truncated {
            return; // what follows a cut would read as if it followed the kept head
        }
        self.truncated = extend_within(&mut self.bytes, part, MAX_LINE);
    }

    /// The reader lost the rest of a part: keep what came, drop what follows.
    fn cut(&mut self) {
        self.truncated = true;
    }

    fn finish(self) -> Entry {
        Entry {
            at: self.at,
            text: text_of(&self.bytes, self.truncated),
        }
    }
}

/// Appends what fits of `part` for `buf` to hold at most `max` bytes; whether any was cut.
fn extend_within(buf: &mut Vec<u8>, part: &[u8], max: usize) -> bool {
    let room = max - buf.len();
    buf.extend_from_slice(&part[..part.len().min(room)]);
    part.len() > room
}

/// The text of at most `MAX_LINE` raw bytes: lossy UTF-8, still at most `MAX_LINE` bytes (each
/// invalid byte becomes a 3-byte U+FFFD), marked when anything was cut.
fn text_of(bytes: &[u8], mut truncated: bool) -> String {
    let bytes = if truncated {
        without_cut_char(bytes)
    } else {
        bytes
    };
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if text.len() > MAX_LINE {
        text.truncate(prefix_within(&text, MAX_LINE).len());
        truncated = true;
    }
    if truncated {
        text.push_str(TRUNCATED_MARK);
    }
    text
}

/// Drops the head of a multi-byte character that a cut split, which would otherwise end the
/// text in U+FFFD.
fn without_cut_char(bytes: &[u8]) -> &[u8] {
    let from = bytes.len().saturating_sub(3);
    for i in (from..bytes.len()).rev() {
        let len = match bytes[i] {
            0x80..=0xBF => continue,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if bytes.len() - i < len {
            &bytes[..i]
        } else {
            bytes
        };
    }
    bytes
}

/// RFC 3339 with any fraction (CRI's and Docker's timestamps).
fn parse_time(bytes: &[u8]) -> Option<SystemTime> {
    crate::model::parse_rfc3339(std::str::from_utf8(bytes).ok()?)
}

/// A token bucket of one second's worth of lines, refilled by the lines' own timestamps (the
/// runtime's, not the workload's): a replay in `since` mode keeps what following live would
/// have kept, and a poll that comes late does not drop more.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    last: SystemTime,
}

impl Bucket {
    fn full(rate: u32, at: SystemTime) -> Bucket {
        Bucket {
            tokens: f64::from(rate),
            last: at,
        }
    }

    fn admit(&mut self, rate: u32, at: SystemTime) -> bool {
        // A line older than the last one (another restart's file, a clock step) refills nothing.
        if let Ok(elapsed) = at.duration_since(self.last) {
            let rate = f64::from(rate);
            self.tokens = (self.tokens + elapsed.as_secs_f64() * rate).min(rate);
            self.last = at;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use std::time::Duration;

    fn t(secs: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(1_700_000_000.0 + secs)
    }

    #[test]
    fn the_tailer_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<LogTailer>();
    }

    #[test]
    fn a_short_line_is_kept_as_is() {
        let e = Entry::whole(t(0.0), b"NCCL WARN Cuda failure 'out of memory'", false);
        assert_eq!(e.text, "NCCL WARN Cuda failure 'out of memory'");
    }

    #[test]
    fn a_long_line_is_cut_at_max_line_and_marked() {
        let e = Entry::whole(t(0.0), &vec![b'x'; MAX_LINE + 10], false);
        assert_eq!(e.text.len(), MAX_LINE + TRUNCATED_MARK.len());
        assert!(e.text.ends_with(TRUNCATED_MARK));
        let line = LogLine {
            origin: ContainerRef::by_id("a", None),
            at: e.at,
            text: e.text,
        };
        assert!(line.is_truncated());
        let exact = Entry::whole(t(0.0), &vec![b'x'; MAX_LINE], false);
        assert_eq!(exact.text.len(), MAX_LINE);
    }

    #[test]
    fn a_cut_through_a_character_drops_its_head() {
        let mut bytes = vec![b'a'; MAX_LINE - 1];
        bytes.extend_from_slice("é and more".as_bytes()); // é is 2 bytes: the cut splits it
        let e = Entry::whole(t(0.0), &bytes, false);
        assert_eq!(
            e.text,
            format!("{}{TRUNCATED_MARK}", "a".repeat(MAX_LINE - 1))
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_and_stays_within_max_line() {
        let e = Entry::whole(t(0.0), b"bad \xff\xfe bytes", false);
        assert_eq!(e.text, "bad \u{FFFD}\u{FFFD} bytes");
        // Every byte invalid: the lossy text would be three times as long.
        let e = Entry::whole(t(0.0), &vec![0xff; MAX_LINE], false);
        assert!(e.text.len() <= MAX_LINE + TRUNCATED_MARK.len());
        assert!(e.text.ends_with(TRUNCATED_MARK));
    }

    #[test]
    fn a_joined_line_stops_growing_at_max_line() {
        let mut j = Joined::new(t(0.0));
        for _ in 0..100 {
            j.push(&[b'y'; 16 * 1024]);
        }
        assert_eq!(j.bytes.len(), MAX_LINE);
        let e = j.finish();
        assert!(e.text.ends_with(TRUNCATED_MARK));
    }

    #[test]
    fn times_parse_as_rfc3339_with_any_fraction_and_offset() {
        let nanos = parse_time(b"2026-11-23T10:15:02.123456789Z").unwrap();
        let d = nanos.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.subsec_nanos(), 123_456_789);
        let offset = parse_time(b"2026-11-23T11:15:02.123456789+01:00").unwrap();
        assert_eq!(nanos, offset);
        assert!(parse_time(b"2026-11-23T10:15:02Z").is_some());
        assert!(parse_time(b"2026-11-23 10:15").is_none());
        assert!(parse_time(b"\xff").is_none());
    }

    #[test]
    fn the_bucket_keeps_a_second_of_lines_then_refills_by_line_time() {
        let mut b = Bucket::full(10, t(0.0));
        let kept = (0..100).filter(|_| b.admit(10, t(0.0))).count();
        assert_eq!(kept, 10);
        assert!(!b.admit(10, t(0.05)));
        assert!(b.admit(10, t(0.15)));
        // Older lines refill nothing.
        assert!(!b.admit(10, t(-5.0)));
        let kept = (0..100).filter(|_| b.admit(10, t(60.0))).count();
        assert_eq!(kept, 10);
    }
}

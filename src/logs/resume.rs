//! Pure: where serve reads on from after a restart, given the positions it saved
//! ([`LogCheckpoints`]) and what a directory lists now.
//!
//! A file is known by (dev, inode) and a fingerprint of its first bytes (a CRC-32 of its first
//! line, at most [`FINGERPRINT_MAX`] bytes): the inode alone is not enough, since a file
//! deleted by a rotation frees its inode for the next one, and a file replaced under the same
//! name has a new inode. The fingerprint is compared over as many bytes as were hashed when the
//! position was saved (a file whose first line was not finished then).

use std::collections::HashMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Bytes of a file's first line hashed at most.
pub const FINGERPRINT_MAX: usize = 1024;

/// One followed file's position: read and handed on up to `offset` (a line boundary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCheckpoint {
    /// Where it was (said in logs; the identity is the rest).
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// CRC-32 of its first `fingerprint_len` bytes.
    pub fingerprint: u32,
    pub fingerprint_len: u32,
    pub offset: u64,
}

/// Every followed file's position, and when they were taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCheckpoints {
    pub at: SystemTime,
    pub files: Vec<LogCheckpoint>,
}

/// The saved positions by (dev, inode), as discovery asks of them.
#[derive(Debug, Clone)]
pub struct LogResume {
    at: SystemTime,
    by_id: HashMap<(u64, u64), LogCheckpoint>,
}

impl LogResume {
    pub fn new(saved: LogCheckpoints) -> LogResume {
        LogResume {
            at: saved.at,
            by_id: saved
                .files
                .into_iter()
                .map(|c| ((c.dev, c.ino), c))
                .collect(),
        }
    }
}

/// What discovery knows of a listed file.
#[derive(Debug, Clone, Copy)]
pub struct Listing {
    pub id: (u64, u64),
    pub size: u64,
    pub mtime: SystemTime,
    pub rotated: bool,
    pub gz: bool,
    /// A gzipped file whose plain self is listed too (being compressed): the plain one is read.
    pub plain_twin: bool,
}

/// Where a file is read from on resuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// Its position was saved: on from there (a rotated one was rotated while the agent was
    /// down; a gzipped one, compressed then: the offset is in its decompressed bytes).
    At(u64),
    /// Unseen and written since the checkpoint: whole.
    Whole,
    /// A live file: from its end; a rotated one: not read.
    Skip,
    /// Its inode was saved but its first bytes differ (the inode reused by another file, or
    /// the file truncated and written again): the position is not trusted and it is said; the
    /// file is another, read whole when written since the checkpoint (deaths in it were never
    /// read), else from its end.
    Mismatch { written_since: bool },
}

/// Decides for one listed file; `fingerprint(len)` hashes its first `len` bytes (a gzipped
/// file's decompressed; None when they cannot be read, or it is shorter).
pub fn resume_at(
    f: &Listing,
    saved: &LogResume,
    mut fingerprint: impl FnMut(u32) -> Option<u32>,
) -> Resumed {
    if f.gz {
        return resume_gz(f, saved, fingerprint);
    }
    if let Some(c) = saved.by_id.get(&f.id) {
        if fingerprint(c.fingerprint_len) != Some(c.fingerprint) {
            return Resumed::Mismatch {
                written_since: f.mtime > saved.at,
            };
        }
        // Truncated (copytruncate) while down: what it holds now was written since.
        return Resumed::At(if f.size < c.offset { 0 } else { c.offset });
    }
    if f.mtime <= saved.at {
        return Resumed::Skip;
    }
    Resumed::Whole
}

/// A gzipped rotation is a new inode holding a followed file's bytes, read before the
/// checkpoint up to its offset: compressed since, it is known by its first line alone. One
/// that matches no saved file (a rotation there before the agent, compressed while it was down)
/// is history: not read.
fn resume_gz(
    f: &Listing,
    saved: &LogResume,
    mut fingerprint: impl FnMut(u32) -> Option<u32>,
) -> Resumed {
    if f.plain_twin || f.mtime <= saved.at {
        return Resumed::Skip;
    }
    saved
        .by_id
        .values()
        .filter(|c| c.fingerprint_len > 0)
        .find(|c| fingerprint(c.fingerprint_len) == Some(c.fingerprint))
        .map_or(Resumed::Skip, |c| Resumed::At(c.offset))
}

/// The fingerprint of a file's first bytes: its first line with its `\n`, at most
/// [`FINGERPRINT_MAX`] bytes; and how many bytes that is.
pub fn fingerprint(head: &[u8]) -> (u32, u32) {
    let head = &head[..head.len().min(FINGERPRINT_MAX)];
    let line = memchr::memchr(b'\n', head).map_or(head, |i| &head[..=i]);
    (crc(line), line.len() as u32)
}

/// CRC-32 (flate2's, already linked for gzipped logs).
pub fn crc(bytes: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(bytes);
    c.sum()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const FIRST: &[u8] = b"2026-11-27T05:00:00Z stdout F hello\n";

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn saved(ino: u64, offset: u64) -> LogResume {
        let (fingerprint, fingerprint_len) = fingerprint(FIRST);
        LogResume::new(LogCheckpoints {
            at: t(100),
            files: vec![LogCheckpoint {
                path: "/var/log/pods/ns_p_u/c/0.log".into(),
                dev: 8,
                ino,
                fingerprint,
                fingerprint_len,
                offset,
            }],
        })
    }

    fn listed(ino: u64, size: u64, mtime: u64, rotated: bool) -> Listing {
        Listing {
            id: (8, ino),
            size,
            mtime: t(mtime),
            rotated,
            gz: false,
            plain_twin: false,
        }
    }

    /// Hashes `content`'s first `len` bytes, as discovery does of the file.
    fn of(content: &'static [u8]) -> impl FnMut(u32) -> Option<u32> {
        move |len| content.get(..len as usize).map(crc)
    }

    #[test]
    fn the_same_file_resumes_at_its_offset() {
        let mut grown = FIRST.to_vec();
        grown.extend_from_slice(b"2026-11-27T05:00:01Z stdout F more\n");
        let grown: &'static [u8] = grown.leak();
        let f = listed(42, grown.len() as u64, 200, false);
        assert_eq!(resume_at(&f, &saved(42, 36), of(grown)), Resumed::At(36));
    }

    #[test]
    fn a_file_rotated_while_down_is_read_on_from_its_offset() {
        // The live file was renamed to 0.log.<time>: same inode, now a rotated name.
        let f = listed(42, 500, 150, true);
        assert_eq!(resume_at(&f, &saved(42, 36), of(FIRST)), Resumed::At(36));
    }

    #[test]
    fn a_file_compressed_while_down_is_known_by_its_first_line() {
        let gz = Listing {
            gz: true,
            ..listed(43, 90, 160, true)
        };
        assert_eq!(resume_at(&gz, &saved(42, 36), of(FIRST)), Resumed::At(36));
        // Another file's rotation, or one there before the checkpoint: history, not read.
        let other: &'static [u8] = b"2026-11-27T04:00:00Z stdout F older\n";
        assert_eq!(resume_at(&gz, &saved(42, 36), of(other)), Resumed::Skip);
        let old = Listing { mtime: t(50), ..gz };
        assert_eq!(resume_at(&old, &saved(42, 36), of(FIRST)), Resumed::Skip);
        // Being compressed: its plain twin is read instead.
        let twin = Listing {
            plain_twin: true,
            ..gz
        };
        assert_eq!(resume_at(&twin, &saved(42, 36), of(FIRST)), Resumed::Skip);
    }

    #[test]
    fn a_file_replaced_under_the_same_name_is_new() {
        // Another inode: unseen; written since the checkpoint, so read whole.
        let f = listed(77, 40, 200, false);
        assert_eq!(resume_at(&f, &saved(42, 36), of(FIRST)), Resumed::Whole);
        // Not written since: from its end (never an old file re-read as new).
        let old = listed(77, 40, 50, false);
        assert_eq!(resume_at(&old, &saved(42, 36), of(FIRST)), Resumed::Skip);
        let old_rotated = listed(78, 40, 50, true);
        assert_eq!(
            resume_at(&old_rotated, &saved(42, 36), of(FIRST)),
            Resumed::Skip
        );
    }

    #[test]
    fn a_reused_inode_is_not_trusted() {
        let other: &'static [u8] = b"2026-11-27T05:30:00Z stderr F another file\n";
        let f = listed(42, other.len() as u64, 200, false);
        let since = Resumed::Mismatch {
            written_since: true,
        };
        assert_eq!(resume_at(&f, &saved(42, 36), of(other)), since);
        // Shorter than the bytes hashed: not the same file either.
        assert_eq!(resume_at(&f, &saved(42, 36), of(b"2026")), since);
        // Not written since the checkpoint: nothing in it is news.
        let old = listed(42, other.len() as u64, 50, false);
        assert_eq!(
            resume_at(&old, &saved(42, 36), of(other)),
            Resumed::Mismatch {
                written_since: false
            }
        );
    }

    #[test]
    fn a_truncated_file_is_read_from_its_start() {
        let f = listed(42, 20, 200, false);
        assert_eq!(resume_at(&f, &saved(42, 36), of(FIRST)), Resumed::At(0));
    }

    #[test]
    fn the_fingerprint_is_the_first_line_within_a_bound() {
        assert_eq!(fingerprint(FIRST).1, FIRST.len() as u32);
        let mut two = FIRST.to_vec();
        two.extend_from_slice(b"next\n");
        assert_eq!(fingerprint(&two), fingerprint(FIRST));
        assert_eq!(fingerprint(&[b'x'; 5000]).1, FINGERPRINT_MAX as u32);
        assert_eq!(fingerprint(b"").1, 0);
    }

    #[test]
    fn checkpoints_survive_json() {
        let c = LogCheckpoints {
            at: t(1),
            files: saved(1, 2).by_id.into_values().collect(),
        };
        let back: LogCheckpoints =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}

//! What `serve` saves to start again where it was (issue 38): each followed log's position, the
//! kernel log's, the Docker exits and memory-cgroup OOM counts already told. Plain serde data:
//! the state store will keep it; until then `SHMLINK_CHECKPOINT_FILE` names a JSON file
//! (provisional, for tests and trials).
//!
//! A position is taken only when the pipeline holds nothing pending, right after what it told
//! was handed on: every death before it was told, none after it was.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::kernel_log::resume::KmsgCheckpoint;
use crate::logs::resume::LogCheckpoints;

/// The provisional file's environment variable.
pub const CHECKPOINT_FILE_ENV: &str = "SHMLINK_CHECKPOINT_FILE";
/// Saved at most this often while nothing was told (positions only move).
const SAVE_EVERY: Duration = Duration::from_secs(2);
/// This layout's version; a file of another is not read.
const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// When it was taken.
    pub at: SystemTime,
    pub logs: Option<LogCheckpoints>,
    pub kmsg: Option<KmsgCheckpoint>,
    /// Docker exits told, by container ID and finish time (bounded).
    pub docker_told: Vec<(String, SystemTime)>,
    /// The memory cgroups' OOM kill counts at the last scan, by container ID.
    pub oom_counts: Option<HashMap<String, u64>>,
}

impl Checkpoint {
    pub fn new(at: SystemTime) -> Checkpoint {
        Checkpoint {
            version: VERSION,
            at,
            logs: None,
            kmsg: None,
            docker_told: Vec::new(),
            oom_counts: None,
        }
    }
}

/// The file named by [`CHECKPOINT_FILE_ENV`], if set.
pub fn file_from_env() -> Option<PathBuf> {
    std::env::var_os(CHECKPOINT_FILE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Reads a checkpoint; None (said) when it is missing, unreadable or of another version: the
/// agent then starts as if new, from the logs' ends.
pub fn load(path: &Path) -> Option<Checkpoint> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("checkpoint {}: {e}; starting from now", path.display());
            return None;
        }
    };
    match serde_json::from_slice::<Checkpoint>(&text) {
        Ok(c) if c.version == VERSION => Some(c),
        Ok(c) => {
            tracing::warn!(
                "checkpoint {}: version {} (this agent reads {VERSION}); starting from now",
                path.display(),
                c.version
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                "checkpoint {}: not readable ({e}); starting from now",
                path.display()
            );
            None
        }
    }
}

/// Writes it whole or not at all: a temporary file, synced, renamed over the old one.
pub fn save(path: &Path, c: &Checkpoint) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// When the follower saves: at once after telling, else every [`SAVE_EVERY`]; never while the
/// pipeline holds something pending.
#[derive(Debug)]
pub struct Saver {
    pub path: PathBuf,
    last: Option<Instant>,
    /// Failed saves (said once).
    failed: u64,
}

impl Saver {
    pub fn new(path: PathBuf) -> Saver {
        Saver {
            path,
            last: None,
            failed: 0,
        }
    }

    pub fn due(&self, told: bool, pending: bool, now: Instant) -> bool {
        !pending
            && (told
                || self
                    .last
                    .is_none_or(|at| now.duration_since(at) >= SAVE_EVERY))
    }

    pub fn save(&mut self, c: &Checkpoint, now: Instant) {
        self.last = Some(now);
        if let Err(e) = save(&self.path, c) {
            self.failed += 1;
            if self.failed == 1 {
                tracing::warn!(
                    "checkpoint {}: not saved ({e}); a restart will not read on from here",
                    self.path.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_saved_whole_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("cp.json");
        assert_eq!(load(&path), None);
        let mut c = Checkpoint::new(SystemTime::UNIX_EPOCH + Duration::from_secs(7));
        c.docker_told.push(("abc".into(), SystemTime::UNIX_EPOCH));
        c.oom_counts = Some(HashMap::from([("id".to_string(), 2)]));
        save(&path, &c).unwrap();
        assert_eq!(load(&path), Some(c.clone()));
        std::fs::write(&path, b"{\"version\": 1, \"at\"").unwrap();
        assert_eq!(load(&path), None, "a torn file is not trusted");
        c.version = 99;
        save(&path, &c).unwrap();
        assert_eq!(load(&path), None, "a newer layout is not misread");
    }

    #[test]
    fn saves_wait_for_nothing_pending_and_are_bounded() {
        let now = Instant::now();
        let mut s = Saver::new(PathBuf::from("/nonexistent/dir/cp.json"));
        assert!(s.due(false, false, now));
        assert!(!s.due(true, true, now));
        s.save(&Checkpoint::new(SystemTime::now()), now);
        assert_eq!(s.failed, 1);
        assert!(!s.due(false, false, now + Duration::from_secs(1)));
        assert!(s.due(true, false, now + Duration::from_secs(1)));
        assert!(s.due(false, false, now + SAVE_EVERY));
    }
}

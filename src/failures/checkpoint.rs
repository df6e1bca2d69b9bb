//! What `serve` keeps to start again where it was (issue 38): each followed log's position, the
//! kernel log's, the Docker exits, Pod-status exits and memory-cgroup OOM counts already told.
//! Plain serde data, kept in the state store under [`KEY`], written in the same transaction as
//! the failures told before it (`state::StoreSender::told`), never on its own ahead of them.
//!
//! A position is taken only when the pipeline holds nothing pending, right after what it told
//! was handed on: every death before it was told, none after it was.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::kernel_log::resume::KmsgCheckpoint;
use crate::kube::exits::DeathKey;
use crate::logs::resume::LogCheckpoints;

/// The store's key of the checkpoint.
pub const KEY: &str = "checkpoint";
/// Taken at most this often while nothing was told (positions only move).
const SAVE_EVERY: Duration = Duration::from_secs(2);
/// This layout's version; a checkpoint of another is not read.
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
    /// Deaths the Pods' statuses recorded that were told, with their finish times.
    #[serde(default)]
    pub pod_exits: Vec<(DeathKey, SystemTime)>,
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
            pod_exits: Vec::new(),
        }
    }

    /// The stored checkpoint; None (said) when it is unreadable or of another version: the
    /// agent then starts as if new, from the logs' ends.
    pub fn from_stored(value: &serde_json::Value) -> Option<Checkpoint> {
        match Checkpoint::deserialize(value) {
            Ok(c) if c.version == VERSION => Some(c),
            Ok(c) => {
                tracing::warn!(
                    "stored checkpoint: version {} (this agent reads {VERSION}); starting from now",
                    c.version
                );
                None
            }
            Err(e) => {
                tracing::warn!("stored checkpoint: not readable ({e}); starting from now");
                None
            }
        }
    }

    pub fn to_stored(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// When the follower takes a checkpoint: at once after telling, else every [`SAVE_EVERY`];
/// never while the pipeline holds something pending.
#[derive(Debug, Default)]
pub struct Saver {
    last: Option<Instant>,
}

impl Saver {
    pub fn due(&self, told: bool, pending: bool, now: Instant) -> bool {
        !pending
            && (told
                || self
                    .last
                    .is_none_or(|at| now.duration_since(at) >= SAVE_EVERY))
    }

    pub fn taken(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_checkpoint_is_read_back_and_a_bad_one_not_trusted() {
        let mut c = Checkpoint::new(SystemTime::UNIX_EPOCH + Duration::from_secs(7));
        c.docker_told.push(("abc".into(), SystemTime::UNIX_EPOCH));
        c.oom_counts = Some(HashMap::from([("id".to_string(), 2)]));
        c.pod_exits.push((
            DeathKey {
                pod_uid: "u".into(),
                container: "trainer".into(),
                instance: "ffff".into(),
            },
            SystemTime::UNIX_EPOCH,
        ));
        let stored: serde_json::Value = serde_json::from_str(&c.to_stored().to_string()).unwrap();
        assert_eq!(Checkpoint::from_stored(&stored), Some(c.clone()));
        assert_eq!(
            Checkpoint::from_stored(&serde_json::json!({"version": 1})),
            None,
            "a partial one is not trusted"
        );
        c.version = 99;
        assert_eq!(
            Checkpoint::from_stored(&c.to_stored()),
            None,
            "a newer layout is not misread"
        );
        // Written before Pod-status exits were kept: read, with none told.
        let mut old = Checkpoint::new(SystemTime::UNIX_EPOCH).to_stored();
        old.as_object_mut().unwrap().remove("pod_exits");
        assert!(Checkpoint::from_stored(&old).unwrap().pod_exits.is_empty());
    }

    #[test]
    fn checkpoints_wait_for_nothing_pending_and_are_bounded() {
        let now = Instant::now();
        let mut s = Saver::default();
        assert!(s.due(false, false, now));
        assert!(!s.due(true, true, now));
        s.taken(now);
        assert!(!s.due(false, false, now + Duration::from_secs(1)));
        assert!(s.due(true, false, now + Duration::from_secs(1)));
        assert!(s.due(false, false, now + SAVE_EVERY));
    }
}

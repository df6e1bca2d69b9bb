//! What `serve` keeps to start again where it was (issue 38): each followed log's position, the
//! kernel log's, the Docker exits, Pod-status exits and memory-cgroup OOM counts already told.
//! Plain serde data, kept in the state store under [`KEY`], written in the same transaction as
//! the failures told before it (`state::StoreSender::told`), never on its own ahead of them.
//!
//! Every death before a checkpoint's positions was told, none after them was. A death read but
//! still pending in the pipeline (an OOM kill held a round for PyTorch's word, a hang waiting
//! for a scan) holds back only its own source, where the pipeline took it in ([`Mark`]): the
//! kernel log's position stays before its record, its container's log files where the last
//! checkpoint had them, its Docker exit and Pod-status death are not among those told, its
//! cgroup's OOM count is the one before it grew ([`Checkpoint::passing`]). The rest move on, so
//! a stream of deaths that keeps something pending never stops positions being saved, and a
//! restart reads again exactly the pending deaths.
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::kernel_log::resume::KmsgCheckpoint;
use crate::kube::exits::DeathKey;
use crate::logs::resume::LogCheckpoints;
use crate::model::ContainerRef;

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

/// Where a source said an account the pipeline took in: what a checkpoint must not pass while
/// the account is pending.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// The kernel log's position before the record that began it.
    Kmsg(KmsgCheckpoint),
    /// A line of this container's log (positions are not kept per line: its files stay where
    /// the last checkpoint had them).
    Log(ContainerRef),
    /// Docker's record of this container ID, finished then.
    Docker(String, SystemTime),
    /// A death a Pod's status recorded, finished then.
    Pod(DeathKey, SystemTime),
    /// This container ID's memory-cgroup OOM kill count before the scan that saw it grow.
    OomCount(String, u64),
}

/// Where every source is now, each death before it read (told or pending).
#[derive(Debug, Clone, Default)]
pub struct Positions {
    pub logs: Option<LogCheckpoints>,
    pub kmsg: Option<KmsgCheckpoint>,
    pub docker_read: Vec<(String, SystemTime)>,
    pub oom_counts: Option<HashMap<String, u64>>,
    pub pod_read: Vec<(DeathKey, SystemTime)>,
}

impl Checkpoint {
    /// Pure: the checkpoint taken at `now` from the sources' positions, held back for the
    /// accounts still `pending` (their marks): every source at the position before its oldest
    /// pending account, what was told counted as told and nothing else. `logs_before`: the
    /// logs' part of the checkpoint taken before (a held file stays where it was).
    pub fn passing(
        now: SystemTime,
        at: Positions,
        pending: &[Mark],
        logs_before: Option<&LogCheckpoints>,
    ) -> Checkpoint {
        let mut c = Checkpoint::new(now);
        c.kmsg = pending
            .iter()
            .filter_map(|m| match m {
                Mark::Kmsg(k) => Some(k),
                _ => None,
            })
            .min_by_key(|k| (k.seq, k.usec))
            .cloned()
            .or(at.kmsg);
        let held: Vec<&ContainerRef> = pending
            .iter()
            .filter_map(|m| match m {
                Mark::Log(who) => Some(who),
                _ => None,
            })
            .collect();
        c.logs = at.logs.map(|now| held_logs(now, &held, logs_before));
        let told_docker = |id: &str, t: &SystemTime| {
            !pending
                .iter()
                .any(|m| matches!(m, Mark::Docker(i, f) if i == id && f == t))
        };
        c.docker_told = at
            .docker_read
            .into_iter()
            .filter(|(id, t)| told_docker(id, t))
            .collect();
        c.pod_exits = at
            .pod_read
            .into_iter()
            .filter(|(k, _)| {
                !pending
                    .iter()
                    .any(|m| matches!(m, Mark::Pod(p, _) if p == k))
            })
            .collect();
        c.oom_counts = at.oom_counts.map(|mut counts| {
            for m in pending {
                if let Mark::OomCount(id, before) = m {
                    let n = counts.entry(id.clone()).or_insert(*before);
                    *n = (*n).min(*before);
                }
            }
            counts
        });
        // Docker's records and the Pods' statuses are read again from the checkpoint's time:
        // not after a pending death's finish.
        c.at = pending
            .iter()
            .filter_map(|m| match m {
                Mark::Docker(_, t) | Mark::Pod(_, t) => Some(*t),
                _ => None,
            })
            .fold(now, SystemTime::min);
        c
    }
}

/// The logs' positions with the files of the `held` containers where `before` had them (one
/// `before` did not list is left out, and the time is `before`'s: a restart reads it whole as
/// written since).
fn held_logs(
    mut now: LogCheckpoints,
    held: &[&ContainerRef],
    before: Option<&LogCheckpoints>,
) -> LogCheckpoints {
    if held.is_empty() {
        return now;
    }
    let mut any = false;
    now.files.retain_mut(|f| {
        if !held.iter().any(|who| of_container(&f.path, who)) {
            return true;
        }
        any = true;
        let was = before.and_then(|b| b.files.iter().find(|b| (b.dev, b.ino) == (f.dev, f.ino)));
        match was {
            Some(was) => {
                *f = was.clone();
                true
            }
            None => false,
        }
    });
    if any {
        if let Some(b) = before {
            now.at = now.at.min(b.at);
        }
    }
    now
}

/// Whether a log file is `who`'s: kubelet's `<ns>_<pod>_<uid>/<container>/<file>`, Docker's
/// `<id>/<file>` (`logs::path`).
fn of_container(path: &str, who: &ContainerRef) -> bool {
    let mut up = std::path::Path::new(path).iter().rev().skip(1);
    let (Some(dir), parent) = (up.next().and_then(|d| d.to_str()), up.next()) else {
        return false;
    };
    if who.container_id.as_deref() == Some(dir) {
        return true;
    }
    let pod = parent
        .and_then(|p| p.to_str())
        .and_then(|p| p.rsplit_once('_'));
    who.container.as_deref() == Some(dir)
        && pod.is_some_and(|(_, uid)| who.pod_uid.as_deref() == Some(uid))
}

/// When the follower takes a checkpoint: at once after telling, else every [`SAVE_EVERY`],
/// whatever is pending (it holds back its own source's position, not the checkpoint).
#[derive(Debug, Default)]
pub struct Saver {
    last: Option<Instant>,
}

impl Saver {
    pub fn due(&self, told: bool, now: Instant) -> bool {
        told || self
            .last
            .is_none_or(|at| now.duration_since(at) >= SAVE_EVERY)
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
    fn checkpoints_go_with_what_was_told_and_are_bounded() {
        let now = Instant::now();
        let mut s = Saver::default();
        assert!(s.due(false, now));
        s.taken(now);
        assert!(!s.due(false, now + Duration::from_secs(1)));
        assert!(s.due(true, now + Duration::from_secs(1)));
        assert!(s.due(false, now + SAVE_EVERY));
    }

    fn kmsg(seq: u64) -> KmsgCheckpoint {
        KmsgCheckpoint {
            boot_id: "b".into(),
            seq: Some(seq),
            usec: seq * 10,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn file(path: &str, ino: u64, offset: u64) -> crate::logs::resume::LogCheckpoint {
        crate::logs::resume::LogCheckpoint {
            path: path.into(),
            dev: 1,
            ino,
            fingerprint: 0,
            fingerprint_len: 0,
            offset,
        }
    }

    fn secs(n: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(n)
    }

    #[test]
    fn each_source_is_held_before_its_oldest_pending_death_and_only_it() {
        let key = |i: &str| DeathKey {
            pod_uid: "u".into(),
            container: "trainer".into(),
            instance: i.into(),
        };
        let pod = "/var/log/pods/ml_trainer-0_u-1/trainer/0.log";
        let other = "/var/log/pods/ml_other-0_u-2/main/0.log";
        let at = Positions {
            logs: Some(LogCheckpoints {
                at: secs(100),
                files: vec![file(pod, 1, 900), file(other, 2, 800)],
            }),
            kmsg: Some(kmsg(9)),
            docker_read: vec![("a".into(), secs(50)), ("b".into(), secs(90))],
            oom_counts: Some(HashMap::from([("x".into(), 3), ("y".into(), 1)])),
            pod_read: vec![(key("1"), secs(60)), (key("2"), secs(95))],
        };
        // Nothing pending: where every source is.
        let c = Checkpoint::passing(secs(100), at.clone(), &[], None);
        assert_eq!((c.at, c.kmsg.clone()), (secs(100), Some(kmsg(9))));
        assert_eq!(c.logs, at.logs);
        assert_eq!((c.docker_told.len(), c.pod_exits.len()), (2, 2));
        assert_eq!(c.oom_counts, at.oom_counts);

        let before = LogCheckpoints {
            at: secs(80),
            files: vec![file(pod, 1, 500), file(other, 2, 700)],
        };
        let trainer = ContainerRef::in_pod("ml", "trainer-0", "u-1", "trainer", None);
        let pending = [
            Mark::Kmsg(kmsg(7)),
            Mark::Kmsg(kmsg(5)),
            Mark::Log(trainer),
            Mark::Docker("b".into(), secs(90)),
            Mark::Pod(key("2"), secs(95)),
            Mark::OomCount("x".into(), 2),
        ];
        let c = Checkpoint::passing(secs(100), at, &pending, Some(&before));
        assert_eq!(c.kmsg, Some(kmsg(5)), "before the oldest pending record");
        let logs = c.logs.unwrap();
        assert_eq!(
            logs.files,
            [file(pod, 1, 500), file(other, 2, 800)],
            "the held container's file where it was, the other's on"
        );
        assert_eq!(logs.at, secs(80));
        assert_eq!(
            c.docker_told,
            [("a".to_string(), secs(50))],
            "only the told"
        );
        assert_eq!(c.pod_exits, [(key("1"), secs(60))]);
        assert_eq!(
            c.at,
            secs(90),
            "records read again from the oldest pending exit"
        );
        assert_eq!(
            c.oom_counts,
            Some(HashMap::from([("x".into(), 2), ("y".into(), 1)]))
        );
    }

    #[test]
    fn a_held_file_the_last_checkpoint_did_not_list_is_left_to_be_read_whole() {
        let docker = format!(
            "/var/lib/docker/containers/{0}/{0}-json.log",
            "c".repeat(64)
        );
        let now = LogCheckpoints {
            at: secs(100),
            files: vec![file(&docker, 3, 40)],
        };
        let who = ContainerRef {
            container_id: Some("c".repeat(64)),
            ..ContainerRef::default()
        };
        let before = LogCheckpoints {
            at: secs(70),
            files: vec![],
        };
        let held = held_logs(now.clone(), &[&who], Some(&before));
        assert!(held.files.is_empty());
        assert_eq!(held.at, secs(70), "written since then: read whole");
        let stranger = ContainerRef::in_pod("ns", "p", "u-9", "c", None);
        assert_eq!(held_logs(now.clone(), &[&stranger], Some(&before)), now);
        assert!(!of_container("/x/ns_p_u-1/c/0.log", &stranger));
        assert!(of_container("/x/ns_p_u-9/c/0.log", &stranger));
        assert!(!of_container("0.log", &stranger));
    }
}

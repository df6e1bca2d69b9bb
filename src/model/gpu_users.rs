//! Which processes use which GPUs: PID -> the GPUs NVML listed it on and its container, kept a
//! while after NVML last listed it, so that a process that crashed or was killed a moment ago
//! still maps to both. Filled by `gpu::users` each scan; read by the failures' correlation and
//! the metrics.
//!
//! A PID is one process only as long as its start time stays the same: the kernel reuses PIDs,
//! and a later process with the PID starts a new entry.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

/// How long a process is remembered after NVML last listed it.
pub const GPU_USERS_HISTORY: Duration = Duration::from_secs(600);
/// Processes remembered at most (the longest unseen go first).
pub const GPU_USERS_KEPT: usize = 4096;

/// The container a process ran in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserContainer {
    pub pod_uid: Option<String>,
    pub container_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Use {
    gpus: BTreeSet<u32>,
    /// None: a host process (or its cgroup could not be read).
    container: Option<UserContainer>,
    start: Option<u64>,
    last_seen: SystemTime,
    /// Listed by the latest scan.
    now: bool,
}

/// PID -> the GPUs it used and its container, for the processes NVML listed lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUsers {
    by_pid: HashMap<u32, Use>,
}

impl GpuUsers {
    /// A new scan's lists begin: nothing is "now" until seen again.
    pub fn begin_scan(&mut self) {
        for u in self.by_pid.values_mut() {
            u.now = false;
        }
    }

    /// Host process `pid` (started at `start` ticks) is on `gpus` now; `place` names its
    /// container, asked only for a process new to the history.
    pub fn seen(
        &mut self,
        pid: u32,
        start: Option<u64>,
        gpus: BTreeSet<u32>,
        now: SystemTime,
        place: impl FnOnce() -> Option<UserContainer>,
    ) {
        let known = self
            .by_pid
            .get_mut(&pid)
            .filter(|u| u.start.is_none() || start.is_none() || u.start == start);
        match known {
            Some(u) => {
                u.gpus.extend(gpus);
                u.last_seen = now;
                u.now = true;
            }
            None => {
                self.by_pid.insert(
                    pid,
                    Use {
                        gpus,
                        container: place(),
                        start,
                        last_seen: now,
                        now: true,
                    },
                );
            }
        }
    }

    /// Forgets what was not listed within [`GPU_USERS_HISTORY`], and the longest unseen beyond
    /// [`GPU_USERS_KEPT`].
    pub fn prune(&mut self, now: SystemTime) {
        self.by_pid.retain(|_, u| {
            u.now
                || now
                    .duration_since(u.last_seen)
                    .is_ok_and(|age| age <= GPU_USERS_HISTORY)
        });
        if self.by_pid.len() > GPU_USERS_KEPT {
            let mut ages: Vec<(SystemTime, u32)> =
                self.by_pid.iter().map(|(p, u)| (u.last_seen, *p)).collect();
            ages.sort_unstable();
            let extra = self.by_pid.len() - GPU_USERS_KEPT;
            for (_, pid) in ages.into_iter().take(extra) {
                self.by_pid.remove(&pid);
            }
        }
    }
    /// The GPUs host process `pid` used, lowest first; empty when NVML never listed it.
    pub fn gpus_of_pid(&self, pid: u32) -> Vec<u32> {
        self.by_pid
            .get(&pid)
            .map(|u| u.gpus.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The container host process `pid` ran in, as read while NVML listed it.
    pub fn container_of_pid(&self, pid: u32) -> Option<&UserContainer> {
        self.by_pid.get(&pid)?.container.as_ref()
    }

    /// The GPUs any process of the container used lately, lowest first.
    pub fn gpus_of_container(&self, container_id: &str) -> Vec<u32> {
        let gpus: BTreeSet<u32> = self
            .by_pid
            .values()
            .filter(|u| {
                u.container
                    .as_ref()
                    .is_some_and(|c| c.container_id == container_id)
            })
            .flat_map(|u| u.gpus.iter().copied())
            .collect();
        gpus.into_iter().collect()
    }

    /// Which container uses which GPU now (the latest scan's lists), each once, sorted.
    pub fn containers_now(&self) -> Vec<(&UserContainer, u32)> {
        let set: BTreeSet<(&UserContainer, u32)> = self
            .by_pid
            .values()
            .filter(|u| u.now)
            .filter_map(|u| Some((u.container.as_ref()?, u)))
            .flat_map(|(c, u)| u.gpus.iter().map(move |&g| (c, g)))
            .collect();
        set.into_iter().collect()
    }

    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::from_secs(1_800_000_000);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(secs)
    }

    fn container(id: &str) -> Option<UserContainer> {
        Some(UserContainer {
            pod_uid: None,
            container_id: id.into(),
        })
    }

    #[test]
    fn a_gone_process_maps_to_its_gpus_until_the_history_ends() {
        let mut users = GpuUsers::default();
        users.begin_scan();
        users.seen(42, Some(100), BTreeSet::from([5, 7]), at(0), || {
            container("c1")
        });
        users.seen(77, Some(5), BTreeSet::from([7]), at(0), || None);
        users.prune(at(0));
        assert_eq!(users.gpus_of_pid(42), vec![5, 7]);
        assert_eq!(users.gpus_of_container("c1"), vec![5, 7]);
        assert_eq!(users.container_of_pid(77), None);
        assert_eq!(users.containers_now().len(), 2);
        users.begin_scan();
        users.prune(at(10));
        assert_eq!(users.gpus_of_pid(42), vec![5, 7]);
        assert!(users.containers_now().is_empty());
        users.begin_scan();
        users.prune(at(11) + GPU_USERS_HISTORY);
        assert!(users.is_empty());
    }

    #[test]
    fn a_reused_pid_is_another_process_and_placing_is_asked_once() {
        let mut users = GpuUsers::default();
        users.seen(42, Some(100), BTreeSet::from([5]), at(0), || {
            container("c1")
        });
        users.seen(42, Some(100), BTreeSet::from([6]), at(1), || {
            panic!("asked again")
        });
        assert_eq!(users.gpus_of_pid(42), vec![5, 6]);
        users.seen(42, Some(900), BTreeSet::from([1]), at(2), || None);
        assert_eq!(users.gpus_of_pid(42), vec![1]);
        assert!(users.gpus_of_container("c1").is_empty());
    }

    #[test]
    fn the_history_is_bounded_newest_kept() {
        let mut users = GpuUsers::default();
        for round in 0..3u32 {
            users.begin_scan();
            for i in 0..2000 {
                users.seen(
                    10_000 + round * 2000 + i,
                    None,
                    BTreeSet::from([0]),
                    at(u64::from(round)),
                    || None,
                );
            }
            users.prune(at(u64::from(round)));
        }
        assert!(users.len() <= GPU_USERS_KEPT + 2000, "{}", users.len());
        users.begin_scan();
        users.prune(at(3));
        assert_eq!(users.len(), GPU_USERS_KEPT);
        assert_eq!(users.gpus_of_pid(10_000 + 2 * 2000 + 1999), vec![0]);
        assert!(users.gpus_of_pid(10_000).is_empty());
    }
}

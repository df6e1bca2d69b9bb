//! Which processes use which GPUs: PID -> the GPUs NVML listed it on and its container, kept a
//! while after NVML last listed it, so that a process that crashed or was killed a moment ago
//! still maps to both. Filled by `gpu::users` each scan; read by the failures' correlation and
//! the metrics.
//!
//! A PID is one process only as long as its start time stays the same: the kernel reuses PIDs,
//! and a later process with the PID starts a new entry. A crash names a PID, a command and a
//! moment: an entry is the crasher's only when its start (where the crasher was readable; else
//! its command) is the crash's and its process was not already found gone before the crash
//! ([`Crasher`]).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use super::ContainerRef;

/// How long a process is remembered after NVML last listed it.
pub const GPU_USERS_HISTORY: Duration = Duration::from_secs(600);
/// Processes remembered at most (the longest unseen go first).
pub const GPU_USERS_KEPT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Use {
    gpus: BTreeSet<u32>,
    /// The container it ran in, by its cgroup (ID, Pod UID); None: a host process (or its
    /// cgroup could not be read).
    container: Option<ContainerRef>,
    start: Option<u64>,
    /// Its command as `/proc/PID/stat` gave it while NVML listed it.
    comm: Option<String>,
    last_seen: SystemTime,
    /// Listed by the latest scan.
    now: bool,
    /// The first scan that found the process gone (or its PID another's): a crash after it is
    /// not this process's.
    gone_by: Option<SystemTime>,
}

/// What a crash's kernel line and `/proc` say of the crashing process.
#[derive(Debug, Clone, Copy)]
pub struct Crasher<'a> {
    pub pid: u32,
    /// Its command, from the kernel's line (printable or raw: compared as printable).
    pub comm: Option<&'a str>,
    /// Its start in ticks since boot, where it was still readable when its line was read.
    pub start: Option<u64>,
    /// When the kernel told the crash.
    pub at: SystemTime,
}

/// The clock slack between the kernel's timestamps and the scans' (boot time is derived).
const CLOCK_SLACK: Duration = Duration::from_secs(1);

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
        comm: Option<&str>,
        gpus: BTreeSet<u32>,
        now: SystemTime,
        place: impl FnOnce() -> Option<ContainerRef>,
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
                u.gone_by = None;
                if let Some(comm) = comm {
                    u.comm = Some(crate::model::printable(comm));
                }
            }
            None => {
                self.by_pid.insert(
                    pid,
                    Use {
                        gpus,
                        container: place(),
                        start,
                        comm: comm.map(crate::model::printable),
                        last_seen: now,
                        now: true,
                        gone_by: None,
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
    /// The processes not listed by the latest scan and not yet found gone, with their starts:
    /// the scan looks whether each still runs.
    pub fn unlisted(&self) -> Vec<(u32, Option<u64>)> {
        self.by_pid
            .iter()
            .filter(|(_, u)| !u.now && u.gone_by.is_none())
            .map(|(p, u)| (*p, u.start))
            .collect()
    }

    /// Process `pid` (started at `start`) was found gone at `now`: `/proc` has no such PID, or
    /// another process with it.
    pub fn gone(&mut self, pid: u32, start: Option<u64>, now: SystemTime) {
        if let Some(u) = self.by_pid.get_mut(&pid) {
            if u.start == start && u.gone_by.is_none() {
                u.gone_by = Some(now);
            }
        }
    }

    /// The entry of the process that crashed, when it is that process: same PID, same command
    /// and start where both are known, and not found gone before the crash.
    fn of_crasher(&self, c: &Crasher<'_>) -> Option<&Use> {
        let u = self.by_pid.get(&c.pid)?;
        let differ = |a: Option<&str>, b: Option<&str>| {
            a.zip(b)
                .is_some_and(|(a, b)| crate::model::printable(a) != crate::model::printable(b))
        };
        // The start decides where both are known (an exec or a rename changes the command of
        // the same process); else the command must be the one NVML's process last had.
        match u.start.zip(c.start) {
            Some((a, b)) if a != b => return None,
            Some(_) => {}
            None if differ(u.comm.as_deref(), c.comm) => return None,
            None => {}
        }
        if u.gone_by.is_some_and(|g| c.at > g + CLOCK_SLACK) {
            return None;
        }
        Some(u)
    }

    /// The GPUs PID `pid` used, whatever process it was (tests).
    #[cfg(test)]
    pub fn gpus_of_pid(&self, pid: u32) -> Vec<u32> {
        self.by_pid
            .get(&pid)
            .map(|u| u.gpus.iter().copied().collect())
            .unwrap_or_default()
    }

    #[cfg(test)]
    pub fn container_of_pid(&self, pid: u32) -> Option<&ContainerRef> {
        self.by_pid.get(&pid)?.container.as_ref()
    }

    /// The GPUs the crashed process used, lowest first; empty when NVML never listed it (or
    /// listed another process with its PID).
    pub fn gpus_of_crasher(&self, c: &Crasher<'_>) -> Vec<u32> {
        self.of_crasher(c)
            .map(|u| u.gpus.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The container the crashed process ran in, as read while NVML listed it.
    pub fn container_of_crasher(&self, c: &Crasher<'_>) -> Option<&ContainerRef> {
        self.of_crasher(c)?.container.as_ref()
    }

    /// The GPUs any process of the container used lately, lowest first.
    pub fn gpus_of_container(&self, container_id: &str) -> Vec<u32> {
        let gpus: BTreeSet<u32> = self
            .by_pid
            .values()
            .filter(|u| {
                u.container
                    .as_ref()
                    .is_some_and(|c| c.container_id.as_deref() == Some(container_id))
            })
            .flat_map(|u| u.gpus.iter().copied())
            .collect();
        gpus.into_iter().collect()
    }

    /// Which container uses which GPU now (the latest scan's lists), each once, sorted.
    pub fn containers_now(&self) -> Vec<(&ContainerRef, u32)> {
        let set: BTreeSet<(&ContainerRef, u32)> = self
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

    fn container(id: &str) -> Option<ContainerRef> {
        Some(ContainerRef::by_id(id, None))
    }

    #[test]
    fn a_gone_process_maps_to_its_gpus_until_the_history_ends() {
        let mut users = GpuUsers::default();
        users.begin_scan();
        users.seen(42, Some(100), None, BTreeSet::from([5, 7]), at(0), || {
            container("c1")
        });
        users.seen(77, Some(5), None, BTreeSet::from([7]), at(0), || None);
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
        users.seen(42, Some(100), None, BTreeSet::from([5]), at(0), || {
            container("c1")
        });
        users.seen(42, Some(100), None, BTreeSet::from([6]), at(1), || {
            panic!("asked again")
        });
        assert_eq!(users.gpus_of_pid(42), vec![5, 6]);
        users.seen(42, Some(900), None, BTreeSet::from([1]), at(2), || None);
        assert_eq!(users.gpus_of_pid(42), vec![1]);
        assert!(users.gpus_of_container("c1").is_empty());
    }

    fn crasher(comm: &str, start: Option<u64>, secs: u64) -> Crasher<'_> {
        Crasher {
            pid: 42,
            comm: Some(comm),
            start,
            at: at(secs),
        }
    }

    /// Issue 36: PID 42 was python of c1 on GPUs 2 and 3; after it went, another process got the
    /// PID and crashed. Only the same command, the same start and a crash before the process was
    /// found gone make it the entry's.
    #[test]
    fn a_crash_is_the_entrys_only_when_it_is_the_same_process() {
        let mut users = GpuUsers::default();
        users.begin_scan();
        users.seen(
            42,
            Some(100),
            Some("python"),
            BTreeSet::from([2, 3]),
            at(0),
            || container("c1"),
        );
        let same = crasher("python", None, 5);
        assert_eq!(users.gpus_of_crasher(&same), vec![2, 3]);
        assert_eq!(users.container_of_crasher(&same), container("c1").as_ref());
        assert_eq!(
            users.gpus_of_crasher(&crasher("python", Some(100), 5)),
            vec![2, 3]
        );
        // Another command, another start: another process; the same start with another command
        // (an exec) is the same.
        assert!(users.gpus_of_crasher(&crasher("bash", None, 5)).is_empty());
        assert_eq!(
            users.gpus_of_crasher(&crasher("bash", Some(100), 5)),
            vec![2, 3]
        );
        assert!(users
            .container_of_crasher(&crasher("python", Some(900), 5))
            .is_none());
        // A command with a newline matches the kernel's line raw or escaped, nothing else.
        users.seen(7, Some(1), Some("a\nb"), BTreeSet::from([1]), at(0), || {
            None
        });
        for (comm, same) in [("a\nb", true), ("a\\x0ab", true), ("ab", false)] {
            let c = Crasher {
                pid: 7,
                ..crasher(comm, None, 5)
            };
            assert_eq!(users.gpus_of_crasher(&c) == vec![1], same, "{comm:?}");
        }
        // Unlisted at 10 s, found gone then: a crash at 10 s may be its, one at 20 s is not.
        users.begin_scan();
        assert_eq!(users.unlisted().len(), 2);
        users.gone(42, Some(100), at(10));
        users.gone(7, Some(2), at(10));
        assert_eq!(
            users.unlisted().len(),
            1,
            "a start not the entry's changes nothing"
        );
        assert_eq!(
            users.gpus_of_crasher(&crasher("python", None, 10)),
            vec![2, 3]
        );
        assert!(users
            .gpus_of_crasher(&crasher("python", None, 20))
            .is_empty());
        // Listed again (the same process): it runs.
        users.seen(
            42,
            Some(100),
            Some("python"),
            BTreeSet::from([2]),
            at(30),
            || panic!("asked again"),
        );
        assert_eq!(
            users.gpus_of_crasher(&crasher("python", None, 40)),
            vec![2, 3]
        );
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

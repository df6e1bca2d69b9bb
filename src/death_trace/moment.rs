//! What a dying process's container holds the moment the kernel tells its death: its cgroup
//! (whose it is), its /dev/shm and its memory cgroup, read at once, before its mounts go.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::sample::Event;
use crate::cgroup::memory::{parse_memory_stat, parse_usage, MemcgReader};
use crate::cgroup::proc::{identity_of_process, memory_cgroup};
use crate::cgroup::CgroupVersion;
use crate::host::{read_ns, NsId};
use crate::model::{MemorySource, MemorySplit, ShmReading, TracedCause, TracedDeath};
use crate::procfs::stat::parent_pid;
use crate::shm::at_death::{look_now, measure_pid, Looked};
use crate::shm::deadline::Measurer;

/// Reads the moment: everything under the agent's roots.
pub struct MomentReader {
    proc_root: PathBuf,
    hierarchy: Option<(PathBuf, CgroupVersion)>,
    /// The host's mount namespace: a process in it is no container's, and nothing is read.
    host_mnt: Option<NsId>,
    measurer: Measurer,
}

impl MomentReader {
    pub fn new(
        proc_root: PathBuf,
        hierarchy: Option<(PathBuf, CgroupVersion)>,
        host_mnt: Option<NsId>,
    ) -> MomentReader {
        MomentReader {
            proc_root,
            hierarchy,
            host_mnt,
            measurer: Measurer::default(),
        }
    }

    /// Whether `pid` lives in the host's mount namespace (one readlink).
    fn on_the_host(&self, pid: i32) -> bool {
        self.host_mnt.is_some_and(|host| {
            read_ns(&self.proc_root, &pid.to_string(), "mnt").is_ok_and(|own| own == host)
        })
    }

    /// The dying process's cgroups. The kernel takes an exiting task out of its cgroups (v1
    /// then shows it at the root) moments after the fatal signal, often before this reads: then
    /// its parent's, where the parent is not the host's (a DataLoader worker's main process, a
    /// launcher's child: the same container).
    fn cgroup_file_of(&self, pid: i32) -> Option<String> {
        let read = |p: &str| std::fs::read_to_string(self.proc_root.join(p).join("cgroup")).ok();
        let own = read(&pid.to_string());
        if own.as_deref().is_some_and(|c| !at_root(c)) {
            return own;
        }
        // cgroup v1 shows an exiting task at the root of every hierarchy but cpuset's file, which
        // does not look at the exit: a container's process has one path in every hierarchy (what
        // runc and the runtimes above it make), so a container's init whose parent is the
        // runtime's shim is placed by it.
        let cpuset = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cpuset"));
        if let Some(file) = own
            .as_deref()
            .and_then(|c| v1_from_cpuset(c, cpuset.ok()?.trim()))
        {
            return Some(file);
        }
        let stat = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat"));
        let Some(parent) = stat.ok().as_deref().and_then(parent_pid) else {
            return own;
        };
        if parent <= 1 || self.on_the_host(parent) {
            return own;
        }
        read(&parent.to_string()).filter(|c| !at_root(c)).or(own)
    }

    /// The death `event` tells, fired at `time_ns` (monotonic clock), and the reading now.
    pub fn read(&mut self, event: Event, time_ns: u64) -> TracedDeath {
        let (pid, comm, cause) = match event {
            Event::Signal { sig, pid, comm, .. } if sig != crate::model::SIGBUS => {
                (pid, comm, TracedCause::Fatal { sig })
            }
            Event::Signal {
                code, pid, comm, ..
            } => (pid, comm, TracedCause::BusFault { code }),
            Event::Victim {
                pid,
                comm,
                anon_kb,
                file_kb,
                shmem_kb,
            } => {
                let b = |kb: Option<u64>| kb.map(|k| k.saturating_mul(1024));
                let cause = TracedCause::OomVictim {
                    anon_rss: b(anon_kb),
                    file_rss: b(file_kb),
                    shmem_rss: b(shmem_kb),
                };
                (pid, comm, cause)
            }
        };
        // A host process has no container to read: told, unplaced, for one readlink.
        let on_host = self.on_the_host(pid);
        let start_of = |r: &Self| crate::procfs::stat::start_ticks_of(&r.proc_root, pid);
        if matches!(cause, TracedCause::Fatal { .. }) {
            // A crash's place is all it needs: no /dev/shm, no memory.
            let cgroup_file = (!on_host).then(|| self.cgroup_file_of(pid)).flatten();
            let placed = (pid, comm, cause, cgroup_file);
            return told(placed, (None, false), None, start_of(self), time_ns);
        }
        // Its /dev/shm first: the dying process lets go of it within milliseconds; whose it is
        // comes after.
        let looked = (!on_host)
            .then(|| look_now(&mut self.measurer, &self.proc_root, pid))
            .flatten();
        // Still holding its files after the look, its exit had freed nothing it held there.
        let in_time = looked.as_ref().is_some_and(Looked::measured)
            && crate::procfs::status::holds_files(&self.proc_root, pid);
        let cgroup_file = (!on_host).then(|| self.cgroup_file_of(pid)).flatten();
        let rel = cgroup_file
            .as_deref()
            .and_then(memory_cgroup)
            .map(|(path, _)| path.to_string());
        let (limits, memory) = match (&self.hierarchy, &rel) {
            (Some((root, version)), Some(rel)) => {
                let limits = MemcgReader::new(root.clone(), *version)
                    .read_at(rel, None)
                    .unwrap_or_default();
                let memory = memory_now(root, *version, rel, limits.limit_bytes);
                (limits, memory)
            }
            _ => (Default::default(), None),
        };
        let identity = cgroup_file.as_deref().and_then(identity_of_process);
        let reading = if on_host {
            None
        } else {
            self.read_shm(pid, looked, rel.as_deref(), identity, limits)
        };
        // After the race-sensitive reading.
        let start = start_of(self);
        told(
            (pid, comm, cause, cgroup_file),
            (reading, in_time),
            memory,
            start,
            time_ns,
        )
    }
}

impl MomentReader {
    /// The container's /dev/shm through `pid`, else, where `pid` has already let go of its
    /// mounts (a small process is gone in microseconds), through another live process of its
    /// cgroup (its parent, a sibling): they share its mount namespace, and so its /dev/shm.
    fn read_shm(
        &mut self,
        pid: i32,
        looked: Option<Looked>,
        rel: Option<&str>,
        identity: Option<crate::cgroup::path::CgroupIdentity>,
        limits: crate::cgroup::memory::MemoryReading,
    ) -> Option<ShmReading> {
        let rel_or_root = rel.unwrap_or("");
        let own = looked.map(|l| l.reading(identity.clone(), pid, rel_or_root, limits.clone()));
        if own.as_ref().is_some_and(|r| r.used_bytes.is_some()) {
            return own;
        }
        let (Some((root, _)), Some(rel)) = (&self.hierarchy, rel.filter(|r| *r != "/")) else {
            return own;
        };
        for other in cgroup_members(root, rel, pid) {
            if self.on_the_host(other) {
                continue;
            }
            let r = measure_pid(
                &mut self.measurer,
                &self.proc_root,
                other,
                rel,
                identity.clone(),
                limits.clone(),
            );
            if r.as_ref().is_some_and(|r| r.used_bytes.is_some()) {
                return r;
            }
        }
        own
    }
}

/// Members of a cgroup read at most for a reading through another process.
const MEMBERS: usize = 16;

/// The processes of the memory cgroup `rel` under `root` but `pid`, at most [`MEMBERS`].
fn cgroup_members(root: &Path, rel: &str, pid: i32) -> Vec<i32> {
    if rel.split('/').any(|c| c == "..") {
        return Vec::new();
    }
    let path = root.join(rel.trim_start_matches('/')).join("cgroup.procs");
    let Ok(text) = crate::procfs::kfile::read_attribute_text(&path) else {
        return Vec::new();
    };
    members(&text, pid)
}

/// Pure: the PIDs of a `cgroup.procs` but `pid`, at most [`MEMBERS`].
fn members(cgroup_procs: &str, pid: i32) -> Vec<i32> {
    cgroup_procs
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|&p| p != pid && p > 0)
        .take(MEMBERS)
        .collect()
}

/// The traced death as read now: its process, the reading (and whether it was in time), the
/// memory and its start.
fn told(
    (pid, comm, cause, cgroup_file): (i32, String, TracedCause, Option<String>),
    (reading, read_in_time): (Option<ShmReading>, bool),
    memory: Option<MemorySplit>,
    start: Option<u64>,
    time_ns: u64,
) -> TracedDeath {
    let (mono, real) = clocks_now();
    TracedDeath {
        pid,
        comm,
        at: wall_time(time_ns, mono, real),
        cause,
        cgroup_file,
        reading,
        memory,
        read_after: Duration::from_nanos(mono.saturating_sub(time_ns)),
        read_in_time,
        start,
    }
}

/// Pure: whether a `/proc/PID/cgroup` puts the memory cgroup at the root (or has none).
fn at_root(cgroup_file: &str) -> bool {
    memory_cgroup(cgroup_file).is_none_or(|(path, _)| path == "/")
}

/// Pure: a v1 `/proc/PID/cgroup` at the root with its memory line at `cpuset`'s path (the
/// exiting task's, from `/proc/PID/cpuset`), where that path names a container; else `None`.
fn v1_from_cpuset(cgroup_file: &str, cpuset: &str) -> Option<String> {
    let (_, version) = memory_cgroup(cgroup_file)?;
    if version != CgroupVersion::V1 || !cpuset.starts_with('/') || cpuset.contains('\n') {
        return None;
    }
    if !crate::cgroup::path::parse_cgroup_path(cpuset)?.is_surely_a_container() {
        return None;
    }
    let lines = cgroup_file.lines().map(|l| {
        let mut parts = l.splitn(3, ':');
        match (parts.next(), parts.next()) {
            (Some(id), Some(c)) if c.split(',').any(|c| c == "memory") => {
                format!("{id}:{c}:{cpuset}")
            }
            _ => l.to_string(),
        }
    });
    Some(lines.map(|l| l + "\n").collect())
}

/// The monotonic and real-time clocks now (ns), read back to back.
fn clocks_now() -> (u64, u64) {
    use rustix::time::{clock_gettime, ClockId};
    let ns = |t: rustix::time::Timespec| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
    };
    let mono = ns(clock_gettime(ClockId::Monotonic));
    (mono, ns(clock_gettime(ClockId::Realtime)))
}

/// Pure: the wall-clock time of an event stamped `event_ns` on the monotonic clock, from the
/// two clocks read now: the real time now less how long ago it was.
fn wall_time(event_ns: u64, mono_now: u64, real_now: u64) -> SystemTime {
    let ago = mono_now.saturating_sub(event_ns);
    UNIX_EPOCH + Duration::from_nanos(real_now.saturating_sub(ago))
}

/// The memory cgroup's usage and split now (`memory.current`/`usage_in_bytes`, `memory.stat`).
fn memory_now(
    root: &Path,
    version: CgroupVersion,
    rel: &str,
    limit: Option<u64>,
) -> Option<MemorySplit> {
    let dir = root.join(rel.trim_start_matches('/'));
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    let files = version.memory_files();
    let usage = std::fs::read_to_string(dir.join(files.usage))
        .ok()
        .and_then(|s| parse_usage(&s));
    let stat = std::fs::read_to_string(dir.join(files.stat))
        .ok()
        .map(|s| parse_memory_stat(&s));
    if usage.is_none() && stat.is_none() {
        return None;
    }
    Some(MemorySplit {
        limit_bytes: limit,
        usage_bytes: usage,
        shm_bytes: stat.as_ref().and_then(|s| s.shmem),
        anon_bytes: stat.as_ref().and_then(|s| s.anon),
        source: MemorySource::Tracepoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dying_task_shown_at_the_root_and_its_parent_read_from_stat() {
        assert!(at_root("12:memory:/\n0::/\n"));
        assert!(at_root("0::/\n"));
        assert!(!at_root("4:memory:/kubepods/burstable/podx/abc\n"));
        assert_eq!(
            parent_pid("4242 (python3) R 4200 4242 4200 0 -1"),
            Some(4200)
        );
        assert_eq!(parent_pid("7 (a) b) (c) S 3 7 7"), Some(3));
        assert_eq!(parent_pid("7 (trunc"), None);
    }

    #[test]
    fn an_exiting_v1_task_is_placed_by_its_cpuset_path_where_that_names_a_container() {
        let cid = "c".repeat(64);
        let at_root = "12:memory:/\n5:cpuset:/\n0::/\n";
        let path = format!("/kubepods/burstable/pod0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80/{cid}");
        let file = v1_from_cpuset(at_root, &path).unwrap();
        assert_eq!(file, format!("12:memory:{path}\n5:cpuset:/\n0::/\n"));
        assert_eq!(
            identity_of_process(&file).map(|i| i.container_id),
            Some(cid.clone())
        );
        // The root, a path of no container, a v2 file, a forged line: nothing.
        assert_eq!(v1_from_cpuset(at_root, "/"), None);
        assert_eq!(v1_from_cpuset(at_root, "/user.slice"), None);
        assert_eq!(v1_from_cpuset("0::/\n", &path), None);
        assert_eq!(
            v1_from_cpuset(at_root, &format!("{path}\n4:memory:/x")),
            None
        );
    }

    #[test]
    fn a_cgroup_of_its_own_is_read_for_usage_and_split() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubepods/pod1/c1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), "1000\n").unwrap();
        std::fs::write(dir.join("memory.stat"), "anon 300\nfile 5\nshmem 600\n").unwrap();
        let m = memory_now(
            root.path(),
            CgroupVersion::V2,
            "/kubepods/pod1/c1",
            Some(2000),
        )
        .unwrap();
        assert_eq!(
            (m.usage_bytes, m.shm_bytes, m.anon_bytes, m.limit_bytes),
            (Some(1000), Some(600), Some(300), Some(2000))
        );
        assert_eq!(
            memory_now(root.path(), CgroupVersion::V2, "/gone", None),
            None
        );
        assert_eq!(
            memory_now(root.path(), CgroupVersion::V2, "/../etc", None),
            None
        );
    }

    #[test]
    fn the_other_members_of_its_cgroup_are_asked_in_order_but_itself() {
        assert_eq!(members("12\n7\n\nx\n-3\n9\n", 7), [12, 9]);
        let many: String = (1..100).map(|p| format!("{p}\n")).collect();
        assert_eq!(members(&many, 1).len(), MEMBERS);
        assert!(cgroup_members(Path::new("/sys/fs/cgroup"), "/../x", 1).is_empty());
    }

    #[test]
    fn a_gone_process_is_told_with_no_reading() {
        let mut r = MomentReader::new(PathBuf::from("/proc"), None, None);
        let d = r.read(
            Event::Signal {
                sig: 7,
                code: 2,
                pid: i32::MAX,
                comm: "x".into(),
            },
            clocks_now().0,
        );
        assert_eq!(d.cause, TracedCause::BusFault { code: 2 });
        assert_eq!((d.reading, d.cgroup_file), (None, None));
        assert!(!d.read_in_time);
        let off = SystemTime::now().duration_since(d.at).unwrap();
        assert!(off < Duration::from_secs(1), "{off:?}");
        assert!(d.read_after < Duration::from_secs(1));
    }

    /// This test process, by the real /proc: in the host's mount namespace nothing is read.
    #[test]
    fn a_host_process_is_told_without_a_reading() {
        let me = std::process::id() as i32;
        let host = read_ns(std::path::Path::new("/proc"), "self", "mnt").ok();
        let event = || Event::Signal {
            sig: 7,
            code: 2,
            pid: me,
            comm: "x".into(),
        };
        let mut on_host = MomentReader::new(PathBuf::from("/proc"), None, host);
        let d = on_host.read(event(), clocks_now().0);
        assert_eq!((d.cgroup_file, d.reading), (None, None));
        let mut elsewhere = MomentReader::new(PathBuf::from("/proc"), None, None);
        let d = elsewhere.read(event(), clocks_now().0);
        assert!(d.cgroup_file.is_some() && d.reading.is_some());
        // Alive, holding its files: a measured /dev/shm is the moment's.
        let measured = d.reading.as_ref().is_some_and(|r| r.used_bytes.is_some());
        assert_eq!(d.read_in_time, measured, "{:?}", d.reading);
    }

    #[test]
    fn an_event_is_placed_on_the_wall_clock_as_long_ago_as_the_monotonic_clock_says() {
        let real = 1_700_000_000_000_000_000;
        assert_eq!(
            wall_time(5_000_000_000, 5_250_000_000, real),
            UNIX_EPOCH + Duration::from_nanos(real - 250_000_000)
        );
        // A stamp after now (another CPU's clock a hair ahead) is now.
        assert_eq!(
            wall_time(6, 5, real),
            UNIX_EPOCH + Duration::from_nanos(real)
        );
    }
}

//! OOM kills as the memory cgroups count them, for `serve` without the kernel log (the base
//! DaemonSet's `--kmsg off`): a container whose `oom_kill` counter grew between two scans had a
//! process OOM-killed (one that appeared since the scan before: any kill it counted). What the
//! memory was comes from the cgroup's memory.stat read right then,
//! after the kill, and the message says so; the kernel's own report (`oom.rs`) has it at the
//! moment of the kill. A container killed whole is gone with its cgroup before a scan sees it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::detect::shm_share_at_least;
use crate::cgroup::memory::{parse_memory_stat, parse_usage, MemoryStat};
use crate::cgroup::CgroupVersion;
use crate::model::{
    ContainerRef, Detected, FailureSource, FindingKind, MemorySource, MemorySplit, ShmReading,
};

/// The counters seen at the scan before, per container.
#[derive(Debug)]
pub struct OomCounters {
    hierarchy: PathBuf,
    version: CgroupVersion,
    share: f64,
    /// None until the first scan: counts from before the agent started have no time to tell.
    last: Option<HashMap<String, u64>>,
    /// Resumed from saved counts, the first scan not yet read: what it counts grew while the
    /// agent was down.
    resumed: bool,
}

impl OomCounters {
    /// `hierarchy`: the memory hierarchy's root the readings' cgroup paths are under; `share`:
    /// `--oom-shm-share`.
    pub fn new(hierarchy: PathBuf, version: CgroupVersion, share: f64) -> OomCounters {
        OomCounters {
            hierarchy,
            version,
            share,
            last: None,
            resumed: false,
        }
    }

    /// The counts at the last scan (a checkpoint keeps them).
    pub fn counts(&self) -> Option<&HashMap<String, u64>> {
        self.last.as_ref()
    }

    /// Started again: the first scan tells what grew since the counts saved (a container first
    /// seen then counts every kill it holds as since).
    pub fn resume(&mut self, counts: HashMap<String, u64>) {
        self.last = Some(counts);
        self.resumed = true;
    }

    /// The kills counted since the scan before, one failure per container.
    pub fn after_scan(&mut self, readings: &[ShmReading], at: SystemTime) -> Vec<Detected> {
        let now: HashMap<String, u64> = readings
            .iter()
            .filter_map(|r| Some((r.container_id.clone(), r.memory_oom_kills?)))
            .collect();
        let Some(last) = self.last.replace(now) else {
            return Vec::new();
        };
        let late = std::mem::take(&mut self.resumed);
        grown(&last, readings)
            .map(|(r, kills)| {
                let stat = self.stat(&r.cgroup);
                let usage = self.usage(&r.cgroup);
                let mut d = told(r, kills, &stat, usage, self.share, at);
                d.found_late = late;
                d
            })
            .collect()
    }

    fn stat(&self, cgroup: &str) -> MemoryStat {
        let files = self.version.memory_files();
        std::fs::read_to_string(self.dir(cgroup).join(files.stat))
            .map(|s| parse_memory_stat(&s))
            .unwrap_or_default()
    }

    fn usage(&self, cgroup: &str) -> Option<u64> {
        let files = self.version.memory_files();
        std::fs::read_to_string(self.dir(cgroup).join(files.usage))
            .ok()
            .and_then(|s| parse_usage(&s))
    }

    /// Beneath the hierarchy: a reading's path is relative to it, `..` never climbs out.
    fn dir(&self, cgroup: &str) -> PathBuf {
        let rel: PathBuf = Path::new(cgroup)
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .collect();
        self.hierarchy.join(rel)
    }
}

/// Pure: the readings whose counter grew since `last`, with by how much. A container first seen
/// now was not there at the scan before: every kill it counted is since then.
fn grown<'a>(
    last: &'a HashMap<String, u64>,
    readings: &'a [ShmReading],
) -> impl Iterator<Item = (&'a ShmReading, u64)> + 'a {
    readings.iter().filter_map(|r| {
        let before = last.get(&r.container_id).copied().unwrap_or(0);
        let kills = r.memory_oom_kills?.checked_sub(before).filter(|&n| n > 0)?;
        Some((r, kills))
    })
}

/// Pure: the failure a grown counter tells.
fn told(
    r: &ShmReading,
    kills: u64,
    stat: &MemoryStat,
    usage: Option<u64>,
    share: f64,
    at: SystemTime,
) -> Detected {
    let memory = MemorySplit {
        limit_bytes: r.memory_limit_bytes,
        usage_bytes: usage,
        shm_bytes: stat.shmem.or(r.memory_shmem_bytes),
        anon_bytes: stat.anon,
        source: MemorySource::MemoryCgroup,
    };
    let kind = if shm_share_at_least(&memory, share) {
        FindingKind::ShmOomKilled
    } else {
        FindingKind::WorkloadOomKilled
    };
    let who = ContainerRef::by_id(&r.container_id, r.pod_uid.clone());
    let evidence = format!(
        "oom_kill +{kills} in the memory cgroup {} ({})",
        r.cgroup,
        r.memory_oom_kills.unwrap_or(kills)
    );
    let mut d = Detected::new(who, kind, at, FailureSource::MemoryCgroup, &evidence);
    d.memory = Some(memory);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{in_pod, shm_reading, MIB};

    fn reading(id: &str, kills: Option<u64>) -> ShmReading {
        let mut r = in_pod(
            shm_reading(id, 64 * MIB, 60 * MIB),
            "ml",
            "loader-0",
            "u1",
            "loader",
        );
        r.memory_oom_kills = kills;
        r.memory_limit_bytes = Some(64 * MIB);
        r
    }

    #[test]
    fn only_a_counter_that_grew_since_the_scan_before_is_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = OomCounters::new(dir.path().into(), CgroupVersion::V2, 0.5);
        let t = SystemTime::UNIX_EPOCH;
        // The first scan: a count from before the agent started is not told.
        assert!(c
            .after_scan(&[reading("a", Some(3)), reading("b", Some(0))], t)
            .is_empty());
        let told = c.after_scan(
            &[
                reading("a", Some(3)),
                reading("b", Some(2)),
                reading("new", Some(1)),
                reading("unread", None),
            ],
            t,
        );
        assert_eq!(told.len(), 2, "{told:?}");
        assert_eq!(told[0].source, FailureSource::MemoryCgroup);
        assert!(
            told[0].evidence.starts_with("oom_kill +2 "),
            "{}",
            told[0].evidence
        );
        // A container that came and was killed between two scans.
        assert!(
            told[1].evidence.starts_with("oom_kill +1 "),
            "{}",
            told[1].evidence
        );
        // A counter that went down (a new cgroup under the same ID) is not a kill.
        assert!(c.after_scan(&[reading("b", Some(0))], t).is_empty());
    }

    #[test]
    fn a_restart_counts_from_the_saved_counts_and_marks_them_late() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = OomCounters::new(dir.path().into(), CgroupVersion::V2, 0.5);
        let t = SystemTime::UNIX_EPOCH;
        c.after_scan(&[reading("a", Some(1))], t);
        let saved = c.counts().cloned().unwrap();
        let mut c = OomCounters::new(dir.path().into(), CgroupVersion::V2, 0.5);
        c.resume(saved);
        // Killed once more while down: told at the first scan, found late; not the saved one.
        let told = c.after_scan(&[reading("a", Some(2))], t);
        assert_eq!(told.len(), 1);
        assert!(told[0].evidence.starts_with("oom_kill +1 "));
        assert!(told[0].found_late);
        let told = c.after_scan(&[reading("a", Some(3))], t);
        assert!(!told[0].found_late, "after the first scan it is news");
    }

    #[test]
    fn the_split_comes_from_memory_stat_read_after_the_kill() {
        let r = reading("a", Some(1));
        let shm = MemoryStat {
            shmem: Some(62 * MIB),
            anon: Some(MIB),
            hierarchical_memory_limit: None,
        };
        let d = told(&r, 1, &shm, Some(63 * MIB), 0.5, SystemTime::UNIX_EPOCH);
        assert_eq!(d.kind, FindingKind::ShmOomKilled);
        let m = d.memory.unwrap();
        assert_eq!(
            (m.shm_bytes, m.anon_bytes, m.usage_bytes, m.limit_bytes),
            (Some(62 * MIB), Some(MIB), Some(63 * MIB), Some(64 * MIB))
        );
        assert_eq!(m.source, MemorySource::MemoryCgroup);
        let own = MemoryStat {
            shmem: Some(0),
            anon: Some(60 * MIB),
            hierarchical_memory_limit: None,
        };
        let d = told(&r, 1, &own, Some(61 * MIB), 0.5, SystemTime::UNIX_EPOCH);
        assert_eq!(d.kind, FindingKind::WorkloadOomKilled);
    }

    #[test]
    fn a_cgroup_path_never_climbs_out_of_the_hierarchy() {
        let c = OomCounters::new("/h".into(), CgroupVersion::V2, 0.5);
        assert_eq!(
            c.dir("/../../etc/kubepods/x"),
            PathBuf::from("/h/etc/kubepods/x")
        );
    }
}

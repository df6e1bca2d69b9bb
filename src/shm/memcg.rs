//! The memory cgroup a container's tmpfs pages are charged to: limit and headroom, v1 and v2.

use std::collections::HashMap;
use std::io;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReading {
    /// Lowest limit of this cgroup and its ancestors (excluding the hierarchy root).
    pub limit_bytes: Option<u64>,
    /// min over limited cgroups (self and ancestors) of limit - usage, saturating at 0.
    pub headroom_bytes: Option<u64>,
    /// shmem charged to this cgroup per its memory.stat.
    pub shmem_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemcgError {
    #[error("cgroup {0} is gone")]
    Gone(String),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Values >= 2^62 are v1's "no limit" (PAGE_COUNTER_MAX rounded to pages); v2 writes `max`.
pub fn parse_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "max" {
        return None;
    }
    s.parse::<u64>().ok().filter(|&v| v < (1 << 62))
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStat {
    pub shmem: Option<u64>,
    pub hierarchical_memory_limit: Option<u64>,
    pub file: Option<u64>,
    pub anon: Option<u64>,
}

pub fn parse_memory_stat(content: &str) -> MemoryStat {
    let mut stat = MemoryStat::default();
    let mut total_shmem = None;
    for line in content.lines() {
        let mut parts = line.split_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "shmem" => stat.shmem = Some(value),
            "total_shmem" => total_shmem = Some(value),
            "hierarchical_memory_limit" => stat.hierarchical_memory_limit = Some(value),
            "file" | "cache" => stat.file = stat.file.or(Some(value)),
            "anon" | "rss" => stat.anon = stat.anon.or(Some(value)),
            _ => {}
        }
    }
    // v1's total_shmem includes child cgroups; prefer it over the cgroup's own.
    stat.shmem = total_shmem.or(stat.shmem);
    stat
}

/// Reads limits and usage under one hierarchy root, memoising ancestors within a scan so a
/// pod's cgroup is read once however many containers it has.
pub struct MemcgReader {
    root: PathBuf,
    version: CgroupVersion,
    memo: HashMap<String, Option<(u64, u64)>>,
}

impl MemcgReader {
    pub fn new(hierarchy_root: PathBuf, version: CgroupVersion) -> Self {
        MemcgReader {
            root: hierarchy_root,
            version,
            memo: HashMap::new(),
        }
    }

    /// Forgets memoised ancestors: called at the start of each scan.
    pub fn start_scan(&mut self) {
        self.memo.clear();
    }

    pub fn read(&mut self, rel_path: &str) -> Result<MemoryReading, MemcgError> {
        let rel = Path::new(rel_path.trim_start_matches('/'));
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(MemcgError::Gone(rel_path.to_string()));
        }
        let leaf = self.root.join(rel);
        let (limit_file, _, _) = self.files();
        let mut reading = MemoryReading::default();
        // The leaf must exist: a missing leaf means the container is gone.
        match self.limit_and_usage(&leaf) {
            Ok(lu) => self.memo.insert(rel_path.to_string(), lu),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MemcgError::Gone(rel_path.to_string()))
            }
            Err(source) => {
                return Err(MemcgError::Io {
                    path: leaf.join(limit_file).display().to_string(),
                    source,
                })
            }
        };
        let mut ancestors: Vec<&Path> = rel.ancestors().collect();
        ancestors.pop(); // the hierarchy root itself has no limit
        for dir in ancestors {
            let key = format!("/{}", dir.display());
            let lu = match self.memo.get(&key) {
                Some(lu) => *lu,
                None => {
                    let lu = self.limit_and_usage(&self.root.join(dir)).unwrap_or(None);
                    self.memo.insert(key, lu);
                    lu
                }
            };
            if let Some((limit, usage)) = lu {
                let headroom = limit.saturating_sub(usage);
                reading.limit_bytes = Some(reading.limit_bytes.map_or(limit, |l| l.min(limit)));
                reading.headroom_bytes =
                    Some(reading.headroom_bytes.map_or(headroom, |h| h.min(headroom)));
            }
        }
        let (_, _, stat_file) = self.files();
        reading.shmem_bytes = std::fs::read_to_string(leaf.join(stat_file))
            .ok()
            .and_then(|s| parse_memory_stat(&s).shmem);
        Ok(reading)
    }

    fn files(&self) -> (&'static str, &'static str, &'static str) {
        match self.version {
            CgroupVersion::V1 => (
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
            ),
            CgroupVersion::V2 => ("memory.max", "memory.current", "memory.stat"),
        }
    }

    /// (limit, usage) of one cgroup; `None` when it has no limit or its files are garbage.
    fn limit_and_usage(&self, dir: &Path) -> io::Result<Option<(u64, u64)>> {
        let (limit_file, usage_file, _) = self.files();
        let Some(limit) = parse_limit(&std::fs::read_to_string(dir.join(limit_file))?) else {
            return Ok(None);
        };
        let usage = std::fs::read_to_string(dir.join(usage_file))?;
        Ok(usage.trim().parse().ok().map(|u| (limit, u)))
    }
}

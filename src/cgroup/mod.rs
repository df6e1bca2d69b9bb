//! What shmlink knows about cgroups, in one place: the versions and their memory files, where
//! the memory hierarchy is, what a cgroup path says about its container (`path`), where
//! /proc/PID/cgroup and mountinfo put a process's memory cgroup (`proc`), and a memory cgroup's
//! limits (`memory`).

pub mod memory;
pub mod path;
pub mod proc;

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CgroupVersion {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

/// The memory controller's files of one cgroup, as a version names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFiles {
    pub limit: &'static str,
    pub usage: &'static str,
    pub stat: &'static str,
    /// Where the cgroup counts its OOM kills (`oom_kill N`): v1 since Linux 4.13.
    pub oom_events: &'static str,
}

impl CgroupVersion {
    /// "v1" or "v2", as JSON and text print it.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }

    pub fn memory_files(self) -> MemoryFiles {
        match self {
            CgroupVersion::V1 => MemoryFiles {
                limit: "memory.limit_in_bytes",
                usage: "memory.usage_in_bytes",
                stat: "memory.stat",
                oom_events: "memory.oom_control",
            },
            CgroupVersion::V2 => MemoryFiles {
                limit: "memory.max",
                usage: "memory.current",
                stat: "memory.stat",
                oom_events: "memory.events",
            },
        }
    }
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The hierarchy under `cgroup_root` whose cgroups carry memory accounting: the unified tree on
/// cgroup v2, the `memory` controller's tree on v1 (hybrid hosts mount v2 at `unified/` beside
/// it). `None` when there is none.
pub fn memory_hierarchy(cgroup_root: &Path) -> Option<(PathBuf, CgroupVersion)> {
    let root = cgroup_root;
    if has_memory_controller(&root.join("cgroup.controllers")) {
        return Some((root.to_path_buf(), CgroupVersion::V2));
    }
    let v1 = root.join("memory");
    if v1.join(CgroupVersion::V1.memory_files().usage).exists() || v1.join("cgroup.procs").exists()
    {
        return Some((v1, CgroupVersion::V1));
    }
    let unified = root.join("unified");
    if has_memory_controller(&unified.join("cgroup.controllers")) {
        return Some((unified, CgroupVersion::V2));
    }
    // A v2 root that delegates no memory controller still groups processes into containers.
    if root.join("cgroup.controllers").exists() {
        return Some((root.to_path_buf(), CgroupVersion::V2));
    }
    None
}

fn has_memory_controller(controllers: &Path) -> bool {
    crate::procfs::kfile::read_attribute_text(controllers)
        .map(|s| s.split_whitespace().any(|c| c == "memory"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_print_and_serialize_as_v1_and_v2() {
        for (version, text) in [(CgroupVersion::V1, "v1"), (CgroupVersion::V2, "v2")] {
            assert_eq!(version.to_string(), text);
            assert_eq!(serde_json::to_value(version).unwrap(), text);
        }
    }

    #[test]
    fn a_v2_root_with_memory_is_the_memory_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert_eq!(
            memory_hierarchy(dir.path()).unwrap(),
            (dir.path().to_path_buf(), CgroupVersion::V2)
        );
    }

    #[test]
    fn a_hybrid_host_uses_the_v1_memory_controller() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("memory")).unwrap();
        std::fs::write(dir.path().join("memory/memory.usage_in_bytes"), "1\n").unwrap();
        std::fs::create_dir_all(dir.path().join("unified")).unwrap();
        std::fs::write(dir.path().join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(
            memory_hierarchy(dir.path()).unwrap(),
            (dir.path().join("memory"), CgroupVersion::V1)
        );
    }
}

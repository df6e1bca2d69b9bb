//! Pure: where /proc/PID/cgroup puts a process, and where a mountinfo shows that cgroup's
//! hierarchy mounted (a container sees its own cgroup, or more of the tree, under a mount).

use super::path::{parse_cgroup_path, CgroupIdentity};
use super::CgroupVersion;
use crate::procfs::mountinfo;

/// The memory cgroup /proc/PID/cgroup names, with its version. v1's `memory` controller wins
/// over v2's unified hierarchy (hybrid hosts keep memory on v1); `None` when neither is named.
pub fn memory_cgroup(proc_cgroup: &str) -> Option<(&str, CgroupVersion)> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        // hierarchy-ID:controller-list:cgroup-path; the path itself may hold colons.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    match (v1, v2) {
        (Some(p), _) => Some((p, CgroupVersion::V1)),
        (None, Some(p)) => Some((p, CgroupVersion::V2)),
        (None, None) => None,
    }
}

/// A process's memory cgroup and where its directory is in this mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLocation {
    /// The cgroup path as /proc/PID/cgroup names it.
    pub cgroup: String,
    pub version: CgroupVersion,
    /// Where the hierarchy is mounted in this container.
    pub mount_point: String,
    /// The cgroup's directory relative to the mount point ("" = the mount point itself).
    pub rel: String,
}

/// What a process's memory cgroup, as its `/proc/PID/cgroup` names it, says of its container.
pub fn identity_of_process(proc_cgroup: &str) -> Option<CgroupIdentity> {
    parse_cgroup_path(memory_cgroup(proc_cgroup)?.0)
}

/// The memory cgroup of a process from its `/proc/PID/cgroup` and `/proc/PID/mountinfo`: the
/// mount of its hierarchy whose root holds the cgroup, the most specific one.
pub fn locate_memory_cgroup(proc_cgroup: &str, mountinfo: &str) -> Result<CgroupLocation, String> {
    let Some((cgroup, version)) = memory_cgroup(proc_cgroup) else {
        return Err("/proc/self/cgroup names no memory cgroup".into());
    };
    let mount = mountinfo
        .lines()
        .filter_map(mountinfo::parse_line)
        .filter(|m| match version {
            CgroupVersion::V1 => {
                m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "memory")
            }
            CgroupVersion::V2 => m.fs_type == "cgroup2",
        })
        // Prefer the mount whose root holds our cgroup, most specific (longest) root first.
        .filter(|m| under(cgroup, &m.root).is_some())
        .max_by_key(|m| m.root.len());
    let Some(mount) = mount else {
        return Err(format!(
            "no {} memory cgroup mounted here holds {cgroup}",
            match version {
                CgroupVersion::V1 => "cgroup v1",
                CgroupVersion::V2 => "cgroup2",
            }
        ));
    };
    Ok(CgroupLocation {
        rel: under(cgroup, &mount.root).unwrap_or_default().to_string(),
        cgroup: cgroup.to_string(),
        version,
        mount_point: mount.mount_point,
    })
}

/// `path` relative to `root` when it lies beneath it (or is it).
fn under<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_found_through_mountinfo_v1_v2_and_cgroupns() {
        // Docker on cgroup v1: only the container's own cgroup is mounted.
        let mi = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let loc = locate_memory_cgroup("4:memory:/docker/abc\n1:cpu:/docker/abc\n", mi).unwrap();
        assert_eq!(
            (loc.version, loc.mount_point.as_str(), loc.rel.as_str()),
            (CgroupVersion::V1, "/sys/fs/cgroup/memory", "")
        );
        // The host's whole hierarchy mounted: the cgroup is below the mount point.
        let mi = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let loc = locate_memory_cgroup("4:memory:/kubepods/pod1/c\n", mi).unwrap();
        assert_eq!(loc.rel, "kubepods/pod1/c");
        // cgroup v2 with a cgroup namespace: "/" is the container's own cgroup.
        let mi = "40 30 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let loc = locate_memory_cgroup("0::/\n", mi).unwrap();
        assert_eq!((loc.version, loc.rel.as_str()), (CgroupVersion::V2, ""));
        // A hybrid host: memory is on v1.
        let mi = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                  36 31 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let loc = locate_memory_cgroup("4:memory:/a\n0::/a\n", mi).unwrap();
        assert_eq!(loc.version, CgroupVersion::V1);
        // No mount that holds it.
        let mi = "35 31 0:32 /other /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        assert!(locate_memory_cgroup("4:memory:/docker/abc\n", mi).is_err());
        assert!(locate_memory_cgroup("", "").is_err());
        // "/docker/abcdef" is not under "/docker/abc".
        let mi = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        assert!(locate_memory_cgroup("4:memory:/docker/abcdef\n", mi).is_err());
    }
}

//! The host as the agent sees it: where its /proc and cgroup trees are, and which namespaces
//! are the host's. Every path the scanners read goes through [`HostPaths`], so tests and a
//! DaemonSet (`/host/proc`) run the same code.

use std::io;
use std::path::{Path, PathBuf};

use crate::cgroup::{self, CgroupVersion};

#[derive(Debug, Clone)]
pub struct HostPaths {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
}

/// A namespace's inode number, as in the `mnt:[4026531840]` link text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsId(pub u64);

/// Parses `mnt:[4026531840]` (the text of a /proc/PID/ns/* link).
pub fn parse_ns_link(text: &str) -> Option<NsId> {
    let (_, rest) = text.split_once(":[")?;
    rest.strip_suffix(']')?.parse().ok().map(NsId)
}

/// Reads /proc/PID/ns/<kind> under the proc root (`pid` may be "self").
pub fn read_ns(proc_root: &Path, pid: &str, kind: &str) -> io::Result<NsId> {
    let link = std::fs::read_link(proc_root.join(pid).join("ns").join(kind))?;
    link.to_str()
        .and_then(parse_ns_link)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "odd namespace link"))
}

/// Whose namespaces were taken as the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsSource {
    /// PID 1 of the proc root: the host's init.
    Pid1,
    /// PID 1's were unreadable (a hardened init holding capabilities the agent lacks); the
    /// agent's own are used, which is right when it runs in the host's namespaces.
    Agent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostNamespaces {
    pub mnt: NsId,
    pub ipc: Option<NsId>,
    pub source: NsSource,
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read the host's mount namespace from {proc}/1/ns/mnt ({pid1}) nor the agent's own ({own})")]
    Namespaces {
        proc: String,
        pid1: io::Error,
        own: io::Error,
    },
    #[error("no memory cgroup hierarchy under {0} (looked for cgroup v2 cgroup.controllers, v1 memory/, unified/)")]
    NoMemoryHierarchy(String),
}

impl HostPaths {
    pub fn host_namespaces(&self) -> Result<HostNamespaces, HostError> {
        let pid1 = match read_ns(&self.proc_root, "1", "mnt") {
            Ok(mnt) => {
                return Ok(HostNamespaces {
                    mnt,
                    ipc: read_ns(&self.proc_root, "1", "ipc").ok(),
                    source: NsSource::Pid1,
                })
            }
            Err(e) => e,
        };
        // "self" under a foreign proc root still names the agent when it shares the host's PID
        // namespace (hostPID); /proc/self is the fallback when that proc root has no "self".
        let own_root = [self.proc_root.as_path(), Path::new("/proc")]
            .into_iter()
            .find(|root| read_ns(root, "self", "mnt").is_ok());
        match own_root {
            Some(root) => Ok(HostNamespaces {
                mnt: read_ns(root, "self", "mnt").map_err(|own| HostError::Namespaces {
                    proc: self.proc_root.display().to_string(),
                    pid1: copy_err(&pid1),
                    own,
                })?,
                ipc: read_ns(root, "self", "ipc").ok(),
                source: NsSource::Agent,
            }),
            None => Err(HostError::Namespaces {
                proc: self.proc_root.display().to_string(),
                own: read_ns(Path::new("/proc"), "self", "mnt").unwrap_err(),
                pid1,
            }),
        }
    }

    /// The hierarchy whose cgroups carry memory accounting (see [`cgroup::memory_hierarchy`]).
    pub fn memory_hierarchy(&self) -> Result<(PathBuf, CgroupVersion), HostError> {
        cgroup::memory_hierarchy(&self.cgroup_root)
            .ok_or_else(|| HostError::NoMemoryHierarchy(self.cgroup_root.display().to_string()))
    }
}

fn copy_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Whether `proc_root` lists any process (a directory named by a PID): false for a path that
/// is not a proc file system (a typo, nothing mounted), where every scan would find nothing.
pub fn has_processes(proc_root: &Path) -> bool {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return false;
    };
    dir.filter_map(Result::ok)
        .any(|e| is_pid(&e.file_name()) && e.file_type().is_ok_and(|t| t.is_dir()))
}

fn is_pid(name: &std::ffi::OsStr) -> bool {
    let b = name.as_encoded_bytes();
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

/// The machine's host name (the default node name outside Kubernetes).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_links_parse() {
        assert_eq!(parse_ns_link("mnt:[4026531840]"), Some(NsId(4026531840)));
        assert_eq!(parse_ns_link("ipc:[1]"), Some(NsId(1)));
        assert_eq!(parse_ns_link("mnt:[x]"), None);
        assert_eq!(parse_ns_link("mnt:4026531840"), None);
        assert_eq!(parse_ns_link(""), None);
    }

    #[test]
    fn a_proc_root_without_pids_has_no_processes() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_processes(dir.path()));
        assert!(!has_processes(&dir.path().join("absent")));
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("12"), "").unwrap();
        assert!(
            !has_processes(dir.path()),
            "a file named by a number is no process"
        );
        std::fs::create_dir(dir.path().join("4242")).unwrap();
        assert!(has_processes(dir.path()));
        assert!(has_processes(Path::new("/proc")));
        assert!(!is_pid("12a".as_ref()) && !is_pid("".as_ref()));
    }

    #[test]
    fn no_hierarchy_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostPaths {
            proc_root: "/proc".into(),
            cgroup_root: dir.path().into(),
        };
        assert!(matches!(
            host.memory_hierarchy(),
            Err(HostError::NoMemoryHierarchy(_))
        ));
    }

    #[test]
    fn the_agents_own_namespaces_stand_in_when_pid1_is_unreadable() {
        // A proc root with no PID 1 plays the hardened init: the agent's namespaces are used.
        let dir = tempfile::tempdir().unwrap();
        let host = HostPaths {
            proc_root: dir.path().into(),
            cgroup_root: "/sys/fs/cgroup".into(),
        };
        let ns = host.host_namespaces().unwrap();
        assert_eq!(ns.source, NsSource::Agent);
        assert_eq!(ns.mnt, read_ns(Path::new("/proc"), "self", "mnt").unwrap());
    }
}

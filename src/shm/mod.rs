//! Per-container /dev/shm discovery.
//!
//! A container is a cgroup whose processes live in a mount namespace other than the host's.
//! The scan walks the memory cgroup hierarchy (not every process), so its cost grows with
//! cgroups, and reads one process per cgroup: its namespaces, its /dev/shm (statvfs of the
//! mount, which counts unlinked-but-open files that `du` misses) and its memory cgroup.

pub mod cgroup;
pub mod memcg;
pub mod mountinfo;
pub mod statfs;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use crate::host::{read_ns, HostError, HostNamespaces, HostPaths, NsId, NsSource};
use crate::snapshot::{short_id, ShmReading, ShmStatus};
use memcg::{MemcgError, MemcgReader, MemoryReading};
use mountinfo::MountEntry;
use statfs::{OpenShmError, ShmStat};

/// How many of a cgroup's processes to try before giving up on it (they may all be exiting).
const PIDS_TO_TRY: usize = 8;

/// The result of one shm scan.
#[derive(Debug, Default)]
pub struct ShmScan {
    pub readings: Vec<ShmReading>,
    /// Real errors (permission, I/O); vanished processes and cgroups are not errors.
    pub errors: u64,
}

/// The /dev/shm mount last seen in a mount namespace, so mountinfo is re-read only when the
/// mount at /dev/shm changes (its statx mount ID differs), not on every scan.
#[derive(Debug, Clone)]
struct CachedMount {
    mount_id: Option<u64>,
    entry: Option<MountEntry>,
}

/// Keeps what outlives one scan: the host's namespaces, the mountinfo cache, and which
/// problems were already logged.
pub struct ShmScanner {
    proc_root: PathBuf,
    hierarchy: PathBuf,
    host_ns: HostNamespaces,
    memcg: MemcgReader,
    mounts: HashMap<NsId, CachedMount>,
    logged: HashSet<String>,
}

impl ShmScanner {
    pub fn new(host: &HostPaths) -> Result<Self, HostError> {
        let host_ns = host.host_namespaces()?;
        if host_ns.source == NsSource::Agent {
            tracing::info!(
                proc_root = %host.proc_root.display(),
                "PID 1's namespaces are unreadable; taking the agent's own as the host's"
            );
        }
        let (hierarchy, version) = host.memory_hierarchy()?;
        tracing::debug!(hierarchy = %hierarchy.display(), ?version, "memory cgroup hierarchy");
        Ok(ShmScanner {
            proc_root: host.proc_root.clone(),
            memcg: MemcgReader::new(hierarchy.clone(), version),
            hierarchy,
            host_ns,
            mounts: HashMap::new(),
            logged: HashSet::new(),
        })
    }

    pub fn host_namespaces(&self) -> HostNamespaces {
        self.host_ns
    }

    /// One pass over the hierarchy. Never fails as a whole: what cannot be read is counted.
    pub fn scan(&mut self) -> ShmScan {
        self.memcg.start_scan();
        let mut out = ShmScan::default();
        let mut live_ns = HashSet::new();
        // (directory, path relative to the hierarchy, mount ns of the nearest container above)
        let mut stack: Vec<(PathBuf, String, Option<NsId>)> = Vec::new();
        self.push_children(&self.hierarchy.clone(), "", None, &mut stack, &mut out);
        while let Some((dir, rel, outer)) = stack.pop() {
            let mut inner = outer;
            match self.first_process(&dir, &rel, &mut out) {
                Some((pid, mnt)) if mnt != self.host_ns.mnt && Some(mnt) != outer => {
                    live_ns.insert(mnt);
                    if let Some(reading) = self.measure(pid, mnt, &rel, &mut out) {
                        out.readings.push(reading);
                    }
                    inner = Some(mnt);
                }
                _ => {}
            }
            self.push_children(&dir, &rel, inner, &mut stack, &mut out);
        }
        self.mounts.retain(|ns, _| live_ns.contains(ns));
        out.readings.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
        out
    }

    fn push_children(
        &mut self,
        dir: &Path,
        rel: &str,
        outer: Option<NsId>,
        stack: &mut Vec<(PathBuf, String, Option<NsId>)>,
        out: &mut ShmScan,
    ) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if is_vanished(&e) => return,
            Err(e) => return self.error(out, "readdir", &dir.display().to_string(), &e),
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                stack.push((entry.path(), format!("{rel}/{name}"), outer));
            }
        }
    }

    /// The first live process of a cgroup and its mount namespace.
    fn first_process(&mut self, dir: &Path, rel: &str, out: &mut ShmScan) -> Option<(i32, NsId)> {
        let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(procs) => procs,
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "cgroup.procs", rel, &e);
                return None;
            }
        };
        for pid in procs
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .take(PIDS_TO_TRY)
        {
            match read_ns(&self.proc_root, &pid.to_string(), "mnt") {
                Ok(ns) => return Some((pid, ns)),
                Err(e) if is_vanished(&e) => continue,
                Err(e) => {
                    self.error(out, "ns/mnt", rel, &e);
                    return None;
                }
            }
        }
        None
    }

    /// Measures one container; `None` when it vanished while being measured.
    fn measure(&mut self, pid: i32, mnt: NsId, rel: &str, out: &mut ShmScan) -> Option<ShmReading> {
        let identity = cgroup::parse_cgroup_path(rel);
        let container_id = identity.as_ref().map_or_else(
            || rel.rsplit('/').next().unwrap_or_default().to_string(),
            |id| id.container_id.clone(),
        );
        let host_ipc = match (
            read_ns(&self.proc_root, &pid.to_string(), "ipc"),
            self.host_ns.ipc,
        ) {
            (Ok(ipc), Some(host)) => ipc == host,
            (Err(e), _) if is_vanished(&e) => return None,
            _ => false,
        };
        let shm = self.stat_shm(pid, mnt, rel, &container_id, out)?;
        let memory = match self.memcg.read(rel) {
            Ok(memory) => memory,
            Err(MemcgError::Gone(_)) => return None,
            Err(e) => {
                self.error(out, "memory cgroup", rel, &e);
                MemoryReading::default()
            }
        };
        Some(build_reading(
            identity,
            container_id,
            pid,
            rel,
            host_ipc,
            shm,
            memory,
        ))
    }

    /// statvfs of /dev/shm with the mount's details; `None` when the process is gone.
    fn stat_shm(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        container_id: &str,
        out: &mut ShmScan,
    ) -> Option<Option<(ShmStat, Option<MountEntry>)>> {
        let root = match statfs::open_container_root(&self.proc_root, pid) {
            Ok(root) => root,
            Err(OpenShmError::Absent(_)) => return None,
            Err(e) => {
                self.error(out, "container root", rel, &e);
                return Some(None);
            }
        };
        let stat = match statfs::open_beneath(&root, "dev/shm")
            .and_then(|fd| statfs::measure(&fd).map_err(OpenShmError::Io))
        {
            Ok(stat) => stat,
            Err(OpenShmError::Absent(_)) => return Some(None),
            Err(OpenShmError::Symlink) => {
                self.warn_once(
                    format!("symlink {rel}"),
                    format_args!(
                        "container {}: /dev/shm is reached through a symlink; not followed, reported as not mounted",
                        short_id(container_id)
                    ),
                );
                return Some(None);
            }
            Err(e) => {
                self.error(out, "statvfs /dev/shm", rel, &e);
                return Some(None);
            }
        };
        if stat.is_mount_root == Some(false) {
            // A plain directory on the container's root file system: nothing is mounted there.
            return Some(None);
        }
        let entry = self.mount_entry(pid, mnt, stat.mount_id, rel, out)?;
        match (&entry, stat.is_mount_root) {
            // Without statx, mountinfo alone tells whether something is mounted at /dev/shm.
            (None, None) => Some(None),
            _ => Some(Some((stat, entry))),
        }
    }

    /// The /dev/shm line of the process's mountinfo, from the cache when the mount is unchanged.
    fn mount_entry(
        &mut self,
        pid: i32,
        mnt: NsId,
        mount_id: Option<u64>,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Option<MountEntry>> {
        if let Some(cached) = self.mounts.get(&mnt) {
            if mount_id.is_some() && cached.mount_id == mount_id {
                return Some(cached.entry.clone());
            }
        }
        let path = self.proc_root.join(pid.to_string()).join("mountinfo");
        // Bytes, not UTF-8: one mount point with odd bytes elsewhere must not hide /dev/shm.
        let text = match std::fs::read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "mountinfo", rel, &e);
                return Some(None);
            }
        };
        let entry = mountinfo::find_mount(&text, "/dev/shm")
            // The mountinfo line must describe the mount we measured, not one stacked elsewhere.
            .filter(|e| mount_id.is_none_or(|id| id == e.mount_id));
        self.mounts.insert(
            mnt,
            CachedMount {
                mount_id,
                entry: entry.clone(),
            },
        );
        Some(entry)
    }

    fn error(&mut self, out: &mut ShmScan, what: &str, subject: &str, e: &dyn std::fmt::Display) {
        out.errors += 1;
        self.warn_once(
            format!("{what} {subject}"),
            format_args!("reading {what} of {subject}: {e}"),
        );
    }

    /// Logs a problem once per key at warn, then at debug: a broken entry must not spam logs.
    fn warn_once(&mut self, key: String, message: std::fmt::Arguments<'_>) {
        if self.logged.len() < 10_000 && self.logged.insert(key) {
            tracing::warn!("{message}");
        } else {
            tracing::debug!("{message}");
        }
    }
}

fn build_reading(
    identity: Option<cgroup::CgroupIdentity>,
    container_id: String,
    pid: i32,
    rel: &str,
    host_ipc: bool,
    shm: Option<(ShmStat, Option<MountEntry>)>,
    memory: MemoryReading,
) -> ShmReading {
    let (mounted, fs_type, size, used, tmpfs_free) = match &shm {
        Some((stat, entry)) => (
            true,
            entry
                .as_ref()
                .map(|e| e.fs_type.clone())
                .or_else(|| stat.is_tmpfs.then(|| "tmpfs".to_string())),
            stat.size_bytes(),
            stat.used_bytes(),
            stat.size_bytes().map(|_| stat.free_bytes),
        ),
        None => (false, None, None, None, None),
    };
    let available = if mounted {
        match (tmpfs_free, memory.headroom_bytes) {
            (Some(free), Some(headroom)) => Some(free.min(headroom)),
            (free, headroom) => free.or(headroom),
        }
    } else {
        None
    };
    ShmReading {
        namespace: None,
        pod: None,
        pod_uid: identity.as_ref().and_then(|i| i.pod_uid.clone()),
        container: None,
        container_id,
        pid,
        cgroup: rel.to_string(),
        host_ipc,
        mounted,
        fs_type,
        size_bytes: size,
        used_bytes: used,
        available_bytes: available,
        memory_limit_bytes: memory.limit_bytes,
        memory_shmem_bytes: memory.shmem_bytes,
        status: ShmStatus::Ok,
    }
}

/// ENOENT / ESRCH: a process or cgroup that ended while we looked. Not an error.
fn is_vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
}

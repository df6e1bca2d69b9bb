//! Per-container /dev/shm discovery.
//!
//! A container is a cgroup whose processes live in a mount namespace other than the host's.
//! The scan walks the memory cgroup hierarchy (not every process), so its cost grows with
//! cgroups, and reads one process per cgroup: its namespaces, its /dev/shm (statvfs of the
//! mount, which counts unlinked-but-open files that `du` misses) and its memory cgroup.

pub mod at_death;
pub mod deadline;
pub mod leftovers;
mod look;
mod mounts;
pub mod peak;
pub mod sandbox;
mod seen_ns;
pub mod statfs;
pub mod status;
mod trusted;
mod walk;

use std::collections::{HashMap, HashSet};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::SystemTime;

use crate::cgroup::memory::{MemcgError, MemcgReader, MemoryReading, OpenDir};
use crate::cgroup::path::{is_pod_cgroup, parse_cgroup_path};
use crate::cgroup::CgroupVersion;
use crate::host::{HostError, HostNamespaces, HostPaths, NsId, NsSource};
use crate::model::{Leftovers, ShmReading, Sight};
use crate::procfs::kept::KeptFiles;
use crate::procfs::kfile::FileReader;
use deadline::Measurer;
use look::build_reading;
use mounts::CachedMount;
use walk::{dir_stat, Pending};

/// The result of one shm scan.
#[derive(Debug, Default)]
pub struct ShmScan {
    pub readings: Vec<ShmReading>,
    /// Real errors (permission, I/O); vanished processes and cgroups are not errors.
    pub errors: u64,
    /// What the scan could look into: the ground for calling it blind.
    pub sight: Sight,
    /// The Pods' sandbox /dev/shm on the host (`sandbox`), tied to their Pods.
    pub sandboxes: Vec<ShmReading>,
}

/// Keeps what outlives one scan: the host's namespaces, the mountinfo cache, and which
/// problems were already logged.
pub struct ShmScanner {
    proc_root: PathBuf,
    /// The cgroup root, looked at again each scan while it holds no memory hierarchy.
    cgroup_root: PathBuf,
    /// The memory hierarchy; the cgroup root itself, unused, while `found` is false.
    hierarchy: PathBuf,
    found: bool,
    read_shmem: bool,
    read_oom_kills: bool,
    host_ns: HostNamespaces,
    memcg: MemcgReader,
    /// The /dev/shm mount last seen by each measured process in its mount namespace.
    mounts: HashMap<Viewer, CachedMount>,
    /// The root and /dev mounts found trusted to look in, by each measured process.
    trusted: HashMap<Viewer, trusted::Trusted>,
    logged: HashSet<String>,
    files: FileReader,
    /// The cgroups' cgroup.procs, kept open across scans.
    kept: KeptFiles,
    /// Whether the hierarchy is cgroup v1 (whose cgroup.procs a kept handle may read stale).
    v1: bool,
    /// A reused buffer for /proc paths.
    path: Vec<u8>,
    /// getdents64's buffer.
    dirents: Vec<MaybeUninit<u8>>,
    /// Each measured process, by PID: its container, when it started, and what its /dev/shm
    /// held from before (both read once: neither changes; a PID reused by another container is
    /// read again).
    starts: HashMap<i32, Started>,
    /// /dev/shm measured where a deadline can end it.
    measurer: Measurer,
    /// Containers whose /dev/shm did not answer in time: not asked again.
    hung: HashSet<String>,
    sandboxes: sandbox::SandboxShm,
    /// The wall-clock time of boot, read once per scan when a process's start is wanted.
    boot: Option<Option<SystemTime>>,
    /// Each cgroup directory's subdirectories as last listed, and the scan that last used them
    /// (`walk::push_children`: queued again while its link count matches).
    listings: HashMap<String, (Vec<String>, u64)>,
    /// Scans begun.
    scans: u64,
    /// The namespaces of each cgroup's measured process, read once a minute.
    seen_ns: seen_ns::SeenNs,
}

/// Whose view of the mounts a cached mount or trust describes: a mount namespace as one process
/// sees it. The kernel hands out mount IDs and namespace inode numbers lowest-free, so a
/// container that starts as another goes often gets the gone one's namespace number and, for one
/// of its mounts, the gone one's root mount ID: keyed by the namespace alone, a FUSE at that ID
/// would have been trusted as the gone container's overlay and looked in. PIDs are handed out in
/// turn, not lowest-free, so the three do not meet again by chance.
pub(super) type Viewer = (NsId, i32);

/// Processes remembered at most (then forgotten all at once and read again).
const STARTS: usize = 16_384;

/// Pure: `at` when it is at most [`leftovers::YOUNG`] ago.
fn young(at: Option<SystemTime>) -> Option<SystemTime> {
    at.filter(|at| {
        SystemTime::now()
            .duration_since(*at)
            .is_ok_and(|age| age <= leftovers::YOUNG)
    })
}

struct Started {
    container_id: String,
    at: Option<SystemTime>,
    /// Listed once, while young: None until then.
    inherited: Option<Option<Leftovers>>,
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
        // No hierarchy is no reason to stop: each scan says it is blind, and looks again.
        let found = host.memory_hierarchy();
        if let Err(e) = &found {
            tracing::info!("{e}: no container can be measured until one appears");
        }
        let (hierarchy, version) = found
            .as_ref()
            .cloned()
            .unwrap_or_else(|_| (host.cgroup_root.clone(), CgroupVersion::V2));
        tracing::debug!(hierarchy = %hierarchy.display(), ?version, "memory cgroup hierarchy");
        Ok(ShmScanner {
            proc_root: host.proc_root.clone(),
            cgroup_root: host.cgroup_root.clone(),
            memcg: MemcgReader::new(hierarchy.clone(), version),
            hierarchy,
            found: found.is_ok(),
            read_shmem: true,
            read_oom_kills: false,
            host_ns,
            mounts: HashMap::new(),
            trusted: HashMap::new(),
            logged: HashSet::new(),
            files: FileReader::default(),
            kept: KeptFiles::default(),
            v1: version == CgroupVersion::V1,
            path: Vec::with_capacity(64),
            dirents: vec![MaybeUninit::uninit(); 16 * 1024],
            starts: HashMap::new(),
            measurer: Measurer::default(),
            hung: HashSet::new(),
            sandboxes: sandbox::SandboxShm::new(host.proc_root.join(match host_ns.source {
                NsSource::Agent => "self",
                _ => "1",
            })),
            boot: None,
            listings: HashMap::new(),
            scans: 0,
            seen_ns: seen_ns::SeenNs::default(),
        })
    }

    /// Whether readings carry `memory_shmem_bytes` (memory.stat): on unless turned off.
    pub fn set_read_shmem(&mut self, on: bool) {
        self.read_shmem = on;
        self.memcg.set_read_shmem(on);
    }

    /// Whether readings carry `memory_oom_kills`: off unless turned on.
    pub fn set_read_oom_kills(&mut self, on: bool) {
        self.read_oom_kills = on;
        self.memcg.set_read_oom_kills(on);
    }

    /// Whether a memory hierarchy is there to walk; one that appeared since is taken up.
    fn hierarchy_found(&mut self) -> bool {
        if self.found {
            return true;
        }
        let Some((hierarchy, version)) = crate::cgroup::memory_hierarchy(&self.cgroup_root) else {
            return false;
        };
        tracing::info!(hierarchy = %hierarchy.display(), "a memory cgroup hierarchy appeared");
        self.memcg = MemcgReader::new(hierarchy.clone(), version);
        self.memcg.set_read_shmem(self.read_shmem);
        self.memcg.set_read_oom_kills(self.read_oom_kills);
        self.v1 = version == CgroupVersion::V1;
        self.hierarchy = hierarchy;
        self.found = true;
        true
    }

    pub fn host_namespaces(&self) -> HostNamespaces {
        self.host_ns
    }

    /// One pass over the hierarchy. Never fails as a whole: what cannot be read is counted.
    ///
    /// A cgroup directory is opened only to be listed; the others are looked at by a short path
    /// beneath the nearest one opened (`walk::CgDir`), and their files (cgroup.procs, the memory
    /// files), opened the same way, are kept open across scans: the least system calls per
    /// cgroup (see BENCHMARKS.md).
    pub fn scan(&mut self) -> ShmScan {
        let mut out = ShmScan::default();
        out.sight.proc_root = self.proc_root.display().to_string();
        out.sight.cgroup_root = self.cgroup_root.display().to_string();
        out.sight.processes = crate::host::has_processes(&self.proc_root);
        out.sight.cgroup_hierarchy = self.hierarchy_found();
        if !out.sight.cgroup_hierarchy {
            return out;
        }
        self.memcg.start_scan();
        self.boot = None;
        self.scans += 1;
        self.walk(&mut out);
        // What the walk did not read again (gone cgroups) is closed now.
        self.kept.end_pass();
        self.memcg.end_scan();
        out.readings.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
        out.sight.measured = out.readings.iter().filter(|r| r.mounted.is_some()).count() as u64;
        out.sandboxes = self.sandboxes.scan(&out.readings, &mut out.errors);
        out
    }

    /// The walk of the hierarchy, each container measured as it is met.
    fn walk(&mut self, out: &mut ShmScan) {
        let mut live: HashSet<Viewer> = HashSet::new();
        let mut measured: HashSet<String> = HashSet::new();
        let Some(root) = self.open_root(out) else {
            return;
        };
        let root_stat = dir_stat(&root.base);
        let mut stack: Vec<Pending> = Vec::new();
        self.push_children(&Rc::new(root), root_stat, "", None, &mut stack, out);
        while let Some(Pending {
            parent,
            parent_id,
            rel,
            outer,
            listed,
        }) = stack.pop()
        {
            let name = rel.rsplit('/').next().unwrap_or_default();
            let here = parent.child(name);
            let Some(stat) = self.stat_cgroup(&here, &rel, out) else {
                if !listed {
                    self.list_again((&parent, parent_id), &rel, outer, &mut stack, out);
                }
                continue;
            };
            let mut inner = outer;
            // kubelet's pod cgroup, with its containers' beneath it, holds no process of its
            // own: its cgroup.procs is not read. Not so a cgroup named like one inside a
            // container (`outer`): the container chose that name.
            let a_pods =
                outer.is_none() && stat.0.is_some_and(|links| links > 2) && is_pod_cgroup(name);
            let first = if a_pods {
                None
            } else {
                self.first_process(&here, stat.1, &rel, out)
            };
            match first {
                Some((pid, mnt)) if mnt != self.host_ns.mnt && Some(mnt) != outer => {
                    live.insert((mnt, pid));
                    let dirs = [here.as_open(stat.1), parent.as_open(parent_id)];
                    if let Some(reading) = self.measure(pid, mnt, &rel, dirs, out) {
                        // A cgroup made inside a container is that container's (cgroup::path),
                        // measured already above it: one reading per container (issue 36).
                        if measured.insert(reading.container_id.clone()) {
                            out.readings.push(reading);
                        }
                    }
                    inner = Some(mnt);
                }
                _ => {}
            }
            drop(parent);
            self.push_children(&Rc::new(here), stat, &rel, inner, &mut stack, out);
        }
        let scan = self.scans;
        self.listings.retain(|_, (_, seen)| *seen == scan);
        self.seen_ns.end_scan(scan);
        self.mounts.retain(|v, _| live.contains(v));
        self.trusted.retain(|v, _| live.contains(v));
    }

    /// Measures one container; `None` when it vanished while being measured.
    fn measure(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        dirs: [OpenDir<'_>; 2],
        out: &mut ShmScan,
    ) -> Option<ShmReading> {
        let identity = parse_cgroup_path(rel);
        let container_id = identity.as_ref().map_or_else(
            || rel.rsplit('/').next().unwrap_or_default().to_string(),
            |id| id.container_id.clone(),
        );
        let dir = dirs[0].id;
        let ipc = match dir.and_then(|dir| self.seen_ns.ipc(dir, pid)) {
            Some(ipc) => Ok(ipc),
            None => {
                let read = self.ns_of(pid, "ipc");
                if let (Some(dir), Ok(ipc)) = (dir, &read) {
                    self.seen_ns.read_ipc(dir, pid, *ipc);
                }
                read
            }
        };
        let host_ipc = match (ipc, self.host_ns.ipc) {
            (Ok(ipc), Some(host)) => ipc == host,
            (Err(e), _) if is_vanished(&e) => return None,
            _ => false,
        };
        // A young container's /dev/shm is looked through once for what was there before it
        // (not the host's: every process of the host writes there). A /dev/shm not measured
        // this scan keeps what an earlier listing found.
        let mut inherited = None;
        let shm = self.stat_shm(pid, mnt, rel, &container_id, host_ipc, &mut inherited, out)?;
        let inherited = inherited.unwrap_or_else(|| self.found_before(pid, &container_id));
        let memory = match self.memcg.read_at(rel, Some(dirs)) {
            Ok(memory) => memory,
            Err(MemcgError::Gone(_)) => return None,
            Err(e) => {
                self.error(out, "memory cgroup", rel, &e);
                match e {
                    MemcgError::Io { partial, .. } => partial,
                    MemcgError::Gone(_) => MemoryReading::default(),
                }
            }
        };
        let mut reading = build_reading(identity, container_id, pid, rel, host_ipc, shm, memory);
        reading.leftovers = inherited;
        Some(reading)
    }

    /// What the measured /dev/shm `shm` (its handle, identity and bytes used) of process `pid`
    /// of container `container_id` held from before the container started, while it is young
    /// ([`leftovers::YOUNG`]): listed once, the first time it holds something, and kept. The
    /// start is its /dev's birth (`dev_born`, from the walk) where it has one, else the
    /// process's, read once; a /dev/shm made after it is not listed ([`leftovers::may_hold_older`]).
    pub(super) fn inherited(
        &mut self,
        (fd, id, used): (&OwnedFd, statfs::Identity, Option<u64>),
        (pid, container_id): (i32, &str),
        dev_born: Option<SystemTime>,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Leftovers> {
        let s = self.started(pid, container_id, dev_born);
        let start = young(s.at)?;
        if let Some(found) = &s.inherited {
            return found.clone();
        }
        // An empty /dev/shm inherited nothing: what it holds later is the container's own.
        let found = if used == Some(0) || !leftovers::may_hold_older(id.born_at(), start) {
            None
        } else {
            match leftovers::list(fd) {
                Ok((entries, truncated)) => leftovers::inherited(&entries, start, truncated),
                Err(e) => {
                    self.error(out, "listing /dev/shm", rel, &e);
                    None
                }
            }
        };
        if let Some(s) = self.starts.get_mut(&pid) {
            s.inherited = Some(found.clone());
        }
        found
    }

    /// What an earlier listing found in the /dev/shm of process `pid` of `container_id`, while
    /// the container is young; nothing is read.
    fn found_before(&self, pid: i32, container_id: &str) -> Option<Leftovers> {
        let s = self
            .starts
            .get(&pid)
            .filter(|s| s.container_id == container_id)?;
        young(s.at)?;
        s.inherited.clone().flatten()
    }

    /// When process `pid` of `container_id` started: `dev_born` where the walk gave it, else
    /// the process's start, read once (a PID reused by another container is read again).
    fn started(&mut self, pid: i32, container_id: &str, dev_born: Option<SystemTime>) -> &Started {
        if self.starts.len() >= STARTS {
            self.starts.clear();
        }
        if self
            .starts
            .get(&pid)
            .is_none_or(|s| s.container_id != container_id)
        {
            let at = dev_born.or_else(|| {
                let proc_root = &self.proc_root;
                let boot = *self
                    .boot
                    .get_or_insert_with(|| crate::procfs::stat::booted(proc_root));
                boot.and_then(|boot| crate::procfs::stat::started_after(boot, proc_root, pid))
            });
            let started = Started {
                container_id: container_id.to_string(),
                at,
                inherited: None,
            };
            self.starts.insert(pid, started);
        }
        &self.starts[&pid]
    }

    fn error(&mut self, out: &mut ShmScan, what: &str, subject: &str, e: &dyn std::fmt::Display) {
        out.errors += 1;
        self.warn_once(
            format!("{what} {subject}"),
            format_args!("reading {what} of {subject}: {e}"),
        );
    }

    /// Logs a problem once per key at warn, then at debug: a broken entry must not spam logs.
    /// A process that could not be looked into (its namespaces or root denied): counted as
    /// unreadable, and, when denied, logged once for all (each scan would deny alike; the
    /// scan's blind reasons say how many).
    fn unreadable(
        &mut self,
        out: &mut ShmScan,
        what: &str,
        rel: &str,
        e: &dyn std::fmt::Display,
        denied: bool,
    ) {
        out.sight.unreadable += 1;
        if !denied {
            return self.error(out, what, rel, e);
        }
        out.errors += 1;
        self.warn_once(
            "denied".to_string(),
            format_args!(
                "reading {what} of {rel}: {e} (other containers denied alike are counted, not \
                 logged: run as root, or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)"
            ),
        );
    }

    fn warn_once(&mut self, key: String, message: std::fmt::Arguments<'_>) {
        if self.logged.len() < 10_000 && self.logged.insert(key) {
            tracing::warn!("{message}");
        } else {
            tracing::debug!("{message}");
        }
    }
}

/// EACCES / EPERM: the agent lacks the permission (or capability) to look.
fn is_denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        || e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error())
}

/// ENOENT / ESRCH: a process or cgroup that ended while we looked. Not an error.
fn is_vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
}

//! Per-container /dev/shm discovery.
//!
//! A container is a cgroup whose processes live in a mount namespace other than the host's.
//! The scan walks the memory cgroup hierarchy (not every process), so its cost grows with
//! cgroups, and reads one process per cgroup: its namespaces, its /dev/shm (statvfs of the
//! mount, which counts unlinked-but-open files that `du` misses) and its memory cgroup.

pub mod deadline;
pub mod leftovers;
pub mod peak;
pub mod statfs;

use std::collections::{HashMap, HashSet};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::SystemTime;

use rustix::fs::{Mode, OFlags, RawDir};

use crate::cgroup::memory::{MemcgError, MemcgReader, MemoryReading};
use crate::cgroup::path::{parse_cgroup_path, CgroupIdentity};
use crate::host::{parse_ns_link, HostError, HostNamespaces, HostPaths, NsId, NsSource};
use crate::model::{short_id, Leftovers, ShmReading, ShmStatus};
use crate::procfs::kfile::FileReader;
use crate::procfs::mountinfo::{self, MountEntry};
use deadline::{Measurer, Unanswered};
use statfs::{OpenShmError, ShmStat};

/// How many of a cgroup's processes to try before giving up on it (they may all be exiting).
const PIDS_TO_TRY: usize = 8;
/// How much of cgroup.procs is read: one read, enough for [`PIDS_TO_TRY`] PIDs many times over.
const PROCS_HEAD: usize = 1024;

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
    key: Option<MountKey>,
    entry: Option<MountEntry>,
}

/// What tells one mount at /dev/shm from another between scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MountKey {
    /// statx's mount ID.
    Id(u64),
    /// Without statx: the handle's device (a tmpfs instance has a device of its own).
    Dev(u32, u32),
}

fn mount_key(stat: &ShmStat) -> Option<MountKey> {
    stat.mount_id
        .map(MountKey::Id)
        .or(stat.dev.map(|(major, minor)| MountKey::Dev(major, minor)))
}

/// Whether a mountinfo line is the mount the handle is on: by statx's mount ID, else (no statx)
/// by device for a tmpfs, whose device is its own and always the one mountinfo prints.
fn same_mount(stat: &ShmStat, e: &MountEntry) -> bool {
    match (stat.mount_id, stat.dev) {
        (Some(id), _) => id == e.mount_id,
        (None, Some(dev)) if stat.is_tmpfs => dev == (e.major, e.minor),
        _ => true,
    }
}

/// What looking at a container's /dev/shm found.
#[derive(Debug)]
enum Look {
    Mounted(ShmStat, Option<MountEntry>),
    /// Nothing mounted there: a plain directory, nothing at all, or a symlink (not followed).
    NotMounted,
    /// It could not be looked at (the error is counted): never taken for "not mounted".
    Unmeasured(String),
}

/// A cgroup still to visit: its parent's open directory, its path relative to the hierarchy
/// (`/kubepods/burstable/pod<uid>/<id>`), the mount namespace of the nearest container above.
struct Pending {
    parent: Rc<OwnedFd>,
    rel: String,
    outer: Option<NsId>,
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
    files: FileReader,
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
}

/// What a container whose /dev/shm hangs is told.
const HUNG: &str = "/dev/shm did not answer statfs within 2 s (a FUSE or network file system \
                    that hangs?): not measured, and not asked again";
const TOO_MANY_STUCK: &str = "not measured: too many /dev/shm mounts of other containers hang";
/// mountinfo read at most per container, and its longest line: a mount point and a root of
/// PATH_MAX each, and their options, fit.
const MOUNTINFO_MAX: usize = 4 << 20;
const MOUNTINFO_LINE_MAX: usize = 16 << 10;
/// Hung containers remembered at most.
const HUNG_KEPT: usize = 4096;

/// Processes remembered at most (then forgotten all at once and read again).
const STARTS: usize = 16_384;

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
        let (hierarchy, version) = host.memory_hierarchy()?;
        tracing::debug!(hierarchy = %hierarchy.display(), ?version, "memory cgroup hierarchy");
        Ok(ShmScanner {
            proc_root: host.proc_root.clone(),
            memcg: MemcgReader::new(hierarchy.clone(), version),
            hierarchy,
            host_ns,
            mounts: HashMap::new(),
            logged: HashSet::new(),
            files: FileReader::default(),
            path: Vec::with_capacity(64),
            dirents: vec![MaybeUninit::uninit(); 16 * 1024],
            starts: HashMap::new(),
            measurer: Measurer::default(),
            hung: HashSet::new(),
        })
    }

    /// Whether readings carry `memory_shmem_bytes` (memory.stat): on unless turned off.
    pub fn set_read_shmem(&mut self, on: bool) {
        self.memcg.set_read_shmem(on);
    }

    /// Whether readings carry `memory_oom_kills`: off unless turned on.
    pub fn set_read_oom_kills(&mut self, on: bool) {
        self.memcg.set_read_oom_kills(on);
    }

    pub fn host_namespaces(&self) -> HostNamespaces {
        self.host_ns
    }

    /// One pass over the hierarchy. Never fails as a whole: what cannot be read is counted.
    ///
    /// Each cgroup directory is opened once and its files (cgroup.procs, the memory files) are
    /// opened relative to it, and listed through the same handle: no path walk from the root
    /// per file, and the least system calls per cgroup (see BENCHMARKS.md).
    pub fn scan(&mut self) -> ShmScan {
        self.memcg.start_scan();
        let mut out = ShmScan::default();
        let mut live_ns = HashSet::new();
        let Some(root) = self.open_cgroup(None, "", &mut out) else {
            return out;
        };
        let mut stack: Vec<Pending> = Vec::new();
        self.push_children(&Rc::new(root), "", None, &mut stack, &mut out);
        while let Some(Pending { parent, rel, outer }) = stack.pop() {
            let Some(dir) = self.open_cgroup(Some(&parent), &rel, &mut out) else {
                continue;
            };
            let mut inner = outer;
            match self.first_process(&dir, &rel, &mut out) {
                Some((pid, mnt)) if mnt != self.host_ns.mnt && Some(mnt) != outer => {
                    live_ns.insert(mnt);
                    let dirs = [dir.as_fd(), parent.as_fd()];
                    if let Some(reading) = self.measure(pid, mnt, &rel, dirs, &mut out) {
                        out.readings.push(reading);
                    }
                    inner = Some(mnt);
                }
                _ => {}
            }
            drop(parent);
            self.push_children(&Rc::new(dir), &rel, inner, &mut stack, &mut out);
        }
        self.mounts.retain(|ns, _| live_ns.contains(ns));
        out.readings.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
        out
    }

    /// Opens a cgroup's directory, relative to its parent's when given (a one-name lookup);
    /// `None` when it is gone (or unreadable: counted).
    fn open_cgroup(
        &mut self,
        parent: Option<&OwnedFd>,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let opened = match parent {
            Some(parent) => {
                let name = rel.rsplit('/').next().unwrap_or_default();
                rustix::fs::openat(parent, name, flags, Mode::empty())
            }
            None => rustix::fs::open(&self.hierarchy, flags, Mode::empty()),
        };
        match opened {
            Ok(dir) => Some(dir),
            Err(e) => {
                let e = io::Error::from(e);
                if !is_vanished(&e) {
                    let path = self.hierarchy.join(rel.trim_start_matches('/'));
                    self.error(out, "readdir", &path.display().to_string(), &e);
                }
                None
            }
        }
    }

    /// Queues the subdirectories of `dir`. They share one handle on `dir` (closed when the
    /// last of them is opened): the handles open at once are bounded by the tree's depth.
    fn push_children(
        &mut self,
        dir: &Rc<OwnedFd>,
        rel: &str,
        outer: Option<NsId>,
        stack: &mut Vec<Pending>,
        out: &mut ShmScan,
    ) {
        let mut entries = RawDir::new(dir.as_fd(), &mut self.dirents);
        let mut failed = None;
        while let Some(entry) = entries.next() {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    failed = Some(io::Error::from(e));
                    break;
                }
            };
            let is_dir = match entry.file_type() {
                rustix::fs::FileType::Directory => true,
                // A file system that does not fill in d_type: ask, as std's read_dir would.
                rustix::fs::FileType::Unknown => rustix::fs::statat(
                    dir,
                    entry.file_name(),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::Directory
                }),
                _ => false,
            };
            let name = entry.file_name().to_bytes();
            if !is_dir || name == b"." || name == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            stack.push(Pending {
                parent: dir.clone(),
                rel: format!("{rel}/{name}"),
                outer,
            });
        }
        if let Some(e) = failed.filter(|e| !is_vanished(e)) {
            let path = self.hierarchy.join(rel.trim_start_matches('/'));
            self.error(out, "readdir", &path.display().to_string(), &e);
        }
    }

    /// The first live process of a cgroup and its mount namespace.
    fn first_process(
        &mut self,
        dir: &OwnedFd,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<(i32, NsId)> {
        let mut pids = [0i32; PIDS_TO_TRY];
        let mut n = 0;
        match self.files.read_head(dir, "cgroup.procs", PROCS_HEAD) {
            Ok(procs) => {
                // A read that filled the buffer may end in a cut-off PID: whole lines only.
                let whole = if procs.len() < PROCS_HEAD {
                    procs
                } else {
                    procs
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(&[][..], |end| &procs[..end])
                };
                for line in whole.split(|&b| b == b'\n') {
                    let pid = std::str::from_utf8(line)
                        .ok()
                        .and_then(|l| l.trim().parse::<i32>().ok());
                    if let Some(pid) = pid {
                        pids[n] = pid;
                        n += 1;
                        if n == PIDS_TO_TRY {
                            break;
                        }
                    }
                }
            }
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "cgroup.procs", rel, &e);
                return None;
            }
        }
        for &pid in &pids[..n] {
            match self.ns_of(pid, "mnt") {
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

    /// /proc/PID/ns/<kind>, as [`crate::host::read_ns`] reads it but without allocating: the
    /// path is written into a reused buffer, the link read into one on the stack.
    fn ns_of(&mut self, pid: i32, kind: &str) -> io::Result<NsId> {
        use std::io::Write as _;
        use std::os::unix::ffi::OsStrExt as _;
        self.path.clear();
        self.path
            .extend_from_slice(self.proc_root.as_os_str().as_bytes());
        write!(self.path, "/{pid}/ns/{kind}")?;
        let mut buf = [MaybeUninit::<u8>::uninit(); 64];
        let (link, _) = rustix::fs::readlinkat_raw(rustix::fs::CWD, &self.path[..], &mut buf)?;
        std::str::from_utf8(link)
            .ok()
            .and_then(parse_ns_link)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "odd namespace link"))
    }

    /// Measures one container; `None` when it vanished while being measured.
    fn measure(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        dirs: [BorrowedFd<'_>; 2],
        out: &mut ShmScan,
    ) -> Option<ShmReading> {
        let identity = parse_cgroup_path(rel);
        let container_id = identity.as_ref().map_or_else(
            || rel.rsplit('/').next().unwrap_or_default().to_string(),
            |id| id.container_id.clone(),
        );
        let host_ipc = match (self.ns_of(pid, "ipc"), self.host_ns.ipc) {
            (Ok(ipc), Some(host)) => ipc == host,
            (Err(e), _) if is_vanished(&e) => return None,
            _ => false,
        };
        // A young container's /dev/shm is looked through once for what was there before it
        // (not the host's: every process of the host writes there).
        let (young, listed) = if host_ipc {
            (None, None)
        } else {
            self.youth(pid, &container_id)
        };
        let to_list = young.filter(|_| listed.is_none());
        let mut inherited = None;
        let shm = self.stat_shm(pid, mnt, rel, &container_id, to_list, &mut inherited, out)?;
        let inherited = match listed {
            Some(before) => before,
            None if to_list.is_some() => {
                if let Some(s) = self.starts.get_mut(&pid) {
                    s.inherited = Some(inherited.clone());
                }
                inherited
            }
            None => None,
        };
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

    /// When process `pid` of `container_id` started, if at most [`leftovers::YOUNG`] ago, and
    /// what its /dev/shm held from before if it was listed already. The start is read once.
    fn youth(
        &mut self,
        pid: i32,
        container_id: &str,
    ) -> (Option<SystemTime>, Option<Option<Leftovers>>) {
        if self.starts.len() >= STARTS {
            self.starts.clear();
        }
        if self
            .starts
            .get(&pid)
            .is_none_or(|s| s.container_id != container_id)
        {
            let started = Started {
                container_id: container_id.to_string(),
                at: leftovers::started(&self.proc_root, pid),
                inherited: None,
            };
            self.starts.insert(pid, started);
        }
        let Some(s) = self.starts.get(&pid) else {
            return (None, None);
        };
        let young = s.at.filter(|at| {
            SystemTime::now()
                .duration_since(*at)
                .is_ok_and(|age| age <= leftovers::YOUNG)
        });
        match young {
            Some(at) => (Some(at), s.inherited.clone()),
            None => (None, None),
        }
    }

    /// statvfs of /dev/shm with the mount's details; `None` when the process is gone. For a
    /// container started at `young` (recently), what its /dev/shm held from before goes to
    /// `inherited`.
    #[allow(clippy::too_many_arguments)]
    fn stat_shm(
        &mut self,
        pid: i32,
        mnt: NsId,
        rel: &str,
        container_id: &str,
        young: Option<SystemTime>,
        inherited: &mut Option<Leftovers>,
        out: &mut ShmScan,
    ) -> Option<Look> {
        let root = match statfs::open_container_root(&self.proc_root, pid) {
            Ok(root) => root,
            Err(OpenShmError::Absent(_)) => return None,
            Err(e) => {
                self.error(out, "container root", rel, &e);
                return Some(Look::Unmeasured(format!(
                    "opening the container's root: {e}"
                )));
            }
        };
        if self.hung.contains(container_id) {
            return Some(Look::Unmeasured(HUNG.into()));
        }
        let opened = match self.measurer.open_and_measure(root) {
            Ok(answer) => answer,
            Err(why) => {
                if why == Unanswered::Hung && self.hung.len() < HUNG_KEPT {
                    self.hung.insert(container_id.to_string());
                }
                self.warn_once(
                    format!("hung {container_id}"),
                    format_args!(
                        "container {}: {}",
                        short_id(container_id),
                        match why {
                            Unanswered::Hung => HUNG,
                            Unanswered::TooManyStuck => TOO_MANY_STUCK,
                        }
                    ),
                );
                out.errors += 1;
                return Some(Look::Unmeasured(
                    match why {
                        Unanswered::Hung => HUNG,
                        Unanswered::TooManyStuck => TOO_MANY_STUCK,
                    }
                    .into(),
                ));
            }
        };
        let stat = match opened {
            Ok((fd, stat)) => {
                // Only a tmpfs mounted there that holds something is worth a listing.
                if let Some(start) = young.filter(|_| {
                    stat.is_tmpfs
                        && stat.is_mount_root != Some(false)
                        && stat.used_bytes() != Some(0)
                }) {
                    match leftovers::list(&fd) {
                        Ok((entries, truncated)) => {
                            *inherited = leftovers::inherited(&entries, start, truncated);
                        }
                        Err(e) => self.error(out, "listing /dev/shm", rel, &e),
                    }
                }
                stat
            }
            Err(OpenShmError::Absent(_)) => return Some(Look::NotMounted),
            Err(OpenShmError::Symlink) => {
                self.warn_once(
                    format!("symlink {rel}"),
                    format_args!(
                        "container {}: /dev/shm is reached through a symlink; not followed, reported as not mounted",
                        short_id(container_id)
                    ),
                );
                return Some(Look::NotMounted);
            }
            Err(e) => {
                // Could not look (EPERM, I/O, a call the kernel lacks): never "not mounted".
                self.error(out, "statvfs /dev/shm", rel, &e);
                return Some(Look::Unmeasured(format!("measuring /dev/shm: {e}")));
            }
        };
        if stat.is_mount_root == Some(false) {
            // A plain directory on the container's root file system: nothing is mounted there.
            return Some(Look::NotMounted);
        }
        if stat.is_tmpfs && stat.is_mount_root == Some(true) {
            // statx says a mount is there and statfs that it is a tmpfs: mountinfo, the most
            // expensive file of a scan, would only repeat the type.
            return Some(Look::Mounted(stat, None));
        }
        let entry = match self.mount_entry(pid, mnt, &stat, rel, out)? {
            Ok(entry) => entry,
            // statx said a mount is there: only its type is missing.
            Err(_) if stat.is_mount_root == Some(true) => None,
            Err(e) => return Some(Look::Unmeasured(format!("reading mountinfo: {e}"))),
        };
        match (&entry, stat.is_mount_root) {
            // Without statx, mountinfo alone tells whether something is mounted at /dev/shm.
            (None, None) => Some(Look::NotMounted),
            _ => Some(Look::Mounted(stat, entry)),
        }
    }

    /// The /dev/shm line of the process's mountinfo, from the cache when the mount is unchanged
    /// (same statx mount ID; without statx, the same device). `None`: the process is gone;
    /// `Err`: mountinfo could not be read (counted).
    fn mount_entry(
        &mut self,
        pid: i32,
        mnt: NsId,
        stat: &ShmStat,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<Result<Option<MountEntry>, String>> {
        let key = mount_key(stat);
        if let Some(cached) = self.mounts.get(&mnt) {
            if key.is_some() && cached.key == key {
                return Some(Ok(cached.entry.clone()));
            }
        }
        let path = self.proc_root.join(pid.to_string()).join("mountinfo");
        // Streamed, a line at a time, bounded: a pod can make its mountinfo tens of MiB. The
        // topmost /dev/shm line is the last; with statx's mount ID the one measured ends it.
        let mut entry: Option<MountEntry> = None;
        let read = self.files.for_each_line(
            rustix::fs::CWD,
            &path,
            MOUNTINFO_MAX,
            MOUNTINFO_LINE_MAX,
            |line| {
                // Bytes, not UTF-8: one mount point with odd bytes elsewhere must not hide it.
                let Some(e) = mountinfo::find_mount(&String::from_utf8_lossy(line), "/dev/shm")
                else {
                    return true;
                };
                // The line must describe the mount we measured, not one stacked elsewhere.
                if same_mount(stat, &e) {
                    let exact = stat.mount_id.is_some();
                    entry = Some(e);
                    return !exact;
                }
                true
            },
        );
        match read {
            Ok(true) => self.warn_once(
                format!("mountinfo cut {rel}"),
                format_args!(
                    "container {rel}: mountinfo is over {} MiB: read no further",
                    MOUNTINFO_MAX >> 20
                ),
            ),
            Ok(false) => {}
            Err(e) if is_vanished(&e) => return None,
            Err(e) => {
                self.error(out, "mountinfo", rel, &e);
                return Some(Err(e.to_string()));
            }
        }
        self.mounts.insert(
            mnt,
            CachedMount {
                key,
                entry: entry.clone(),
            },
        );
        Some(Ok(entry))
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
    identity: Option<CgroupIdentity>,
    container_id: String,
    pid: i32,
    rel: &str,
    host_ipc: bool,
    shm: Look,
    memory: MemoryReading,
) -> ShmReading {
    let (mounted, fs_type, size, used, tmpfs_free) = match &shm {
        Look::Mounted(stat, entry) => (
            Some(true),
            entry
                .as_ref()
                .map(|e| e.fs_type.clone())
                .or_else(|| stat.is_tmpfs.then(|| "tmpfs".to_string())),
            stat.size_bytes(),
            stat.used_bytes(),
            stat.size_bytes().map(|_| stat.free_bytes),
        ),
        Look::NotMounted => (Some(false), None, None, None, None),
        Look::Unmeasured(_) => (None, None, None, None, None),
    };
    let available = if mounted == Some(true) {
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
        memory_oom_kills: memory.oom_kills,
        used_peak_bytes: used,
        image: None,
        status: ShmStatus::Ok,
        error: match shm {
            Look::Unmeasured(e) => Some(e),
            _ => None,
        },
        leftovers: None,
    }
}

/// ENOENT / ESRCH: a process or cgroup that ended while we looked. Not an error.
fn is_vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(mount_id: Option<u64>, dev: Option<(u32, u32)>, is_tmpfs: bool) -> ShmStat {
        ShmStat {
            mount_id,
            is_mount_root: mount_id.map(|_| true),
            dev,
            is_tmpfs,
            total_bytes: 64 << 20,
            free_bytes: 60 << 20,
        }
    }

    fn entry(mount_id: u64, major: u32, minor: u32) -> MountEntry {
        let line = format!("{mount_id} 1 {major}:{minor} / /dev/shm rw - tmpfs shm rw,size=65536k");
        mountinfo::find_mount(&line, "/dev/shm").unwrap()
    }

    #[test]
    fn without_statx_the_mountinfo_line_is_matched_by_device() {
        let e = entry(42, 0, 77);
        assert!(same_mount(&stat(Some(42), None, true), &e));
        assert!(!same_mount(&stat(Some(41), None, true), &e));
        assert!(same_mount(&stat(None, Some((0, 77)), true), &e));
        assert!(!same_mount(&stat(None, Some((0, 78)), true), &e));
        // Not a tmpfs (btrfs subvolumes report other devices): the topmost mount stands.
        assert!(same_mount(&stat(None, Some((0, 78)), false), &e));
        assert_eq!(
            mount_key(&stat(None, Some((0, 77)), true)),
            Some(MountKey::Dev(0, 77))
        );
        assert_eq!(
            mount_key(&stat(Some(42), None, true)),
            Some(MountKey::Id(42))
        );
    }

    fn reading(look: Look) -> ShmReading {
        build_reading(
            None,
            "c".into(),
            1,
            "/x/c",
            false,
            look,
            MemoryReading::default(),
        )
    }

    #[test]
    fn could_not_look_is_unknown_with_its_error_never_not_mounted() {
        let r = reading(Look::Unmeasured(
            "measuring /dev/shm: Operation not permitted".into(),
        ));
        assert_eq!(r.mounted, None);
        assert_eq!(r.size_bytes, None);
        assert_eq!(r.available_bytes, None);
        assert!(r.error.as_deref().unwrap().contains("not permitted"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["mounted"], serde_json::Value::Null);

        let r = reading(Look::NotMounted);
        assert_eq!((r.mounted, r.error), (Some(false), None));
        let r = reading(Look::Mounted(stat(Some(1), None, true), None));
        assert_eq!(r.mounted, Some(true));
        assert_eq!(r.size_bytes, Some(64 << 20));
        assert_eq!(r.used_bytes, Some(4 << 20));
        assert_eq!(r.fs_type.as_deref(), Some("tmpfs"));
    }
}

//! The walk of the memory cgroup hierarchy: each cgroup directory looked at beneath the nearest
//! one opened, its subdirectories queued, its first live process and that process's namespaces.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir};

use super::{is_vanished, ShmScan, ShmScanner};
use crate::cgroup::memory::OpenDir;
use crate::host::{parse_ns_link, NsId};
use crate::procfs::kept::{beneath, DirId};

/// How many of a cgroup's processes to try before giving up on it (they may all be exiting).
const PIDS_TO_TRY: usize = 8;
/// How much of cgroup.procs is read: one read, enough for [`PIDS_TO_TRY`] PIDs many times over.
const PROCS_HEAD: usize = 1024;
/// cgroup v1 keeps the PID list an open cgroup.procs read for a second after the read
/// (`CGROUP_PIDLIST_DESTROY_DELAY`) and a read of that open file from offset 0 within it hands
/// the same list over again: a handle kept across scans is trusted only this long after.
const V1_PIDLIST_KEPT: Duration = Duration::from_secs(2);

/// A cgroup directory as a path beneath the nearest directory the walk opened. A directory is
/// opened only to be listed (and the root): the others are reached by a path beneath it, one
/// `statat` for its link count and identity where an open, an `fstat` and a close were three,
/// and their files are opened by that path when not kept open already.
pub(super) struct CgDir {
    pub(super) base: Rc<OwnedFd>,
    /// Beneath `base`; `""` is `base` itself.
    pub(super) at: String,
}

impl CgDir {
    fn opened(fd: OwnedFd) -> CgDir {
        CgDir {
            base: Rc::new(fd),
            at: String::new(),
        }
    }

    pub(super) fn child(&self, name: &str) -> CgDir {
        CgDir {
            base: self.base.clone(),
            at: match self.at.as_str() {
                "" => name.to_string(),
                at => format!("{at}/{name}"),
            },
        }
    }

    pub(super) fn as_open(&self, id: Option<DirId>) -> OpenDir<'_> {
        OpenDir {
            fd: self.base.as_fd(),
            at: &self.at,
            id,
        }
    }
}

/// A cgroup still to visit: its parent, its path relative to the hierarchy
/// (`/kubepods/burstable/pod<uid>/<id>`), the mount namespace of the nearest container above,
/// and whether a listing of this scan found it (not one kept from an earlier scan).
pub(super) struct Pending {
    pub(super) parent: Rc<CgDir>,
    /// The parent's identity ([`dir_stat`]).
    pub(super) parent_id: Option<DirId>,
    pub(super) rel: String,
    pub(super) outer: Option<NsId>,
    pub(super) listed: bool,
}

impl ShmScanner {
    /// Opens the hierarchy's root; `None` when it is gone (or unreadable: counted).
    pub(super) fn open_root(&mut self, out: &mut ShmScan) -> Option<CgDir> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match rustix::fs::open(&self.hierarchy, flags, Mode::empty()) {
            Ok(dir) => Some(CgDir::opened(dir)),
            Err(e) => {
                self.cgroup_error(out, "", e.into());
                None
            }
        }
    }

    /// The link count and identity of the cgroup `dir` (at `rel`, beneath the root: a
    /// [`CgDir::child`]); `None` when it is gone (or unreadable: counted).
    pub(super) fn stat_cgroup(
        &mut self,
        dir: &CgDir,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<DirStat> {
        match rustix::fs::statat(&*dir.base, &dir.at, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                Some((Some(st.st_nlink), Some((st.st_dev, st.st_ino))))
            }
            // Made again as something else since it was listed: not a cgroup any more.
            Ok(_) => None,
            Err(e) => {
                self.cgroup_error(out, rel, e.into());
                None
            }
        }
    }

    /// `dir` opened to be listed (itself when it is open already).
    fn open_to_list(&mut self, dir: &Rc<CgDir>, rel: &str, out: &mut ShmScan) -> Option<Rc<CgDir>> {
        if dir.at.is_empty() {
            return Some(dir.clone());
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match rustix::fs::openat(&*dir.base, &dir.at, flags, Mode::empty()) {
            Ok(fd) => Some(Rc::new(CgDir::opened(fd))),
            Err(e) => {
                self.cgroup_error(out, rel, e.into());
                None
            }
        }
    }

    /// A cgroup directory that could not be looked at: counted unless it vanished.
    fn cgroup_error(&mut self, out: &mut ShmScan, rel: &str, e: io::Error) {
        if !is_vanished(&e) {
            let path = self.hierarchy.join(rel.trim_start_matches('/'));
            self.error(out, "readdir", &path.display().to_string(), &e);
        }
    }

    /// Queues the subdirectories of `dir`. They share one handle on the directory they are beneath
    /// (closed when the last of them is visited): the handles open at once are bounded by the
    /// tree's depth.
    ///
    /// A directory's link count is 2 and one per subdirectory (kernfs keeps it so for every
    /// cgroup directory, as ext4 and tmpfs do for a test's tree; btrfs and overlay say 1, and
    /// are always listed). So a container's cgroup, at 2, is not listed (getdents would hand
    /// over its 30-odd control files for nothing), and a directory whose count still matches
    /// the subdirectories its last listing found has those queued as they were (`listed`
    /// false): one of them gone means the count hides another, and [`Self::list_again`] lists
    /// it then.
    pub(super) fn push_children(
        &mut self,
        dir: &Rc<CgDir>,
        (links, id): DirStat,
        rel: &str,
        outer: Option<NsId>,
        stack: &mut Vec<Pending>,
        out: &mut ShmScan,
    ) {
        if links == Some(2) {
            return;
        }
        let scan = self.scans;
        if let Some((names, seen)) = self.listings.get_mut(rel) {
            if links.is_some_and(|n| n == names.len() as u64 + 2) {
                *seen = scan;
                for name in names.iter() {
                    stack.push(Pending {
                        parent: dir.clone(),
                        parent_id: id,
                        rel: format!("{rel}/{name}"),
                        outer,
                        listed: false,
                    });
                }
                return;
            }
        }
        let subdirs = links.and_then(|n| n.checked_sub(2));
        if let Some(dir) = self.open_to_list(dir, rel, out) {
            self.list((&dir, id), rel, outer, &[], subdirs, stack, out);
        }
    }

    /// `child` (queued from a listing kept from an earlier scan) is gone: its parent `dir` is
    /// listed again, once, and what it holds that was not queued is queued.
    pub(super) fn list_again(
        &mut self,
        (dir, id): (&Rc<CgDir>, Option<DirId>),
        child: &str,
        outer: Option<NsId>,
        stack: &mut Vec<Pending>,
        out: &mut ShmScan,
    ) {
        let Some((rel, name)) = child.rsplit_once('/') else {
            return;
        };
        // Listed again already this scan when the name is no longer in its listing.
        let Some((queued, _)) = self.listings.get(rel) else {
            return;
        };
        if !queued.iter().any(|n| n == name) {
            return;
        }
        let queued = queued.clone();
        if let Some(dir) = self.open_to_list(dir, rel, out) {
            self.list((&dir, id), rel, outer, &queued, None, stack, out);
        }
    }

    /// Lists `dir` (open) and queues its subdirectories but those in `skip`; the listing is kept.
    /// With `subdirs` (its link count's word), the listing ends once that many are found: the
    /// rest are control files (a pod's 30-odd, and getdents' last call that says the end). A
    /// subdirectory made since the count was read is then missed this scan only: the next
    /// count no longer matches the listing kept, and the directory is listed again.
    #[allow(clippy::too_many_arguments)]
    fn list(
        &mut self,
        (dir, id): (&Rc<CgDir>, Option<DirId>),
        rel: &str,
        outer: Option<NsId>,
        skip: &[String],
        subdirs: Option<u64>,
        stack: &mut Vec<Pending>,
        out: &mut ShmScan,
    ) {
        let mut names = Vec::new();
        let mut entries = RawDir::new(dir.base.as_fd(), &mut self.dirents);
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
                    &*dir.base,
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
            if !skip.iter().any(|s| s == name) {
                stack.push(Pending {
                    parent: dir.clone(),
                    parent_id: id,
                    rel: format!("{rel}/{name}"),
                    outer,
                    listed: true,
                });
            }
            names.push(name.to_string());
            if subdirs == Some(names.len() as u64) {
                break;
            }
        }
        match failed {
            // A listing cut short is not kept: the next scan lists again.
            Some(e) => {
                self.listings.remove(rel);
                if !is_vanished(&e) {
                    let path = self.hierarchy.join(rel.trim_start_matches('/'));
                    self.error(out, "readdir", &path.display().to_string(), &e);
                }
            }
            None => {
                self.listings.insert(rel.to_string(), (names, self.scans));
            }
        }
    }

    /// The first live process of a cgroup and its mount namespace; `id`: the directory's.
    pub(super) fn first_process(
        &mut self,
        dir: &CgDir,
        id: Option<DirId>,
        rel: &str,
        out: &mut ShmScan,
    ) -> Option<(i32, NsId)> {
        let mut pids = [0i32; PIDS_TO_TRY];
        let mut n = 0;
        // Kept open for the next scan when the directory's identity is known.
        let fresh = self.v1.then_some(V1_PIDLIST_KEPT);
        let procs = match id {
            Some(id) => self.kept.read_head(
                (dir.base.as_fd(), &dir.at),
                id,
                "cgroup.procs",
                PROCS_HEAD,
                fresh,
            ),
            None => self
                .files
                .read_head(&*dir.base, beneath(&dir.at, "cgroup.procs"), PROCS_HEAD),
        };
        match procs {
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
        let now = std::time::Instant::now();
        for &pid in &pids[..n] {
            if let Some(ns) = id.and_then(|id| self.seen_ns.mnt(id, pid, self.scans, now)) {
                return Some((pid, ns));
            }
            match self.ns_of(pid, "mnt") {
                Ok(ns) => {
                    if let Some(id) = id {
                        self.seen_ns.read_mnt(id, pid, ns, self.scans, now);
                    }
                    return Some((pid, ns));
                }
                Err(e) if is_vanished(&e) => continue,
                Err(e) => {
                    self.unreadable(out, "ns/mnt", rel, &e, super::is_denied(&e));
                    return None;
                }
            }
        }
        None
    }

    /// /proc/PID/ns/<kind>, as [`crate::host::read_ns`] reads it but without allocating: the
    /// path is written into a reused buffer, the link read into one on the stack.
    pub(super) fn ns_of(&mut self, pid: i32, kind: &str) -> io::Result<NsId> {
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
}

/// A cgroup directory's link count and identity, from one `fstat`.
pub(super) type DirStat = (Option<u64>, Option<DirId>);

/// [`DirStat`] of an open directory (both unknown when `fstat` fails).
pub(super) fn dir_stat(dir: &OwnedFd) -> DirStat {
    match rustix::fs::fstat(dir) {
        Ok(st) => (Some(st.st_nlink), Some((st.st_dev, st.st_ino))),
        Err(_) => (None, None),
    }
}

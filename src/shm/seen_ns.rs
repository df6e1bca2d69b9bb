//! The namespaces of each cgroup's measured process, kept across scans: reading the two
//! `/proc/PID/ns` links was the largest cost of `serve`'s scan after the cgroup files were kept
//! open (BENCHMARKS.md, "Namespaces read once").
//!
//! Keyed by the cgroup directory's identity and the PID, as the scan reads them again each
//! time from the kept cgroup.procs: a PID listed there is this cgroup's process, so a PID
//! reused by another container is in another cgroup and another key. The one change this does
//! not see at once is a process moving itself into other namespaces (`setns`, `unshare`) after
//! it was read: the links are read again [`REREAD`] after they were, so that is seen within it.
//! What the namespaces decide moves little on it: /dev/shm is still opened through the
//! process's root and identified by its mount each scan.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::host::NsId;
use crate::procfs::kept::DirId;

/// Namespaces read this long ago are read again.
pub(super) const REREAD: Duration = Duration::from_secs(60);

type Key = (DirId, i32);

#[derive(Debug, Default)]
pub(super) struct SeenNs {
    by: HashMap<Key, Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    mnt: NsId,
    ipc: Option<NsId>,
    read: Instant,
    /// The scan that last asked.
    scan: u64,
}

impl SeenNs {
    /// The mount namespace of `pid` in the cgroup `dir` when read less than [`REREAD`] ago.
    pub(super) fn mnt(&mut self, dir: DirId, pid: i32, scan: u64, now: Instant) -> Option<NsId> {
        let seen = self.by.get_mut(&(dir, pid))?;
        if now.saturating_duration_since(seen.read) >= REREAD {
            return None;
        }
        seen.scan = scan;
        Some(seen.mnt)
    }

    /// Its IPC namespace, when kept with the mount namespace still in use.
    pub(super) fn ipc(&self, dir: DirId, pid: i32) -> Option<NsId> {
        self.by.get(&(dir, pid)).and_then(|s| s.ipc)
    }

    /// Keeps a mount namespace just read (the IPC one is read again after it).
    pub(super) fn read_mnt(&mut self, dir: DirId, pid: i32, mnt: NsId, scan: u64, now: Instant) {
        self.by.insert(
            (dir, pid),
            Seen {
                mnt,
                ipc: None,
                read: now,
                scan,
            },
        );
    }

    pub(super) fn read_ipc(&mut self, dir: DirId, pid: i32, ipc: NsId) {
        if let Some(seen) = self.by.get_mut(&(dir, pid)) {
            seen.ipc = Some(ipc);
        }
    }

    /// Forgets what the scan `scan` did not ask about: bounded by the cgroups measured.
    pub(super) fn end_scan(&mut self, scan: u64) {
        self.by.retain(|_, s| s.scan == scan);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_per_cgroup_and_pid_read_again_when_old_and_forgotten_when_not_asked() {
        let mut seen = SeenNs::default();
        let t0 = Instant::now();
        let (a, b) = ((0, 1), (0, 2));
        assert_eq!(seen.mnt(a, 7, 1, t0), None);
        seen.read_mnt(a, 7, NsId(100), 1, t0);
        assert_eq!(seen.ipc(a, 7), None, "not read yet");
        seen.read_ipc(a, 7, NsId(200));
        assert_eq!(seen.mnt(a, 7, 2, t0 + REREAD / 2), Some(NsId(100)));
        assert_eq!(seen.ipc(a, 7), Some(NsId(200)));
        // The same PID in another cgroup is another process: not this one's namespaces.
        assert_eq!(seen.mnt(b, 7, 2, t0), None);
        assert_eq!(seen.ipc(b, 7), None);
        // Another PID of the same cgroup likewise.
        assert_eq!(seen.mnt(a, 8, 2, t0), None);
        // Read again once old: a fresh read replaces both.
        assert_eq!(seen.mnt(a, 7, 3, t0 + REREAD), None);
        seen.read_mnt(a, 7, NsId(101), 3, t0 + REREAD);
        assert_eq!(seen.ipc(a, 7), None, "the IPC namespace is read again too");
        seen.read_mnt(b, 9, NsId(5), 3, t0);
        seen.end_scan(4);
        assert_eq!(seen.len(), 0, "what scan 4 did not ask about is forgotten");
        seen.read_mnt(a, 7, NsId(100), 5, t0);
        seen.read_mnt(b, 9, NsId(100), 4, t0);
        seen.end_scan(5);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen.mnt(a, 7, 6, t0), Some(NsId(100)));
    }
}

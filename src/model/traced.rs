//! A death the kernel's tracepoints told at the moment it happened (`death_trace`), with what
//! the dying process's /dev/shm and memory cgroup held then.

use std::time::{Duration, SystemTime};

use super::{MemorySplit, ShmReading};

/// What the kernel said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TracedCause {
    /// `signal:signal_generate` of SIGBUS from a fault (`code`: BUS_ADRERR, BUS_OBJERR, ...);
    /// a `kill` (SI_USER, SI_TKILL, SI_QUEUE) is no fault and never becomes one.
    BusFault { code: i32 },
    /// `oom:mark_victim`: the process the OOM killer chose, with the RSS the kernel counted
    /// (bytes; absent where the running kernel's format has no such field).
    OomVictim {
        anon_rss: Option<u64>,
        file_rss: Option<u64>,
        shmem_rss: Option<u64>,
    },
    /// `signal:signal_generate` of SIGSEGV, SIGABRT or SIGKILL: no failure alone, but whose
    /// process it was at that moment, so the kernel's crash line (read later, its PID perhaps
    /// another process's by then) is placed by it.
    Fatal { sig: i32 },
}

/// One traced death and the reading taken for it.
#[derive(Debug, Clone, PartialEq)]
pub struct TracedDeath {
    /// The host PID (thread ID) the kernel named.
    pub pid: i32,
    pub comm: String,
    /// When the kernel fired the tracepoint (its real-time clock).
    pub at: SystemTime,
    pub cause: TracedCause,
    /// `/proc/PID/cgroup` as read at once: whose container it is (`failures` places it).
    pub cgroup_file: Option<String>,
    /// Its /dev/shm at that moment; `None` when it was already gone or not a mount.
    pub reading: Option<ShmReading>,
    /// Its memory cgroup at that moment (usage, limit, shmem, anon).
    pub memory: Option<MemorySplit>,
    /// How long after the tracepoint the reading was taken.
    pub read_after: Duration,
    /// Whether `reading` is the dying process's own, taken while it still held its files: its
    /// exit had freed nothing of /dev/shm yet (the kernel puts a dying process's last file
    /// references after it lets go of its files). A reading after that, or through another
    /// process of its container, may lack what the death itself freed (a DataLoader worker's
    /// unlinked segments): it can say /dev/shm was full, never that it was not. One case this
    /// misses: in a process of several threads, the last one to exit unmaps; a segment only
    /// mapped (unlinked, its descriptor closed) may be freed by it before this one's files go.
    pub read_in_time: bool,
    /// The process's start (clock ticks after boot, `/proc/PID/stat`) read at the moment: NVML's
    /// history of the PID is its own only with the same start.
    pub start: Option<u64>,
}

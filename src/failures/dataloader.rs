//! PyTorch's word that a DataLoader worker died of a SIGKILL: `DataLoader worker (pid 57) is
//! killed by signal: Killed.` and `DataLoader worker (pid(s) 57, 58) exited unexpectedly`
//! (torch/utils/data/dataloader.py and torch/csrc/DataLoader.cpp print them).
//!
//! Alone such a line is no failure: anyone may send a SIGKILL. With the kernel's (or the memory
//! cgroup's) OOM kill in the same container about the same time it is that kill told by the
//! workload: one death, and the line is told with it (`same.rs` ties them). The PIDs are the
//! worker's in the container's PID namespace; the kernel's are the host's, so they are compared
//! only where the killed process's `NSpid` was read.

use std::path::Path;

/// A worker death PyTorch told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerDeath {
    /// In the container's PID namespace.
    pub pids: Vec<i32>,
}

/// The text every such line holds (the recogniser's filter looks for it).
pub const NEEDLE: &str = "DataLoader worker (pid";
/// Listed PIDs at most (a DataLoader has a few dozen workers).
const MAX_PIDS: usize = 64;

/// The worker death `text` tells, if it is one of a SIGKILL or of an unexplained exit. A bus
/// error (`killed by signal: Bus error`) is a signature of its own; other signals are not
/// deaths of memory.
pub fn parse(text: &str) -> Option<WorkerDeath> {
    let start = text.find(NEEDLE)? + NEEDLE.len();
    let rest = &text[start..];
    let rest = rest.strip_prefix("(s)").unwrap_or(rest);
    let rest = rest.strip_prefix(' ')?;
    let close = rest.find(')')?;
    let pids: Vec<i32> = rest[..close]
        .split(',')
        .map(|p| p.trim().parse::<i32>().ok().filter(|p| *p > 0))
        .take(MAX_PIDS)
        .collect::<Option<_>>()?;
    if pids.is_empty() {
        return None;
    }
    let how = rest[close + 1..].trim_start();
    let killed =
        how.starts_with("is killed by signal: Killed") || how.starts_with("exited unexpectedly");
    killed.then_some(WorkerDeath { pids })
}

/// The PID a host process has in its own (innermost) PID namespace: the last field of
/// `NSpid` in /proc/PID/status, readable while the process lives and while it is a zombie
/// (PyTorch's main process waits for its workers with `WNOWAIT`). None when it is gone.
pub fn pid_in_namespace(proc_root: &Path, host_pid: i32) -> Option<i32> {
    let status =
        std::fs::read_to_string(proc_root.join(host_pid.to_string()).join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_worker_deaths_are_read_with_their_pids() {
        let cases = [
            (
                "RuntimeError: DataLoader worker (pid 57) is killed by signal: Killed. ",
                vec![57],
            ),
            (
                "RuntimeError: DataLoader worker (pid(s) 57, 58) exited unexpectedly",
                vec![57, 58],
            ),
            (
                "ERROR: Unexpected segmentation... no: DataLoader worker (pid(s) 9) exited \
                 unexpectedly",
                vec![9],
            ),
        ];
        for (line, pids) in cases {
            assert!(line.contains(NEEDLE), "{line}");
            assert_eq!(parse(line), Some(WorkerDeath { pids }), "{line}");
        }
    }

    #[test]
    fn other_signals_and_lookalikes_are_not_worker_kills() {
        for line in [
            // A bus error is a signature of its own; a segfault is no death of memory.
            "RuntimeError: DataLoader worker (pid 57) is killed by signal: Bus error. ",
            "RuntimeError: DataLoader worker (pid 57) is killed by signal: Segmentation fault. ",
            "DataLoader worker (pid 57) exited normally",
            "DataLoader worker (pid ) is killed by signal: Killed.",
            "DataLoader worker (pid -1) is killed by signal: Killed.",
            "DataLoader worker (pid 12x) exited unexpectedly",
            "DataLoader worker (pid 57 is killed by signal: Killed.",
            "a DataLoader worker exited unexpectedly",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    #[test]
    fn a_live_or_zombie_process_has_its_namespace_pid_read_from_status() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("4242");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("status"),
            "Name:\tpt_data_worker\nState:\tZ (zombie)\nNSpid:\t4242\t57\n",
        )
        .unwrap();
        assert_eq!(pid_in_namespace(root.path(), 4242), Some(57));
        assert_eq!(pid_in_namespace(root.path(), 4243), None, "gone");
        // This process, in this machine's (host) namespace: its own PID.
        let me = std::process::id() as i32;
        assert_eq!(pid_in_namespace(Path::new("/proc"), me), Some(me));
    }
}

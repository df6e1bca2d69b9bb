//! `/proc/PID/status`, for whether an exiting process has let go of its files yet.

use std::path::Path;

/// Its file table's size (`FDSize:`); 0 once the process has let go of its files (`exit_files`).
pub fn fd_size(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("FDSize:"))?;
    line.trim().parse().ok()
}

/// The longest /proc/PID/status: about 1.5 KiB of fields, with room for long group lists.
const STATUS_MAX: usize = 8192;

/// Whether `pid` still holds its files. A dying process releases nothing it held in /dev/shm
/// before: its last references to files (descriptors, and the mappings its exit unmaps) are
/// put as deferred work that runs after it lets go of its files and root.
pub fn holds_files(proc_root: &Path, pid: i32) -> bool {
    let mut buf = [0u8; STATUS_MAX];
    let path = proc_root.join(pid.to_string()).join("status");
    let Ok(bytes) = super::kfile::read_small(&path, &mut buf) else {
        return false;
    };
    std::str::from_utf8(bytes)
        .ok()
        .and_then(fd_size)
        .is_some_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_file_tables_size_is_read_and_its_absence_is_none() {
        assert_eq!(fd_size("Name:\tx\nFDSize:\t64\nGroups:\n"), Some(64));
        assert_eq!(fd_size("Name:\tx\nFDSize:\t0\n"), Some(0));
        assert_eq!(fd_size("Name:\tx\n"), None);
        assert_eq!(fd_size("FDSize:\tlots\n"), None);
    }

    /// A live process holds its files; a zombie (exited, not yet reaped) has let them go.
    #[test]
    fn a_zombie_holds_no_files_and_a_live_process_does() {
        let proc_root = Path::new("/proc");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(holds_files(proc_root, pid));
        child.kill().unwrap(); // SIGKILL, not reaped
        let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stat().contains(") Z ") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(stat().contains(") Z "), "{}", stat());
        assert!(!holds_files(proc_root, pid));
        child.wait().unwrap();
        assert!(!holds_files(proc_root, pid), "reaped: no status at all");
    }
}

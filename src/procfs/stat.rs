//! Pure: `/proc/PID/stat`, for a process's start (which tells a process from a later one that
//! got its PID).

use std::path::Path;
use std::time::{Duration, SystemTime};

/// The `n`th field after the command (0: the state), counted after the command's closing
/// parenthesis, which the command itself may contain.
fn field_after_comm(stat: &str, n: usize) -> Option<&str> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_ascii_whitespace().nth(n)
}

/// A process's start, in clock ticks since boot (field 22).
pub fn start_ticks(stat: &str) -> Option<u64> {
    field_after_comm(stat, 19)?.parse().ok()
}

/// A process's command (field 2), as the kernel keeps it (at most 15 bytes, any bytes but NUL).
pub fn comm(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// A process's start in ticks since boot, read from `/proc/PID/stat` under `proc_root`.
pub fn start_ticks_of(proc_root: &Path, pid: i32) -> Option<u64> {
    let mut buf = [0u8; STAT_MAX];
    start_ticks(read_stat(proc_root, pid, &mut buf)?)
}

/// The longest /proc/PID/stat: 52 fields of at most 20 digits and a command of at most 64
/// bytes fit many times over.
const STAT_MAX: usize = 4096;

/// `<proc_root>/<pid>/stat` in one read.
fn read_stat<'a>(proc_root: &Path, pid: i32, buf: &'a mut [u8]) -> Option<&'a str> {
    let path = proc_root.join(pid.to_string()).join("stat");
    let bytes = super::kfile::read_small(&path, buf).ok()?;
    std::str::from_utf8(bytes).ok()
}

/// A process's parent's PID (field 4).
pub fn parent_pid(stat: &str) -> Option<i32> {
    field_after_comm(stat, 1)?.parse().ok()
}

/// When the process `pid` started, by the clock: boot time plus its start ticks.
pub fn started(proc_root: &Path, pid: i32) -> Option<SystemTime> {
    started_after(booted(proc_root)?, proc_root, pid)
}

/// The wall-clock time of boot, by `<proc_root>/uptime` (what [`started`] adds ticks to): a
/// caller that asks after many processes reads it once.
pub fn booted(proc_root: &Path) -> Option<SystemTime> {
    SystemTime::now().checked_sub(super::uptime::since_boot(proc_root))
}

/// [`started`], with the boot time given.
pub fn started_after(boot: SystemTime, proc_root: &Path, pid: i32) -> Option<SystemTime> {
    let ticks = start_ticks_of(proc_root, pid)?;
    let hz = rustix::param::clock_ticks_per_second();
    if hz == 0 {
        return None;
    }
    boot.checked_add(Duration::from_millis(ticks.saturating_mul(1000) / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_is_field_22_whatever_the_command_holds() {
        let stat = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 \
                    987654 1000000 200 18446744073709551615";
        assert_eq!(start_ticks(stat), Some(987654));
        assert_eq!(comm(stat), Some("a) b) (c"));
        assert_eq!(comm("4242 (x"), None);
        assert_eq!(start_ticks("4242 (x"), None);
        assert_eq!(start_ticks(""), None);
        let me = started(Path::new("/proc"), std::process::id() as i32).unwrap();
        let age = SystemTime::now().duration_since(me).unwrap_or_default();
        assert!(
            age < Duration::from_secs(3600),
            "this test started {age:?} ago"
        );
    }

    /// To the clock's tick, not to sysinfo(2)'s whole second: a PID reused a second after a
    /// kernel record must not look started before it.
    #[test]
    fn a_process_just_started_is_placed_within_ticks_of_now() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let spawned = SystemTime::now();
        let start = started(Path::new("/proc"), child.id() as i32).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let off = match spawned.duration_since(start) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        assert!(off < Duration::from_millis(200), "{off:?} off");
    }
}

//! When a record was written (boot time + its microseconds since boot), and where a reader
//! starts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where reading starts.
#[derive(Debug, Clone, Copy)]
pub enum KmsgStart {
    /// Only records written after the open.
    End,
    /// The oldest record the ring still holds whose wall-clock time is at or after this one.
    Since(SystemTime),
}

pub(super) fn wall_time(boot: SystemTime, usec: u64) -> SystemTime {
    boot.checked_add(Duration::from_micros(usec))
        .unwrap_or(boot)
}

/// The kernel's clocks are the same in every mount namespace, so the agent's own /proc serves
/// (a time namespace would offset it; /dev/kmsg is not offset, and pods do not use one).
pub(super) fn boot_time_now() -> SystemTime {
    let since_boot = crate::procfs::uptime::since_boot(std::path::Path::new("/proc"));
    boot_time(SystemTime::now(), since_boot)
}

fn boot_time(now: SystemTime, since_boot: Duration) -> SystemTime {
    now.checked_sub(since_boot).unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_is_boot_plus_the_record_time() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let boot = boot_time(now, Duration::from_millis(4_312_840));
        assert_eq!(boot, UNIX_EPOCH + Duration::from_millis(1_699_995_687_160));
        assert_eq!(
            wall_time(boot, 5_503_016_123),
            UNIX_EPOCH + Duration::from_micros(1_699_995_687_160_000 + 5_503_016_123)
        );
        assert_eq!(wall_time(boot, 0), boot);
        // Absurd clocks do not panic.
        assert_eq!(boot_time(UNIX_EPOCH, Duration::MAX), UNIX_EPOCH);
        let _ = wall_time(boot, u64::MAX);
    }
}

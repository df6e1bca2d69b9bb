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
    /// After a saved record of this boot (`resume`): by sequence number where it has one (a
    /// /dev/kmsg reader's), else by time since boot (syslog(2)'s).
    AfterSeq { seq: Option<u64>, usec: u64 },
}

pub(super) fn wall_time(boot: SystemTime, usec: u64) -> SystemTime {
    boot.checked_add(Duration::from_micros(usec))
        .unwrap_or(boot)
}

/// The wall-clock instant of boot: the real-time clock less the boot-time clock, read back to
/// back to the nanosecond, then rounded to the millisecond. So every reader of one boot (`serve`
/// following, `check` reading back) puts a record at the same time, and tells the same failure
/// in the same words; /proc/uptime's hundredths left up to 10 ms between two readers. The
/// kernel's clocks are the same in every mount namespace (a time namespace would offset the
/// boot-time clock; /dev/kmsg is not offset, and pods do not use one).
pub(super) fn boot_time_now() -> SystemTime {
    use rustix::time::{clock_gettime, ClockId};
    let nanos =
        |t: rustix::time::Timespec| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
    let real = nanos(clock_gettime(ClockId::Realtime));
    let since_boot = nanos(clock_gettime(ClockId::Boottime));
    boot_from_nanos(real - since_boot)
}

/// Pure: nanoseconds since the epoch at boot, to the nearest millisecond.
fn boot_from_nanos(boot: i128) -> SystemTime {
    let millis = (boot + 500_000).div_euclid(1_000_000);
    u64::try_from(millis)
        .ok()
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_is_boot_plus_the_record_time() {
        let boot = UNIX_EPOCH + Duration::from_millis(1_699_995_687_160);
        assert_eq!(
            wall_time(boot, 5_503_016_123),
            UNIX_EPOCH + Duration::from_micros(1_699_995_687_160_000 + 5_503_016_123)
        );
        assert_eq!(wall_time(boot, 0), boot);
        // Absurd clocks do not panic.
        let _ = wall_time(boot, u64::MAX);
    }

    #[test]
    fn two_readers_of_one_boot_put_it_at_the_same_millisecond() {
        let boot = 1_699_995_687_160_i128 * 1_000_000;
        // The two clocks read a few hundred nanoseconds apart, by two processes.
        for jitter in [-400, -1, 0, 1, 400] {
            assert_eq!(
                boot_from_nanos(boot + 123_456 + jitter),
                UNIX_EPOCH + Duration::from_millis(1_699_995_687_160)
            );
        }
        assert_eq!(boot_from_nanos(-5), UNIX_EPOCH);
        let now = boot_time_now();
        let since = SystemTime::now().duration_since(now).unwrap();
        let uptime = crate::procfs::uptime::since_boot(std::path::Path::new("/proc"));
        assert!(
            since.abs_diff(uptime) < Duration::from_millis(50),
            "{since:?} {uptime:?}"
        );
    }
}

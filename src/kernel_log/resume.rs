//! Pure: where the kernel log is read on from after a restart. /dev/kmsg's sequence numbers
//! and the records' microseconds count from the boot, so a position holds only with the boot
//! ID it was taken in (`/proc/sys/kernel/random/boot_id`); in another boot the records after the
//! checkpoint's wall time are the new ones.

use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::time::KmsgStart;

/// The last record told: its sequence number (/dev/kmsg's; syslog(2) has none) and time since
/// boot, in which boot, and when the position was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsgCheckpoint {
    pub boot_id: String,
    pub seq: Option<u64>,
    pub usec: u64,
    pub at: SystemTime,
}

/// Where to read from: the end without a checkpoint; after its record in the same boot; from
/// this boot's first record after its time in another (or when the boot is unknown).
pub fn kmsg_start(saved: Option<&KmsgCheckpoint>, boot_id: Option<&str>) -> KmsgStart {
    match saved {
        None => KmsgStart::End,
        Some(c) if boot_id == Some(c.boot_id.as_str()) => KmsgStart::AfterSeq {
            seq: c.seq,
            usec: c.usec,
        },
        Some(c) => KmsgStart::Since(c.at),
    }
}

/// The position of a reader opened at the log's end now, before it read a record: records
/// after this time since boot (the records' clock, CLOCK_MONOTONIC) are new.
pub fn at_end_now(boot_id: Option<String>) -> KmsgCheckpoint {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let usec = u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000
        + u64::try_from(t.tv_nsec).unwrap_or(0) / 1000;
    KmsgCheckpoint {
        boot_id: boot_id.unwrap_or_default(),
        seq: None,
        usec,
        at: SystemTime::now(),
    }
}

/// This boot's ID, under `proc_root` (None when it cannot be read).
pub fn boot_id(proc_root: &Path) -> Option<String> {
    let id = std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id")).ok()?;
    Some(id.trim().to_string()).filter(|id| !id.is_empty())
}

/// Whether a record comes after the saved one: by sequence number where known, else by time.
pub fn is_after(seq: Option<u64>, usec: u64, record_seq: Option<u64>, record_usec: u64) -> bool {
    match (seq, record_seq) {
        (Some(s), Some(r)) => r > s,
        _ => record_usec > usec,
    }
}

/// Records the ring overwrote between the saved one and the first read now (0 if none).
pub fn lost_since(saved_seq: u64, first_seq: u64) -> u64 {
    first_seq.saturating_sub(saved_seq.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn saved() -> KmsgCheckpoint {
        KmsgCheckpoint {
            boot_id: "b1".into(),
            seq: Some(1200),
            usec: 5_000_000,
            at: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        }
    }

    #[test]
    fn the_same_boot_reads_on_after_the_saved_record() {
        let start = kmsg_start(Some(&saved()), Some("b1"));
        assert!(matches!(
            start,
            KmsgStart::AfterSeq {
                seq: Some(1200),
                usec: 5_000_000
            }
        ));
        assert!(!is_after(Some(1200), 5_000_000, Some(1200), 5_000_000));
        assert!(is_after(Some(1200), 5_000_000, Some(1201), 4_000_000));
        // syslog(2)'s records have no sequence number: their time says.
        assert!(is_after(Some(1200), 5_000_000, None, 5_000_001));
        assert!(!is_after(None, 5_000_000, None, 5_000_000));
    }

    #[test]
    fn another_boot_reads_this_boots_records_after_the_checkpoint() {
        let c = saved();
        assert!(matches!(kmsg_start(Some(&c), Some("b2")), KmsgStart::Since(t) if t == c.at));
        assert!(matches!(kmsg_start(Some(&c), None), KmsgStart::Since(_)));
        assert!(matches!(kmsg_start(None, Some("b1")), KmsgStart::End));
    }

    #[test]
    fn a_ring_that_wrapped_past_the_saved_record_counts_the_lost() {
        assert_eq!(lost_since(1200, 1201), 0);
        assert_eq!(lost_since(1200, 1500), 299);
        assert_eq!(lost_since(1200, 7), 0);
    }

    #[test]
    fn the_boot_id_is_read_under_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(boot_id(tmp.path()), None);
        let dir = tmp.path().join("sys/kernel/random");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("boot_id"), "9f1c\n").unwrap();
        assert_eq!(boot_id(tmp.path()).as_deref(), Some("9f1c"));
    }
}

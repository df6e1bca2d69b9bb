//! I/O: /dev/kmsg read without blocking. Each read(2) returns exactly one record; the kernel
//! keeps each reader's position, and when the ring overwrote records before we read them the
//! read fails with EPIPE and the position jumps to the oldest record left.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use super::record::{parse_record, KmsgRecord};
use super::resume::{is_after, lost_since};
use super::time::{boot_time_now, wall_time, KmsgStart};

/// The kernel formats a record into CONSOLE_EXT_LOG_MAX (8 KiB) and fails a smaller read with
/// EINVAL without moving on; twice that leaves room should the limit grow.
const READ_BUF: usize = 16 * 1024;

pub struct KmsgReader {
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Records before this time are skipped (`KmsgStart::Since`), until the first one after.
    since: Option<SystemTime>,
    /// Records up to this one are skipped (`KmsgStart::AfterSeq`), until the first one after.
    after: Option<(Option<u64>, u64)>,
    /// Wall-clock time of boot, refreshed on each batch that returns records.
    boot: SystemTime,
    loss: Loss,
    /// The start of a line a read cut (a file of records only).
    partial: Vec<u8>,
}

impl KmsgReader {
    /// O_RDONLY|O_NONBLOCK|O_CLOEXEC; End: lseek(SEEK_END) (only new records). Reading
    /// needs CAP_SYSLOG when `kernel.dmesg_restrict` is 1.
    pub fn open(path: &Path, start: KmsgStart) -> io::Result<KmsgReader> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let (since, after) = match start {
            KmsgStart::End => {
                rustix::fs::seek(&fd, SeekFrom::End(0))?;
                (None, None)
            }
            // A fresh open already stands at the oldest record.
            KmsgStart::Since(t) => (Some(t), None),
            KmsgStart::AfterSeq { seq, usec } => (None, Some((seq, usec))),
        };
        Ok(KmsgReader {
            fd,
            buf: vec![0; READ_BUF],
            since,
            after,
            boot: boot_time_now(),
            loss: Loss::default(),
            partial: Vec::new(),
        })
    }

    /// Records available now, without blocking; EAGAIN ends the batch; EPIPE (records overwritten before we read them) is counted in `lost()` and reading goes on; at most `max` records per call (a read that holds more returns them all).
    ///
    /// /dev/kmsg returns one record per read (its header line, then dictionary lines that start
    /// with a space); a file of records, which tests append to, returns several: each line is
    /// taken, and a line cut by the end of a read waits for its rest.
    pub fn read_available(&mut self, max: usize) -> Vec<KmsgRecord> {
        let mut out = Vec::new();
        while out.len() < max {
            let n = match rustix::io::read(&self.fd, &mut self.buf) {
                Ok(0) | Err(Errno::AGAIN) => break,
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(Errno::PIPE) => {
                    self.loss.overrun();
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading /dev/kmsg");
                    break;
                }
            };
            let mut chunk = std::mem::take(&mut self.partial);
            chunk.extend_from_slice(&self.buf[..n.min(self.buf.len())]);
            let complete = chunk.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in chunk[..complete].split(|&b| b == b'\n') {
                let Some(record) = parse_record(line) else {
                    continue;
                };
                self.loss.seen(record.seq);
                if let Some((seq, usec)) = self.after {
                    if !is_after(seq, usec, Some(record.seq), record.usec) {
                        continue;
                    }
                    self.after = None;
                    self.loss.ring_wrapped(seq, record.seq);
                }
                if let Some(since) = self.since {
                    if wall_time(self.boot, record.usec) < since {
                        continue;
                    }
                    self.since = None;
                }
                out.push(record);
            }
            if chunk.len() - complete <= READ_BUF {
                self.partial = chunk[complete..].to_vec();
            }
        }
        if !out.is_empty() {
            // The wall clock may have been stepped since the open.
            self.boot = boot_time_now();
        }
        out
    }

    /// Records overwritten before they were read.
    pub fn lost(&self) -> u64 {
        self.loss.lost
    }

    /// Wall-clock time of a record: boot time + usec. Boot time is CLOCK_REALTIME minus
    /// CLOCK_BOOTTIME, read from /proc/uptime (10 ms steps) because the library's rustix lacks
    /// the `time` feature (clock_gettime). BOOTTIME and the records' MONOTONIC-like clock part
    /// only over a suspend, which a GPU node does not do. The records' clock is not slewed by
    /// NTP, so after weeks of uptime a time can be seconds off.
    pub fn wall_time(&self, usec: u64) -> SystemTime {
        wall_time(self.boot, usec)
    }
}

/// Counts records lost to overruns: one per EPIPE at once, the rest of the gap in sequence
/// numbers once the next record says how far the kernel jumped.
#[derive(Debug, Default)]
struct Loss {
    last: Option<u64>,
    pending: bool,
    lost: u64,
}

impl Loss {
    fn overrun(&mut self) {
        if !self.pending {
            self.pending = true;
            self.lost = self.lost.saturating_add(1);
        }
    }

    /// The first record after a saved one (`KmsgStart::AfterSeq`): those between were
    /// overwritten while no one read.
    fn ring_wrapped(&mut self, saved: Option<u64>, first: u64) {
        let lost = saved.map_or(0, |s| lost_since(s, first));
        if lost > 0 {
            tracing::warn!(
                "kernel log: {lost} records written while the agent was down were overwritten \
                 before it started again (the ring is too small for the time it was down): \
                 deaths told in them are not found"
            );
            self.lost = self.lost.saturating_add(lost);
        }
    }

    fn seen(&mut self, seq: u64) {
        if std::mem::take(&mut self.pending) {
            if let Some(last) = self.last {
                let gap = seq.saturating_sub(last.saturating_add(1));
                self.lost = self.lost.saturating_add(gap.saturating_sub(1));
            }
        }
        self.last = Some(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failures::crash::gpu_lib_crash;
    use std::time::{Duration, UNIX_EPOCH};

    const KMSG: &str = "/dev/kmsg";

    fn seqs_after(records: &str, seq: Option<u64>, usec: u64) -> (Vec<u64>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        std::fs::write(&path, records).unwrap();
        let mut reader = KmsgReader::open(&path, KmsgStart::AfterSeq { seq, usec }).unwrap();
        let seqs = reader.read_available(100).iter().map(|r| r.seq).collect();
        (seqs, reader.lost())
    }

    #[test]
    fn a_restart_in_the_same_boot_reads_on_after_the_saved_record() {
        let ring = "6,10,100,-;a\n6,11,200,-;b\n6,12,300,-;c\n";
        assert_eq!(seqs_after(ring, Some(10), 100), (vec![11, 12], 0));
        assert_eq!(seqs_after(ring, Some(12), 300), (vec![], 0));
        // Saved by syslog(2), no sequence number: by time.
        assert_eq!(seqs_after(ring, None, 200), (vec![12], 0));
        // The ring overwrote records 4..9 while the agent was down: six lost, said.
        assert_eq!(seqs_after(ring, Some(3), 50), (vec![10, 11, 12], 6));
    }

    #[test]
    fn a_file_of_records_is_read_line_by_line_as_it_grows() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        std::fs::write(&path, "4,1,100,-;before the open\n").unwrap();
        let mut reader = KmsgReader::open(&path, KmsgStart::End).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"4,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n SUBSYSTEM=pci\n4,3,300,-;second\n4,4,400,-;cut ").unwrap();
        let got: Vec<String> = reader
            .read_available(10)
            .into_iter()
            .map(|r| r.message)
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("NVRM: Xid"));
        assert_eq!(got[1], "second");
        f.write_all(b"here\n").unwrap();
        let got: Vec<String> = reader
            .read_available(10)
            .into_iter()
            .map(|r| r.message)
            .collect();
        assert_eq!(got, ["cut here"]);
        assert_eq!(reader.lost(), 0);
    }

    /// The reader tests need the real device; without it they say so and pass nothing else.
    fn open(start: KmsgStart) -> Option<KmsgReader> {
        match KmsgReader::open(Path::new(KMSG), start) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("SKIPPED: {KMSG} not readable ({e}); no kernel log facts tested");
                None
            }
        }
    }

    #[test]
    fn reading_from_the_end_returns_at_once() {
        let Some(mut reader) = open(KmsgStart::End) else {
            return;
        };
        let started = std::time::Instant::now();
        let first = reader.read_available(1000);
        let second = reader.read_available(1000);
        assert!(started.elapsed() < Duration::from_secs(5));
        // Only what was logged since the open, each record once.
        let mut seqs: Vec<u64> = first.iter().chain(&second).map(|r| r.seq).collect();
        let n = seqs.len();
        seqs.dedup();
        assert_eq!(seqs.len(), n);
        assert_eq!(reader.read_available(0), []);
    }

    #[test]
    fn a_record_user_space_writes_comes_back_as_user_facility_and_no_kernel_fact() {
        let Some(mut reader) = open(KmsgStart::End) else {
            return;
        };
        // A write needs root (or CAP_SYSLOG-free write access to /dev/kmsg); without it the
        // read side above is all there is to test.
        let marker = format!(
            "shmlink kernel_log::kmsg test {}: python3[1]: segfault at 0 ip 0 sp 0 error 4 in \
             libnccl.so.2[7f0000000000+1000]",
            std::process::id()
        );
        if std::fs::write(KMSG, format!("<14>{marker}\n")).is_err() {
            eprintln!("SKIPPED: {KMSG} not writable; the facility of a user record is not tested");
            return;
        }
        let mut found = None;
        for _ in 0..100 {
            found = reader
                .read_available(1000)
                .into_iter()
                .find(|r| r.message == marker);
            if found.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let record = found.expect("the record just written");
        assert_eq!((record.facility, record.level), (1, 6));
        assert!(!record.is_kernel());
        assert_eq!(gpu_lib_crash(&record), None);
        // Its wall-clock time is now, give or take the clocks' difference.
        let age = SystemTime::now()
            .duration_since(reader.wall_time(record.usec))
            .unwrap_or_else(|e| e.duration());
        assert!(age < Duration::from_secs(60), "{age:?}");
    }

    #[test]
    fn since_skips_older_records() {
        let Some(mut old) = open(KmsgStart::Since(UNIX_EPOCH)) else {
            return;
        };
        // A running kernel's ring is never empty.
        assert!(!old.read_available(10).is_empty());
        let Some(mut future) = open(KmsgStart::Since(
            SystemTime::now() + Duration::from_secs(3600),
        )) else {
            return;
        };
        assert_eq!(future.read_available(100_000), []);
    }

    #[test]
    fn lost_records_are_the_gap_an_overrun_leaves() {
        let mut loss = Loss::default();
        loss.seen(10);
        loss.seen(11);
        assert_eq!(loss.lost, 0);
        // EPIPE: the kernel jumps to the oldest record left, 20.
        loss.overrun();
        assert_eq!(loss.lost, 1);
        loss.overrun();
        loss.seen(20);
        assert_eq!(loss.lost, 8);
        loss.seen(21);
        assert_eq!(loss.lost, 8);
        // An overrun before any record: at least one lost, the gap unknown.
        let mut fresh = Loss::default();
        fresh.overrun();
        fresh.seen(500);
        assert_eq!(fresh.lost, 1);
    }
}

//! The kernel log through syslog(2) (`SYSLOG_ACTION_READ_ALL`), for where /dev/kmsg cannot be
//! opened: in a pod that is not privileged the device cgroup refuses /dev/kmsg (EPERM) whatever
//! the capabilities, while syslog(2) needs only CAP_SYSLOG (which RuntimeDefault seccomp
//! profiles then let through as well).
//!
//! READ_ALL copies the newest records that fit the buffer, as text, without consuming them:
//! `<prefix>[seconds.micros] message` a line, the prefix being facility * 8 + level as on
//! /dev/kmsg. It carries no sequence numbers, so what is new is told by time: records after the
//! newest one seen, or at its very microsecond but not seen then. The kernel formats the whole
//! ring on every call (about 1 ms here for a 128 KiB ring), so it is read at most once a
//! [`EVERY`], not on every poll.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io;
use std::time::{Duration, Instant, SystemTime};

use super::record::{decimal, KmsgRecord};
use super::time::{boot_time_now, wall_time, KmsgStart};

/// How often the ring is read.
pub const EVERY: Duration = Duration::from_secs(1);
/// The buffer never grows past this, whatever the ring's size (`log_buf_len` is at most 32 MiB,
/// and the newest records are what matter).
const MAX_BUF: usize = 4 << 20;
const MIN_BUF: usize = 64 << 10;

const SYSLOG_ACTION_READ_ALL: libc::c_int = 3;
const SYSLOG_ACTION_SIZE_BUFFER: libc::c_int = 10;

/// One line of READ_ALL's text: `<6>[ 1234.567890] message`; `None` without a timestamp
/// (`printk.time=0`), which leaves nothing to tell new records by.
pub fn parse_line(line: &[u8]) -> Option<(u8, u8, u64, &[u8])> {
    let rest = line.strip_prefix(b"<")?;
    let close = memchr::memchr(b'>', rest)?;
    let prefix: u32 = decimal(&rest[..close])?;
    let rest = rest[close + 1..].strip_prefix(b"[")?;
    let end = memchr::memchr(b']', rest)?;
    let stamp = rest[..end].trim_ascii_start();
    let (secs, micros) = stamp.split_at(memchr::memchr(b'.', stamp)?);
    let micros = &micros[1..];
    if micros.len() != 6 {
        return None;
    }
    let usec = decimal::<u64>(secs)?
        .checked_mul(1_000_000)?
        .checked_add(decimal(micros)?)?;
    let message = rest[end + 1..]
        .strip_prefix(b" ")
        .unwrap_or(&rest[end + 1..]);
    Some((
        u8::try_from(prefix >> 3).ok()?,
        (prefix & 7) as u8,
        usec,
        message,
    ))
}

/// The records of a READ_ALL text. The kernel repeats a multi-line record's `<prefix>[time] `
/// on each of its lines: a line with the same prefix and time as the line before, or with none,
/// continues that record (two records the kernel stamped in the same microsecond with the same
/// prefix are read as one: the text cannot tell them apart, and a forged line must not pass).
/// Its lines are joined with a newline, so a record reads as the /dev/kmsg reader gives it
/// (`\x0a` unescaped): a newline a process puts in its comm or a file name neither starts a
/// record of its own nor a report line (`failures::oom` reads a record's start only).
fn records(text: &[u8]) -> Vec<(u8, u8, u64, Vec<u8>)> {
    let mut out: Vec<(u8, u8, u64, Vec<u8>)> = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        match parse_line(line) {
            Some((f, l, u, m)) => match out.last_mut() {
                Some(last) if (last.0, last.1, last.2) == (f, l, u) => {
                    last.3.push(b'\n');
                    last.3.extend_from_slice(m);
                }
                _ => out.push((f, l, u, m.to_vec())),
            },
            None if !line.is_empty() => {
                if let Some(last) = out.last_mut() {
                    last.3.push(b'\n');
                    last.3.extend_from_slice(line);
                }
            }
            None => {}
        }
    }
    out
}

/// Which records of a READ_ALL text are new, given what earlier reads saw.
#[derive(Debug, Default)]
struct Newest {
    /// The newest record's time, and the records seen at exactly that time.
    at: Option<(u64, Vec<u64>)>,
    lost: u64,
}

impl Newest {
    /// The records of `text` not seen before, oldest first.
    fn take(&mut self, text: &[u8]) -> Vec<(u8, u8, u64, Vec<u8>)> {
        let joined = records(text);
        let records: Vec<(u8, u8, u64, &[u8])> = joined
            .iter()
            .map(|(f, l, u, m)| (*f, *l, *u, m.as_slice()))
            .collect();
        let mut found_last = self.at.is_none();
        let mut out = Vec::new();
        for &(facility, level, usec, message) in &records {
            let hash = fingerprint(facility, level, message);
            let new = match &self.at {
                None => true,
                Some((last, seen)) if usec == *last => {
                    if seen.contains(&hash) {
                        found_last = true;
                    }
                    !seen.contains(&hash)
                }
                Some((last, _)) => usec > *last,
            };
            if new {
                out.push((facility, level, usec, message.to_vec()));
            }
        }
        // The newest record seen before is no longer in the text, and what is there begins
        // after it: the ring (or the buffer) dropped records in between, at least one.
        if !found_last {
            if let (Some((last, _)), Some(first)) = (&self.at, records.first()) {
                if first.2 > *last {
                    self.lost += 1;
                }
            }
        }
        if let Some(&(_, _, newest, _)) = records.last() {
            let newest = self
                .at
                .as_ref()
                .map_or(newest, |(last, _)| newest.max(*last));
            let mut seen: Vec<u64> = match self.at.take() {
                Some((last, seen)) if last == newest => seen,
                _ => Vec::new(),
            };
            seen.extend(
                records
                    .iter()
                    .filter(|r| r.2 == newest)
                    .map(|&(f, l, _, m)| fingerprint(f, l, m)),
            );
            seen.sort_unstable();
            seen.dedup();
            self.at = Some((newest, seen));
        }
        out
    }
}

fn fingerprint(facility: u8, level: u8, message: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    (facility, level, message).hash(&mut h);
    h.finish()
}

/// Reads the kernel's ring through syslog(2); the same records as a /dev/kmsg reader gives.
pub struct SyslogReader {
    buf: Vec<u8>,
    newest: Newest,
    since: Option<SystemTime>,
    boot: SystemTime,
    next_read: Instant,
    seq: u64,
    /// Records at or before this time since boot are not returned (`KmsgStart::AfterSeq`).
    after_usec: Option<u64>,
}

impl SyslogReader {
    /// Fails as syslog(2) does: EPERM without CAP_SYSLOG (where `kernel.dmesg_restrict` is 1,
    /// or where a seccomp profile allows the call only with it).
    pub fn open(start: KmsgStart) -> io::Result<SyslogReader> {
        // SAFETY: SIZE_BUFFER reads no buffer.
        let size = unsafe { libc::klogctl(SYSLOG_ACTION_SIZE_BUFFER, std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = usize::try_from(size).unwrap_or(0).clamp(MIN_BUF, MAX_BUF);
        let mut reader = SyslogReader {
            buf: vec![0; len],
            newest: Newest::default(),
            since: None,
            boot: boot_time_now(),
            next_read: Instant::now(),
            seq: 0,
            after_usec: None,
        };
        let text_len = reader.read_all()?;
        match start {
            // What is there now is history: seen, not returned.
            KmsgStart::End => {
                let text = reader.buf[..text_len].to_vec();
                reader.newest.take(&text);
            }
            KmsgStart::Since(t) => reader.since = Some(t),
            KmsgStart::AfterSeq { usec, .. } => reader.after_usec = Some(usec),
        }
        // The first read after the open is due at once (it returns what came since).
        reader.next_read = Instant::now();
        Ok(reader)
    }

    fn read_all(&mut self) -> io::Result<usize> {
        let len = libc::c_int::try_from(self.buf.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the kernel writes at most `len` bytes into the buffer, which is that long.
        let n = unsafe { libc::klogctl(SYSLOG_ACTION_READ_ALL, self.buf.as_mut_ptr().cast(), len) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(n).unwrap_or(0).min(self.buf.len()))
    }

    /// The records that came since the last read, at most `max`; nothing when the last read
    /// was less than [`EVERY`] ago.
    pub fn read_available(&mut self, max: usize) -> Vec<KmsgRecord> {
        let now = Instant::now();
        if now < self.next_read {
            return Vec::new();
        }
        self.next_read = now + EVERY;
        let n = match self.read_all() {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "reading the kernel log with syslog(2)");
                return Vec::new();
            }
        };
        let text = std::mem::take(&mut self.buf);
        let fresh = self.newest.take(&text[..n]);
        self.buf = text;
        if !fresh.is_empty() {
            self.boot = boot_time_now();
        }
        let mut out = Vec::new();
        for (facility, level, usec, message) in fresh {
            if self
                .since
                .is_some_and(|since| wall_time(self.boot, usec) < since)
                || self.after_usec.is_some_and(|after| usec <= after)
            {
                continue;
            }
            if out.len() >= max {
                break;
            }
            self.seq += 1;
            out.push(KmsgRecord {
                facility,
                level,
                seq: self.seq,
                usec,
                message: String::from_utf8_lossy(&message).into_owned(),
            });
        }
        out
    }

    /// Times records were dropped between two reads (each at least one record).
    pub fn lost(&self) -> u64 {
        self.newest.lost
    }

    pub fn wall_time(&self, usec: u64) -> SystemTime {
        wall_time(self.boot, usec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failures::crash::gpu_lib_crash;

    #[test]
    fn a_line_is_prefix_time_and_message() {
        let line = b"<6>[11014.145243] crash[11117]: segfault at 0 ip 00007fa91d1f6010 sp \
                     00007ffddae2e8f8 error 4 in libnccl.so.2[1010,7fa91d1f6000+1000]";
        let (facility, level, usec, message) = parse_line(line).unwrap();
        assert_eq!((facility, level, usec), (0, 6, 11_014_145_243));
        assert!(message.starts_with(b"crash[11117]: segfault at 0"));
        // Padded seconds; user space's records carry their facility (1: user).
        let (facility, _, usec, message) = parse_line(b"<14>[    5.000001] hello").unwrap();
        assert_eq!((facility, usec, message), (1, 5_000_001, &b"hello"[..]));
    }

    #[test]
    fn lines_without_a_time_or_out_of_shape_are_not_records() {
        for line in [
            &b"<6>no time"[..],
            b"[ 1.000000] no prefix",
            b"<6>[1.0] short micros",
            b"<x>[1.000000] bad prefix",
            b"<6>[1.000000 unclosed",
            b"",
            b"<99999999999>[1.000000] huge",
        ] {
            assert_eq!(
                parse_line(line),
                None,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    fn text(records: &[(u64, &str)]) -> Vec<u8> {
        records
            .iter()
            .map(|(usec, m)| format!("<6>[{}.{:06}] {m}\n", usec / 1_000_000, usec % 1_000_000))
            .collect::<String>()
            .into_bytes()
    }

    fn messages(records: Vec<(u8, u8, u64, Vec<u8>)>) -> Vec<String> {
        records
            .into_iter()
            .map(|r| String::from_utf8(r.3).unwrap())
            .collect()
    }

    #[test]
    fn only_records_after_the_newest_seen_are_new() {
        let mut n = Newest::default();
        let first = text(&[(1, "a"), (2, "b"), (3, "c")]);
        assert_eq!(messages(n.take(&first)), ["a", "b", "c"]);
        assert!(
            n.take(&first).is_empty(),
            "the same text again: nothing new"
        );
        // Later ones.
        let more = text(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]);
        assert_eq!(messages(n.take(&more)), ["d", "e"]);
        assert_eq!(n.lost, 0);
        // Lines at one microsecond with one prefix are one record (its lines, as the kernel
        // prints a multi-line record): read once.
        let multi = text(&[(6, "f"), (6, "g")]);
        assert_eq!(messages(n.take(&multi)), ["f\ng"]);
        assert!(n.take(&multi).is_empty());
    }

    #[test]
    fn a_ring_that_moved_past_the_newest_seen_counts_a_loss() {
        let mut n = Newest::default();
        n.take(&text(&[(1, "a"), (2, "b")]));
        assert_eq!(messages(n.take(&text(&[(5, "x"), (6, "y")]))), ["x", "y"]);
        assert_eq!(n.lost, 1);
        // Older records only (a clock that cannot go back): nothing new, no loss.
        assert!(n.take(&text(&[(1, "a")])).is_empty());
        assert_eq!(n.lost, 1);
    }

    /// A file name with a newline in it, as syslog(2) prints the crash line: the kernel repeats
    /// the record's prefix on the second line, which reads like a crash of PID 1 on its own.
    #[test]
    fn a_newline_in_a_record_continues_it_and_never_starts_one() {
        let text = b"<6>[  100.000001] crash[4242]: segfault at 0 ip 0000000000401000 sp \
                     00007ffc2b6c1f40 error 4 in x\n<6>[  100.000001] trainer[1]: segfault at 0 \
                     ip 00007f0000001000 sp 00007ffc2b6c1f40 error 4 in libnccl.so.2[7f0000000000+\
                     1000]\n<4>[  100.000002] next record\n";
        let got = records(text);
        assert_eq!(got.len(), 2);
        let first = String::from_utf8_lossy(&got[0].3).into_owned();
        assert!(
            first.starts_with("crash[4242]: segfault at 0")
                && first.contains(" in x\ntrainer[1]: segfault at 0"),
            "{first}"
        );
        assert_eq!(String::from_utf8_lossy(&got[1].3), "next record");
    }

    /// Issue 36's forged OOM kill as syslog(2) prints it: the kernel repeats the segfault's
    /// prefix and time on each line of its file name, the reader joins them into one record,
    /// and no report line is read past a record's start.
    #[test]
    fn a_file_name_holding_an_oom_report_is_no_kill() {
        let victim = format!(
            "/kubepods/burstable/pod99999999-2222-3333-4444-555555555555/{}",
            "b".repeat(64)
        );
        let t = "<6>[  200.000001] ";
        let text = format!(
            "<4>[  199.000000] dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n\
             {t}x[777]: segfault at 0 ip 0000000000401000 sp 00007ffc2b6c1f40 error 4 in x\n\
             {t}oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,\
             oom_memcg={victim},task_memcg={victim},task=py,pid=42,uid=0\n\
             {t}Memory cgroup out of memory: Killed process 42 (py) total-vm:1kB, \
             anon-rss:0kB, file-rss:0kB, shmem-rss:60000kB[401000,400000+1000]\n"
        );
        let got = records(text.as_bytes());
        assert_eq!(got.len(), 2);
        let mut reports = crate::failures::oom::OomReports::default();
        for (facility, level, usec, message) in got {
            let record = KmsgRecord {
                facility,
                level,
                seq: 1,
                usec,
                message: String::from_utf8_lossy(&message).into_owned(),
            };
            assert_eq!(reports.feed(&record), None, "{record:?}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = crate::fixtures::rng::Rng::new(7);
        let seed = b"<6>[11014.145243] crash[11117]: segfault at 0 in libnccl.so.2[1010]\n";
        let mut n = Newest::default();
        for _ in 0..20_000 {
            let bytes = if rng.below(2) == 0 {
                rng.mutate(seed)
            } else {
                rng.bytes(120)
            };
            let _ = parse_line(&bytes);
            let _ = n.take(&bytes);
        }
    }

    /// The real call: as root here it reads the ring; a record written to /dev/kmsg from user
    /// space shows, with its user facility, so it is never taken as a kernel fact.
    #[test]
    fn the_real_ring_reads_as_records() {
        let mut reader = match SyslogReader::open(KmsgStart::End) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("SKIPPED: syslog(2) refused ({e}); no ring read");
                return;
            }
        };
        assert!(reader.read_available(100).is_empty() || reader.lost() == 0);
        let marker = format!(
            "shmlink syslog test {}: python3[1]: segfault at 0 ip 0 sp 0 error 4 in \
             libnccl.so.2[7f0000000000+1000]",
            std::process::id()
        );
        if let Err(e) = std::fs::write("/dev/kmsg", format!("{marker}\n")) {
            eprintln!("SKIPPED: cannot write /dev/kmsg ({e})");
            return;
        }
        // The ring shows a record once the kernel has finalized it: look for a few seconds.
        let mut ours = Vec::new();
        for _ in 0..30 {
            reader.next_read = Instant::now();
            ours.extend(
                reader
                    .read_available(4096)
                    .into_iter()
                    .filter(|r| r.message == marker),
            );
            if !ours.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(ours.len(), 1, "{:?}", reader.newest);
        assert_eq!(ours[0].facility, 1, "user space's record");
        assert!(!ours[0].is_kernel());
        assert_eq!(gpu_lib_crash(&ours[0]), None);
        reader.next_read = Instant::now();
        assert!(
            !reader
                .read_available(4096)
                .iter()
                .any(|r| r.message == marker),
            "read once"
        );
    }
}

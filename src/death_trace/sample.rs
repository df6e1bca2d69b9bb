//! Pure: one perf record from the ring (PERF_SAMPLE_TID | TIME | RAW, in that order, as the
//! kernel writes them) and the tracepoint event its raw bytes hold.

use super::format::Format;

/// `PERF_RECORD_SAMPLE` and `PERF_RECORD_LOST` (linux/perf_event.h).
pub const RECORD_SAMPLE: u32 = 9;
pub const RECORD_LOST: u32 = 2;

/// One record out of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    Sample {
        time_ns: u64,
        raw: &'a [u8],
    },
    /// The ring was full: this many events were dropped.
    Lost(u64),
    Other,
}

/// Parses one whole record (its 8-byte header included); `None` when it is malformed.
pub fn parse_record(rec: &[u8]) -> Option<Record<'_>> {
    let kind = u32::from_ne_bytes(rec.get(0..4)?.try_into().ok()?);
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(rec.get(at..at + 8)?.try_into().ok()?))
    };
    match kind {
        RECORD_SAMPLE => {
            // header 8, pid+tid 8, time 8, raw size 4, raw bytes.
            let time_ns = u64_at(16)?;
            let size = u32::from_ne_bytes(rec.get(24..28)?.try_into().ok()?) as usize;
            let raw = rec.get(28..28usize.checked_add(size)?)?;
            Some(Record::Sample { time_ns, raw })
        }
        // header, id, lost.
        RECORD_LOST => Some(Record::Lost(u64_at(16)?)),
        _ => Some(Record::Other),
    }
}

/// SIGBUS's `si_code`s that a fault gives (asm-generic/siginfo.h): BUS_ADRALN, BUS_ADRERR,
/// BUS_OBJERR, BUS_MCEERR_AR, BUS_MCEERR_AO. `kill` gives SI_USER (0), `tgkill` SI_TKILL (-6),
/// `sigqueue` SI_QUEUE (-1), the kernel's own SI_KERNEL (0x80): none of them a fault.
pub fn is_fault_code(code: i32) -> bool {
    (1..=5).contains(&code)
}

/// What a tracepoint's raw record said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Signal {
        sig: i32,
        code: i32,
        pid: i32,
        comm: String,
    },
    Victim {
        pid: i32,
        comm: String,
        /// kB, as the kernel counts them.
        anon_kb: Option<u64>,
        file_kb: Option<u64>,
        shmem_kb: Option<u64>,
    },
}

/// The two tracepoints' formats and ids, as the running kernel states them.
#[derive(Debug, Clone)]
pub struct Formats {
    pub signal_id: u64,
    pub signal: Format,
    pub victim_id: u64,
    pub victim: Format,
}

impl Formats {
    /// The event a raw record holds, told apart by its `common_type` (the tracepoint's id).
    pub fn event(&self, raw: &[u8]) -> Option<Event> {
        let ty = self.signal.int(raw, "common_type")? as u64;
        if ty == self.signal_id {
            let f = &self.signal;
            Some(Event::Signal {
                sig: f.int(raw, "sig")? as i32,
                code: f.int(raw, "code")? as i32,
                pid: f.int(raw, "pid")? as i32,
                comm: f.string(raw, "comm").unwrap_or_default(),
            })
        } else if ty == self.victim_id {
            let f = &self.victim;
            let kb = |name| f.int(raw, name).map(|v| v as u64);
            Some(Event::Victim {
                pid: f.int(raw, "pid")? as i32,
                comm: f.string(raw, "comm").unwrap_or_default(),
                anon_kb: kb("anon_rss"),
                file_kb: kb("file_rss"),
                shmem_kb: kb("shmem_rss"),
            })
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::parse_format;
    use super::*;

    fn formats() -> Formats {
        Formats {
            signal_id: 261,
            signal: parse_format(include_str!("testdata/signal_generate.format")),
            victim_id: 609,
            victim: parse_format(include_str!("testdata/mark_victim.format")),
        }
    }

    /// A sample record as the kernel lays it out: header, pid/tid, time, raw size, raw, padding.
    fn sample(time: u64, raw: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&1234u32.to_ne_bytes());
        body.extend_from_slice(&1235u32.to_ne_bytes());
        body.extend_from_slice(&time.to_ne_bytes());
        body.extend_from_slice(&(raw.len() as u32).to_ne_bytes());
        body.extend_from_slice(raw);
        while (body.len() + 8) % 8 != 0 {
            body.push(0);
        }
        let mut rec = Vec::new();
        rec.extend_from_slice(&RECORD_SAMPLE.to_ne_bytes());
        rec.extend_from_slice(&0u16.to_ne_bytes());
        rec.extend_from_slice(&((body.len() + 8) as u16).to_ne_bytes());
        rec.extend_from_slice(&body);
        rec
    }

    fn signal_raw(sig: i32, code: i32, pid: i32) -> Vec<u8> {
        let mut raw = vec![0u8; 48];
        raw[0..2].copy_from_slice(&261u16.to_ne_bytes());
        raw[8..12].copy_from_slice(&sig.to_ne_bytes());
        raw[16..20].copy_from_slice(&code.to_ne_bytes());
        raw[20..27].copy_from_slice(b"python3");
        raw[36..40].copy_from_slice(&pid.to_ne_bytes());
        raw
    }

    #[test]
    fn a_page_faults_sigbus_is_read_from_its_sample() {
        let rec = sample(1_700_000_000_123_456_789, &signal_raw(7, 2, 4242));
        let Some(Record::Sample { time_ns, raw }) = parse_record(&rec) else {
            panic!("not a sample");
        };
        assert_eq!(time_ns, 1_700_000_000_123_456_789);
        let event = formats().event(raw).unwrap();
        assert_eq!(
            event,
            Event::Signal {
                sig: 7,
                code: 2,
                pid: 4242,
                comm: "python3".into()
            }
        );
        assert!(is_fault_code(2) && is_fault_code(3));
        // kill -BUS, tgkill, sigqueue, the kernel's own.
        for code in [0, -6, -1, 0x80] {
            assert!(!is_fault_code(code), "{code}");
        }
    }

    #[test]
    fn an_oom_victim_carries_its_rss_and_its_data_loc_name() {
        let mut raw = vec![0u8; 80];
        raw[0..2].copy_from_slice(&609u16.to_ne_bytes());
        raw[8..12].copy_from_slice(&99i32.to_ne_bytes());
        // comm placed after the record: 5 bytes at offset 72.
        raw[12..16].copy_from_slice(&((5u32 << 16) | 72).to_ne_bytes());
        raw[24..32].copy_from_slice(&1000u64.to_ne_bytes());
        raw[32..40].copy_from_slice(&20u64.to_ne_bytes());
        raw[40..48].copy_from_slice(&300_000u64.to_ne_bytes());
        raw[72..77].copy_from_slice(b"hog\0\0");
        let event = formats().event(&raw).unwrap();
        assert_eq!(
            event,
            Event::Victim {
                pid: 99,
                comm: "hog".into(),
                anon_kb: Some(1000),
                file_kb: Some(20),
                shmem_kb: Some(300_000),
            }
        );
    }

    #[test]
    fn malformed_records_and_other_tracepoints_are_refused_without_panic() {
        assert_eq!(parse_record(&[]), None);
        let mut rec = sample(1, &signal_raw(7, 2, 1));
        // A raw size past the record's end.
        rec[24..28].copy_from_slice(&10_000u32.to_ne_bytes());
        assert_eq!(parse_record(&rec), None);
        let mut lost = RECORD_LOST.to_ne_bytes().to_vec();
        lost.extend_from_slice(&[0; 12]);
        lost.extend_from_slice(&17u64.to_ne_bytes());
        assert_eq!(parse_record(&lost), Some(Record::Lost(17)));
        let mut other = signal_raw(7, 2, 1);
        other[0..2].copy_from_slice(&1u16.to_ne_bytes());
        assert_eq!(formats().event(&other), None);
        assert_eq!(formats().event(&[1, 2]), None);
    }
}

//! Pure: the CRI log format that containerd and CRI-O write for kubelet, one record a line:
//! `<RFC 3339 nano time> <stdout|stderr> <P|F>[:<more tags>] <text>`. A line longer than the
//! runtime's buffer (16 KiB in containerd) comes as `P` (partial) records ended by an `F` (full)
//! one; they are joined here, per stream, at most `MAX_LINE` bytes kept.

#[cfg(test)]
use std::time::SystemTime;

use super::{parse_time, Entry, Joined, Pushed};

/// One parsed record.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record<'a> {
    pub at: SystemTime,
    /// 0 = stdout, 1 = stderr.
    pub stream: usize,
    pub partial: bool,
    pub text: &'a [u8],
}

/// Parses one line (without its `\n`); `None` for anything not in the format.
#[cfg(test)]
pub(super) fn parse(line: &[u8]) -> Option<Record<'_>> {
    let r = parse_lazy(line)?;
    Some(Record {
        at: parse_time(r.time)?,
        stream: r.stream,
        partial: r.partial,
        text: r.text,
    })
}

/// A record with its time not yet parsed: the time is wanted only for the few lines kept.
struct Lazy<'a> {
    time: &'a [u8],
    stream: usize,
    partial: bool,
    text: &'a [u8],
}

fn parse_lazy(line: &[u8]) -> Option<Lazy<'_>> {
    let (time, rest) = split_at_space(line)?;
    let (stream, rest) = split_at_space(rest)?;
    // The text may be empty, and then the space after the tag may be missing too.
    let (tags, text) = split_at_space(rest).unwrap_or((rest, &[]));
    let stream = match stream {
        b"stdout" => 0,
        b"stderr" => 1,
        _ => return None,
    };
    // Kubelet reads only the first tag, so later ones may be added; so do we.
    let partial = match tags.split(|&b| b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return None,
    };
    Some(Lazy {
        time,
        stream,
        partial,
        text,
    })
}

fn split_at_space(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = memchr::memchr(b' ', bytes)?;
    Some((&bytes[..i], &bytes[i + 1..]))
}

/// Joins `P` records until their `F`; stdout and stderr apart, since their records interleave.
#[derive(Default)]
pub(super) struct CriJoiner {
    open: [Option<Joined>; 2],
}

impl CriJoiner {
    /// Takes one line of the file; `cut` when the reader kept only its head. Reports the line
    /// it completes: whole only if `keep` wants its text, which is asked before the time is
    /// parsed or a `String` made (most lines stop there). Garbage is skipped and leaves a line
    /// being joined as it was.
    pub fn push(&mut self, line: &[u8], cut: bool, keep: &dyn Fn(&[u8]) -> bool) -> Pushed {
        let Some(record) = parse_lazy(line) else {
            return Pushed::Nothing;
        };
        let slot = &mut self.open[record.stream];
        if !record.partial && slot.is_none() {
            if !keep(record.text) {
                return Pushed::Skipped;
            }
            return match parse_time(record.time) {
                Some(at) => Pushed::Line(Entry::whole(at, record.text, cut)),
                None => Pushed::Nothing,
            };
        }
        let joined = match slot {
            Some(joined) => joined,
            None => match parse_time(record.time) {
                Some(at) => slot.insert(Joined::new(at)),
                None => return Pushed::Nothing,
            },
        };
        joined.push(record.text);
        if cut {
            joined.cut();
        }
        if record.partial {
            return Pushed::Nothing;
        }
        match slot.take() {
            Some(joined) if keep(&joined.bytes) => Pushed::Line(joined.finish()),
            _ => Pushed::Skipped,
        }
    }

    /// Forgets the lines being joined (the file was truncated under them).
    pub fn reset(&mut self) {
        self.open = Default::default();
    }

    /// Whether a line's parts are being joined (its end not read yet).
    pub fn is_joining(&self) -> bool {
        self.open.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_LINE, TRUNCATED_MARK};
    use super::*;

    impl CriJoiner {
        /// Every line kept.
        fn push_all(&mut self, line: &[u8], cut: bool) -> Option<Entry> {
            self.push(line, cut, &|_| true).line()
        }
    }

    const SHM: &str = "2026-11-23T10:15:02.123456789Z stderr F RuntimeError: unable to allocate \
        shared memory(shm) for file </torch_13_1234_0>: No space left on device (28)";

    fn texts(joiner: &mut CriJoiner, lines: &[&str]) -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| joiner.push_all(l.as_bytes(), false))
            .map(|e| e.text)
            .collect()
    }

    #[test]
    fn a_full_record_is_parsed() {
        let r = parse(SHM.as_bytes()).unwrap();
        assert_eq!(r.stream, 1);
        assert!(!r.partial);
        assert!(r
            .text
            .starts_with(b"RuntimeError: unable to allocate shared memory(shm)"));
        assert_eq!(r.at, parse_time(b"2026-11-23T10:15:02.123456789Z").unwrap());
    }

    #[test]
    fn the_text_keeps_its_own_spaces_and_may_be_empty() {
        let r = parse(b"2026-11-23T10:15:02Z stdout F   indented  ").unwrap();
        assert_eq!(r.text, b"  indented  ");
        assert_eq!(parse(b"2026-11-23T10:15:02Z stdout F ").unwrap().text, b"");
        assert_eq!(parse(b"2026-11-23T10:15:02Z stdout F").unwrap().text, b"");
    }

    #[test]
    fn later_tags_are_ignored() {
        let r = parse(b"2026-11-23T10:15:02+01:00 stdout P:x:y part").unwrap();
        assert!(r.partial);
        assert_eq!(r.text, b"part");
    }

    #[test]
    fn garbage_is_not_a_record() {
        for line in [
            &b""[..],
            b"hello world",
            b"2026-11-23T10:15:02Z",
            b"2026-11-23T10:15:02Z stdout",
            b"2026-11-23T10:15:02Z stdin F text",
            b"2026-11-23T10:15:02Z stdout X text",
            b"2026-11-23T10:15:02Z stdout  text",
            b"not-a-time stdout F text",
            b"2026-13-45T10:15:02Z stdout F text",
            b"\xff\xfe\x00 stdout F text",
            b"{\"log\":\"text\\n\",\"stream\":\"stdout\",\"time\":\"2026-11-23T10:15:02Z\"}",
        ] {
            assert_eq!(parse(line), None, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn partial_records_are_joined_until_the_full_one() {
        let mut j = CriJoiner::default();
        let got = texts(
            &mut j,
            &[
                "2026-11-23T10:15:01.000000001Z stdout P [rank0]: Traceback ",
                "2026-11-23T10:15:01.000000002Z stdout P (most recent call last)",
                "2026-11-23T10:15:01.000000003Z stdout F :",
                "2026-11-23T10:15:01.000000004Z stdout F next",
            ],
        );
        assert_eq!(got, ["[rank0]: Traceback (most recent call last):", "next"]);
    }

    #[test]
    fn a_joined_line_takes_the_time_of_its_first_part() {
        let mut j = CriJoiner::default();
        assert!(j
            .push_all(b"2026-11-23T10:15:01Z stdout P a", false)
            .is_none());
        let e = j
            .push_all(b"2026-11-23T10:15:09Z stdout F b", false)
            .unwrap();
        assert_eq!(e.at, parse_time(b"2026-11-23T10:15:01Z").unwrap());
    }

    #[test]
    fn streams_are_joined_apart() {
        let mut j = CriJoiner::default();
        let got = texts(
            &mut j,
            &[
                "2026-11-23T10:15:01Z stdout P out-",
                "2026-11-23T10:15:01Z stderr P err-",
                "2026-11-23T10:15:01Z stderr F end",
                "2026-11-23T10:15:01Z stdout F end",
            ],
        );
        assert_eq!(got, ["err-end", "out-end"]);
    }

    #[test]
    fn garbage_between_parts_does_not_break_the_line() {
        let mut j = CriJoiner::default();
        let got = texts(
            &mut j,
            &[
                "2026-11-23T10:15:01Z stdout P a",
                "\u{0}\u{1}garbage",
                "2026-11-23T10:15:01Z stdout F b",
            ],
        );
        assert_eq!(got, ["ab"]);
    }

    #[test]
    fn a_huge_joined_line_is_truncated_at_max_line() {
        let mut j = CriJoiner::default();
        let part = format!("2026-11-23T10:15:01Z stdout P {}", "x".repeat(16 * 1024));
        for _ in 0..64 {
            assert!(j.push_all(part.as_bytes(), false).is_none());
        }
        let e = j
            .push_all(b"2026-11-23T10:15:01Z stdout F tail", false)
            .unwrap();
        assert_eq!(e.text.len(), MAX_LINE + TRUNCATED_MARK.len());
        assert!(e.text.ends_with(&format!("xxx{TRUNCATED_MARK}")));
        // The next line starts afresh.
        let e = j.push_all(SHM.as_bytes(), false).unwrap();
        assert!(e.text.starts_with("RuntimeError"));
    }

    #[test]
    fn a_line_the_reader_cut_is_marked_truncated() {
        let mut j = CriJoiner::default();
        let e = j
            .push_all(b"2026-11-23T10:15:01Z stdout F head", true)
            .unwrap();
        assert_eq!(e.text, format!("head{TRUNCATED_MARK}"));
        assert!(j
            .push_all(b"2026-11-23T10:15:01Z stdout P a", true)
            .is_none());
        assert!(j
            .push_all(b"2026-11-23T10:15:01Z stdout P b", false)
            .is_none());
        let e = j
            .push_all(b"2026-11-23T10:15:01Z stdout F c", false)
            .unwrap();
        assert_eq!(e.text, format!("a{TRUNCATED_MARK}"));
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let mut j = CriJoiner::default();
        let e = j
            .push_all(b"2026-11-23T10:15:01Z stdout F \xc3\x28 ok", false)
            .unwrap();
        assert_eq!(e.text, "\u{FFFD}( ok");
    }

    #[test]
    fn reset_forgets_a_partial_line() {
        let mut j = CriJoiner::default();
        assert!(j
            .push_all(b"2026-11-23T10:15:01Z stdout P old", false)
            .is_none());
        j.reset();
        let e = j
            .push_all(b"2026-11-23T10:15:01Z stdout F new", false)
            .unwrap();
        assert_eq!(e.text, "new");
    }
}

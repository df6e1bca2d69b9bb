//! Pure: Docker's json-file log driver, one JSON object a line:
//! `{"log":"text\n","stream":"stderr","time":"2026-11-23T10:15:02.123456789Z"}`. Docker splits a
//! line longer than its 16 KiB buffer into entries whose `log` lacks the trailing `\n`; they are
//! joined here, per stream, until one ends with `\n`, at most `MAX_LINE` bytes kept.

use std::borrow::Cow;

use super::{parse_time, Entry, Joined, Pushed};

#[derive(serde::Deserialize)]
struct Record<'a> {
    #[serde(borrow)]
    log: Cow<'a, str>,
    #[serde(borrow, default)]
    stream: Cow<'a, str>,
    #[serde(borrow)]
    time: Cow<'a, str>,
}

/// Joins split entries until the one that ends the line; stdout and stderr apart.
#[derive(Default)]
pub(super) struct DockerJoiner {
    open: [Option<Joined>; 2],
}

impl DockerJoiner {
    /// Takes one line of the file; `cut` when the reader kept only its head, which leaves
    /// unfinished JSON: skipped, like any other line that is not an entry. Reports the line it
    /// completes: whole only if `keep` wants its text (asked before the time is parsed).
    pub fn push(&mut self, line: &[u8], cut: bool, keep: &dyn Fn(&[u8]) -> bool) -> Pushed {
        if cut {
            return Pushed::Nothing;
        }
        // Docker writes valid UTF-8; a damaged file is read as far as it still parses.
        let line = String::from_utf8_lossy(line);
        let Ok(record) = serde_json::from_str::<Record>(&line) else {
            return Pushed::Nothing;
        };
        let slot = &mut self.open[usize::from(record.stream == "stderr")];
        match record.log.strip_suffix('\n') {
            Some(text) => match slot.take() {
                None if !keep(text.as_bytes()) => Pushed::Skipped,
                None => match parse_time(record.time.as_bytes()) {
                    Some(at) => Pushed::Line(Entry::whole(at, text.as_bytes(), false)),
                    None => Pushed::Nothing,
                },
                Some(mut joined) => {
                    joined.push(text.as_bytes());
                    if keep(&joined.bytes) {
                        Pushed::Line(joined.finish())
                    } else {
                        Pushed::Skipped
                    }
                }
            },
            None => {
                let joined = match slot {
                    Some(joined) => joined,
                    None => match parse_time(record.time.as_bytes()) {
                        Some(at) => slot.insert(Joined::new(at)),
                        None => return Pushed::Nothing,
                    },
                };
                joined.push(record.log.as_bytes());
                Pushed::Nothing
            }
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

    impl DockerJoiner {
        /// Every line kept.
        fn push_all(&mut self, line: &[u8], cut: bool) -> Option<Entry> {
            self.push(line, cut, &|_| true).line()
        }
    }

    fn entry(log: &str, stream: &str, time: &str) -> String {
        serde_json::json!({ "log": log, "stream": stream, "time": time }).to_string()
    }

    #[test]
    fn an_entry_is_one_line_without_its_newline() {
        let mut j = DockerJoiner::default();
        let line = r#"{"log":"RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.\n","stream":"stderr","time":"2026-11-23T10:15:02.123456789Z"}"#;
        let e = j.push_all(line.as_bytes(), false).unwrap();
        assert_eq!(
            e.text,
            "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error."
        );
        assert_eq!(e.at, parse_time(b"2026-11-23T10:15:02.123456789Z").unwrap());
    }

    #[test]
    fn escapes_are_decoded() {
        let mut j = DockerJoiner::default();
        let line = r#"{"log":"tab\there \"quoted\" \u00e9\r\n","stream":"stdout","time":"2026-11-23T10:15:02Z","attrs":{"tag":"x"}}"#;
        let e = j.push_all(line.as_bytes(), false).unwrap();
        assert_eq!(e.text, "tab\there \"quoted\" é\r");
    }

    #[test]
    fn split_entries_are_joined_until_one_ends_the_line() {
        let mut j = DockerJoiner::default();
        let t = "2026-11-23T10:15:02.1Z";
        assert!(j
            .push_all(entry("NCCL WARN ", "stdout", t).as_bytes(), false)
            .is_none());
        assert!(j
            .push_all(
                entry("Error while creating shared memory ", "stdout", t).as_bytes(),
                false
            )
            .is_none());
        let e = j
            .push_all(
                entry("segment\n", "stdout", "2026-11-23T10:15:03Z").as_bytes(),
                false,
            )
            .unwrap();
        assert_eq!(
            e.text,
            "NCCL WARN Error while creating shared memory segment"
        );
        assert_eq!(e.at, parse_time(t.as_bytes()).unwrap());
    }

    #[test]
    fn streams_are_joined_apart() {
        let mut j = DockerJoiner::default();
        let t = "2026-11-23T10:15:02Z";
        assert!(j
            .push_all(entry("out-", "stdout", t).as_bytes(), false)
            .is_none());
        let e = j
            .push_all(entry("err\n", "stderr", t).as_bytes(), false)
            .unwrap();
        assert_eq!(e.text, "err");
        let e = j
            .push_all(entry("end\n", "stdout", t).as_bytes(), false)
            .unwrap();
        assert_eq!(e.text, "out-end");
    }

    #[test]
    fn a_huge_split_line_is_truncated_at_max_line() {
        let mut j = DockerJoiner::default();
        let part = entry(&"z".repeat(16 * 1024), "stderr", "2026-11-23T10:15:02Z");
        for _ in 0..64 {
            assert!(j.push_all(part.as_bytes(), false).is_none());
        }
        let e = j
            .push_all(
                entry("end\n", "stderr", "2026-11-23T10:15:02Z").as_bytes(),
                false,
            )
            .unwrap();
        assert_eq!(e.text.len(), MAX_LINE + TRUNCATED_MARK.len());
        assert!(e.text.ends_with(TRUNCATED_MARK));
    }

    #[test]
    fn garbage_is_skipped() {
        let mut j = DockerJoiner::default();
        for line in [
            &b""[..],
            b"{",
            b"[]",
            b"null",
            b"2026-11-23T10:15:02Z stdout F text",
            br#"{"log":"x\n","stream":"stdout"}"#,
            br#"{"log":"x\n","stream":"stdout","time":"yesterday"}"#,
            br#"{"log":7,"stream":"stdout","time":"2026-11-23T10:15:02Z"}"#,
            b"\xff\xfe{\"log\"",
        ] {
            assert_eq!(
                j.push_all(line, false),
                None,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let line = entry("whole\n", "stdout", "2026-11-23T10:15:02Z");
        assert_eq!(
            j.push_all(line.as_bytes(), true),
            None,
            "a cut entry is not JSON"
        );
    }

    #[test]
    fn invalid_utf8_in_a_damaged_file_is_replaced() {
        let mut j = DockerJoiner::default();
        let e = j
            .push_all(
                b"{\"log\":\"bad \xff byte\\n\",\"stream\":\"stdout\",\"time\":\"2026-11-23T10:15:02Z\"}",
                false,
            )
            .unwrap();
        assert_eq!(e.text, "bad \u{FFFD} byte");
    }

    #[test]
    fn a_missing_stream_is_stdout() {
        let mut j = DockerJoiner::default();
        let e = j
            .push_all(br#"{"log":"x\n","time":"2026-11-23T10:15:02Z"}"#, false)
            .unwrap();
        assert_eq!(e.text, "x");
    }
}

//! Pure: what of a line a workload wrote is kept as evidence, and how it is written out. The one
//! home of redaction: a line may carry a password, a token or a cloud key beside the words
//! that named the failure, and what is kept goes into the store, `history`, the HTTP API,
//! Events, serve's log and `check`'s output. So evidence is the matched words with a bounded
//! context, every secret shape in it replaced by [`REDACTED`], and every control or format
//! character written out (`\x1b`, `\u{202e}`), so no escape sequence or bidi override reaches
//! a terminal.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// What a secret is replaced by.
pub const REDACTED: &str = "<redacted>";
/// Bytes of the line kept before the matched words, and after them.
pub const BEFORE: usize = 96;
pub const AFTER: usize = 192;

/// One secret shape: where it is, and which capture group is the secret (0: all of it).
struct Shape {
    re: Regex,
    group: usize,
}

/// The shapes, each a regex of the `regex` crate (linear time, whatever the line holds).
static SHAPES: LazyLock<Vec<Shape>> = LazyLock::new(|| {
    let shape = |re: &str, group| Shape {
        // The patterns are this file's constants: a build error is a bug the tests catch.
        re: Regex::new(re).expect("a secret shape compiles"),
        group,
    };
    vec![
        // `password=...`, `DB_PASSWORD: ...`, `"api_key": "..."`, `--token=...`: any key whose
        // name says secret, then its value.
        shape(
            r#"(?i)[\w.-]*(?:passw(?:or)?d|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth|session[_-]?id|cookie)[\w.-]*["']?\s*[:=]\s*["']?([^\s"',;&]+)"#,
            1,
        ),
        // `Authorization: Bearer <token>`, `Bearer <token>` alone.
        shape(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{8,})", 1),
        shape(r"(?i)\bbasic\s+([A-Za-z0-9+/]{12,}={0,2})", 1),
        // A JWT: base64url JSON header (`{"` is `eyJ`), payload, signature.
        shape(
            r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?",
            0,
        ),
        // Cloud and service keys by their prefixes: AWS access key IDs, GitHub, GitLab, Slack,
        // OpenAI and Anthropic, Hugging Face, Google API keys.
        shape(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b", 0),
        shape(
            r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
            0,
        ),
        shape(r"\bglpat-[A-Za-z0-9_-]{20,}", 0),
        shape(r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0),
        shape(r"\bsk-[A-Za-z0-9_-]{20,}", 0),
        shape(r"\bhf_[A-Za-z0-9]{20,}", 0),
        shape(r"\bAIza[0-9A-Za-z_-]{35}", 0),
        // `scheme://user:password@host`: the password.
        shape(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:([^\s/@]+)@", 1),
        shape(r"-----BEGIN[A-Z ]*PRIVATE KEY-----(.*)", 1),
    ]
});

/// Where the secrets of `text` are: byte ranges, sorted and merged.
fn secrets(text: &str) -> Vec<Range<usize>> {
    let mut found: Vec<Range<usize>> = Vec::new();
    for shape in SHAPES.iter() {
        for caps in shape.re.captures_iter(text) {
            let Some(m) = caps.get(shape.group) else {
                continue;
            };
            // A key's value that is only the scheme word: the next shape takes its token.
            let word = m.as_str();
            if shape.group == 1
                && (word.eq_ignore_ascii_case("bearer") || word.eq_ignore_ascii_case("basic"))
            {
                continue;
            }
            if !word.is_empty() {
                found.push(m.range());
            }
        }
    }
    found.sort_by_key(|r| (r.start, r.end));
    let mut merged: Vec<Range<usize>> = Vec::new();
    for r in found {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// `text` with every secret shape replaced by [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    redact_keeping(text, 0..0).0
}

/// [`redact`], and where `span` (a range of `text`) is in what it returns: shifted past the
/// replacements before it, grown over those it touches.
fn redact_keeping(text: &str, span: Range<usize>) -> (Cow<'_, str>, Range<usize>) {
    let found = secrets(text);
    if found.is_empty() {
        return (Cow::Borrowed(text), span);
    }
    let mut out = String::with_capacity(text.len());
    let (mut start, mut end) = (None, None);
    let mut at = 0;
    for r in found {
        out.push_str(&text[at..r.start]);
        let (from, to) = (out.len(), out.len() + REDACTED.len());
        out.push_str(REDACTED);
        if start.is_none() && span.start < r.end {
            start = Some(if span.start >= r.start {
                from
            } else {
                from - (r.start - span.start)
            });
        }
        if end.is_none() && span.end <= r.start {
            end = Some(from - (r.start - span.end));
        } else if end.is_none() && span.end <= r.end {
            end = Some(to);
        }
        at = r.end;
    }
    let tail = out.len();
    out.push_str(&text[at..]);
    let start = start.unwrap_or(tail + span.start.saturating_sub(at));
    let end = end.unwrap_or(tail + span.end.saturating_sub(at));
    (Cow::Owned(out), start..end.max(start))
}

/// The part of `line` a match at `span` (the matched words) stands in: [`BEFORE`] bytes before
/// it and [`AFTER`] after (at character boundaries, `…` where cut), redacted. Redacted first,
/// so a secret is never cut into a piece its shape no longer matches.
pub fn around(line: &str, span: Range<usize>) -> String {
    let span = span.start.min(line.len())..span.end.min(line.len());
    let (text, span) = redact_keeping(line, span);
    let mut from = span.start.saturating_sub(BEFORE);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = (span.end + AFTER).min(text.len());
    while !text.is_char_boundary(to) {
        to += 1;
    }
    let mut out = String::with_capacity(to - from + 6);
    if from > 0 {
        out.push('…');
    }
    out.push_str(&text[from..to]);
    if to < text.len() {
        out.push('…');
    }
    out
}

/// A character written out rather than shown: controls (C0, DEL, C1), format characters (bidi
/// overrides and isolates, zero-width ones, the BOM, soft hyphen) and the line and paragraph
/// separators.
static HIDDEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]").expect("the character classes compile")
});

/// `text` with its control and format characters written out: `\x1b` (ESC, CR, C1 controls,
/// ...), `\u{202e}` (beyond U+00FF). A line a workload printed reaches terminals (`check`'s
/// tables, `history`) and Event notes, where an escape sequence would redraw what a person
/// reads and a bidi override reorder it.
pub fn printable(text: &str) -> String {
    HIDDEN
        .replace_all(text, |caps: &regex::Captures<'_>| {
            let c = caps[0].chars().next().map_or(0, u32::from);
            if c <= 0xff {
                format!("\\x{c:02x}")
            } else {
                format!("\\u{{{c:04x}}}")
            }
        })
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> String {
        redact(text).into_owned()
    }

    #[test]
    fn each_secret_shape_is_redacted_and_the_words_around_it_stay() {
        let cases = [
            (
                "connecting with password=hunter2 to db",
                "connecting with password=<redacted> to db",
            ),
            (
                "DB_PASSWORD: 's3cr3t!' failed",
                "DB_PASSWORD: '<redacted>' failed",
            ),
            (
                r#"{"api_key": "abc123def456", "x": 1}"#,
                r#"{"api_key": "<redacted>", "x": 1}"#,
            ),
            ("--token=xyz.789 next", "--token=<redacted> next"),
            (
                "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG x",
                "AWS_SECRET_ACCESS_KEY=<redacted> x",
            ),
            (
                "client_secret=abc&grant=1",
                "client_secret=<redacted>&grant=1",
            ),
            (
                "Authorization: Bearer abcdef0123456789.x-y",
                "Authorization: Bearer <redacted>",
            ),
            ("header Bearer AbCdEf0123456789", "header Bearer <redacted>"),
            (
                "auth header Basic dXNlcjpwYXNzd29yZA==",
                "auth header Basic <redacted>",
            ),
            (
                "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sflKxwRJSMeKKF2QT4fwpM rest",
                "jwt <redacted> rest",
            ),
            ("key AKIAIOSFODNN7EXAMPLE used", "key <redacted> used"),
            (
                "gh ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789 x",
                "gh <redacted> x",
            ),
            (
                "slack xoxb-123456789012-abcdefABCDEF x",
                "slack <redacted> x",
            ),
            (
                "openai sk-proj-abcdefghijklmnopqrstuvwx y",
                "openai <redacted> y",
            ),
            ("hf hf_abcdefghijklmnopqrstuvwxyz123 y", "hf <redacted> y"),
            (
                "git clone https://alice:p4ss@github.com/x.git",
                "git clone https://alice:<redacted>@github.com/x.git",
            ),
            (
                "redis://:pw0rd@10.0.0.1:6379/0 refused",
                "redis://:<redacted>@10.0.0.1:6379/0 refused",
            ),
        ];
        for (line, want) in cases {
            assert_eq!(r(line), want, "{line}");
        }
    }

    #[test]
    fn failure_texts_hold_no_secret_shape() {
        for line in [
            "RuntimeError: unable to allocate shared memory(shm) for file </torch_4242_3195629858_0>: No space left on device (28)",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
            "host:168:168 [0] misc/shmutils.cc:133 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-VPyhzw (size 9637888)",
            "python3[4242]: segfault at 0 ip 00007f1c2a3b4c5d sp 00007ffd1e2f3a40 error 6 in libnccl.so.2[7f1c2a200000+1a00000]",
            "Memory cgroup out of memory: Killed process 5947 (dd) total-vm:1234kB, anon-rss:0kB, file-rss:0kB, shmem-rss:1048576kB",
        ] {
            assert_eq!(r(line), line);
        }
    }

    #[test]
    fn the_kept_part_is_the_match_with_its_context_redacted_first() {
        let secret = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sflKxwRJSMeKKF2QT4fwpM";
        let line = format!(
            "{} token={secret} RuntimeError: unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28) {}",
            "a".repeat(300),
            "b".repeat(300)
        );
        let start = line.find("unable to allocate").unwrap();
        let kept = around(
            &line,
            start..start + "unable to allocate shared memory".len(),
        );
        assert!(kept.starts_with('…') && kept.ends_with('…'), "{kept}");
        assert!(
            kept.contains("token=<redacted> RuntimeError: unable to allocate"),
            "{kept}"
        );
        assert!(kept.contains("No space left on device (28)"), "{kept}");
        assert!(!kept.contains("eyJ"), "{kept}");
        assert!(
            kept.len() <= BEFORE + AFTER + 40 + 6,
            "{} bytes",
            kept.len()
        );
        // The span is kept wherever the secrets are: after it, across it, none.
        let line = "bus error in worker password=x then more";
        assert_eq!(
            around(line, 0..9),
            "bus error in worker password=<redacted> then more"
        );
        let (text, span) = redact_keeping("a token=abcdef b", 2..14);
        assert_eq!(&text[span], "token=<redacted>");
        let (text, span) = redact_keeping("abc", 1..2);
        assert_eq!(&text[span], "b");
    }

    #[test]
    fn control_and_format_characters_are_written_out() {
        assert_eq!(printable("a\u{1b}[2Jb\r\u{9b}"), "a\\x1b[2Jb\\x0d\\x9b");
        assert_eq!(
            printable("evil\u{202e}txt.exe\u{2066}x\u{2069}\u{200b}\u{200d}\u{feff}\u{2060}\u{200e}\u{ad}\u{2028}"),
            "evil\\u{202e}txt.exe\\u{2066}x\\u{2069}\\u{200b}\\u{200d}\\u{feff}\\u{2060}\\u{200e}\\xad\\u{2028}"
        );
        assert_eq!(printable("plain ü 日本 ok"), "plain ü 日本 ok");
    }
}

//! How a line says what it says: a failure, or what a program goes on from (NCCL's INFO, a
//! retry, a fallback), or a person's words about failures (advice, help text, a question, a
//! search). Only a failure names anything.

use super::speaker::Speaker;

/// How a line says its facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    Failure,
    /// A level below a failure: NCCL's INFO (a call it ignores and goes on from), a logger's
    /// INFO or DEBUG.
    Info,
    /// Advice or help text: the clause starts with `Tip`, `Please`, `If`, `Try` ...
    Advice,
    /// The program tries again.
    Retry,
    /// The program goes on another way (falling back, serial mode, instead).
    Fallback,
    /// A search or a quote of the words (`grep`, backticks).
    Quote,
    /// A question about them.
    Question,
    /// Nothing on the line says anything failed.
    Unsaid,
}

/// Words a failure is said with (a severity, a verb, an exception).
const FAILURE: &[&str] = &[
    "error",
    "Error",
    "ERROR",
    "fail",
    "Fail",
    "FAIL",
    "unable",
    "Unable",
    "could not",
    "Could not",
    "cannot",
    "Cannot",
    "can't",
    "couldn't",
    "Couldn't",
    "FATAL",
    "Fatal",
    "fatal",
    "WARN ",
    "WARN]",
    "Exception",
    "exception",
    "killed",
    "abort",
    "Abort",
    "terminate",
    "crash",
    "[Errno ",
    "panic",
    "returned ",
    "return value",
];
/// Clause openers of advice and help text.
const ADVICE: &[&str] = &[
    "tip",
    "hint",
    "note",
    "consider",
    "try ",
    "please",
    "make sure",
    "you can",
    "you may",
    "you might",
    "you should",
    "you need",
    "if ",
    "to fix",
    "to avoid",
    "to solve",
    "see ",
    "e.g.",
    "for example",
    "usage",
    "--",
];
const RETRY: &[&str] = &["retrying", "Retrying", "will retry", "retry ", "Retry "];
const FALLBACK: &[&str] = &[
    "falling back",
    "Falling back",
    "fall back",
    "fallback",
    "Fallback",
    "serial mode",
    " instead",
];

/// How `line` says the facts that start at byte `at` and end at `end`; `said` is the bytes of
/// what failed (a person quotes those in backticks or double quotes: programs quote CUDA's words
/// in single quotes, never an errno's); `name` those of a GPU error's name, which says "Error"
/// of itself and is no failure's word; `shortage_of_a_file`: words that say a file under
/// /dev/shm could not get its space, a failure of themselves.
pub fn how(
    line: &str,
    speaker: &Speaker<'_>,
    (at, end): (usize, usize),
    said: (usize, usize),
    name: Option<(usize, usize)>,
    shortage_of_a_file: bool,
) -> Said {
    if let Speaker::Nccl { warn: false, .. } = speaker {
        return Said::Info;
    }
    let before = &line[..at];
    let after = &line[end..];
    if before.contains("grep ") || ['`', '"'].iter().any(|&q| quoted_in(line, said, q)) {
        return Said::Quote;
    }
    if line.trim_end().ends_with('?') {
        return Said::Question;
    }
    if RETRY.iter().any(|w| after.contains(w)) {
        return Said::Retry;
    }
    if FALLBACK.iter().any(|w| line.contains(w)) {
        return Said::Fallback;
    }
    let (head, tail) = match name {
        Some((s, e)) => (&line[..s], &line[e..]),
        None => (line, ""),
    };
    // A Python warning is not a failure of itself (its words may still say one).
    let exception =
        matches!(speaker, Speaker::Python { exception } if !exception.ends_with("Warning"));
    let failure = FAILURE.iter().any(|w| head.contains(w) || tail.contains(w))
        || exception
        || matches!(speaker, Speaker::Nccl { .. })
        || shortage_of_a_file;
    if advice(clause(line, at)) {
        return Said::Advice;
    }
    if info_before(before) && !FAILURE.iter().any(|w| before.contains(w)) {
        return Said::Info;
    }
    if failure {
        Said::Failure
    } else {
        Said::Unsaid
    }
}

/// The clause the facts at `at` are in: from the last sentence's end (or a logger's prefix
/// ending in `: ` or `] `) before them.
fn clause(line: &str, at: usize) -> &str {
    let before = &line[..at];
    let start = [". ", "! ", "; "]
        .iter()
        .filter_map(|s| before.rfind(s).map(|i| i + s.len()))
        .max()
        .unwrap_or(0);
    line[start..].trim_start_matches(|c: char| c.is_whitespace() || "#*>".contains(c))
}

fn advice(clause: &str) -> bool {
    let lower = clause
        .get(..24.min(clause.len()))
        .map(str::to_ascii_lowercase);
    lower.is_some_and(|l| ADVICE.iter().any(|w| l.starts_with(w)))
}

/// A logger's INFO or DEBUG before the facts: NCCL's, glog's `I0123`, `[I `, `INFO:`,
/// `level=info`.
fn info_before(before: &str) -> bool {
    [
        " INFO ",
        "INFO:",
        "[INFO]",
        "[I ",
        "level=info",
        "DEBUG",
        " I0",
    ]
    .iter()
    .any(|w| before.contains(w))
        || before.starts_with("I0")
}

/// Whether the bytes `at..end` sit inside a pair of `mark`s.
fn quoted_in(line: &str, (at, end): (usize, usize), mark: char) -> bool {
    line[..at].matches(mark).count() % 2 == 1 && line[end..].contains(mark)
}

#[cfg(test)]
mod tests {
    use super::super::speaker::speaker;
    use super::*;

    fn said(line: &str, fact: &str) -> Said {
        let at = line.find(fact).unwrap();
        let span = (at, at + fact.len());
        how(line, &speaker(line), span, span, None, false)
    }

    #[test]
    fn failures_and_what_is_not() {
        let f = "No space left on device";
        assert_eq!(
            said(
                "OSError: [Errno 28] No space left on device: '/dev/shm/x'",
                f
            ),
            Said::Failure
        );
        assert_eq!(
            said(
                "Tip: No space left on device on /dev/shm means it is full",
                f
            ),
            Said::Advice
        );
        assert_eq!(
            said(
                "If you see No space left on device in /dev/shm, raise --shm-size",
                f
            ),
            Said::Advice
        );
        assert_eq!(
            said("$ grep 'No space left on device' /var/log/x", f),
            Said::Quote
        );
        assert_eq!(
            said("why does /dev/shm say No space left on device?", f),
            Said::Question
        );
        assert_eq!(
            said(
                "write /dev/shm/x failed: No space left on device, retrying in 1s",
                f
            ),
            Said::Retry
        );
        assert_eq!(
            said("UserWarning: [Errno 28] No space left on device.  joblib will operate in serial mode", f),
            Said::Fallback
        );
        assert_eq!(
            said(
                "node:1:2 [0] NCCL INFO transport/p2p.cc:1 Cuda failure 'invalid argument'",
                "invalid argument"
            ),
            Said::Info
        );
        assert_eq!(
            said(
                "I0612 10:00:00 main.cc:1] shm_open: Permission denied",
                "Permission denied"
            ),
            Said::Info
        );
        assert_eq!(
            said("shared memory: insufficient", "insufficient"),
            Said::Unsaid
        );
        // Advice after the failure is still the failure's.
        let line = "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be \
                    caused by insufficient shared memory (shm), please check";
        assert_eq!(said(line, "BUS error"), Said::Failure);
    }
}

//! The C library's and the kernel's facts: an errno by number, name or text; /dev/shm, a
//! POSIX shared-memory name or call; words that say shared memory ran short; SIGBUS in every
//! spelling.
//!
//! POSIX shared memory is /dev/shm: `shm_open` and `sem_open` make their objects there (glibc
//! sysdeps/pthread/shm-directory.c), as PyTorch (`/torch_*`), CPython (`/psm_*`, `/mp-*`),
//! NCCL (`/dev/shm/nccl-*`), PostgreSQL's dynamic segments (`/PostgreSQL.*`) and Open MPI do.
//! SysV segments (`shmget`) and PostgreSQL's main segment are not: an ENOSPC or an "out of
//! shared memory" without one of these is no /dev/shm fact.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, MatchKind};

use super::tables::{self, Errno};

/// The strerror texts, glibc's and Go's lower-case ones, in one automaton.
static ERRNO_TEXTS: LazyLock<(AhoCorasick, Vec<u32>)> = LazyLock::new(|| {
    let mut texts = Vec::new();
    let mut numbers = Vec::new();
    for c in tables::errno_table() {
        texts.push(c.text.to_string());
        numbers.push(c.code);
        let lower = c.text.to_ascii_lowercase();
        if lower != c.text {
            texts.push(lower);
            numbers.push(c.code);
        }
    }
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&texts)
        // The tables are constants: a failure is a bug the tests catch.
        .expect("errno texts build an automaton");
    (ac, numbers)
});

/// The errno a line names: Python's `[Errno N]`, else strerror's text, else a name (`ENOSPC`),
/// else `errno N`. The first of its kind on the line; its bytes.
pub fn errno(line: &str) -> Option<(Errno, (usize, usize))> {
    if let Some(at) = line.find("[Errno ") {
        let digits = &line[at + 7..];
        let n: String = digits.chars().take_while(char::is_ascii_digit).collect();
        if let Some(e) = n.parse().ok().and_then(tables::errno_by_number) {
            // The text after it, if any, is part of the fact.
            let end = at + 7 + n.len() + 1;
            let end = line
                .get(end..)
                .and_then(|r| tables::errno_by_text(r.trim_start()).map(|(_, l)| l))
                .map_or(end, |l| end + 1 + l);
            return Some((e, (at, end.min(line.len()))));
        }
    }
    let (ac, numbers) = &*ERRNO_TEXTS;
    if let Some(m) = ac.find(line) {
        let e = tables::errno_by_number(numbers[m.pattern().as_usize()])?;
        return Some((e, (m.start(), m.end())));
    }
    for (at, _) in line.match_indices('E') {
        let starts = line[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric());
        if let Some((e, len)) = tables::errno_by_name(&line[at..]).filter(|_| starts) {
            if e.name.len() >= 4 {
                return Some((e, (at, at + len)));
            }
        }
    }
    for head in ["errno ", "errno=", "errno: ", "error code "] {
        if let Some(at) = line.find(head) {
            let rest = &line[at + head.len()..];
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Some(e) = n.parse().ok().and_then(tables::errno_by_number) {
                return Some((e, (at, at + head.len() + n.len())));
            }
        }
    }
    None
}

/// What shared memory the line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmObject {
    /// As printed: `/dev/shm/torch_1`, `/PostgreSQL.1136`, `shm_open`, `shared memory (shm)`.
    pub name: String,
    pub at: (usize, usize),
    /// The line speaks of making it (`create`, `creating`, `O_CREAT`): a missing /dev/shm, not
    /// a segment another process made.
    pub create: bool,
}

/// POSIX shared-memory names as their programs make them.
const NAMES: &[&str] = &[
    "/dev/shm",
    "/torch_",
    "/psm_",
    "/PostgreSQL.",
    "/sem.",
    "/loky-",
    "/mp-",
    "/nccl-",
];
/// POSIX shared-memory calls (each makes or opens an object in /dev/shm).
const CALLS: &[&str] = &[
    "shm_open",
    "sem_open",
    "shm_unlink",
    "SemLock",
    "SharedMemory(",
];

/// The /dev/shm object `line` names: a path or name, else a POSIX call, else DataLoader's
/// `(shm)`.
pub fn object(line: &str) -> Option<ShmObject> {
    let create = line.contains("creat") || line.contains("Creat") || line.contains("O_CREAT");
    let found = NAMES
        .iter()
        .filter_map(|n| line.find(n))
        .min()
        .map(|at| (at, token_end(line, at)))
        .or_else(|| {
            CALLS
                .iter()
                .filter_map(|c| {
                    line.find(c)
                        .map(|at| (at, at + c.trim_end_matches('(').len()))
                })
                .min()
        })
        .or_else(|| line.find("(shm)").map(|at| (at, at + 5)))?;
    Some(ShmObject {
        name: crate::model::cut(&crate::model::printable(&line[found.0..found.1]), 96),
        at: found,
        create,
    })
}

/// Where a path or name that starts at `at` ends: at a space, a quote, a bracket or a comma.
fn token_end(line: &str, at: usize) -> usize {
    let end = line[at..]
        .find(|c: char| c.is_whitespace() || "'\"<>(),;`".contains(c))
        .map_or(line.len(), |i| at + i);
    at + line[at..end].trim_end_matches([':', '.']).len()
}

/// Words that say shared memory ran short, and their bytes, in the line's ASCII lower case
/// (`lower`: the same bytes as the line): a shortage word before `shared
/// memory` or `/dev/shm` in the same clause (`insufficient shared memory (shm)`, `Unable to
/// allocate shared memory`, `not enough space for /dev/shm/...`).
pub fn shortage(lower: &str) -> Option<(usize, usize)> {
    const SHORT: &[&str] = &[
        "insufficient",
        "not enough",
        "out of",
        "ran out",
        "run out",
        "unable to allocate",
        "failed to allocate",
        "could not allocate",
        "cannot allocate",
        "can't allocate",
        "no space",
        "exceeds",
    ];
    for noun in ["shared memory", "/dev/shm"] {
        for (at, _) in lower.match_indices(noun) {
            // The clause before the noun: back to a sentence's end, at most 48 bytes.
            let from = lower[..at]
                .rfind(['.', ';', '!', '?'])
                .map_or(0, |i| i + 1)
                .max(at.saturating_sub(48));
            let Some(from) = (from..=at).find(|&i| lower.is_char_boundary(i)) else {
                continue;
            };
            let clause = &lower[from..at];
            if let Some(w) = SHORT.iter().filter_map(|w| clause.find(w)).min() {
                let end = if lower[at..].starts_with("shared memory (shm)") {
                    at + 19
                } else {
                    at + noun.len()
                };
                return Some((from + w, end));
            }
        }
    }
    None
}

/// SIGBUS, in every spelling (`lower`, the line in ASCII lower case): its name, strsignal's `Bus error`, `signal 7`, an exit code of
/// -7 (Python's subprocess, DeepSpeed, sglang) or 135 (a shell's 128 + 7).
pub fn sigbus(lower: &str) -> Option<(usize, usize)> {
    for word in ["sigbus", "bus error"] {
        if let Some(at) = lower.find(word) {
            return Some((at, at + word.len()));
        }
    }
    for head in [
        "signal 7",
        "signal: 7",
        "exit code -7",
        "exit code: -7",
        "exitcode: -7",
        "return code = -7",
        "exit status 135",
        "exit code 135",
        "exit code: 135",
        "exited with code 135",
    ] {
        for (at, _) in lower.match_indices(head) {
            let end = at + head.len();
            if !lower[end..].starts_with(|c: char| c.is_ascii_digit()) {
                return Some((at, end));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno_no(line: &str) -> Option<u32> {
        errno(line).map(|(e, _)| e.number)
    }

    #[test]
    fn an_errno_by_number_text_or_name() {
        // CPython's OSError (Objects/exceptions.c), glibc's strerror, Go's, a name, a number.
        assert_eq!(
            errno_no("OSError: [Errno 28] No space left on device: '/dev/shm/x'"),
            Some(28)
        );
        assert_eq!(
            errno_no("write /dev/shm/x: no space left on device"),
            Some(28)
        );
        assert_eq!(errno_no("shm_open failed: Permission denied"), Some(13));
        assert_eq!(errno_no("semaphore: [Errno 38] ENOSYS"), Some(38));
        assert_eq!(errno_no("fallocate returned ENOSPC"), Some(28));
        assert_eq!(errno_no("open failed, errno=24"), Some(24));
        assert_eq!(errno_no("EPERMANENT storage"), None);
        assert_eq!(errno_no("all good"), None);
        let (_, (s, e)) = errno("x [Errno 2] No such file or directory: '/psm_1'").unwrap();
        assert_eq!(
            &"x [Errno 2] No such file or directory: '/psm_1'"[s..e],
            "[Errno 2] No such file or directory"
        );
    }

    #[test]
    fn dev_shm_names_and_calls() {
        let o =
            object("OSError: [Errno 28] No space left on device: '/dev/shm/torch_123'").unwrap();
        assert_eq!(o.name, "/dev/shm/torch_123");
        let o =
            object("could not resize shared memory segment \"/PostgreSQL.1767612635\" to 1 bytes")
                .unwrap();
        assert_eq!(o.name, "/PostgreSQL.1767612635");
        assert_eq!(
            object("sl = self._semlock = _multiprocessing.SemLock(")
                .unwrap()
                .name,
            "SemLock"
        );
        assert!(
            object("Error while creating shm_open segment")
                .unwrap()
                .create
        );
        // SysV and PostgreSQL's main segment are not /dev/shm.
        assert_eq!(
            object("FATAL:  could not create shared memory segment: No space left on device"),
            None
        );
        assert_eq!(object("ERROR:  out of shared memory"), None);
    }

    #[test]
    fn words_that_say_it_ran_short() {
        let line = "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be \
                    caused by insufficient shared memory (shm), please check";
        let (s, e) = shortage(&line.to_ascii_lowercase()).unwrap();
        assert_eq!(&line[s..e], "insufficient shared memory (shm)");
        let line = "Unable to allocate shared memory for intra-node messaging.";
        let (s, e) = shortage(&line.to_ascii_lowercase()).unwrap();
        assert_eq!(&line[s..e], "Unable to allocate shared memory");
        assert_eq!(
            shortage("Shared memory segments: 3 in use, plenty free"),
            None
        );
        assert_eq!(shortage("out of memory. shared memory is fine"), None);
    }

    #[test]
    fn sigbus_in_every_spelling() {
        for line in [
            "Fatal Python error: Bus error",
            "ERROR: Unexpected BUS error encountered in DataLoader worker.",
            "Signal 7 (SIGBUS) received by PID 10",
            "exits with return code = -7",
            "Container exited with code 135",
        ] {
            assert!(sigbus(&line.to_ascii_lowercase()).is_some(), "{line}");
        }
        for line in ["signal 70 received", "exit code -77", "a busy error"] {
            assert_eq!(sigbus(&line.to_ascii_lowercase()), None, "{line}");
        }
    }
}

//! Pure: which known failure a workload's log line reports. One [`Signature`] row per text a
//! program prints (`table.rs`, with where each comes from); an Aho-Corasick automaton over
//! every row's needle finds the candidates in one pass over the line, so a line costs its
//! length whatever the number of rows, and only a line holding a needle is looked at further
//! (`verify`: the rest of the line, the errno that decides the kind). A line no row matches
//! goes on to the fact tier (`failures::facts`) when the same pass found one of its needles.

use std::cell::OnceCell;

use crate::failures::nccl_diag;
use crate::model::{FindingKind, NamedFrom};
use aho_corasick::AhoCorasick;

/// A line that matched a signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMatch {
    pub kind: FindingKind,
    /// The matching row's [`Signature::id`].
    pub signature: &'static str,
    /// For [`FindingKind::NcclP2pDisabled`]: the two GPUs NCCL names, as NVML indices in the
    /// workload's own view (`nvmlDeviceGetIndex` inside its container, which sees only its
    /// GPUs), in the order NCCL printed them.
    pub gpus: Option<(u32, u32)>,
    /// The kind is the row's usual cause, not said by the line (no errno): told only when no
    /// line of the same container just said more (`context.rs`).
    pub guessed: bool,
    /// The line names a fault, not its cause: told only when /dev/shm was full then
    /// (`table::JUDGED`).
    pub judged: bool,
    /// Where in the line the row's words are (its needle): the evidence kept is that part
    /// with its context (`model::around`).
    pub span: std::ops::Range<usize>,
    /// The fact tier's match: the facts it was named from (`signature` is then [`FACTS`]).
    pub named_from: Option<NamedFrom>,
}

/// [`LogMatch::signature`] of a match of the fact tier: no row's.
pub const FACTS: &str = "facts";

/// One known text.
#[derive(Clone, Copy)]
pub struct Signature {
    /// Stable name, reported in [`LogMatch::signature`].
    pub id: &'static str,
    pub kind: FindingKind,
    /// The literal the automaton looks for; case-sensitive, as the program prints it.
    pub needle: &'static str,
    /// A line as the program prints it (the tests match every one).
    pub fixture: &'static str,
    /// Where the text comes from.
    pub source: &'static str,
}

mod gpu_table;
mod table;

use gpu_table::*;
use table::*;

/// Every known text: /dev/shm's that say their cause, the GPUs', then the generic ones and the
/// judged (`table.rs`, `gpu_table.rs`). The order is the priority when one line matches
/// several rows.
pub const SIGNATURES: &[Signature] = &ALL;
const ALL: [Signature; SHM.len() + GPU.len() + GENERIC.len()] = joined([SHM, GPU, GENERIC]);

/// The tables one after the other, at compile time (a row count that does not add up fails the
/// build).
const fn joined<const N: usize>(parts: [&[Signature]; 3]) -> [Signature; N] {
    let mut out = [parts[0][0]; N];
    let (mut n, mut p) = (0, 0);
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            out[n] = parts[p][i];
            n += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(n == N);
    out
}

/// The matcher over [`SIGNATURES`], built once, when the first line is asked about: a `check`
/// with no log to read (or `preflight`) does not pay for the automata (0.7 ms).
#[derive(Debug, Clone)]
pub struct Signatures {
    /// The callers' needles besides the rows'.
    more: Vec<&'static str>,
    /// The fact tier's needles are in `any`, and a line no row matches goes on to it.
    facts: bool,
    built: std::sync::OnceLock<Automata>,
}

#[derive(Debug, Clone)]
struct Automata {
    needles: AhoCorasick,
    /// The same needles, leftmost-first: `is_match` with a SIMD prefilter, which overlapping
    /// search does without. Most lines hold no needle and stop here.
    any: AhoCorasick,
}

impl Default for Signatures {
    fn default() -> Self {
        Self::new()
    }
}

impl Signatures {
    pub fn new() -> Self {
        Self::with_candidates(&[])
    }

    /// The rows alone, without the fact tier: the baseline the benchmark measures it against.
    pub fn exact_only() -> Self {
        Self::build(&[], false)
    }

    /// Also wanting, in the same one pass, the lines that hold one of `more`: texts that are no
    /// row's but that the recogniser decides from their neighbours (`context.rs`, `worker.rs`).
    pub fn with_candidates(more: &[&'static str]) -> Self {
        Self::build(more, true)
    }

    fn build(more: &[&'static str], facts: bool) -> Self {
        Signatures {
            more: more.to_vec(),
            facts,
            built: std::sync::OnceLock::new(),
        }
    }

    fn automata(&self) -> &Automata {
        self.built.get_or_init(|| self.compile())
    }

    fn compile(&self) -> Automata {
        let (more, facts) = (&self.more, self.facts);
        let fact_needles = if facts { super::facts::NEEDLES } else { &[] };
        // The needles are this file's constants and the callers': a build error is a bug the
        // tests catch, never a consequence of input.
        // Searched only in the rare lines `any` found a needle in: the compact NFA, not the
        // DFA the crate picks for this many needles (1.2 MiB, resident for the agent's life).
        let needles = AhoCorasick::builder()
            .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
            .build(SIGNATURES.iter().map(|s| s.needle))
            .expect("the signature needles build an automaton");
        let any = AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostFirst)
            .build(
                SIGNATURES
                    .iter()
                    .map(|s| s.needle)
                    .chain(more.iter().copied())
                    .chain(fact_needles.iter().copied()),
            )
            .expect("the signature needles build an automaton");
        Automata { needles, any }
    }

    /// Whether the line holds any signature's needle (or one of the extra candidates): the
    /// cheap first look, on raw bytes (a
    /// log's line before its lossy UTF-8 conversion; no needle holds a byte that the conversion
    /// or Docker's JSON escaping would change).
    pub fn is_candidate(&self, line: &[u8]) -> bool {
        self.automata().any.is_match(line)
    }

    /// The failure `line` reports, if any. Of several rows that match, the first in
    /// [`SIGNATURES`] wins; with no row, the fact tier's decision.
    pub fn match_line(&self, line: &str) -> Option<LogMatch> {
        if !self.automata().any.is_match(line) {
            return None;
        }
        match self.exact(line) {
            Exact::Matched(m) => Some(m),
            Exact::Vetoed => None,
            Exact::Nothing => self.facts(line),
        }
    }

    /// The fact tier's match of a line no row matched.
    fn facts(&self, line: &str) -> Option<LogMatch> {
        if !self.facts {
            return None;
        }
        let (kind, named_from) = super::facts::recognise(line)?;
        let (start, end) = named_from.span;
        Some(LogMatch {
            kind,
            signature: FACTS,
            gpus: None,
            guessed: false,
            judged: false,
            span: start..end,
            named_from: Some(named_from),
        })
    }

    /// The exact tier: the first row in [`SIGNATURES`] whose text the line holds, verified.
    fn exact(&self, line: &str) -> Exact {
        let mut best: Option<(usize, LogMatch)> = None;
        let mut vetoed = false;
        // Looked for once per line, however many ENOSPC needles it holds.
        let names_shm = OnceCell::new();
        // Overlapping: a needle inside another's match must still be seen (each is verified
        // on its own, and a lookalike of one must not hide another).
        for m in self.automata().needles.find_overlapping_iter(line) {
            let row = m.pattern().as_usize();
            if best.as_ref().is_some_and(|(b, _)| *b <= row) {
                continue;
            }
            let Some(sig) = SIGNATURES.get(row) else {
                continue;
            };
            let start = m.end() - sig.needle.len();
            let verified = match (
                nccl_diag::verified(sig.id, line, start, m.end()),
                verify_gpu(sig, line, m.end()),
            ) {
                (Some(diag), _) => diag.map(|gpus| (sig.kind, gpus)),
                (None, Some(gpu)) => gpu.map(|kind| (kind, None)),
                (None, None) => verify(sig, line, m.end(), &names_shm),
            };
            vetoed |= verified.is_none() && VETO.contains(&sig.id);
            if let Some((kind, gpus)) = verified {
                let guessed =
                    sig.id == NCCL_SHM_CREATE && line.get(m.end()..).and_then(errno).is_none();
                best = Some((
                    row,
                    LogMatch {
                        kind,
                        signature: sig.id,
                        gpus,
                        guessed,
                        judged: JUDGED.contains(&sig.id),
                        span: m.start()..m.end(),
                        named_from: None,
                    },
                ));
            }
        }
        match best {
            Some((_, m)) => Exact::Matched(m),
            None if vetoed => Exact::Vetoed,
            None => Exact::Nothing,
        }
    }
}

/// What the exact tier made of a line.
enum Exact {
    Matched(LogMatch),
    /// A row's text is there and its source says the line is not ours ([`VETO`]): the fact
    /// tier is not asked.
    Vetoed,
    Nothing,
}

/// Rows whose own program says a line of theirs that fails `verify` is nothing of ours (not
/// merely another errno than the row names): NCCL's attach with `(size 0)` is its cuMem host
/// mismatch; PyTorch's unlink with another errno than ENOENT is not a segment gone.
const VETO: &[&str] = &[NCCL_SHM_ATTACH, TORCH_UNLINK];

/// Chromium's rows and the programs that drive it: `--disable-dev-shm-usage` is their own way
/// out.
pub fn is_browser(signature: &str) -> bool {
    ["chromium-", "puppeteer-", "chromedriver-"]
        .iter()
        .any(|p| signature.starts_with(p))
}

/// Whether `Bus error` (between `before` and `rest`) is a shell's word of a child killed by
/// SIGBUS: the whole line, `(core dumped)` after it, or bash's job line, the PID before it and
/// the status padded to a column after it (`bash: line 1:  4242 Bus error      python x.py`); a
/// sentence that mentions bus errors is none of these.
fn shell_reported(before: &str, rest: &str) -> bool {
    if rest.trim_start().starts_with("(core dumped)")
        || (before.trim().is_empty() && rest.trim().is_empty())
    {
        return true;
    }
    let Some(job) = before.strip_suffix(' ') else {
        return false;
    };
    let name = job.trim_end_matches(|c: char| c.is_ascii_digit());
    name.len() < job.len()
        && name.ends_with(' ')
        && name.trim_end().ends_with(':')
        && (rest.is_empty() || rest.starts_with("  "))
}

/// Checks beyond the needle, which ends at `end`: `None` if the line only looks like the text,
/// else its kind (the row's, or what the errno it names says) and the GPUs it names (for the
/// P2P row). `names_shm` caches whether the line names /dev/shm.
fn verify(
    sig: &Signature,
    line: &str,
    end: usize,
    names_shm: &OnceCell<bool>,
) -> Option<(FindingKind, Option<(u32, u32)>)> {
    let rest = line.get(end..)?;
    let on_shm = || *names_shm.get_or_init(|| line.contains("/dev/shm"));
    let kind = match sig.id {
        // Docker's json-file driver writes `<` as \u003c.
        TORCH_SHM_WRITE => {
            (rest.starts_with("</torch_") || rest.starts_with("\\u003c/torch_")).then_some(sig.kind)
        }
        NCCL_P2P_DISABLED => return gpu_pair(rest).map(|g| (sig.kind, Some(g))),
        ENOSPC_DEV_SHM | ENOSPC_DEV_SHM_GO | ENOSPC_CODE_DEV_SHM | EROFS_DEV_SHM
        | UCX_POSIX_NO_SPACE => on_shm().then_some(sig.kind),
        // Only the errnos that say which; an old line without one says nothing sure.
        TORCH_OPEN_SHM => match errno(rest)? {
            Errno::NoFiles => Some(FindingKind::FdLimitReached),
            Errno::NoEntry => Some(FindingKind::ShmNotShared),
            Errno::NoSpace => Some(FindingKind::ShmAllocationFailed),
            Errno::Denied | Errno::ReadOnly => Some(FindingKind::ShmUnavailable),
        },
        TORCH_UNLINK => match errno(rest) {
            None | Some(Errno::NoEntry) => Some(sig.kind),
            Some(_) => None,
        },
        NCCL_SHM_CREATE | TRITON_SHM_INIT | CHROMIUM_SHM_CREATE | NCCL_SHM_OPEN | NCCL_SHM_FILE => {
            if sig.id == CHROMIUM_SHM_CREATE && !rest.starts_with("/dev/shm/") {
                return None;
            }
            match errno(rest) {
                Some(Errno::NoSpace) => Some(FindingKind::ShmAllocationFailed),
                Some(Errno::Denied | Errno::ReadOnly | Errno::NoEntry) => {
                    Some(FindingKind::ShmUnavailable)
                }
                Some(Errno::NoFiles) => Some(FindingKind::FdLimitReached),
                // NCCL's create line before 2.22 names no errno: a full /dev/shm is its usual
                // cause (the lines before it say which call failed).
                None if sig.id == NCCL_SHM_CREATE => Some(sig.kind),
                None => None,
            }
        }
        // `(size 0)` or no name: NCCL's cuMem host mismatch, not a /dev/shm matter.
        NCCL_SHM_ATTACH => (errno(rest) == Some(Errno::NoEntry)
            && !rest.contains("(size 0)")
            && !rest.trim_start().starts_with("/dev/shm/nccl- "))
        .then_some(sig.kind),
        NCCL_SHM_UNLINK => rest
            .contains("failed, error: No such file or directory")
            .then_some(sig.kind),
        POSTGRES_DSM_RESIZE => (errno(rest) == Some(Errno::NoSpace)).then_some(sig.kind),
        POSTGRES_DSM_OPEN => (errno(rest) == Some(Errno::NoEntry)).then_some(sig.kind),
        RAYLET_SHM_CAP => rest.starts_with(" /dev/shm").then_some(sig.kind),
        SHELL_BUS_ERROR => {
            let before = line.get(..end - sig.needle.len())?;
            shell_reported(before, rest).then_some(sig.kind)
        }
        DEEPSPEED_EXIT_SIGBUS => {
            (!rest.starts_with(|c: char| c.is_ascii_digit())).then_some(sig.kind)
        }
        CHROMIUM_OOM => line.contains(":FATAL:memory").then_some(sig.kind),
        // The error's whole text: it ends the line (its stack follows on the next ones).
        PUPPETEER_PAGE_CRASHED => rest.trim().is_empty().then_some(sig.kind),
        SEMAPHORE_TRACKER => {
            (rest.contains("ENOSYS") || rest.contains("[Errno 38]")).then_some(sig.kind)
        }
        // Triton appends the error it met: only ENOSPC (or none said) is a full /dev/shm.
        TRITON_SHM_GROW => match rest.rsplit_once("Error: ") {
            Some((_, error)) => error
                .trim()
                .starts_with("No space left on device")
                .then_some(sig.kind),
            None => Some(sig.kind),
        },
        _ => Some(sig.kind),
    }?;
    Some((kind, None))
}

/// `verify` of the GPU rows (`gpu_table.rs`): None for another row, else whether the line is
/// the failure (its kind) or only looks like it.
fn verify_gpu(sig: &Signature, line: &str, end: usize) -> Option<Option<FindingKind>> {
    if sig.kind == FindingKind::GpuCollectiveTimeout {
        // A hang's line is one only when its facts read (`failures/hang/parse.rs`).
        let told = crate::failures::hang::parse::facts(sig.id, line).is_some();
        return Some(told.then_some(sig.kind));
    }
    if !SAID.contains(&sig.id) {
        return None;
    }
    let start = end - sig.needle.len();
    let (Some(before), Some(rest)) = (line.get(..start), line.get(end..)) else {
        return Some(None);
    };
    if !said_as_failure(before, rest) {
        return Some(None);
    }
    let any = |words: &[&str]| words.iter().any(|w| line.contains(w));
    let told = match sig.id {
        // RCCL warns of `amd_iommu=on` and others with the same words.
        RCCL_IOMMU => before.trim_end().ends_with("iommu=pt\""),
        NCCL_NVLS_CUDA => rest.contains("NCCL WARN Cuda failure"),
        // 205 is also graphics interop's: only NCCL's or a peer mapping's.
        CUDA_MAP_FAILED | CUDA_MAP_FAILED_NAME => any(&["NCCL", "ncclMemAlloc", "PeerAccess"]),
        // Any wrong device number says this; only CUDA IPC's is ours (else `context.rs`).
        CUDA_IPC_INVALID_DEVICE => any(&["IpcOpenMemHandle", "IPC handle"]),
        _ => true,
    };
    Some(told.then_some(sig.kind))
}

/// Whether the GPU text between `before` and `rest` is a program's failure, not a quote of it:
/// not after `grep` (a search), not NCCL's INFO (a CUDA call NCCL ignores and goes on from), not
/// followed by a retry, and when inside quotes, quoted as NCCL quotes CUDA's string (`Cuda
/// failure 711 '...'`, `CUDA error 802 '...'`), not as help text quotes an error (`` `Error 802:
/// ...` ``).
fn said_as_failure(before: &str, rest: &str) -> bool {
    if before.contains("grep ") || before.contains("NCCL INFO") {
        return false;
    }
    if rest.to_ascii_lowercase().contains("retrying") {
        return false;
    }
    ['\'', '"', '`'].iter().all(|&q| {
        // Inside a quote: an odd count of the mark before the text, and one after it.
        let opened = before.matches(q).count() % 2 == 1 && rest.contains(q);
        !opened || before.rfind(q).is_some_and(|at| nccl_quotes(&before[..at]))
    })
}

/// Whether a quote opening after `head` is a CUDA error string quoted by NCCL (`Cuda failure
/// 711 '`, `CUDA error 401 '`) or nccl-tests (`Test CUDA failure common.cu:941 '`).
fn nccl_quotes(head: &str) -> bool {
    let head = head.trim_end();
    // The number or the file:line between the words and the quote.
    let said = match head.rsplit_once(' ') {
        Some((said, last))
            if last.bytes().all(|b| {
                b.is_ascii_digit() || b == b':' || b == b'.' || b.is_ascii_alphabetic()
            }) && last.bytes().any(|b| b.is_ascii_digit()) =>
        {
            said.trim_end()
        }
        _ => head,
    };
    ["Cuda failure", "CUDA failure", "CUDA error"]
        .iter()
        .any(|w| said.ends_with(w))
}

/// The errnos that decide a row's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Errno {
    NoSpace,
    NoEntry,
    NoFiles,
    Denied,
    ReadOnly,
}

/// The errno a line's rest names by its text (glibc's strerror, as every program here prints
/// it), the first of them.
fn errno(rest: &str) -> Option<Errno> {
    const TEXTS: [(&str, Errno); 5] = [
        ("No space left on device", Errno::NoSpace),
        ("No such file or directory", Errno::NoEntry),
        ("Too many open files", Errno::NoFiles),
        ("Permission denied", Errno::Denied),
        ("Read-only file system", Errno::ReadOnly),
    ];
    TEXTS
        .iter()
        .filter_map(|(text, e)| rest.find(text).map(|at| (at, *e)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, e)| e)
}

/// ` <a> and <b>` at the start of `rest`.
fn gpu_pair(rest: &str) -> Option<(u32, u32)> {
    let rest = rest.strip_prefix(' ')?;
    let (a, rest) = leading_number(rest)?;
    let rest = rest.strip_prefix(" and ")?;
    let (b, _) = leading_number(rest)?;
    Some((a, b))
}

/// The decimal number `s` starts with, and what follows it.
fn leading_number(s: &str) -> Option<(u32, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n = s.get(..digits)?.parse().ok()?;
    Some((n, &s[digits..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../../tests/fixtures/logs/", $name))
        };
    }

    /// The fixture files' lines that are not comments or blank.
    fn lines(content: &str) -> impl Iterator<Item = &str> {
        content
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    }

    fn kind(line: &str) -> Option<FindingKind> {
        Signatures::new().match_line(line).map(|m| m.kind)
    }

    #[test]
    fn every_signature_matches_its_own_fixture() {
        let sigs = Signatures::new();
        for sig in SIGNATURES {
            let m = sigs.match_line(sig.fixture);
            assert_eq!(m.as_ref().map(|m| m.signature), Some(sig.id), "{}", sig.id);
            assert_eq!(m.map(|m| m.kind), Some(sig.kind), "{}", sig.id);
            assert!(sig.fixture.contains(sig.needle), "{}", sig.id);
        }
    }

    #[test]
    fn the_contract_lists_every_row() {
        let contract = include_str!("../../../docs/CONTRACT.md");
        for sig in SIGNATURES {
            assert!(
                contract.contains(&format!("| `{}` |", sig.id)),
                "docs/CONTRACT.md, \"What a log line must say\", has no row {}",
                sig.id
            );
        }
    }

    #[test]
    fn ids_and_needles_are_unique_and_every_row_is_documented() {
        let mut ids: Vec<_> = SIGNATURES.iter().map(|s| s.id).collect();
        let mut needles: Vec<_> = SIGNATURES.iter().map(|s| s.needle).collect();
        ids.sort_unstable();
        ids.dedup();
        needles.sort_unstable();
        needles.dedup();
        assert_eq!(ids.len(), SIGNATURES.len());
        assert_eq!(needles.len(), SIGNATURES.len());
        assert!(SIGNATURES
            .iter()
            .all(|s| !s.needle.is_empty() && !s.source.is_empty()));
    }

    #[test]
    fn pytorch_texts_are_shm_allocation_failures() {
        let sigs = Signatures::new();
        let mut seen = Vec::new();
        for line in lines(fixture!("pytorch.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(m.kind, FindingKind::ShmAllocationFailed, "{line}");
            assert_eq!(m.gpus, None);
            seen.push(m.signature);
        }
        for id in [
            "torch-shm-fallocate",
            "torch-shm-write",
            "torch-worker-sigbus",
            "torch-dataloader-sigbus",
        ] {
            assert!(seen.contains(&id), "{id}");
        }
    }

    #[test]
    fn nccl_shm_texts_are_shm_allocation_failures() {
        let sigs = Signatures::new();
        let mut seen = Vec::new();
        for line in lines(fixture!("nccl-shm.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(m.kind, FindingKind::ShmAllocationFailed, "{line}");
            seen.push(m.signature);
        }
        for id in [
            "nccl-shm-create",
            "nccl-shm-extend",
            "nccl-posix-fallocate",
            "nccl-shm-unable-allocate",
        ] {
            assert!(seen.contains(&id), "{id}");
        }
    }

    #[test]
    fn nccl_p2p_disabled_names_both_gpus_in_order() {
        let sigs = Signatures::new();
        let got: Vec<_> = lines(fixture!("nccl-p2p.log"))
            .map(|l| sigs.match_line(l).and_then(|m| m.gpus))
            .collect();
        assert_eq!(
            got,
            [Some((1, 3)), Some((5, 4)), Some((1, 0)), Some((7, 6))]
        );
    }

    #[test]
    fn enospc_counts_only_when_the_line_names_dev_shm() {
        let sigs = Signatures::new();
        for line in lines(fixture!("enospc.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert!(m.signature.starts_with("enospc-dev-shm"), "{line}");
        }
        assert_eq!(
            kind("OSError: [Errno 28] No space left on device: '/data/checkpoints/step_1000.pt'"),
            None
        );
    }

    #[test]
    fn a_shells_bus_error_is_judged_and_a_sentence_about_one_is_nothing() {
        let sigs = Signatures::new();
        // As bash 5.2, busybox ash and dash print a child killed by SIGBUS (the first two
        // seen on this machine).
        for line in [
            "bash:  4577 Bus error               python3 -c \"import os\"",
            "/entrypoint.sh: line 12:  4242 Bus error               python train.py",
            "sh: line 1: 7 Bus error (core dumped) ./a.out",
            "Bus error",
            "Bus error (core dumped)",
        ] {
            let m = sigs.match_line(line).expect(line);
            assert_eq!((m.signature, m.judged), (SHELL_BUS_ERROR, true), "{line}");
            assert_eq!(m.kind, FindingKind::ShmBusError);
        }
        for line in [
            "stats: 3 Bus error events",
            "on Bus error: abort",
            "Tip: a Bus error here usually means /dev/shm is full",
            "bash:  4577 Bus errors counted",
        ] {
            assert_eq!(sigs.match_line(line), None, "{line}");
        }
        // A line that says the cause is told as that, not judged.
        let torch = sigs
            .match_line("RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error.")
            .unwrap();
        assert!(!torch.judged);
    }

    #[test]
    fn gpu_texts_are_their_kinds_and_quotes_searches_and_retries_of_them_are_nothing() {
        use FindingKind::*;
        for (line, want) in [
            (
                "RuntimeError: CUDA error: peer mapping resources exhausted",
                GpuTooManyPeers,
            ),
            (
                "failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_ECC_UNCORRECTABLE: \
                 uncorrectable ECC error encountered",
                GpuEccUncorrectable,
            ),
            (
                "  what():  Error (gpu_burn-drv.cpp:298): system not yet initialized",
                GpuFabricNotReady,
            ),
            // CUDA 802 inside NCCL's NVLS line: the fabric manager's, said more precisely.
            (
                "NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 \
                 : CUDA error 802 'system not yet initialized'.",
                GpuFabricNotReady,
            ),
            (
                "Unable to enable peer access: code=205(cudaErrorMapBufferObjectFailed) \
                 cudaDeviceEnablePeerAccess(1, 0)",
                GpuPeerMappingFailed,
            ),
            (
                "RuntimeError: cudaIpcOpenMemHandle failed: invalid device ordinal",
                CudaIpcInvalidDevice,
            ),
        ] {
            assert_eq!(kind(line), Some(want), "{line}");
        }
        for line in [
            // A search, help text quoting it, NCCL's ignored call, a retry, any device number,
            // graphics interop's 205.
            "$ grep 'peer mapping resources exhausted' nccl.log",
            "Tip: 'uncorrectable ECC error encountered' means the GPU memory is bad",
            "node-1:77:77 [0] NCCL INFO misc/cudawrap.cc:90 Cuda failure 802 'system not yet \
             initialized'",
            "cuMulticastBindMem returned 802 (system not yet initialized), retrying (1/5)",
            "RuntimeError: CUDA error: invalid device ordinal",
            "cudaGraphicsMapResources failed: mapping of buffer object failed",
            "For `Error 802: system not yet initialized`, install `nvidia-fabricmanager`.",
            "init.cc:120 NCCL WARN Missing \"amd_iommu=on\" from kernel command line which can \
             lead to system instablity or hang!",
            "node-1:77:77 [0] NCCL INFO transport/nvls.cc:409 -> 1",
        ] {
            assert_eq!(Signatures::new().match_line(line), None, "{line}");
        }
    }

    #[test]
    fn lookalikes_match_nothing() {
        let sigs = Signatures::new();
        for line in lines(fixture!("lookalikes.log")) {
            assert_eq!(sigs.match_line(line), None, "{line}");
        }
    }

    #[test]
    fn a_specific_text_wins_over_the_generic_enospc_on_the_same_line() {
        let m = Signatures::new()
            .match_line(
                "NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9637892 bytes, error: \
                 No space left on device (28)",
            )
            .unwrap();
        assert_eq!(m.signature, "nccl-shm-extend");
    }

    #[test]
    fn a_lookalike_needle_does_not_hide_a_real_one_later_on_the_line() {
        // The P2P needle without GPUs first, then a real shm failure.
        let m = Signatures::new()
            .match_line(
                "grep 'P2P is disabled between NVLINK connected GPUs' && echo 'Error while \
                 creating shared memory segment /dev/shm/nccl-a (size 1)'",
            )
            .unwrap();
        assert_eq!(m.signature, "nccl-shm-create");
        // And the same P2P text twice: the second names the GPUs.
        let m = Signatures::new()
            .match_line(
                "P2P is disabled between NVLINK connected GPUs: P2P is disabled between NVLINK \
                 connected GPUs 2 and 6.",
            )
            .unwrap();
        assert_eq!(m.gpus, Some((2, 6)));
    }

    #[test]
    fn a_long_line_costs_its_length_not_its_needles_times_its_length() {
        // 4.6 MB of ENOSPC about another path: each occurrence would rescan the line for
        // /dev/shm were the answer not kept.
        let line = "No space left on device: /data ".repeat(150_000);
        assert_eq!(Signatures::new().match_line(&line), None);
        let line = format!("{line} /dev/shm");
        assert_eq!(
            Signatures::new().match_line(&line).map(|m| m.signature),
            Some("enospc-dev-shm")
        );
    }

    #[test]
    fn needles_are_plain_ascii_that_no_log_format_rewrites() {
        // The tailer asks `is_candidate` of raw bytes: a Docker entry's JSON-escaped text
        // (Go escapes `"`, `\`, `<`, `>`, `&` and control bytes) or a line before its lossy
        // UTF-8 conversion. A needle of other printable ASCII reads the same in both.
        for sig in SIGNATURES {
            assert!(
                sig.needle
                    .bytes()
                    .all(|b| (b' '..=b'~').contains(&b) && !b"\"\\<>&".contains(&b)),
                "{}: {:?}",
                sig.id,
                sig.needle
            );
        }
        let sigs = Signatures::new();
        for sig in SIGNATURES {
            assert!(sigs.is_candidate(sig.fixture.as_bytes()), "{}", sig.id);
        }
        assert!(!sigs.is_candidate(b"step 10 loss 0.1 \xff\xfe"));
    }

    #[test]
    fn docker_json_logs_escape_the_angle_bracket() {
        let line = r#"{"log":"RuntimeError: unable to write to file \u003c/torch_18692_1954506624\u003e: No space left on device (28)\n","stream":"stderr","time":"2024-05-01T10:00:00Z"}"#;
        assert_eq!(kind(line), Some(FindingKind::ShmAllocationFailed));
    }

    #[test]
    fn gpu_numbers_that_do_not_fit_are_no_match() {
        assert_eq!(
            kind("P2P is disabled between NVLINK connected GPUs 99999999999 and 1."),
            None
        );
        assert_eq!(gpu_pair(" 0 and 7."), Some((0, 7)));
        assert_eq!(gpu_pair(" 0 and x"), None);
        assert_eq!(gpu_pair("0 and 7"), None);
    }

    #[test]
    fn kinds_serialize_in_snake_case() {
        assert_eq!(
            serde_json::to_string(&FindingKind::ShmAllocationFailed).unwrap(),
            "\"shm_allocation_failed\""
        );
        assert_eq!(
            serde_json::to_string(&FindingKind::NcclP2pDisabled).unwrap(),
            "\"nccl_p2p_disabled\""
        );
    }

    #[test]
    fn garbage_never_panics() {
        let sigs = Signatures::new();
        let mut rng = crate::fixtures::rng::Rng::new(0x5eed);
        let seeds: Vec<&str> = SIGNATURES.iter().map(|s| s.fixture).collect();
        for _ in 0..20_000 {
            let seed = rng.below(seeds.len());
            let line = rng.mutate(seeds[seed].as_bytes());
            let _ = sigs.match_line(&String::from_utf8_lossy(&line));
        }
        for seed in &seeds {
            for cut in 0..=seed.len() {
                if let Some(prefix) = seed.get(..cut) {
                    let _ = sigs.match_line(prefix);
                }
            }
        }
    }
}

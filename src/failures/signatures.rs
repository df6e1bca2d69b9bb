//! Pure: which known failure a workload's log line reports. One [`Signature`] row per text
//! PyTorch, NCCL or libc prints; an Aho-Corasick automaton over every row's needle finds the
//! candidates in one pass over the line, so a line costs its length whatever the number of
//! rows, and only a line holding a needle is looked at further.

use std::cell::OnceCell;

use aho_corasick::AhoCorasick;
use serde::Serialize;

/// What a log line says killed (or is about to kill) the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFailure {
    /// A shared-memory segment (in /dev/shm) could not be allocated or grown.
    ShmAllocationFailed,
    /// NCCL refused to run because NVML says P2P is off between two NVLink-connected GPUs.
    NcclP2pDisabled,
}

/// A line that matched a signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMatch {
    pub kind: LogFailure,
    /// The matching row's [`Signature::id`].
    pub signature: &'static str,
    /// For [`LogFailure::NcclP2pDisabled`]: the two GPUs NCCL names, as NVML indices in the
    /// workload's own view (`nvmlDeviceGetIndex` inside its container, which sees only its
    /// GPUs), in the order NCCL printed them.
    pub gpus: Option<(u32, u32)>,
}

/// One known text.
pub struct Signature {
    /// Stable name, reported in [`LogMatch::signature`].
    pub id: &'static str,
    pub kind: LogFailure,
    /// The literal the automaton looks for; case-sensitive, as the program prints it.
    pub needle: &'static str,
    /// A line as the program prints it (the tests match every one).
    pub fixture: &'static str,
    /// Where the text comes from.
    pub source: &'static str,
}

// Ids of rows that need more than their needle (see `verify`).
const TORCH_SHM_WRITE: &str = "torch-shm-write";
const NCCL_P2P_DISABLED: &str = "nccl-p2p-disabled-nvlink";
const ENOSPC_DEV_SHM: &str = "enospc-dev-shm";
const ENOSPC_DEV_SHM_GO: &str = "enospc-dev-shm-go";

/// Every known text. The order is the priority when one line matches several rows: specific
/// texts first, the generic ENOSPC last.
pub const SIGNATURES: &[Signature] = &[
    Signature {
        id: "torch-shm-fallocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "unable to allocate shared memory(shm) for file",
        fixture: "RuntimeError: unable to allocate shared memory(shm) for file \
                  </torch_13_2001593316_0>: No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp: posix_fallocate of a shared-memory \
                 tensor's segment failed",
    },
    Signature {
        id: TORCH_SHM_WRITE,
        kind: LogFailure::ShmAllocationFailed,
        needle: "unable to write to file ",
        fixture: "RuntimeError: unable to write to file </torch_18692_1954506624>: \
                  No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp (TH/THAllocator.cpp before): writing \
                 the last byte of a shared-memory segment failed; only /torch_* segments count",
    },
    Signature {
        id: "torch-worker-sigbus",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Unexpected bus error encountered in worker",
        fixture: "ERROR: Unexpected bus error encountered in worker. This might be caused by \
                  insufficient shared memory (shm).",
        source: "PyTorch torch/csrc/DataLoader.cpp: the DataLoader worker's SIGBUS handler",
    },
    Signature {
        id: "torch-dataloader-sigbus",
        kind: LogFailure::ShmAllocationFailed,
        needle: "dataloader's workers are out of shared memory",
        fixture: "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. \
                  It is possible that dataloader's workers are out of shared memory. Please try \
                  to raise your shared memory limit.",
        source: "PyTorch torch/csrc/DataLoader.cpp: the main process sees a worker killed by \
                 SIGBUS",
    },
    Signature {
        id: "nccl-shm-create",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Error while creating shared memory segment",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while creating \
                  shared memory segment /dev/shm/nccl-Y7jXhK (size 9637888)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen (src/include/shm.h shmOpen before): any \
                 failure to create a segment; attaching to a peer's is another text",
    },
    Signature {
        id: "nccl-shm-extend",
        kind: LogFailure::ShmAllocationFailed,
        needle: "failed to extend /dev/shm/",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend \
                  /dev/shm/nccl-Y7jXhK to 9637892 bytes",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen: fallocate of a new segment failed",
    },
    Signature {
        id: "nccl-posix-fallocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Call to posix_fallocate failed",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate \
                  failed : No space left on device",
        source: "NCCL src/include/shm.h (older releases): SYSCHECK's warning when \
                 posix_fallocate of a segment fails",
    },
    Signature {
        id: "nccl-shm-unable-allocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Unable to allocate shared memory (",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:26 NCCL WARN Unable to allocate shared \
                  memory (4263936 bytes) : No space left on device",
        source: "NCCL src/include/shm.h (older releases): shm_allocate's warning",
    },
    Signature {
        id: NCCL_P2P_DISABLED,
        kind: LogFailure::NcclP2pDisabled,
        needle: "P2P is disabled between NVLINK connected GPUs",
        fixture: "node-000:8639:8745 [1] graph/paths.cc:314 NCCL WARN P2P is disabled between \
                  NVLINK connected GPUs 1 and 3. This should not be the case given their \
                  connectivity, and is probably due to a hardware issue. If you still want to \
                  proceed, you can set NCCL_IGNORE_DISABLED_P2P=1.",
        source: "NCCL src/graph/paths.cc ncclTopoCheckP2p: NVML says P2P is not OK between two \
                 NVLink-connected GPUs (NVML indices); NCCL then fails with an unhandled CUDA \
                 error",
    },
    Signature {
        id: ENOSPC_DEV_SHM,
        kind: LogFailure::ShmAllocationFailed,
        needle: "No space left on device",
        fixture: "OSError: [Errno 28] No space left on device: '/dev/shm/psm_4a1b2c3d'",
        source: "strerror(ENOSPC) (glibc, Python's OSError) on a line that names /dev/shm; \
                 about any other path it is no shm fact",
    },
    Signature {
        id: ENOSPC_DEV_SHM_GO,
        kind: LogFailure::ShmAllocationFailed,
        needle: "no space left on device",
        fixture: "Error: write /dev/shm/cache/shard-0007: no space left on device",
        source: "Go's text for ENOSPC (syscall.Errno), lower-case, on a line that names /dev/shm",
    },
];

/// The matcher over [`SIGNATURES`], built once and shared.
#[derive(Debug, Clone)]
pub struct Signatures {
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
        // The needles are this file's constants: a build error is a bug the tests catch, never
        // a consequence of input.
        let needles = AhoCorasick::new(SIGNATURES.iter().map(|s| s.needle))
            .expect("the signature needles build an automaton");
        let any = AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostFirst)
            .build(SIGNATURES.iter().map(|s| s.needle))
            .expect("the signature needles build an automaton");
        Signatures { needles, any }
    }

    /// Whether the line holds any signature's needle: the cheap first look, on raw bytes (a
    /// log's line before its lossy UTF-8 conversion; no needle holds a byte that the conversion
    /// or Docker's JSON escaping would change).
    pub fn is_candidate(&self, line: &[u8]) -> bool {
        self.any.is_match(line)
    }

    /// The failure `line` reports, if any. Of several rows that match, the first in
    /// [`SIGNATURES`] wins.
    pub fn match_line(&self, line: &str) -> Option<LogMatch> {
        if !self.any.is_match(line) {
            return None;
        }
        let mut best: Option<(usize, LogMatch)> = None;
        // Looked for once per line, however many ENOSPC needles it holds.
        let names_shm = OnceCell::new();
        // Overlapping: a needle inside another's match must still be seen (each is verified
        // on its own, and a lookalike of one must not hide another).
        for m in self.needles.find_overlapping_iter(line) {
            let row = m.pattern().as_usize();
            if best.as_ref().is_some_and(|(b, _)| *b <= row) {
                continue;
            }
            let Some(sig) = SIGNATURES.get(row) else {
                continue;
            };
            if let Some(gpus) = verify(sig, line, m.end(), &names_shm) {
                best = Some((
                    row,
                    LogMatch {
                        kind: sig.kind,
                        signature: sig.id,
                        gpus,
                    },
                ));
            }
        }
        best.map(|(_, m)| m)
    }
}

/// Checks beyond the needle, which ends at `end`: `None` if the line only looks like the text,
/// else the GPUs it names (for the P2P row). `names_shm` caches whether the line names /dev/shm.
fn verify(
    sig: &Signature,
    line: &str,
    end: usize,
    names_shm: &OnceCell<bool>,
) -> Option<Option<(u32, u32)>> {
    let rest = line.get(end..)?;
    match sig.id {
        // Docker's json-file driver writes `<` as \u003c.
        TORCH_SHM_WRITE => {
            (rest.starts_with("</torch_") || rest.starts_with("\\u003c/torch_")).then_some(None)
        }
        NCCL_P2P_DISABLED => gpu_pair(rest).map(Some),
        ENOSPC_DEV_SHM | ENOSPC_DEV_SHM_GO => {
            (*names_shm.get_or_init(|| line.contains("/dev/shm"))).then_some(None)
        }
        _ => Some(None),
    }
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
            include_str!(concat!("../../tests/fixtures/logs/", $name))
        };
    }

    /// The fixture files' lines that are not comments or blank.
    fn lines(content: &str) -> impl Iterator<Item = &str> {
        content
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    }

    fn kind(line: &str) -> Option<LogFailure> {
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
            assert_eq!(m.kind, LogFailure::ShmAllocationFailed, "{line}");
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
            assert_eq!(m.kind, LogFailure::ShmAllocationFailed, "{line}");
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
        assert_eq!(kind(line), Some(LogFailure::ShmAllocationFailed));
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
            serde_json::to_string(&LogFailure::ShmAllocationFailed).unwrap(),
            "\"shm_allocation_failed\""
        );
        assert_eq!(
            serde_json::to_string(&LogFailure::NcclP2pDisabled).unwrap(),
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

//! Pure: the fact tier, beneath the exact signatures (`signatures/`). A line no exact text
//! matched is read for facts by the grammar of the programs that print failures, and one table
//! decides from the facts:
//!
//! - who speaks (`speaker.rs`): NCCL/RCCL's line and its source file (the transport), Python's
//!   exception line, PostgreSQL's severity;
//! - what failed: a CUDA or HIP error in any spelling (`gpu.rs`, by the toolkits' own tables in
//!   `tables/`), an errno by number, name or text, SIGBUS in any spelling, words that say shared
//!   memory ran short (`shm.rs`);
//! - on what: a GPU path call or transport (IPC, peer access, multicast), /dev/shm, a POSIX
//!   shared-memory name or call; the GPU the line names;
//! - how it is said (`said.rs`): a failure, or INFO, advice, a retry, a fallback, a quote.
//!
//! `decide.rs` is the one table from facts to a kind. A decision carries the facts it used
//! ([`NamedFrom`]): the message says them, so a wrong call can be seen and fixed.

mod decide;
mod gpu;
mod said;
mod shm;
mod speaker;
mod tables;

use crate::model::{Failed, FindingKind, GpuNamed, NamedFrom};
use speaker::{Speaker, Transport};

/// What a line holds for the fact tier to look at it: asked in the same one pass as the exact
/// rows' needles (`Signatures::with_candidates`). Each is in every spelling the readers take
/// of its fact, so a line with none has no fact.
pub const NEEDLES: &[&str] = &[
    // GPU errors: reports' heads and names (`gpu.rs`), NCCL's WARN.
    "CUDA error",
    "CUDA Error",
    "Cuda error",
    "Cuda failure",
    "CUDA failure",
    "cuda runtime error",
    "CUDA IPC handle",
    "HIP error",
    "HIP failure",
    "hip error",
    "cudaError",
    "CUDA_ERROR_",
    "hipError",
    "NCCL WARN",
    "failed: ",
    "failed : ",
    // /dev/shm: names, calls, DataLoader's word (`shm.rs`); errnos come with Python's
    // `[Errno ` (a context needle already) or one of these on the line.
    "/dev/shm",
    "shm_open",
    "sem_open",
    "SemLock",
    "/PostgreSQL.",
    "/torch_",
    "/psm_",
    "(shm)",
    "shared memory",
    "Shared memory",
];

/// The facts of one line.
#[derive(Debug)]
pub struct Facts<'a> {
    pub speaker: Speaker<'a>,
    pub gpu_error: Option<(tables::GpuError, (usize, usize))>,
    pub call: Option<(gpu::Path, (usize, usize))>,
    /// A source file about P2P speaks (`Cuda failure p2pBandwidthLatencyTest.cu:189 ...`).
    pub p2p_file: bool,
    pub errno: Option<(tables::Errno, (usize, usize))>,
    pub shm: Option<shm::ShmObject>,
    pub shortage: Option<(usize, usize)>,
    pub sigbus: Option<(usize, usize)>,
    /// A DataLoader speaks of itself (PyTorch's, PaddlePaddle's, ...).
    pub dataloader: bool,
}

impl Facts<'_> {
    fn transport(&self) -> Option<Transport> {
        match self.speaker {
            Speaker::Nccl { transport, .. } => Some(transport),
            _ => None,
        }
    }
}

/// Reads the facts of `line`; None when it holds nothing that could fail (no GPU error, no
/// errno, no words of shortage): most lines a needle admitted stop here.
pub fn read(line: &str) -> Option<Facts<'_>> {
    let gpu_error = gpu::error(line);
    let mut f = Facts {
        speaker: Speaker::Other,
        gpu_error,
        call: None,
        p2p_file: false,
        errno: None,
        shm: None,
        shortage: None,
        sigbus: None,
        dataloader: false,
    };
    if gpu_error.is_some() {
        f.call = gpu::call(line);
        f.p2p_file = p2p_file(line);
    } else {
        // Lower case keeps every byte where it was: spans hold for the line.
        let lower = line.to_ascii_lowercase();
        f.errno = shm::errno(line);
        f.shortage = shm::shortage(&lower);
        if f.errno.is_none() && f.shortage.is_none() {
            return None;
        }
        f.shm = shm::object(line);
        f.sigbus = shm::sigbus(&lower);
        f.dataloader = lower.contains("dataloader");
    }
    f.speaker = speaker::speaker(line);
    Some(f)
}

/// A source file whose name is about P2P (`p2pBandwidthLatencyTest.cu:189`, `simpleP2P.cu`).
fn p2p_file(line: &str) -> bool {
    line.split_whitespace().any(|t| {
        let p2p = t
            .as_bytes()
            .windows(3)
            .any(|w| w.eq_ignore_ascii_case(b"p2p"));
        p2p && (t.contains(".cu:") || t.contains(".cc:"))
    })
}

/// The failure `line`'s facts name, with them; None when they name none or the line does not
/// say a failure.
pub fn recognise(line: &str) -> Option<(FindingKind, NamedFrom)> {
    let f = read(line)?;
    let (what, on) = decide::what_and_on(&f);
    let kind = decide::kind(what, on)?;
    let (failed, on_name, spans) = used(&f, line, what)?;
    let start = spans.iter().map(|s| s.0).min()?;
    let end = spans.iter().map(|s| s.1).max()?;
    // A GPU error's name says "Error" of itself: no failure's word (a report's head is one).
    let name = f.gpu_error.map(|(_, s)| s).filter(|&(s, _)| {
        let said = &line[s..];
        ["cudaError", "CUDA_ERROR_", "hipError", "ERROR_"]
            .iter()
            .any(|n| said.starts_with(n))
    });
    let shortage_of_a_file = what == decide::What::Short
        && f.shm
            .as_ref()
            .is_some_and(|o| o.name.starts_with("/dev/shm/"));
    let said = said::how(
        line,
        &f.speaker,
        (start, end),
        spans[0],
        name,
        shortage_of_a_file,
    );
    if said != said::Said::Failure {
        return None;
    }
    let gpu = match &f.speaker {
        Speaker::Nccl { dev: Some(d), .. } if f.gpu_error.is_some() => Some(GpuNamed::Device(*d)),
        _ if f.gpu_error.is_some() => gpu::pci(line),
        _ => None,
    };
    Some((
        kind,
        NamedFrom {
            failed,
            on: on_name,
            by: f.speaker.name(),
            gpu,
            span: (start, end),
        },
    ))
}

/// The facts a decision used: what failed, on what (as printed), and their bytes (what failed
/// first).
type Used = (Failed, Option<String>, Vec<(usize, usize)>);

fn used(f: &Facts<'_>, line: &str, what: decide::What) -> Option<Used> {
    let text = |(s, e): (usize, usize)| {
        crate::model::cut(&crate::model::printable(line.get(s..e)?), 96).into()
    };
    if let Some((e, span)) = f.gpu_error {
        let mut spans = vec![span];
        let on = f.call.map(|(_, s)| {
            spans.push(s);
            text(s)
        });
        let failed = Failed::Gpu {
            api: e.api,
            code: e.code,
            name: e.name,
        };
        return Some((failed, on.flatten(), spans));
    }
    let object = f.shm.as_ref();
    let (failed, mut spans) = match (what, f.errno, f.shortage, f.sigbus) {
        (decide::What::Short, _, Some(words), Some(bus)) => (
            Failed::SignalAndWords {
                number: crate::model::SIGBUS as u32,
                name: "SIGBUS",
                words: text(words)?,
            },
            vec![bus, words],
        ),
        (decide::What::Short, _, Some(words), None) => (Failed::Words(text(words)?), vec![words]),
        (_, Some((e, span)), _, _) => (
            Failed::Errno {
                number: e.number,
                name: e.name,
            },
            vec![span],
        ),
        _ => return None,
    };
    // The object is said apart unless the words already hold it (`(shm)`).
    let apart = object.filter(|o| !spans.iter().any(|s| s.0 <= o.at.0 && o.at.1 <= s.1));
    if let Some(o) = object {
        spans.push(o.at);
    }
    Some((failed, apart.map(|o| o.name.clone()), spans))
}

#[cfg(test)]
mod tests;

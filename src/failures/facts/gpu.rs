//! CUDA's and HIP's errors in all their spellings, the GPU path's calls, the GPU a line names.
//!
//! A CUDA error is said by its name anywhere (`cudaErrorPeerAccessUnsupported`,
//! `CUDA_ERROR_NVLINK_UNCORRECTABLE`, CUDAdrv.jl's `ERROR_ECC_UNCORRECTABLE`,
//! `hipErrorPeerAccessUnsupported`), or by its words after a report's head: PyTorch's `CUDA
//! error: <words>` (c10/cuda/CUDAException.cpp), NCCL's `Cuda failure '<words>'` (CUDACHECK)
//! and `Cuda failure <n> '<words>'` (CUCHECK), nccl-tests' `Cuda failure <file>:<line> '...'`,
//! llama.cpp's `CUDA error <n> at <file>:<line>: <words>`, THC's `cuda runtime error (<n>) :
//! <words>`, HIP's `HIP error: <words>`, NCCL's p2p transport's `failed to open CUDA IPC handle :
//! <n> <words>` and `cudaIpcGetMemHandle failed : <words>`, a call's `<call> failed: <words>`.
//! The words decide over a number: CUDA before 10.1 numbered its errors otherwise (peer access
//! unsupported was 64, invalid value 11), and lines of both eras are in the field.

use super::tables::{self, GpuError};
use crate::model::{GpuApi, GpuNamed};

/// A report's head, the API whose words follow it.
const HEADS: &[(&str, GpuApi)] = &[
    ("CUDA error", GpuApi::Cuda),
    ("CUDA Error", GpuApi::Cuda),
    ("Cuda error", GpuApi::Cuda),
    ("Cuda failure", GpuApi::Cuda),
    ("CUDA failure", GpuApi::Cuda),
    ("cuda runtime error", GpuApi::Cuda),
    ("CUDA IPC handle", GpuApi::Cuda),
    ("HIP error", GpuApi::Hip),
    ("HIP failure", GpuApi::Hip),
    ("hip error", GpuApi::Hip),
];

/// The GPU error `line` reports, and the bytes that say it.
pub fn error(line: &str) -> Option<(GpuError, (usize, usize))> {
    by_name(line)
        .or_else(|| by_head(line))
        .or_else(|| after_call(line))
}

/// A name anywhere; CUDAdrv.jl's `ERROR_` only on a line that speaks of CUDA.
fn by_name(line: &str) -> Option<(GpuError, (usize, usize))> {
    for head in ["cudaError", "CUDA_ERROR_", "hipError", "ERROR_"] {
        if head == "ERROR_" && !line.contains("CUDA") {
            continue;
        }
        for (at, _) in line.match_indices(head) {
            // A name starts a word (`ERROR_` inside `CUDA_ERROR_` was read as that).
            let starts = line[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            if let Some((e, len)) = tables::gpu_by_name(&line[at..]).filter(|_| starts) {
                return Some((e, (at, at + len)));
            }
        }
    }
    None
}

/// The words (or number) after a report's head.
fn by_head(line: &str) -> Option<(GpuError, (usize, usize))> {
    for &(head, api) in HEADS {
        for (at, _) in line.match_indices(head) {
            let rest = &line[at + head.len()..];
            if let Some((e, end)) = words_after(rest, api) {
                return Some((e, (at, at + head.len() + end)));
            }
        }
    }
    None
}

/// After a GPU call's name and its arguments, if printed: `<call> failed: <words>`, `<call>
/// failed : <words>`, `<call>(...) failed: <words>` (UCX's cuda_ipc), `<call> returned <n>`,
/// `<call> return value: <n>` (Open MPI's smcuda).
fn after_call(line: &str) -> Option<(GpuError, (usize, usize))> {
    let (_, (start, mut end)) = call(line)?;
    if line[end..].starts_with('(') {
        end += line[end..].find(')').map_or(0, |i| i + 1);
    }
    let rest = &line[end..];
    for verb in [
        " failed: ",
        " failed : ",
        " failed with ",
        " returned ",
        " return value: ",
        ": ",
    ] {
        if let Some(r) = rest.strip_prefix(verb) {
            let api = if line[start..end].starts_with("hip") {
                GpuApi::Hip
            } else {
                GpuApi::Cuda
            };
            let (e, n) = words_after(r, api)?;
            return Some((e, (start, end + verb.len() + n)));
        }
    }
    None
}

/// What follows a head: separators, a number (`(60)`, `802`, `code=711(`), a place (`at
/// file:line:`, `common.cu:941`), a quote, then a name or the words; the number alone when
/// nothing else. Returns the error and where its words end in `rest`.
fn words_after(rest: &str, api: GpuApi) -> Option<(GpuError, usize)> {
    let mut i = 0;
    let mut number = None;
    let b = rest.as_bytes();
    // At most a few tokens between the head and the words.
    for _ in 0..6 {
        while i < b.len() && matches!(b[i], b' ' | b':' | b'(' | b')' | b'\'' | b'"' | b'=' | b'#')
        {
            i += 1;
        }
        let tail = &rest[i..];
        if let Some((e, len)) = tables::gpu_by_name(tail) {
            return Some((e, i + len));
        }
        if let Some((e, len)) = tables::gpu_by_text(tail, api) {
            return Some((e, i + len));
        }
        let token_len = tail.find([' ', '\'', '(', ')', '"']).unwrap_or(tail.len());
        let token = &tail[..token_len];
        if token.is_empty() {
            break;
        }
        let digits = token.trim_end_matches([':', ',']);
        if number.is_none() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            number = digits.parse::<u32>().ok();
        } else if !(token == "at"
            || token.starts_with("code=")
            || token.contains(".c")
            || token.contains(".h")
            || token.contains(".py"))
        {
            break;
        }
        i += token_len;
    }
    let e = tables::gpu_by_code(api, number?)?;
    Some((e, i))
}

/// Where a GPU error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A handle of the process's own memory got or exported (`cudaIpcGetMemHandle`,
    /// `cuMemExportToShareableHandle`): it fails for that allocation (not from cudaMalloc, a
    /// pool without IPC), nothing between GPUs.
    OwnMemory,
    /// CUDA/HIP IPC: a handle of another process's memory opened, got or imported.
    Ipc,
    /// Peer access between two GPUs: enabled, mapped, copied over.
    Peer,
    /// NVLink SHARP multicast (NVLS).
    Multicast,
}

/// The GPU path's calls and words, each with what it is.
const CALLS: &[(&str, Path)] = &[
    ("IpcOpenMemHandle", Path::Ipc),
    ("IpcGetMemHandle", Path::OwnMemory),
    ("ImportFromShareableHandle", Path::Ipc),
    ("ExportToShareableHandle", Path::OwnMemory),
    ("ImportShareableBuffer", Path::Ipc),
    ("_new_shared_cuda", Path::Ipc),
    ("rebuild_cuda_tensor", Path::Ipc),
    ("EnablePeerAccess", Path::Peer),
    ("enable peer access", Path::Peer),
    ("peer with device", Path::Peer),
    ("MemcpyPeer", Path::Peer),
    ("cuMulticast", Path::Multicast),
    ("hipMulticast", Path::Multicast),
    ("NVLS", Path::Multicast),
];

/// The GPU path call `line` names (the first), and its bytes: a call's whole identifier
/// (`cudaIpcOpenMemHandle` for `IpcOpenMemHandle`).
pub fn call(line: &str) -> Option<(Path, (usize, usize))> {
    let (at, word, path) = CALLS
        .iter()
        .filter_map(|(w, p)| line.find(w).map(|at| (at, *w, *p)))
        .min_by_key(|(at, _, _)| *at)?;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if word.contains(' ') {
        return Some((path, (at, at + word.len())));
    }
    let start = after_last(&line[..at], |c| !ident(c));
    let end = line[at..]
        .find(|c: char| !ident(c))
        .map_or(line.len(), |i| at + i);
    Some((path, (start, end)))
}

/// Where the run of characters `s` ends with, that `stop` is true of none of, starts.
pub(super) fn after_last(s: &str, stop: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .rev()
        .find(|&(_, c)| stop(c))
        .map_or(0, |(i, c)| i + c.len_utf8())
}

/// A PCI address the line names (`0000:29:00.0`, or NVML's `00000000:29:00.0`).
pub fn pci(line: &str) -> Option<GpuNamed> {
    let b = line.as_bytes();
    let hex = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_hexdigit);
    for (i, _) in line.match_indices(':') {
        // domain:bus:device.function
        let start = after_last(&line[..i], |c| !c.is_ascii_hexdigit());
        let (dom, rest) = (&b[start..i], &b[i + 1..]);
        if !(4..=8).contains(&dom.len()) || !hex(dom) || rest.len() < 7 {
            continue;
        }
        if hex(&rest[..2])
            && rest[2] == b':'
            && hex(&rest[3..5])
            && rest[5] == b'.'
            && rest[6].is_ascii_digit()
        {
            let end = i + 8;
            return Some(GpuNamed::Pci(line[start..end].to_ascii_lowercase()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> Option<u32> {
        error(line).map(|(e, _)| e.code)
    }

    #[test]
    fn every_spelling_of_a_cuda_error() {
        for (line, want) in [
            // PyTorch c10/cuda/CUDAException.cpp
            ("RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution", 220),
            // NCCL src/include/checks.h CUDACHECK, cudawrap.h CUCHECK
            ("transport/p2p.cc:1129 NCCL WARN Cuda failure 1 'invalid argument'", 1),
            ("transport/p2p.cc:1129 NCCL WARN Cuda failure 'peer access is not supported between these two devices'", 217),
            // NCCL <= 2.3 p2p.cu: the old numbering (11) with today's words (1)
            ("[0] transport/p2p.cu:526 WARN failed to open CUDA IPC handle : 11 invalid argument", 1),
            // THC
            ("RuntimeError: cuda runtime error (60) : peer mapping resources exhausted at x.c:1", 711),
            // llama.cpp, cuda-samples' checkCudaErrors, TensorFlow, CUDAdrv.jl, HIP
            ("CUDA error 217 at ggml-cuda.cu:6292: peer access is not supported between these two devices", 217),
            ("CUDA error at simpleP2P.cu:126 code=220(cudaErrorNvlinkUncorrectable) \"f()\"", 220),
            ("failed to enable peer access from 0x1 to 0x2: CUDA_ERROR_NVLINK_UNCORRECTABLE", 220),
            ("  CUDA error: uncorrectable ECC error encountered (code #214, ERROR_ECC_UNCORRECTABLE)", 214),
            ("RuntimeError: HIP error: invalid device ordinal", 101),
            ("hipDeviceEnablePeerAccess failed: peer access is not supported between these two devices", 217),
            // A number alone, today's numbering.
            ("nvls.cc:254 NCCL WARN Cuda failure 401", 401),
        ] {
            assert_eq!(code(line), Some(want), "{line}");
        }
        for line in [
            "CUDA error: something no table has",
            "the cudaErrorX enum",
            "ERROR_ECC_UNCORRECTABLE without the API's name",
            "Cuda failure",
        ] {
            assert_eq!(code(line), None, "{line}");
        }
        let hip = error("hipErrorPeerAccessUnsupported").unwrap().0;
        assert_eq!(
            (hip.api, hip.name),
            (GpuApi::Hip, "hipErrorPeerAccessUnsupported")
        );
    }

    #[test]
    fn calls_and_pci_addresses() {
        let line = "RuntimeError: cudaIpcOpenMemHandle failed: invalid argument";
        let (path, (s, e)) = call(line).unwrap();
        assert_eq!((path, &line[s..e]), (Path::Ipc, "cudaIpcOpenMemHandle"));
        assert_eq!(
            call("cuMulticastBindMem returned 1").unwrap().0,
            Path::Multicast
        );
        assert_eq!(call("training step 10"), None);
        assert_eq!(
            pci("GPU 00000000:29:00.0 fell off"),
            Some(GpuNamed::Pci("00000000:29:00.0".into()))
        );
        assert_eq!(pci("time 12:30:45.1"), None);
    }
}

//! Who speaks, by the grammar of the programs that print failures:
//!
//! - NCCL and RCCL (`src/debug.cc` ncclDebugLog): `host:pid:tid [dev] file.cc:line NCCL WARN
//!   msg`, since 2.27 `[dev] file.cc:line (func) NCCL WARN msg`, a timestamp before it when
//!   asked; up to 2.3 `[dev] transport/p2p.cu:526 WARN msg` without the word NCCL. The file names
//!   the transport that failed (`transport/p2p.cc`, `nvls.cc`, `shm.cc`, `net_ib.cc`, `proxy.cc`).
//! - Python's last traceback line: `module.Name(Error|Exception|Warning): message`, as every
//!   Python program (PyTorch's RuntimeError, CuPy's CUDARuntimeError, OSError) ends with.
//! - PostgreSQL's `ERROR:  ` and `FATAL:  ` (two spaces: elog.c's severity then the message).

/// The transport an NCCL/RCCL source file is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `transport/p2p.cc` (`.cu` up to 2.3): CUDA IPC and peer access between GPUs.
    P2p,
    /// `transport/nvls.cc`: NVLink SHARP multicast.
    Nvls,
    /// `transport/shm.cc`, `misc/shmutils.cc`, `include/shm.h`: host shared memory.
    Shm,
    /// `transport/net*.cc`, `coll_net.cc`: the network.
    Net,
    /// Anything else (init, the proxy, allocators, graphs).
    Other,
}

/// Who printed the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Speaker<'a> {
    Nccl {
        file: Option<&'a str>,
        transport: Transport,
        dev: Option<u32>,
        /// WARN (a failure) or INFO/TRACE (what NCCL goes on from).
        warn: bool,
        /// Where the level word is: the message follows.
        at: usize,
    },
    /// Python's exception line: the exception's name (its last dotted part).
    Python {
        exception: &'a str,
    },
    /// PostgreSQL's severity word.
    Postgres {
        severity: &'a str,
    },
    Other,
}

impl Speaker<'_> {
    /// How the message names it: `NCCL's transport/p2p.cc`, `Python's OSError`.
    pub fn name(&self) -> String {
        match self {
            Speaker::Nccl {
                file: Some(file), ..
            } => {
                format!("NCCL's {}", crate::model::cut(file, 64))
            }
            Speaker::Nccl { warn, .. } => format!("NCCL's {}", if *warn { "WARN" } else { "INFO" }),
            Speaker::Python { exception } => {
                format!("Python's {}", crate::model::cut(exception, 64))
            }
            Speaker::Postgres { severity } => format!("PostgreSQL's {severity}"),
            Speaker::Other => "its log line".into(),
        }
    }
}

/// The speaker of `line`.
pub fn speaker(line: &str) -> Speaker<'_> {
    if let Some(nccl) = nccl(line) {
        return nccl;
    }
    if let Some(exception) = python_exception(line) {
        return Speaker::Python { exception };
    }
    for (head, severity) in [
        ("ERROR:  ", "ERROR"),
        ("FATAL:  ", "FATAL"),
        ("PANIC:  ", "PANIC"),
    ] {
        if line.contains(head) {
            return Speaker::Postgres { severity };
        }
    }
    Speaker::Other
}

/// NCCL's grammar: the level word, then back over `(func)`, `file:line` and `[dev]`. Up to 2.3
/// the level word came without `NCCL`: then only after a `file:line`.
fn nccl(line: &str) -> Option<Speaker<'_>> {
    const LEVELS: [(&str, bool); 5] = [
        ("NCCL WARN", true),
        ("NCCL INFO", false),
        ("NCCL TRACE", false),
        (" WARN ", true),
        (" INFO ", false),
    ];
    for (word, warn) in LEVELS {
        for (at, _) in line.match_indices(word) {
            let at = at + usize::from(word.starts_with(' '));
            let mut before = line[..at].trim_end();
            // 2.27+: ` (func)` between the file and the level.
            if before.ends_with(')') {
                if let Some(open) = before.rfind(" (") {
                    before = before[..open].trim_end();
                }
            }
            let (rest, last) = before.rsplit_once(' ').unwrap_or(("", before));
            let file = file_of(last);
            if !word.starts_with("NCCL") && file.is_none() {
                continue;
            }
            let devs = if file.is_some() { rest } else { before };
            let dev = devs
                .trim_end()
                .rsplit_once('[')
                .and_then(|(_, d)| d.strip_suffix(']'))
                .and_then(|d| d.parse().ok());
            return Some(Speaker::Nccl {
                file,
                transport: file.map_or(Transport::Other, transport),
                dev,
                warn,
                at,
            });
        }
    }
    None
}

/// `transport/p2p.cc` of `transport/p2p.cc:273` (RCCL prints the whole build path: its last two
/// parts are kept).
fn file_of(token: &str) -> Option<&str> {
    let (file, line) = token.rsplit_once(':')?;
    if line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if ![".cc", ".cu", ".h", ".cpp"]
        .iter()
        .any(|e| file.ends_with(e))
    {
        return None;
    }
    let cut = file.rmatch_indices('/').nth(1).map_or(0, |(i, _)| i + 1);
    Some(&file[cut..])
}

fn transport(file: &str) -> Transport {
    let has = |w: &str| file.contains(w);
    if has("p2p.c") {
        Transport::P2p
    } else if has("nvls.c") {
        Transport::Nvls
    } else if has("shm.c") || has("shmutils") || has("shm.h") {
        Transport::Shm
    } else if has("net") {
        Transport::Net
    } else {
        Transport::Other
    }
}

/// Python's exception line: `Name: ` where Name ends in Error, Exception or Warning and starts
/// the line or follows a prefix (`[rank0]: `, a logger's `ERROR ... :`). The first on the line.
fn python_exception(line: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(i) = line[from..].find(": ").map(|i| i + from) {
        let head = &line[..i];
        let start = super::gpu::after_last(head, |c| {
            !(c.is_ascii_alphanumeric() || c == '_' || c == '.')
        });
        let name = &head[start..];
        let last = name.rsplit('.').next().unwrap_or(name);
        let class = ["Error", "Exception", "Warning"]
            .iter()
            .any(|s| last.ends_with(s) && last.len() > s.len())
            && last.starts_with(|c: char| c.is_ascii_uppercase());
        if class {
            return Some(last);
        }
        from = i + 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_grammar_in_every_version() {
        // src/debug.cc as of 2.7-2.26, then 2.27+ with the function, then 2.2 (Horovod).
        let s = speaker(
            "node-2:3127:3180 [3] transport/p2p.cc:273 NCCL WARN failed to open CUDA IPC handle",
        );
        let Speaker::Nccl {
            file,
            transport,
            dev,
            warn,
            ..
        } = s
        else {
            panic!("{s:?}")
        };
        assert_eq!(
            (file, transport, dev, warn),
            (Some("transport/p2p.cc"), Transport::P2p, Some(3), true)
        );
        let s = speaker(
            "[2026-06-23 15:45:07] gpu-7:420:437 [5] transport/nvls.cc:379 (nvlsAllocateMem) NCCL \
             WARN Failed",
        );
        assert!(matches!(
            s,
            Speaker::Nccl {
                transport: Transport::Nvls,
                dev: Some(5),
                ..
            }
        ));
        let s = speaker("localhost:95772:95782 [0] transport/p2p.cu:526 WARN failed to open");
        assert!(
            matches!(
                s,
                Speaker::Nccl {
                    transport: Transport::P2p,
                    warn: true,
                    ..
                }
            ),
            "{s:?}"
        );
        // RCCL prints its build path.
        let s =
            speaker("node [0] /app/rccl/build/release/hipify/src/init.cc:213 NCCL WARN Missing");
        assert!(
            matches!(
                s,
                Speaker::Nccl {
                    file: Some("src/init.cc"),
                    ..
                }
            ),
            "{s:?}"
        );
        let s = speaker("node-1:77:77 [0] NCCL INFO transport/nvls.cc:409 -> 1");
        assert!(matches!(s, Speaker::Nccl { warn: false, .. }), "{s:?}");
    }

    #[test]
    fn pythons_exception_line() {
        assert_eq!(
            speaker("RuntimeError: CUDA error: uncorrectable NVLink error detected").name(),
            "Python's RuntimeError"
        );
        assert_eq!(
            speaker("cupy.cuda.runtime.CUDARuntimeError: cudaErrorSystemNotReady: system").name(),
            "Python's CUDARuntimeError"
        );
        assert_eq!(
            speaker("[rank0]: OSError: [Errno 28] No space left on device").name(),
            "Python's OSError"
        );
        // An error's words are not an exception's name.
        assert_eq!(speaker("CUDA error: out of memory"), Speaker::Other);
        assert_eq!(
            speaker("2021-06-01 06:43:28.473 UTC [340] ERROR:  could not resize").name(),
            "PostgreSQL's ERROR"
        );
    }
}

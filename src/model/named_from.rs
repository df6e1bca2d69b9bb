//! The facts a failure was named from when no exact text of a program matched its line
//! (`failures::facts`): what failed, on what, who said it, the GPU the line names. Kept typed
//! until it is written out once, by its `Display`: `check --json`'s `named_from`, the message's
//! "named from: ...".

use std::fmt;

/// The GPU API whose error a line reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuApi {
    Cuda,
    Hip,
}

/// What failed, as the line says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// An errno, by its number and name.
    Errno { number: u32, name: &'static str },
    /// A CUDA or HIP error, by its number and name (the toolkit's own tables).
    Gpu {
        api: GpuApi,
        code: u32,
        name: &'static str,
    },
    /// A signal, by its number and name.
    Signal { number: u32, name: &'static str },
    /// Words that say the cause (`insufficient shared memory`), as the line has them.
    Words(String),
    /// A fault and the words that say its cause, on one line.
    SignalAndWords {
        number: u32,
        name: &'static str,
        words: String,
    },
}

/// Where a GPU named in the line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuNamed {
    /// A device number as the process counts them (its own CUDA_VISIBLE_DEVICES).
    Device(u32),
    /// A PCI address.
    Pci(String),
}

/// The facts one line gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFrom {
    pub failed: Failed,
    /// On what: a path, a shared-memory name or a call, as printed (bounded, written out).
    pub on: Option<String>,
    /// Who said it: `NCCL's transport/p2p.cc`, `Python's OSError`.
    pub by: String,
    pub gpu: Option<GpuNamed>,
    /// The bytes of the line the facts came from (start, end): the matched part.
    pub span: (usize, usize),
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::Errno { number, name } => write!(f, "errno {number} ({name})"),
            Failed::Gpu { api, code, name } => {
                let api = match api {
                    GpuApi::Cuda => "CUDA",
                    GpuApi::Hip => "HIP",
                };
                write!(f, "{api} error {code} ({name})")
            }
            Failed::Signal { number, name } => write!(f, "signal {number} ({name})"),
            Failed::Words(words) => write!(f, "\"{words}\""),
            Failed::SignalAndWords {
                number,
                name,
                words,
            } => write!(f, "signal {number} ({name}) with \"{words}\""),
        }
    }
}

/// `errno 28 (ENOSPC) on /dev/shm/torch_123 in Python's OSError`, `CUDA error 1
/// (cudaErrorInvalidValue) on cudaIpcOpenMemHandle in NCCL's transport/p2p.cc, device 3`.
impl fmt::Display for NamedFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.failed)?;
        if let Some(on) = &self.on {
            write!(f, " on {on}")?;
        }
        write!(f, " in {}", self.by)?;
        match &self.gpu {
            Some(GpuNamed::Device(d)) => write!(f, ", device {d} of the process"),
            Some(GpuNamed::Pci(p)) => write!(f, ", GPU {p}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_read_as_one_phrase() {
        let errno = NamedFrom {
            failed: Failed::Errno {
                number: 28,
                name: "ENOSPC",
            },
            on: Some("/dev/shm/torch_123".into()),
            by: "Python's OSError".into(),
            gpu: None,
            span: (0, 10),
        };
        assert_eq!(
            errno.to_string(),
            "errno 28 (ENOSPC) on /dev/shm/torch_123 in Python's OSError"
        );
        let cuda = NamedFrom {
            failed: Failed::Gpu {
                api: GpuApi::Cuda,
                code: 1,
                name: "cudaErrorInvalidValue",
            },
            on: Some("cudaIpcOpenMemHandle".into()),
            by: "NCCL's transport/p2p.cc".into(),
            gpu: Some(GpuNamed::Device(3)),
            span: (0, 10),
        };
        assert_eq!(
            cuda.to_string(),
            "CUDA error 1 (cudaErrorInvalidValue) on cudaIpcOpenMemHandle in NCCL's \
             transport/p2p.cc, device 3 of the process"
        );
        let words = Failed::SignalAndWords {
            number: 7,
            name: "SIGBUS",
            words: "insufficient shared memory (shm)".into(),
        };
        assert_eq!(
            words.to_string(),
            "signal 7 (SIGBUS) with \"insufficient shared memory (shm)\""
        );
    }
}

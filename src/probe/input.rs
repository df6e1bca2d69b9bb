//! Pure: what the probe is asked, checked before any GPU is touched. A typo in `--gpus` or a
//! size no GPU can take is the user's mistake (exit 2, saying what would do), never a pair
//! blamed for it.
//!
//! `--bytes` runs from 4 KiB (a page of the pattern, below which the timing is all overhead)
//! to 4 GiB (the worker holds the pattern and the bytes read back in host memory, twice the
//! size; 4 GiB copies in under a second on any link that is up). Where NVML says how much
//! memory a chosen GPU has free, the copy must fit in it: each GPU holds one buffer of it.

use thiserror::Error;

use crate::units::{human_bytes, parse_size};

pub const MIN_BYTES: u64 = 4 << 10;
pub const MAX_BYTES: u64 = 4 << 30;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InputError {
    #[error("{0}")]
    BytesUnreadable(String),
    /// Said after clap's "invalid value '<given>' for '--bytes <SIZE>'".
    #[error("the sized copy must be from 4 KiB to 4 GiB (e.g. 64Mi, the default)")]
    BytesOutOfRange { given: String },
    #[error(
        "--bytes {}: GPU {gpu} has {} free (of {}); the copy needs that much on each GPU",
        human_bytes(*.bytes), human_bytes(*.free), human_bytes(*.total)
    )]
    BytesOverGpuMemory {
        bytes: u64,
        gpu: u32,
        free: u64,
        total: u64,
    },
    #[error("--gpus {asked}: no GPU {} here; NVML lists {}", list(.unknown), gpus(.listed))]
    UnknownGpus {
        asked: String,
        unknown: Vec<u32>,
        listed: Vec<u32>,
    },
    #[error("--gpus {asked}: GPU {gpu} is named twice")]
    Repeated { asked: String, gpu: u32 },
    #[error("--gpus {asked}: a pair needs two GPUs; NVML lists {}", gpus(.listed))]
    OneGpuAsked { asked: String, listed: Vec<u32> },
    #[error("no pair to probe: NVML lists {}", gpus(.listed))]
    FewerThanTwo { listed: Vec<u32> },
}

fn list(gpus: &[u32]) -> String {
    let each: Vec<String> = gpus.iter().map(u32::to_string).collect();
    each.join(", ")
}

/// `GPUs 0, 1, 2`, `only GPU 0`, `no GPU`.
fn gpus(listed: &[u32]) -> String {
    match listed {
        [] => "no GPU".into(),
        [one] => format!("only GPU {one}"),
        many => format!("GPUs {}", list(many)),
    }
}

/// `--bytes` as clap reads it: a size (`64Mi`, `1Gi`, plain bytes) within the bounds.
pub fn parse_bytes(text: &str) -> Result<u64, InputError> {
    let bytes =
        parse_size("--bytes", text).map_err(|e| InputError::BytesUnreadable(e.to_string()))?;
    if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) {
        return Err(InputError::BytesOutOfRange {
            given: text.trim().to_string(),
        });
    }
    Ok(bytes)
}

/// The GPUs to probe among those NVML `listed`: `asked` (`--gpus`), each listed and named once,
/// at least two; all of them when not asked.
pub fn choose_gpus(listed: &[u32], asked: Option<&[u32]>) -> Result<Vec<u32>, InputError> {
    let Some(asked) = asked else {
        if listed.len() < 2 {
            return Err(InputError::FewerThanTwo {
                listed: listed.to_vec(),
            });
        }
        return Ok(listed.to_vec());
    };
    let spelled = list(asked).replace(", ", ",");
    let unknown: Vec<u32> = asked
        .iter()
        .copied()
        .filter(|g| !listed.contains(g))
        .collect();
    if !unknown.is_empty() {
        return Err(InputError::UnknownGpus {
            asked: spelled,
            unknown,
            listed: listed.to_vec(),
        });
    }
    let repeated = (1..asked.len()).find(|&i| asked[..i].contains(&asked[i]));
    if let Some(i) = repeated {
        return Err(InputError::Repeated {
            asked: spelled,
            gpu: asked[i],
        });
    }
    if asked.len() < 2 {
        return Err(InputError::OneGpuAsked {
            asked: spelled,
            listed: listed.to_vec(),
        });
    }
    Ok(asked.to_vec())
}

/// GPU memory as NVML reports it, where it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    pub gpu: u32,
    pub free: u64,
    pub total: u64,
}

/// The copy fits in each chosen GPU's free memory (GPUs NVML gives no figure for pass).
pub fn fits(bytes: u64, memory: &[GpuMemory]) -> Result<(), InputError> {
    match memory.iter().find(|m| m.free < bytes) {
        Some(m) => Err(InputError::BytesOverGpuMemory {
            bytes,
            gpu: m.gpu,
            free: m.free,
            total: m.total,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_out_of_range_are_refused_with_the_range() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("4Ki"), Ok(4096));
        assert_eq!(parse_bytes("4Gi"), Ok(4 << 30));
        for bad in ["0", "4095", "100Gi", "5Gi"] {
            let e = parse_bytes(bad).unwrap_err();
            assert_eq!(
                e,
                InputError::BytesOutOfRange {
                    given: bad.to_string()
                }
            );
            assert_eq!(
                e.to_string(),
                "the sized copy must be from 4 KiB to 4 GiB (e.g. 64Mi, the default)"
            );
        }
        let e = parse_bytes("lots").unwrap_err().to_string();
        assert!(e.starts_with("--bytes: \"lots\" is not a size"), "{e}");
    }

    #[test]
    fn gpus_must_be_listed_named_once_and_two_or_more() {
        let listed: Vec<u32> = (0..8).collect();
        assert_eq!(choose_gpus(&listed, None), Ok(listed.clone()));
        assert_eq!(choose_gpus(&listed, Some(&[5, 7])), Ok(vec![5, 7]));
        let e = |asked: &[u32]| choose_gpus(&listed, Some(asked)).unwrap_err().to_string();
        assert_eq!(
            e(&[0, 9]),
            "--gpus 0,9: no GPU 9 here; NVML lists GPUs 0, 1, 2, 3, 4, 5, 6, 7"
        );
        assert_eq!(
            e(&[0, 9, 12]),
            "--gpus 0,9,12: no GPU 9, 12 here; NVML lists GPUs 0, 1, 2, 3, 4, 5, 6, 7"
        );
        assert_eq!(
            e(&[0]),
            "--gpus 0: a pair needs two GPUs; NVML lists GPUs 0, 1, 2, 3, 4, 5, 6, 7"
        );
        assert_eq!(e(&[3, 1, 3]), "--gpus 3,1,3: GPU 3 is named twice");
        assert_eq!(
            choose_gpus(&[0], None).unwrap_err().to_string(),
            "no pair to probe: NVML lists only GPU 0"
        );
        assert_eq!(
            choose_gpus(&[], Some(&[0, 1])).unwrap_err().to_string(),
            "--gpus 0,1: no GPU 0, 1 here; NVML lists no GPU"
        );
    }

    #[test]
    fn a_copy_must_fit_in_each_gpus_free_memory() {
        let m = |gpu, free_gib: u64| GpuMemory {
            gpu,
            free: free_gib << 30,
            total: 80 << 30,
        };
        assert_eq!(fits(4 << 30, &[m(0, 80), m(1, 79)]), Ok(()));
        assert_eq!(fits(4 << 30, &[]), Ok(()), "unknown memory passes");
        assert_eq!(
            fits(4 << 30, &[m(0, 80), m(1, 2)]).unwrap_err().to_string(),
            "--bytes 4.0 GiB: GPU 1 has 2.0 GiB free (of 80.0 GiB); the copy needs that much \
             on each GPU"
        );
    }
}

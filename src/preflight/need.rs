//! Pure: the /dev/shm a workload needs, from what it says (`--min-shm`, the DataLoader sizing
//! helper) and the GPUs it sees (NCCL's SHM segments, the GPU default).

use serde::Serialize;

use crate::units::{human_bytes, parse_size, SizeError, GIB, MIB};

/// Below this much effective /dev/shm a container that sees GPUs gets a warning when no need
/// was given: PyTorch DataLoader workers hand every batch over through /dev/shm and NCCL puts
/// its intra-node buffers there; the runtimes' default 64 MiB runs out at the first real batch.
pub const DEFAULT_GPU_SHM_BYTES: u64 = GIB;

/// One segment of NCCL's SHM transport, which NCCL creates per receiving connection, i.e. per
/// ordered pair of local ranks (one rank per GPU) and channel, when two GPUs talk through host
/// memory (no P2P between them, P2P disabled, or the ranks in different containers). It holds
/// the buffers of NCCL's three protocols and a header:
///
/// - Simple: `NCCL_BUFFSIZE`, default 4 MiB = 4,194,304;
/// - LL128: 120 elements x 640 threads x 8 steps x 8 bytes = 4,915,200;
/// - LL: 8 lines x 512 threads x 8 steps x 16 bytes = 524,288;
/// - the connection header, one 4 KiB page.
///
/// 9,637,888 bytes: the very size NCCL prints in `Error while creating shared memory segment
/// /dev/shm/nccl-XXXXXX (size 9637888)`. The sizing helper counts one segment per ordered GPU
/// pair (one channel); NCCL opens more channels on large boards, so this is a floor, not a
/// ceiling.
pub const NCCL_SHM_SEGMENT_BYTES: u64 = 4_194_304 + 4_915_200 + 524_288 + 4_096;

/// PyTorch's DataLoader default `prefetch_factor`: batches in flight per worker.
pub const DEFAULT_PREFETCH_FACTOR: u64 = 2;

/// What the workload says it needs (the command line, parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeedSpec {
    /// `--min-shm SIZE`.
    MinShm(u64),
    /// `--dataloader-workers N --batch-bytes B [--prefetch-factor P]`.
    Sizing {
        workers: u64,
        prefetch_factor: u64,
        batch_bytes: u64,
    },
    /// Neither: only the GPU default warns.
    Unspecified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NeedSource {
    MinShm,
    Sizing,
    /// No need given, GPUs visible: [`DEFAULT_GPU_SHM_BYTES`], a warning only.
    GpuDefault,
}

/// The /dev/shm the workload needs, with how it was reckoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Need {
    pub source: NeedSource,
    pub bytes: u64,
    /// Falling short fails (exit 1); the GPU default only warns.
    pub enforced: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataloader_workers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_bytes: Option<u64>,
    /// workers x prefetch factor x batch bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataloader_bytes: Option<u64>,
    /// [`NCCL_SHM_SEGMENT_BYTES`] x GPUs x (GPUs - 1), when more than one GPU is visible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_bytes: Option<u64>,
}

/// The need as preflight's options state it (`--min-shm`, else the sizing helper's three), in
/// one place for `preflight` itself and for the admission webhook, which reads the options of a
/// preflight init container from the Pod spec.
pub fn spec_of(
    min_shm: Option<&str>,
    workers: Option<u64>,
    batch_bytes: Option<&str>,
    prefetch_factor: u64,
) -> Result<NeedSpec, SizeError> {
    Ok(match (min_shm, workers, batch_bytes) {
        (Some(min), _, _) => NeedSpec::MinShm(parse_size("--min-shm", min)?),
        (None, Some(workers), Some(batch)) => NeedSpec::Sizing {
            workers,
            prefetch_factor,
            batch_bytes: parse_size("--batch-bytes", batch)?,
        },
        _ => NeedSpec::Unspecified,
    })
}

/// NCCL's SHM segments for `gpus` local ranks: one per ordered pair (see the constant).
pub fn nccl_bytes(gpus: usize) -> u64 {
    let g = gpus as u64;
    if g < 2 {
        0
    } else {
        NCCL_SHM_SEGMENT_BYTES.saturating_mul(g * (g - 1))
    }
}

/// The /dev/shm a container with `gpus` GPUs and no need given should have: at least
/// [`DEFAULT_GPU_SHM_BYTES`], and room for NCCL's SHM segments among its GPUs, rounded up to a
/// whole MiB. Preflight's GPU default and the admission webhook's size, so both ask for the same.
pub fn gpu_default_bytes(gpus: usize) -> u64 {
    DEFAULT_GPU_SHM_BYTES
        .max(nccl_bytes(gpus))
        .div_ceil(MIB)
        .saturating_mul(MIB)
}

/// The need for `spec` with `gpus` GPUs visible; `None` when nothing is asked and no GPU seen.
pub fn need(spec: NeedSpec, gpus: usize) -> Option<Need> {
    let base = |source, bytes, enforced| Need {
        source,
        bytes,
        enforced,
        dataloader_workers: None,
        prefetch_factor: None,
        batch_bytes: None,
        dataloader_bytes: None,
        nccl_bytes: None,
    };
    match spec {
        NeedSpec::MinShm(bytes) => Some(base(NeedSource::MinShm, bytes, true)),
        NeedSpec::Sizing {
            workers,
            prefetch_factor,
            batch_bytes,
        } => {
            let loader = workers
                .saturating_mul(prefetch_factor)
                .saturating_mul(batch_bytes);
            let nccl = (gpus > 1).then(|| nccl_bytes(gpus));
            Some(Need {
                dataloader_workers: Some(workers),
                prefetch_factor: Some(prefetch_factor),
                batch_bytes: Some(batch_bytes),
                dataloader_bytes: Some(loader),
                nccl_bytes: nccl,
                ..base(
                    NeedSource::Sizing,
                    loader.saturating_add(nccl.unwrap_or(0)),
                    true,
                )
            })
        }
        NeedSpec::Unspecified if gpus > 0 => {
            Some(base(NeedSource::GpuDefault, gpu_default_bytes(gpus), false))
        }
        NeedSpec::Unspecified => None,
    }
}

/// How the need was reckoned, in words (the problems and the text report say it).
pub(super) fn need_words(need: &Need) -> String {
    match need.source {
        NeedSource::MinShm => "--min-shm".to_string(),
        // No parentheses: the text report puts these words in its own.
        NeedSource::GpuDefault => "a GPU workload with no need given".to_string(),
        NeedSource::Sizing => {
            let mut s = format!(
                "{} DataLoader workers x prefetch {} x {} batches = {}",
                need.dataloader_workers.unwrap_or(0),
                need.prefetch_factor.unwrap_or(0),
                human_bytes(need.batch_bytes.unwrap_or(0)),
                human_bytes(need.dataloader_bytes.unwrap_or(0)),
            );
            if let Some(nccl) = need.nccl_bytes {
                s.push_str(&format!(" + NCCL's SHM segments {}", human_bytes(nccl)));
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::parse_size;

    /// Issue 37: `need 1.0 GiB (a GPU workload (no need given; ...))` had parentheses in
    /// parentheses.
    #[test]
    fn the_gpu_defaults_words_nest_no_parentheses() {
        let words = need_words(&need(NeedSpec::Unspecified, 2).unwrap());
        assert_eq!(words, "a GPU workload with no need given");
        assert!(!words.contains('('));
    }

    #[test]
    fn the_gpu_default_is_a_gib_or_nccls_segments_in_whole_mib() {
        assert_eq!(gpu_default_bytes(0), GIB);
        assert_eq!(gpu_default_bytes(1), GIB);
        assert_eq!(gpu_default_bytes(8), GIB, "56 segments are 515 MiB");
        assert_eq!(gpu_default_bytes(11), GIB, "110 segments are 1011 MiB");
        // 132 x 9,637,888 = 1,272,201,216 bytes = 1213.3 MiB.
        assert_eq!(gpu_default_bytes(12), 1214 * MIB);
        assert_eq!(gpu_default_bytes(16), 2206 * MIB);
        assert_eq!(need(NeedSpec::Unspecified, 16).unwrap().bytes, 2206 * MIB);
    }

    #[test]
    fn the_nccl_segment_is_the_size_nccl_prints() {
        assert_eq!(NCCL_SHM_SEGMENT_BYTES, 9_637_888);
        assert_eq!(nccl_bytes(0), 0);
        assert_eq!(nccl_bytes(1), 0);
        assert_eq!(nccl_bytes(2), 2 * 9_637_888);
        assert_eq!(nccl_bytes(8), 56 * 9_637_888);
    }

    #[test]
    fn the_sizing_helper_is_workers_times_prefetch_times_batch_plus_nccl() {
        let spec = NeedSpec::Sizing {
            workers: 8,
            prefetch_factor: 2,
            batch_bytes: 64 * MIB,
        };
        let one = need(spec, 1).unwrap();
        assert_eq!(one.bytes, GIB);
        assert_eq!(one.dataloader_bytes, Some(GIB));
        assert_eq!(one.nccl_bytes, None, "one GPU talks to no peer");
        assert!(one.enforced);
        let two = need(spec, 2).unwrap();
        assert_eq!(two.bytes, GIB + 2 * NCCL_SHM_SEGMENT_BYTES);
        assert_eq!(two.nccl_bytes, Some(19_275_776));
        assert_eq!(
            need(NeedSpec::MinShm(GIB), 8).unwrap().bytes,
            GIB,
            "--min-shm is taken as given"
        );
        let default = need(NeedSpec::Unspecified, 2).unwrap();
        assert_eq!(
            (default.source, default.bytes, default.enforced),
            (NeedSource::GpuDefault, GIB, false)
        );
        assert_eq!(need(NeedSpec::Unspecified, 0), None);
    }

    #[test]
    fn the_example_training_pod_fits_what_its_preflight_asks_for() {
        let yaml = include_str!("../../deploy/examples/training-pod.yaml");
        let value = |key: &str| -> &str {
            let at = yaml
                .find(key)
                .unwrap_or_else(|| panic!("{key} in the example"));
            yaml[at + key.len()..]
                .split(|c: char| c.is_whitespace() || c == '"')
                .next()
                .unwrap()
        };
        let workers: u64 = value("--dataloader-workers=").parse().unwrap();
        let batch = parse_size("batch", value("--batch-bytes=")).unwrap();
        let prefetch: u64 = value("--prefetch-factor=").parse().unwrap();
        let gpus: usize = value("nvidia.com/gpu: ").parse().unwrap();
        let size_limit = parse_size("sizeLimit", value("sizeLimit: ")).unwrap();
        let memory = parse_size("memory", value("memory: ")).unwrap();
        let need = need(
            NeedSpec::Sizing {
                workers,
                prefetch_factor: prefetch,
                batch_bytes: batch,
            },
            gpus,
        )
        .unwrap();
        assert_eq!(need.nccl_bytes, Some(56 * NCCL_SHM_SEGMENT_BYTES));
        assert!(
            need.bytes <= size_limit,
            "{need:?} vs sizeLimit {size_limit}"
        );
        assert!(size_limit < memory);
        // The figures its comment gives.
        assert!(yaml.contains(&format!("{} MiB)", nccl_bytes(8).div_ceil(MIB))));
        assert!(yaml.contains(&format!(": {:.1} GiB", need.bytes as f64 / GIB as f64)));
    }
}

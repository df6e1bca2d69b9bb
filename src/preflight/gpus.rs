//! Pure: which GPUs the workload sees (CUDA_/NVIDIA_VISIBLE_DEVICES against NVML's list), the
//! pairs among them, and the GPUs to avoid.

use serde::Serialize;

use crate::model::{Blame, PairStatus, PairVerdict, Suspect};

/// Which GPUs the workload will use, as its environment says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelector {
    /// Every GPU NVML lists.
    All,
    /// None at all (`CUDA_VISIBLE_DEVICES=""`, `NVIDIA_VISIBLE_DEVICES=void|none`).
    NoGpus,
    /// Indices or UUIDs (or UUID prefixes, as CUDA takes them), in order.
    List(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectorSource {
    CudaVisibleDevices,
    NvidiaVisibleDevices,
    Nvml,
}

/// `CUDA_VISIBLE_DEVICES` first (what CUDA itself obeys), else `NVIDIA_VISIBLE_DEVICES` (what
/// the NVIDIA container runtime injected), else all of NVML's.
pub fn selector(cuda: Option<&str>, nvidia: Option<&str>) -> (GpuSelector, SelectorSource) {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    };
    if let Some(cuda) = cuda {
        let entries = list(cuda);
        let sel = if entries.is_empty() {
            GpuSelector::NoGpus
        } else {
            GpuSelector::List(entries)
        };
        return (sel, SelectorSource::CudaVisibleDevices);
    }
    if let Some(nvidia) = nvidia {
        let sel = match nvidia.trim() {
            "all" => GpuSelector::All,
            "" | "void" | "none" => GpuSelector::NoGpus,
            other => GpuSelector::List(list(other)),
        };
        return (sel, SelectorSource::NvidiaVisibleDevices);
    }
    (GpuSelector::All, SelectorSource::Nvml)
}

/// One GPU as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// A GPU the workload sees: NVML's index and the ordinal CUDA gives it in the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisibleGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub cuda_ordinal: u32,
}

/// The GPUs `selector` picks out of NVML's, and the entries that name none of them.
///
/// Indices are NVML's, which CUDA's match when `CUDA_DEVICE_ORDER=PCI_BUS_ID` (UUIDs always
/// match). Like CUDA, `CUDA_VISIBLE_DEVICES` stops at the first entry that names no GPU. An
/// `NVIDIA_VISIBLE_DEVICES` list as long as NVML's list is taken as already applied by the
/// container runtime (inside such a container NVML numbers the injected GPUs from 0).
pub fn visible_gpus(
    selector: &GpuSelector,
    source: SelectorSource,
    nvml: &[NvmlGpu],
) -> (Vec<VisibleGpu>, Vec<String>) {
    let pick = |gpus: Vec<&NvmlGpu>| -> Vec<VisibleGpu> {
        gpus.into_iter()
            .enumerate()
            .map(|(i, g)| VisibleGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                cuda_ordinal: i as u32,
            })
            .collect()
    };
    let entries = match selector {
        GpuSelector::All => return (pick(nvml.iter().collect()), Vec::new()),
        GpuSelector::NoGpus => return (Vec::new(), Vec::new()),
        GpuSelector::List(entries) => entries,
    };
    let find = |entry: &str| -> Option<&NvmlGpu> {
        if let Ok(i) = entry.parse::<u32>() {
            return nvml.iter().find(|g| g.index == i);
        }
        let want = entry.to_ascii_lowercase();
        let mut hits = nvml
            .iter()
            .filter(|g| g.uuid.to_ascii_lowercase().starts_with(&want));
        match (hits.next(), hits.next()) {
            (Some(g), None) => Some(g),
            _ => None,
        }
    };
    let mut picked = Vec::new();
    let mut unmatched = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        match find(entry) {
            Some(g) if !picked.iter().any(|p: &&NvmlGpu| p.index == g.index) => picked.push(g),
            Some(_) => {}
            None => {
                if source == SelectorSource::NvidiaVisibleDevices
                    && entries.len() == nvml.len()
                    && entries.iter().all(|e| e.parse::<u32>().is_ok())
                {
                    return (pick(nvml.iter().collect()), Vec::new());
                }
                unmatched.push(entry.clone());
                if source == SelectorSource::CudaVisibleDevices {
                    unmatched.extend(entries[i + 1..].iter().cloned());
                    break;
                }
            }
        }
    }
    (pick(picked), unmatched)
}

/// The pairs among `visible` (both ends visible).
pub fn visible_pairs(all: &[PairVerdict], visible: &[VisibleGpu]) -> Vec<PairVerdict> {
    let seen = |i: u32| visible.iter().any(|g| g.index == i);
    all.iter()
        .filter(|p| seen(p.gpu) && seen(p.peer_gpu))
        .cloned()
        .collect()
}

/// The GPUs the pair judge's blame names as culprits: not "either end" of pairs that share no
/// GPU (those are told pair by pair), nor any when every GPU fails (the node's fault).
pub fn culprits(blame: &Blame) -> Vec<Suspect> {
    blame.culprits().cloned().collect()
}

/// GPUs to avoid so that no pair among the rest fails: repeatedly drop the GPU in the most
/// failing pairs (a broken GPU fails with every peer, so it goes first). Sorted.
pub fn gpus_to_avoid(all: &[PairVerdict]) -> Vec<u32> {
    let mut failing: Vec<(u32, u32)> = all
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .map(|p| (p.gpu, p.peer_gpu))
        .collect();
    let mut avoid = Vec::new();
    while !failing.is_empty() {
        let mut counts = std::collections::BTreeMap::<u32, usize>::new();
        for &(a, b) in &failing {
            *counts.entry(a).or_default() += 1;
            *counts.entry(b).or_default() += 1;
        }
        // Most failing pairs first; on a tie the higher index (the later GPU in a pair).
        let (&worst, _) = counts
            .iter()
            .max_by_key(|&(&gpu, &n)| (n, gpu))
            .expect("failing pairs name GPUs");
        avoid.push(worst);
        failing.retain(|&(a, b)| a != worst && b != worst);
    }
    avoid.sort_unstable();
    avoid
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pair;
    use crate::fixtures::preflight::{gpu7_broken, nvml};

    fn indices(v: &[VisibleGpu]) -> Vec<(u32, u32)> {
        v.iter().map(|g| (g.index, g.cuda_ordinal)).collect()
    }

    #[test]
    fn cuda_visible_devices_wins_and_numbers_the_gpus_from_zero() {
        let gpus = nvml(8);
        let (sel, src) = selector(Some("6,7"), Some("all"));
        assert_eq!(src, SelectorSource::CudaVisibleDevices);
        let (v, unmatched) = visible_gpus(&sel, src, &gpus);
        assert_eq!(indices(&v), vec![(6, 0), (7, 1)]);
        assert!(unmatched.is_empty());
        // UUIDs and unique prefixes, as CUDA takes them.
        let (sel, src) = selector(Some("GPU-00000003,GPU-00000001-aaaa"), None);
        let (v, _) = visible_gpus(&sel, src, &gpus);
        assert_eq!(indices(&v), vec![(3, 0), (1, 1)]);
        // CUDA stops at the first entry that names no GPU.
        let (sel, src) = selector(Some("1,9,2"), None);
        let (v, unmatched) = visible_gpus(&sel, src, &gpus);
        assert_eq!(indices(&v), vec![(1, 0)]);
        assert_eq!(unmatched, vec!["9", "2"]);
        // Empty: no GPU at all.
        let (sel, src) = selector(Some(""), Some("all"));
        assert_eq!(sel, GpuSelector::NoGpus);
        assert!(visible_gpus(&sel, src, &gpus).0.is_empty());
    }

    #[test]
    fn nvidia_visible_devices_applies_when_cuda_visible_devices_is_unset() {
        let gpus = nvml(8);
        let (sel, src) = selector(None, Some("2,3"));
        assert_eq!(src, SelectorSource::NvidiaVisibleDevices);
        assert_eq!(
            indices(&visible_gpus(&sel, src, &gpus).0),
            vec![(2, 0), (3, 1)]
        );
        for none in ["void", "none", ""] {
            assert_eq!(selector(None, Some(none)).0, GpuSelector::NoGpus);
        }
        assert_eq!(selector(None, Some("all")).0, GpuSelector::All);
        // The runtime injected GPUs 6 and 7; NVML in the container numbers them 0 and 1.
        let (sel, src) = selector(None, Some("6,7"));
        let (v, unmatched) = visible_gpus(&sel, src, &nvml(2));
        assert_eq!(indices(&v), vec![(0, 0), (1, 1)]);
        assert!(unmatched.is_empty());
        let (sel, src) = selector(None, None);
        assert_eq!((sel, src), (GpuSelector::All, SelectorSource::Nvml));
    }

    #[test]
    fn the_gpu_to_avoid_is_the_one_in_every_failing_pair() {
        assert_eq!(gpus_to_avoid(&gpu7_broken()), vec![7]);
        assert!(gpus_to_avoid(&[pair(0, 1, PairStatus::Ok)]).is_empty());
        // One bad pair alone: drop one end of it.
        assert_eq!(gpus_to_avoid(&[pair(2, 5, PairStatus::Degraded)]).len(), 1);
    }
}

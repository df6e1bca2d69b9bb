//! The sample, indexed: GPUs by NVML index, lost GPUs, whether the board has NVSwitches.

use std::collections::{BTreeMap, BTreeSet};

use super::reasons::PairState;
use crate::model::{GpuReading, GpuSample, Peer};

pub(super) fn ordered(a: u32, b: u32) -> (u32, u32) {
    (a.min(b), a.max(b))
}

/// The sample, indexed.
pub(super) struct Board<'a> {
    /// By NVML index; the first reading of a duplicated index wins.
    pub gpus: BTreeMap<u32, &'a GpuReading>,
    /// Every GPU index in the sample, from readings and pairs.
    pub indices: BTreeSet<u32>,
    pub lost: BTreeSet<u32>,
    /// Some GPU has a link to an NVSwitch: every pair should then reach every other over NVLink.
    pub nvswitch: bool,
}

impl<'a> Board<'a> {
    pub fn new(sample: &'a GpuSample) -> Self {
        let mut gpus = BTreeMap::new();
        for g in &sample.gpus {
            gpus.entry(g.index).or_insert(g);
        }
        let mut indices: BTreeSet<u32> = gpus.keys().copied().collect();
        for p in &sample.pairs {
            if p.gpu != p.peer_gpu {
                indices.insert(p.gpu);
                indices.insert(p.peer_gpu);
            }
        }
        let lost = gpus.values().filter(|g| g.lost).map(|g| g.index).collect();
        let nvswitch = gpus
            .values()
            .any(|g| !g.lost && g.links.iter().any(|l| l.peer == Peer::Switch));
        Board {
            gpus,
            indices,
            lost,
            nvswitch,
        }
    }

    /// What baselines are keyed by: the UUID, or the index when NVML gave no UUID.
    pub fn key(&self, index: u32) -> String {
        match self.gpus.get(&index) {
            Some(g) if !g.uuid.is_empty() => g.uuid.clone(),
            _ => format!("#{index}"),
        }
    }

    pub fn is_lost(&self, pair: (u32, u32)) -> bool {
        self.lost.contains(&pair.0) || self.lost.contains(&pair.1)
    }

    /// ` (GPU-…, NVIDIA H100, PCI 0000:…)`, with what is known.
    pub fn describe(&self, index: u32) -> String {
        self.gpus
            .get(&index)
            .map_or_else(String::new, |g| crate::text::gpu_describe(g))
    }

    /// Every unordered pair of indices, with the sample's P2P status and topology.
    pub fn pair_states(&self, sample: &GpuSample) -> BTreeMap<(u32, u32), PairState> {
        let indices: Vec<u32> = self.indices.iter().copied().collect();
        let mut pairs = BTreeMap::new();
        for (i, &a) in indices.iter().enumerate() {
            for &b in indices.iter().skip(i + 1) {
                pairs.insert((a, b), PairState::default());
            }
        }
        for p in &sample.pairs {
            if p.gpu == p.peer_gpu {
                continue;
            }
            if let Some(st) = pairs.get_mut(&ordered(p.gpu, p.peer_gpu)) {
                if !st.sampled {
                    st.sampled = true;
                    st.p2p = p.p2p;
                    st.topology = p.topology;
                }
            }
        }
        pairs
    }
}

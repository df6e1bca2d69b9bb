//! Observations for the tests of the pure modules: a tmpfs, a memory cgroup, an IPC namespace,
//! NVML's GPUs and their pairs.

use crate::cgroup::CgroupVersion;
use crate::gpu::{PairStatus, PairVerdict};

use super::gpus::{
    gpus_to_avoid, visible_gpus, visible_pairs, GpuSelector, NvmlGpu, SelectorSource,
};
use super::observe::{ipc_verdict, GpuObs, IpcObs, MemObs, NvmlState, ShmObs, ShmState};

pub(super) fn nvml(n: u32) -> Vec<NvmlGpu> {
    (0..n)
        .map(|i| NvmlGpu {
            index: i,
            uuid: format!("GPU-{i:08x}-aaaa-bbbb-cccc-{i:012}"),
            name: "NVIDIA H100".into(),
        })
        .collect()
}

pub(super) fn pair(gpu: u32, peer_gpu: u32, status: PairStatus) -> PairVerdict {
    PairVerdict {
        gpu,
        peer_gpu,
        status,
        p2p: None,
        topology: None,
        links: Vec::new(),
        reasons: if status == PairStatus::Ok {
            Vec::new()
        } else {
            vec![format!("links of GPU {peer_gpu} are inactive")]
        },
    }
}

/// An 8-GPU board whose GPU 7 fails with every peer.
pub(super) fn gpu7_broken() -> Vec<PairVerdict> {
    let mut pairs = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            let status = if b == 7 {
                PairStatus::Down
            } else {
                PairStatus::Ok
            };
            pairs.push(pair(a, b, status));
        }
    }
    pairs
}

pub(super) fn mounted(size: u64, used: u64) -> ShmObs {
    ShmObs {
        path: "/dev/shm".into(),
        state: ShmState::Mounted,
        fs_type: Some("tmpfs".into()),
        size_bytes: Some(size),
        used_bytes: Some(used),
        free_bytes: Some(size - used),
        error: None,
    }
}

pub(super) fn memory(limit: Option<u64>, usage: u64) -> MemObs {
    MemObs {
        cgroup: Some("/kubepods/burstable/podX/abc".into()),
        version: Some(CgroupVersion::V1),
        visible: true,
        limit_bytes: limit,
        usage_bytes: Some(usage),
        headroom_bytes: limit.map(|l| l.saturating_sub(usage)),
        note: None,
    }
}

pub(super) fn private_ipc() -> IpcObs {
    ipc_verdict(Some(4026532300), None)
}

pub(super) fn gpus(visible: &[u32], all_pairs: &[PairVerdict], total: u32) -> GpuObs {
    let nv = nvml(total);
    let list = GpuSelector::List(visible.iter().map(|i| i.to_string()).collect());
    let (visible, unmatched) = visible_gpus(&list, SelectorSource::CudaVisibleDevices, &nv);
    let avoid = gpus_to_avoid(all_pairs);
    GpuObs {
        nvml: NvmlState::Loaded,
        explicit_lib: true,
        evidence: None,
        selected_by: SelectorSource::CudaVisibleDevices,
        pairs: visible_pairs(all_pairs, &visible),
        healthy: (0..total).filter(|g| !avoid.contains(g)).collect(),
        avoid,
        visible,
        unmatched,
    }
}

pub(super) fn no_gpus() -> GpuObs {
    GpuObs {
        nvml: NvmlState::Disabled,
        explicit_lib: false,
        evidence: None,
        selected_by: SelectorSource::Nvml,
        visible: Vec::new(),
        unmatched: Vec::new(),
        pairs: Vec::new(),
        avoid: Vec::new(),
        healthy: Vec::new(),
    }
}

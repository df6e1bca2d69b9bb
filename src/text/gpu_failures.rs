//! GPU failures in the job's own words (CUDA's, NCCL's, RCCL's): what was said, the GPUs it
//! used, what NVML knew of them then, and the fix for that kind.

use super::failures::{gpu_context, gpus_named, JobGpus};
use crate::model::FindingKind;

/// What the last scan knew of the job's GPUs beyond its pairs, for the texts that can use it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuEvidence {
    /// Whether the last scan had NVML (else nothing below is known).
    pub nvml: bool,
    /// Recent ECC XIDs (GPU, XID, what the catalogue calls it) on the GPUs looked at.
    pub ecc_xids: Vec<(u32, u64, &'static str)>,
    /// GPUs whose NVSwitch fabric state is not healthy, with what NVML says of it.
    pub fabric: Vec<(u32, String)>,
    /// GPUs whose fabric state NVML reported healthy.
    pub fabric_ok: Vec<u32>,
}

/// Whether `kind` is a GPU failure in the job's words, worded by [`gpu_failure`].
pub fn in_gpu_words(kind: FindingKind) -> bool {
    use FindingKind::*;
    matches!(
        kind,
        GpuTooManyPeers
            | GpuEccUncorrectable
            | GpuFabricNotReady
            | GpuPeerMappingFailed
            | GpuNvlinkError
            | GpuP2pFailed
            | CudaIpcInvalidDevice
            | IommuNotPassthrough
            | NvlsMulticastFailed
            | NcclRanksDead
            | GpuCollectiveTimeout
            | NcclP2pCheckFailed
    )
}

/// The message of such a failure: the job's words, its GPUs and what was known of them;
/// `pair`: the GPUs NCCL named, where it did.
pub fn gpu_failure(
    kind: FindingKind,
    (who, at, said): (&str, &str, &str),
    pair: Option<(u32, u32)>,
    job: &JobGpus<'_>,
) -> String {
    match kind {
        FindingKind::GpuTooManyPeers => gpu_too_many_peers(who, at, said, job),
        FindingKind::GpuEccUncorrectable => gpu_ecc_uncorrectable(who, at, said, job),
        FindingKind::GpuFabricNotReady => gpu_fabric_not_ready(who, at, said, job),
        FindingKind::GpuPeerMappingFailed => gpu_peer_mapping_failed(who, at, said, job),
        FindingKind::GpuNvlinkError => gpu_nvlink_error(who, at, said, job),
        FindingKind::GpuP2pFailed => gpu_p2p_failed(who, at, said, job),
        FindingKind::CudaIpcInvalidDevice => cuda_ipc_invalid_device(who, at, said, job),
        FindingKind::IommuNotPassthrough => iommu_not_passthrough(who, at, said),
        FindingKind::NvlsMulticastFailed => nvls_multicast_failed(who, at, said, job),
        FindingKind::NcclRanksDead => nccl_ranks_dead(who, at, said),
        FindingKind::GpuCollectiveTimeout => super::gpu_collective_timeout(who, at, said, job),
        _ => nccl_p2p_check_failed(who, at, said, pair, job),
    }
}

/// `gpu_too_many_peers`: CUDA 711.
pub fn gpu_too_many_peers(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let mut out = format!(
        "CUDA in {who} ran out of peer mappings at {at}: {evidence}. One GPU can map at most \
         eight peers (CUDA 711): a process enabled peer access to more GPUs than that. A \
         topology or setting, not a broken link"
    );
    out.push_str(&used(job));
    out.push_str(
        ". Fix: one process per GPU (torchrun, mpirun) or at most eight peer GPUs per \
         process (CUDA_VISIBLE_DEVICES); NCCL_P2P_DISABLE=1 runs through host memory (slower).",
    );
    out
}

/// `gpu_ecc_uncorrectable`: CUDA 214; the GPU with a recent ECC XID among the job's is named.
pub fn gpu_ecc_uncorrectable(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let known = &job.evidence;
    let mut out = format!(
        "CUDA in {who} met an uncorrectable ECC error at {at}: {evidence}. GPU memory is \
         corrupt: a bad GPU, not the job's code"
    );
    out.push_str(&used(job));
    let bad: Vec<u32> = dedup(known.ecc_xids.iter().map(|(g, _, _)| *g));
    if bad.is_empty() {
        out.push_str(if !known.nvml {
            ". Which GPU is not known (no NVML); `nvidia-smi -q -d ECC` on each tells"
        } else if job.gpus.is_empty() {
            ". Which GPU is not known (no GPU of this node reported an ECC XID lately); \
             `nvidia-smi -q -d ECC` on each tells"
        } else {
            ". None of them reported an ECC XID lately, so which one is not known; `nvidia-smi \
             -q -d ECC` on each tells"
        });
    } else {
        let xids: Vec<String> = known
            .ecc_xids
            .iter()
            .map(|(g, x, what)| format!("GPU {g}: XID {x}, {what}"))
            .collect();
        out.push_str(&format!(
            ". The bad one: {} ({})",
            gpus_named(&bad),
            xids.join("; ")
        ));
    }
    let reset = match bad.as_slice() {
        [] => "reset the GPU".to_string(),
        gpus => gpus
            .iter()
            .map(|g| format!("`nvidia-smi -r -i {g}`"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    out.push_str(&format!(
        ". Fix: drain the node, {reset} or reboot it, and replace the GPU if ECC errors come \
         back (row remapping failures, XID 64 or 95); restart the job from its checkpoint."
    ));
    out
}

/// `gpu_fabric_not_ready`: CUDA 802, and NVML's fabric state when the scan had it.
pub fn gpu_fabric_not_ready(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let known = &job.evidence;
    let mut out = format!(
        "CUDA in {who} says the system is not yet initialized at {at}: {evidence}. On NVSwitch \
         systems CUDA waits for the fabric manager to train the fabric: it is not running, \
         not the driver's version, or not done"
    );
    out.push_str(&used(job));
    out.push_str(&fabric_said(known));
    out.push_str(
        ". Fix: start nvidia-fabricmanager (the driver's version) on the node and run GPU jobs \
         once `nvidia-smi -q` shows each GPU's fabric state Completed, status Success.",
    );
    out
}

/// `gpu_peer_mapping_failed`: CUDA 205 on a peer mapping.
pub fn gpu_peer_mapping_failed(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let mut out = format!(
        "CUDA in {who} could not map GPU memory for its peer GPUs at {at}: {evidence}. NCCL's \
         ncclMemAlloc (PyTorch's NCCL memory pool, NVLS, symmetric memory) maps each buffer \
         for every GPU that may reach it; CUDA 205 means the driver could not: P2P these GPUs \
         do not really support (consumer GPUs, a VM, an IOMMU in the way) or no BAR1 space left"
    );
    out.push_str(&gpu_context(job));
    out.push_str(
        " Fix: NCCL_CUMEM_ENABLE=0 allocates without it; `shmlink probe` tells which pair \
         fails; NCCL_P2P_DISABLE=1 runs through host memory (slower).",
    );
    out
}

/// `gpu_nvlink_error`: CUDA 220, an uncorrectable NVLink error on the job's path.
pub fn gpu_nvlink_error(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let mut out = format!(
        "CUDA in {who} met an uncorrectable NVLink error at {at}: {evidence}. A link of the \
         job's GPUs (between two of them, or to an NVSwitch) failed under it: the hardware, not \
         the job's code; the error stays with the process, so later CUDA calls fail too"
    );
    out.push_str(&used(job));
    out.push_str(
        ". Fix: drain the node, read the links' error counters (`nvidia-smi nvlink -e`) and the \
         kernel's NVLink XIDs, reset the GPUs or reboot; replace the GPU or its board if the \
         errors come back; restart the job from its checkpoint.",
    );
    out
}

/// `gpu_p2p_failed`: a peer-to-peer or IPC call on the job's path failed.
pub fn gpu_p2p_failed(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let mut out = format!(
        "A GPU peer-to-peer or IPC call in {who} failed at {at}: {evidence}. Its processes could \
         not reach each other's GPU memory: processes that do not share the IPC and PID \
         namespaces or see different GPUs (CUDA IPC needs both), P2P these GPUs or the platform \
         do not support (a VM, an IOMMU or ACS in the way), or a broken pair"
    );
    out.push_str(&gpu_context(job));
    out.push_str(
        " Fix: run the processes that share GPU memory in one container, or Pods with hostIPC \
         and the same GPUs; `shmlink probe` tells whether a pair copies; NCCL_P2P_DISABLE=1 \
         runs through host memory (slower) meanwhile.",
    );
    out
}

/// `cuda_ipc_invalid_device`: CUDA 101 opening another process's memory.
pub fn cuda_ipc_invalid_device(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let mut out = format!(
        "CUDA in {who} could not open another process's GPU memory at {at}: {evidence}. The \
         memory is on a GPU this process does not see: the two processes see different GPUs \
         (their own CUDA_VISIBLE_DEVICES, or containers given different GPUs), and CUDA IPC \
         needs the device that holds the memory"
    );
    out.push_str(&used(job));
    out.push_str(
        ". Fix: give the processes that share GPU memory the same GPUs (one container, the same \
         CUDA_VISIBLE_DEVICES), or pass the tensors through host memory.",
    );
    out
}

/// `iommu_not_passthrough`: RCCL's warning.
pub fn iommu_not_passthrough(who: &str, at: &str, evidence: &str) -> String {
    format!(
        "RCCL in {who} says the node's IOMMU is not in passthrough mode at {at}: {evidence}. \
         With the IOMMU translating, P2P between AMD GPUs can hang the job or the node. Fix: \
         add iommu=pt to the node's kernel command line and reboot it (not needed where the \
         kernel's default is already passthrough, CONFIG_IOMMU_DEFAULT_PASSTHROUGH=y, nor in a \
         VM, where RCCL warns regardless)."
    )
}

/// `nvls_multicast_failed`: NCCL's NVLS setup, with NVML's fabric state.
pub fn nvls_multicast_failed(who: &str, at: &str, evidence: &str, job: &JobGpus<'_>) -> String {
    let known = &job.evidence;
    let mut out = format!(
        "NCCL in {who} could not set up NVLink SHARP (NVLS) multicast memory at {at}: \
         {evidence}. The NVSwitches make multicast groups through the fabric manager: the \
         fabric manager (restarted under running jobs, or failing), the NVSwitches, or a \
         container without /dev/nvidia-caps, not the job's code"
    );
    out.push_str(&used(job));
    out.push_str(&fabric_said(known));
    out.push_str(
        ". Fix: check nvidia-fabricmanager and the GPUs' fabric state (`nvidia-smi -q`), \
         restart it or reboot the node; NCCL_NVLS_ENABLE=0 runs jobs without NVLS meanwhile.",
    );
    out
}

/// `nccl_ranks_dead`: NCCL's RAS report of unreachable processes.
pub fn nccl_ranks_dead(who: &str, at: &str, evidence: &str) -> String {
    format!(
        "NCCL's RAS in {who} reports processes of the job dead at {at}: {evidence}. No peer \
         can reach them: their node died or lost its network, or they were killed. Fix: look \
         at the nodes the report names (their kernel log, shmlink's findings there) and \
         restart the job without them."
    )
}

/// `nccl_p2p_check_failed`: NCCL's own P2P check (NCCL_RUN_DIAGNOSTICS) at communicator
/// init; `pair`: the NVML devices NCCL named (in the process's view), when the line names them.
pub fn nccl_p2p_check_failed(
    who: &str,
    at: &str,
    evidence: &str,
    pair: Option<(u32, u32)>,
    job: &JobGpus<'_>,
) -> String {
    let which = match pair {
        Some((a, b)) => format!(
            "GPU {a} to GPU {b} (NVML's numbers in the job's own view, which in a container \
             count only its GPUs)"
        ),
        None => "some of its GPU pairs".into(),
    };
    let probe = if job.gpus.len() >= 2 {
        let gpus: Vec<String> = job.gpus.iter().map(u32::to_string).collect();
        format!("`shmlink probe --gpus {}`", gpus.join(","))
    } else {
        "`shmlink probe`".to_string()
    };
    let mut out = format!(
        "NCCL's P2P check in {who} found peer accesses failing at {at}, {which}: {evidence}. \
         A direct GPU-to-GPU path (NVLink or PCIe) that does not carry data correctly: the \
         GPUs, their link or the driver, not the job's code; NCCL goes on, and the job may hang \
         or compute on bad data"
    );
    out.push_str(&used(job));
    out.push_str(&format!(
        ". Fix: {probe} on the node names the pair; drain it and reset the GPU the probe and \
         the pair judge blame; NCCL_P2P_DISABLE=1 runs through host memory (slower) meanwhile."
    ));
    out
}

/// `; it was using GPUs 0 and 1` / `; its Pod holds GPU 3`, or that they are not known.
fn used(job: &JobGpus<'_>) -> String {
    use crate::model::GpusFrom;
    if job.gpus.is_empty() {
        return "; the GPUs it used are not known (NVML listed no process of it)".into();
    }
    let list = gpus_named(job.gpus);
    match job.from {
        Some(GpusFrom::Process) => format!("; it was using {list}"),
        Some(GpusFrom::Container) => format!("; its container was using {list}"),
        _ => format!("; its Pod holds {list}"),
    }
}

/// What NVML said of the fabric: the unhealthy GPUs, or that it agreed all was well.
fn fabric_said(known: &GpuEvidence) -> String {
    if !known.fabric.is_empty() {
        let parts: Vec<String> = known
            .fabric
            .iter()
            .map(|(g, what)| format!("GPU {g}: {what}"))
            .collect();
        return format!(". NVML agrees: {}", parts.join("; "));
    }
    if !known.fabric_ok.is_empty() {
        return format!(
            ". NVML reported the fabric state of {} healthy at the last scan",
            gpus_named(&known.fabric_ok)
        );
    }
    if known.nvml {
        ". NVML reported no fabric state for these GPUs".into()
    } else {
        ". NVML's fabric state is not known (no NVML)".into()
    }
}

fn dedup(gpus: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut out: Vec<u32> = gpus.collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpusFrom;

    fn job(gpus: &[u32]) -> JobGpus<'_> {
        with(gpus, GpuEvidence::default())
    }

    fn with(gpus: &[u32], evidence: GpuEvidence) -> JobGpus<'_> {
        JobGpus {
            gpus,
            from: Some(GpusFrom::Process),
            pairs: &[],
            culprits: &[],
            node_culprits: &[],
            evidence,
            hang: None,
        }
    }

    #[test]
    fn the_ecc_text_names_the_gpu_with_a_recent_ecc_xid_or_says_it_is_not_known() {
        let known = GpuEvidence {
            nvml: true,
            ecc_xids: vec![(5, 48, "Double Bit ECC Error")],
            ..Default::default()
        };
        let m = gpu_ecc_uncorrectable("ml/t/c", "T", "CUDA error: x", &with(&[4, 5], known));
        assert!(m.contains("it was using GPUs 4 and 5"), "{m}");
        assert!(
            m.contains("The bad one: GPU 5 (GPU 5: XID 48, Double Bit ECC Error)"),
            "{m}"
        );
        assert!(m.contains("`nvidia-smi -r -i 5`"), "{m}");
        let none = GpuEvidence {
            nvml: true,
            ..Default::default()
        };
        let m = gpu_ecc_uncorrectable("ml/t/c", "T", "x", &with(&[4, 5], none));
        assert!(m.contains("which one is not known"), "{m}");
        assert!(!m.contains("The bad one"), "{m}");
        let m = gpu_ecc_uncorrectable("ml/t/c", "T", "x", &job(&[]));
        assert!(m.contains("Which GPU is not known (no NVML)"), "{m}");
        assert!(m.contains("the GPUs it used are not known"), "{m}");
    }

    #[test]
    fn fabric_texts_say_what_nvml_said_of_the_fabric() {
        let known = GpuEvidence {
            nvml: true,
            fabric: vec![(0, "its fabric registration has not started".into())],
            ..Default::default()
        };
        let m = gpu_fabric_not_ready("c", "T", "x", &with(&[0], known));
        assert!(
            m.contains("NVML agrees: GPU 0: its fabric registration has not started"),
            "{m}"
        );
        assert!(m.contains("nvidia-fabricmanager"), "{m}");
        let ok = GpuEvidence {
            nvml: true,
            fabric_ok: vec![0, 1],
            ..Default::default()
        };
        let m = nvls_multicast_failed("c", "T", "x", &with(&[0, 1], ok));
        assert!(m.contains("fabric state of GPUs 0 and 1 healthy"), "{m}");
        assert!(m.contains("NCCL_NVLS_ENABLE=0"), "{m}");
        let m = nvls_multicast_failed("c", "T", "x", &job(&[0]));
        assert!(m.contains("not known (no NVML)"), "{m}");
    }

    #[test]
    fn each_text_carries_its_fix() {
        let j = job(&[2]);
        for (m, fix) in [
            (gpu_too_many_peers("c", "T", "x", &j), "eight peer GPUs"),
            (
                gpu_peer_mapping_failed("c", "T", "x", &j),
                "NCCL_CUMEM_ENABLE=0",
            ),
            (cuda_ipc_invalid_device("c", "T", "x", &j), "the same GPUs"),
            (gpu_nvlink_error("c", "T", "x", &j), "nvidia-smi nvlink -e"),
            (gpu_p2p_failed("c", "T", "x", &j), "shmlink probe"),
            (iommu_not_passthrough("c", "T", "x"), "iommu=pt"),
            (nccl_ranks_dead("c", "T", "x"), "restart the job"),
        ] {
            assert!(m.contains(fix) && m.contains("Fix: "), "{m}");
            assert!(m.len() < 900, "an Event note is cut at 1024 bytes: {m}");
        }
    }

    #[test]
    fn nccls_p2p_check_names_the_pair_and_the_probe() {
        let gpus = [5, 7];
        let m = nccl_p2p_check_failed(
            "ml/llama-0/trainer",
            "2026-11-24T10:00:00Z",
            "node0:24563 NCCL DIAG [INFO] p2p: write mismatch srcRank=0 srcCudaDev=0 \
             srcNvmlDev=5 dstRank=1 dstCudaDev=1 dstNvmlDev=7 path=NVL",
            Some((5, 7)),
            &job(&gpus),
        );
        println!("{m}");
        for part in [
            "NCCL's P2P check in ml/llama-0/trainer found peer accesses failing at \
             2026-11-24T10:00:00Z, GPU 5 to GPU 7 (NVML's numbers in the job's own view",
            "not the job's code; NCCL goes on, and the job may hang or compute on bad data; it was \
             using GPUs 5 and 7. Fix: `shmlink probe --gpus 5,7` on the node names the pair",
        ] {
            assert!(m.contains(part), "{part:?} not in {m}");
        }
    }
}

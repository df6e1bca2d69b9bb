//! Why a workload died: what it said, what its /dev/shm and GPUs were then, and the fix.

use super::{pair_status, SHM_FIX_KUBERNETES};
use crate::model::{PairStatus, PairThen, ShmThen};
use crate::units::{docker_size, human_bytes, k8s_quantity};

/// `shm_allocation_failed`: what the workload said, its /dev/shm then, and a concrete fix.
/// `kubernetes`: the container is a Pod's (the fix is a Pod spec), else Docker's flags.
pub fn shm_allocation_failed(
    who: &str,
    at: &str,
    evidence: &str,
    shm: Option<&ShmThen>,
    kubernetes: bool,
) -> String {
    let mut out = format!("container {who} could not allocate shared memory at {at}: {evidence}");
    let Some(s) = shm else {
        out.push_str(&format!(
            ". Its /dev/shm was not measured before it died; give it a larger one: {}",
            if kubernetes {
                format!("in Kubernetes {SHM_FIX_KUBERNETES}")
            } else {
                "docker run --shm-size (or --ipc=host)".to_string()
            }
        ));
        return out;
    };
    let size = s.size_bytes.map_or("no size limit".into(), human_bytes);
    let what = if s.host_ipc {
        "the host's /dev/shm (host IPC)"
    } else if s.runtime_default {
        "the container runtime's default 64 MiB tmpfs"
    } else {
        "its own tmpfs"
    };
    out.push_str(&format!(
        ". Its /dev/shm then: {what}, {size}, {} used, peak {} since the scan before{}.",
        s.used_bytes.map_or("?".into(), human_bytes),
        s.peak_bytes.map_or("?".into(), human_bytes),
        s.memory_limit_bytes.map_or(String::new(), |m| format!(
            ", memory limit {}",
            human_bytes(m)
        )),
    ));
    // At least double what it had, and never under 1 GiB: the failing request is not in the
    // message, and the next batch is as large as the last.
    let want = s
        .size_bytes
        .unwrap_or(0)
        .max(s.peak_bytes.unwrap_or(0))
        .saturating_mul(2)
        .max(1 << 30);
    if kubernetes {
        out.push_str(&format!(
            " Fix: mount an emptyDir with medium: Memory and sizeLimit: {} at /dev/shm, and raise \
             the container's memory limit by as much (tmpfs pages count against it).",
            k8s_quantity(want)
        ));
    } else {
        out.push_str(&format!(
            " Fix: docker run --shm-size={} (or --ipc=host); tmpfs pages count against --memory.",
            docker_size(want)
        ));
    }
    out
}

/// `gpu_job_crashed`: the kernel's word, and whether the Pod's GPU pairs point at the hardware.
pub fn gpu_job_crashed(
    who: &str,
    at: &str,
    comm: &str,
    pid: Option<i32>,
    library: &str,
    gpus: &[u32],
    pairs: &[PairThen],
) -> String {
    let pid = pid.map_or(String::new(), |p| format!(" (host PID {p})"));
    let mut out = format!("process {comm}{pid} of {who} crashed in {library} at {at}");
    out.push_str(&gpu_context(gpus, pairs));
    out
}

/// `nccl_p2p_disabled`: NCCL's GPUs are its CUDA device numbers in the process.
pub fn nccl_p2p_disabled(
    who: &str,
    at: &str,
    nccl: Option<(u32, u32)>,
    gpus: &[u32],
    pairs: &[PairThen],
) -> String {
    let between = nccl.map_or(String::new(), |(a, b)| {
        format!(" between GPUs {a} and {b} (as the container numbers them)")
    });
    let mut out = format!(
        "NCCL in {who} says P2P is disabled{between} although they are NVLink-connected, at \
         {at}: traffic falls back to slower paths or the job fails"
    );
    out.push_str(&gpu_context(gpus, pairs));
    out
}

/// ". Its GPUs: ...; pair 6-7 is degraded: the hardware, not your code (...)", or healthy.
fn gpu_context(gpus: &[u32], pairs: &[PairThen]) -> String {
    if gpus.is_empty() {
        return ". The GPUs it held are not known (no kubelet pod-resources answer).".into();
    }
    let list = gpus
        .iter()
        .map(|g| format!("GPU {g}"))
        .collect::<Vec<_>>()
        .join(", ");
    let bad: Vec<&PairThen> = pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .collect();
    if bad.is_empty() {
        let pairs = if pairs.is_empty() {
            String::new()
        } else {
            " and all its GPU pairs are healthy".to_string()
        };
        return format!(
            ". It held {list}{pairs}: look at the job itself (NCCL_DEBUG=INFO, the stack of \
             the crash)."
        );
    }
    let parts = bad
        .iter()
        .map(|p| {
            format!(
                "pair {}-{} is {}: {}",
                p.gpu,
                p.peer_gpu,
                pair_status(p.status),
                p.reasons.join("; ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!(". It held {list}; {parts}: the hardware, not your code. Drain the node and have the GPU reset or replaced.")
}

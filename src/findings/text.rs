//! Every sentence a person reads about a condition, written once. `check` prints these as
//! findings, `serve` publishes them as Event notes, `preflight` reuses the parts it shares.
//! The alert rules' annotations (deploy/prometheus) say the same in their own templates;
//! `tests` below keeps their /dev/shm fix in step with this one.

use std::time::Duration;

use crate::model::{
    ContainerRef, PairStatus, PairThen, RecoveryAction, ShmReading, ShmThen, Weight, XidAction,
    XidEntry,
};
use crate::units::{docker_size, human_bytes, k8s_quantity};

/// The Kubernetes fix for a /dev/shm too small: the alert rules' ShmNearlyFull says it too.
pub const SHM_FIX_KUBERNETES: &str =
    "an emptyDir with medium: Memory at /dev/shm with a larger sizeLimit";

/// `shm_nearly_full` / `shm_exhausted`: how full, what runs out first, and the fix.
pub fn shm_full(r: &ShmReading) -> String {
    let used = r.used_bytes.unwrap_or(0);
    let available = r.available_bytes.unwrap_or(0);
    let limit = used.saturating_add(available);
    let pct = r.fullness().unwrap_or(0.0) * 100.0;
    let memory_bound = match (r.memory_limit_bytes, r.size_bytes) {
        // The memory cgroup's headroom, not the tmpfs, is what runs out first.
        (Some(_), Some(size)) => limit < size,
        (Some(_), None) => true,
        _ => false,
    };
    let container = ContainerRef::of(r);
    let mut message = format!(
        "/dev/shm of container {} is {pct:.0}% full: {} used, {} more can be written",
        container.short_name(),
        human_bytes(used),
        human_bytes(available),
    );
    if let Some(size) = r.size_bytes {
        message.push_str(&format!(" (tmpfs size {}", human_bytes(size)));
        if let Some(mem) = r.memory_limit_bytes {
            message.push_str(&format!(", memory limit {}", human_bytes(mem)));
        }
        message.push(')');
    }
    message.push_str(". ");
    if memory_bound {
        message.push_str(
            "The memory limit, not the tmpfs size, is what runs out: tmpfs pages count against \
             the container's memory limit, so raise the memory limit along with /dev/shm.",
        );
    } else {
        message.push_str(&format!(
            "Give it a larger /dev/shm: in Kubernetes {SHM_FIX_KUBERNETES}; in Docker \
             --shm-size (or --ipc=host). tmpfs pages count against the memory limit, so leave room for them \
             there too."
        ));
    }
    message
}

/// `shm_runtime_default`: a GPU workload on the runtime's 64 MiB, and the YAML that fixes it.
/// `shm_unmeasured`: the agent could not look, which is not the same as nothing being there.
pub fn shm_unmeasured(r: &ShmReading, error: &str) -> String {
    let container = ContainerRef::of(r);
    format!(
        "The /dev/shm of container {} could not be measured ({error}); its size and use are          unknown, not absent. Check the agent's privileges (SYS_PTRACE, DAC_READ_SEARCH) and          its log.",
        container.short_name()
    )
}

pub fn shm_runtime_default(r: &ShmReading) -> String {
    let container = ContainerRef::of(r);
    format!(
        "Container {} requests GPUs but runs on the container runtime's default 64 MiB \
         /dev/shm: PyTorch DataLoader workers and NCCL fail with bus errors once it fills. Add to \
         the pod spec:\n\
         volumes:\n- name: dshm\n  emptyDir:\n    medium: Memory\n    sizeLimit: 8Gi\n\
         and to the container:\n\
         volumeMounts:\n- name: dshm\n  mountPath: /dev/shm\n\
         (tmpfs pages count against the memory limit: raise it by the sizeLimit).",
        container.short_name()
    )
}

/// `gpu_xid`; `entry`: what the catalogue says of it.
pub fn xid(gpu: u32, xid: u64, count: u64, entry: Option<XidEntry>) -> String {
    let said = match entry {
        Some(e) => format!(
            "{}; NVIDIA's XID catalogue: {}",
            e.what,
            xid_advice(e.action)
        ),
        None => "not in NVIDIA's XID catalogue".to_string(),
    };
    format!("XID {xid} on GPU {gpu} ({count} since the agent started): {said}.")
}

/// What an XID's catalogue action asks of a person.
pub const fn xid_advice(action: XidAction) -> &'static str {
    match action {
        XidAction::Ignore => "no action needed",
        XidAction::RestartApp => "restart the application that hit it",
        XidAction::UpdateSoftware => "update the driver or firmware",
        XidAction::ResetGpu => "drain the node and reset the GPU (or reboot the node)",
        XidAction::RebootNode => "drain and reboot the node",
        XidAction::ContactVendor => "drain the node and contact the hardware vendor",
    }
}

/// One fatal XID in `GpuFault`'s message: `times` seen within `hold` (a repeat escalates, as
/// a fault that comes back after its action calls for the vendor).
pub fn fault_xid(gpu: u32, xid: u64, entry: Option<XidEntry>, times: usize, hold: &str) -> String {
    let (what, advice) = entry.map_or(("unknown", "drain the node"), |e| {
        (e.what, xid_advice(e.action))
    });
    if times > 1 {
        format!(
            "XID {xid} ({what}) seen {times} times on GPU {gpu} within {hold}: it came back, so \
             {advice}, and if it returns after that, replace the GPU or contact the vendor"
        )
    } else {
        format!("XID {xid} ({what}) on GPU {gpu}: {advice}")
    }
}

/// A GPU the driver lists that NVML does not see, by its PCI bus id.
pub fn gpu_not_in_nvml(bus_ids: &[String], driver: usize, nvml: usize) -> String {
    format!(
        "The driver lists {driver} NVIDIA GPUs but NVML sees {nvml}: {} {} missing (fallen off \
         the bus, or failed to initialise). Drain the node, check `dmesg` for Xid 79, then reset \
         or reboot; replace the GPU if it stays missing.",
        bus_ids.join(", "),
        if bus_ids.len() == 1 { "is" } else { "are" }
    )
}

/// The part `check` and `preflight` share when the driver shows GPUs and NVML does not load.
pub fn nvml_not_loading(evidence: &str, reason: &str) -> String {
    format!("{evidence} but NVML does not load ({reason})")
}

/// `nvml_unavailable`.
pub fn nvml_unavailable(evidence: &str, reason: &str) -> String {
    format!(
        "{}: GPU link health is unknown. Make the driver's libnvidia-ml.so.1 visible to shmlink \
         (the NVIDIA container runtime, or --nvml-lib).",
        nvml_not_loading(evidence, reason)
    )
}

/// The note of `GpuLinkRecovered`: `about` is what the failure was about (`GPU 7`).
pub fn gpu_links_recovered(about: &str) -> String {
    format!("{about}: GPU links healthy again")
}

/// `gpu_lost`. `describe`: ` (GPU-…, name, PCI …)`; `down`: the GPUs it no longer reaches.
pub fn gpu_lost(g: u32, describe: &str, down: &[u32]) -> String {
    format!(
        "GPU {g}{describe} is lost: NVML reports it fell off the bus, so every job using it \
         fails{}. Drain the node, check `dmesg` for Xid 79, then reset the GPU \
         (`nvidia-smi -r -i {g}`) or reboot; replace it if it falls off again.",
        if down.is_empty() {
            String::new()
        } else {
            format!(" and its {} are down", pairs_with(down))
        },
    )
}

/// The broken-GPU case: GPU `g` fails with every other GPU.
pub fn gpu_fails_with_all(
    g: u32,
    describe: &str,
    peers: &[u32],
    state: &str,
    reasons: &str,
) -> String {
    format!(
        "GPU {g}{describe} fails with every other GPU: all {} of its pairs ({}) are {state}, so \
         any job that uses GPU {g} together with another GPU can crash or hang in collectives \
         such as all-reduce. Reasons: {reasons}. Drain the node (or keep jobs off GPU {g}) and \
         reset or replace GPU {g}; confirm with `nvidia-smi nvlink -s -i {g}`, `nvidia-smi \
         nvlink -e -i {g}` and `nvidia-smi topo -p2p rw`.",
        peers.len(),
        pairs_with(peers),
    )
}

/// Every pair of every live GPU fails: a node-wide cause.
pub fn all_pairs_fail(pairs: usize, gpus: usize, state: &str, reasons: &str) -> String {
    format!(
        "Every one of the {pairs} pairs of the {gpus} GPUs is {state}, which points at the node \
         rather than one GPU. Reasons: {reasons}. Drain the node; on an NVSwitch system check the \
         fabric manager (`systemctl status nvidia-fabricmanager`), and check `nvidia-smi nvlink \
         -s` and `nvidia-smi topo -p2p rw`."
    )
}

/// One failing pair, with what to do for how badly it fails.
pub fn pair_fails(
    a: u32,
    b: u32,
    status: PairStatus,
    weight: Option<Weight>,
    reasons: &[String],
) -> String {
    let advice = match weight {
        Some(Weight::Down) => {
            "Jobs using these two GPUs together crash or hang at their first collective: drain \
             the node, check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p rw`, then reseat \
             or replace the GPU or its NVLink bridge."
        }
        Some(Weight::Broken) => {
            "Peer-to-peer transfers between them fail or fall back: drain the node, check \
             `nvidia-smi topo -p2p rw` and `nvidia-smi nvlink -s`, then reset or replace the GPU."
        }
        _ => {
            "The link still carries traffic but retries transfers, so jobs slow down: watch \
             `nvidia-smi nvlink -e`, and drain the node to reseat or replace the GPU if the \
             counters keep growing."
        }
    };
    format!(
        "GPU {a} <-> GPU {b} is {}: {}. {advice}",
        pair_status(status),
        reasons.join("; ")
    )
}

/// `gpu_recovery_action`: what NVML says GPU `g` needs, and what to do.
pub fn gpu_recovery_action(g: u32, describe: &str, action: RecoveryAction) -> String {
    let what = match action {
        RecoveryAction::None => return format!("NVML asks for no recovery action on GPU {g}."),
        RecoveryAction::DrainP2p => {
            "to drain peer-to-peer traffic: its P2P transfers are not safe. Drain the node of multi-GPU jobs; NVML clears the action once the GPU has recovered, else reset it"
        }
        RecoveryAction::GpuReset => {
            "a GPU reset: drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"
        }
        RecoveryAction::DrainAndReset => {
            "to drain peer-to-peer traffic and reset the GPU: drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"
        }
        RecoveryAction::NodeReboot => "a node reboot: drain the node, then reboot it",
    };
    format!(
        "NVML's recovery action for GPU {g}{describe} is {} ({}); jobs on it fail until that is done.",
        action.as_str(),
        what.replace("{g}", &g.to_string()),
    )
}

/// A `GpuFault` sentence for NVML's recovery action on GPU `g` at PCI `bus`.
pub fn fault_recovery_action(g: u32, bus: &str, action: RecoveryAction) -> String {
    let todo = match action {
        RecoveryAction::NodeReboot => "drain the node, then reboot it".to_string(),
        _ => format!("drain the node, then reset the GPU (`nvidia-smi -r -i {g}`)"),
    };
    format!(
        "NVML's recovery action for GPU {g} ({bus}) is {}: {todo}",
        action.as_str()
    )
}

/// `gpu_fabric_unhealthy`: GPU `g`'s NVSwitch fabric registration or health. `problem` is
/// [`crate::model::FabricInfo::problem`].
pub fn gpu_fabric_unhealthy(g: u32, describe: &str, problem: &str, nvswitch: bool) -> String {
    format!(
        "GPU {g}{describe}: {problem}{}. Check the fabric manager (`systemctl status nvidia-fabricmanager`, `nvidia-smi -q -i {g} | grep -A4 Fabric`), then reset the GPU or reboot the node if it does not register.",
        if nvswitch {
            ", so its NVLink traffic through the NVSwitches fails or runs slow"
        } else {
            ""
        }
    )
}

/// `gpu_link_errors`: counter growth on GPU `g` that made no pair fail yet.
pub fn link_errors(g: u32, describe: &str, window: Duration, parts: &[String]) -> String {
    format!(
        "NVLink errors on GPU {g}{describe} in the last {} s: {}. No GPU pair fails because of \
         them yet, but a link that keeps counting errors is marginal: watch \
         `nvidia-smi nvlink -e -i {g}` and reseat or replace the GPU or its NVLink \
         bridge if they keep growing.",
        secs(window),
        parts.join("; "),
    )
}

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

/// `down` / `degraded`: a failing pair's state as a person says it.
pub fn pair_status(status: PairStatus) -> &'static str {
    match status {
        PairStatus::Down => "down",
        PairStatus::Degraded => "degraded",
        PairStatus::Ok => "ok",
    }
}

/// `pairs with GPUs 0-6` / `pair with GPU 3`.
pub fn pairs_with(peers: &[u32]) -> String {
    match peers {
        [one] => format!("pair with GPU {one}"),
        _ => format!("pairs with GPUs {}", ranges(peers)),
    }
}

/// `link 3` / `links 0, 2, 5-17`.
pub fn link_list(links: &[u32]) -> String {
    let mut sorted = links.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    match sorted.as_slice() {
        [one] => format!("link {one}"),
        _ => format!("links {}", ranges(&sorted)),
    }
}

/// Sorted, deduplicated numbers with runs of three or more as `a-b`.
pub fn ranges(numbers: &[u32]) -> String {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while let Some(&next) = iter.peek() {
            if end.checked_add(1) == Some(next) {
                end = next;
                iter.next();
            } else {
                break;
            }
        }
        match end - start {
            0 => parts.push(start.to_string()),
            1 => parts.push(format!("{start}, {end}")),
            _ => parts.push(format!("{start}-{end}")),
        }
    }
    parts.join(", ")
}

/// `250`, `1`, `0.4`: a rate per second, whole above 10.
pub fn rate(per_sec: f64) -> String {
    if per_sec >= 10.0 || per_sec.fract() == 0.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.1}")
    }
}

/// `60`, `0.5`: a duration in seconds as a person writes it.
pub fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_format_as_a_person_writes() {
        assert_eq!(link_list(&[3]), "link 3");
        assert_eq!(link_list(&[5, 0, 1, 2, 7, 8, 2]), "links 0-2, 5, 7, 8");
        assert_eq!(
            ranges(&[u32::MAX - 1, u32::MAX]),
            format!("{}, {}", u32::MAX - 1, u32::MAX)
        );
        assert_eq!(ranges(&[]), "");
        assert_eq!(secs(Duration::from_secs(60)), "60");
        assert_eq!(rate(250.4), "250");
        assert_eq!(rate(1.0), "1");
        assert_eq!(rate(0.4), "0.4");
        assert_eq!(secs(Duration::from_millis(500)), "0.5");
        assert_eq!(pairs_with(&[3]), "pair with GPU 3");
    }

    /// The alert that pages for a full /dev/shm gives the fix in the same words as `check`.
    #[test]
    fn the_alert_rules_give_the_same_shm_fix() {
        let rules = include_str!("../../deploy/prometheus/shmlink.rules.yml");
        assert!(
            rules.contains(SHM_FIX_KUBERNETES),
            "deploy/prometheus/shmlink.rules.yml no longer says {SHM_FIX_KUBERNETES:?}"
        );
    }
}

//! A container's /dev/shm: how full, what runs out first, and the fix.

use crate::model::{printable, ContainerRef, Leftovers, ShmReading};
use crate::units::human_bytes;

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

/// `shm_unmeasured`: the agent could not look, which is not the same as nothing being there.
pub fn shm_unmeasured(r: &ShmReading, error: &str) -> String {
    let container = ContainerRef::of(r);
    format!(
        "The /dev/shm of container {} could not be measured ({error}); its size and use are \
         unknown, not absent. Check the agent's privileges (SYS_PTRACE, DAC_READ_SEARCH) and \
         its log.",
        container.short_name()
    )
}

/// `shm_runtime_default`: a GPU workload on the runtime's 64 MiB, and what fixes it: the Pod's
/// YAML, or docker run's options for a plain Docker container.
pub fn shm_runtime_default(r: &ShmReading) -> String {
    let container = ContainerRef::of(r);
    // No Pod: a plain Docker container, whose record said it was given GPUs.
    if r.pod_uid.is_none() {
        return format!(
            "Container {} was given GPUs but runs on Docker's default 64 MiB /dev/shm: PyTorch \
             DataLoader workers and NCCL fail with bus errors once it fills. Run it with a larger \
             one: docker run --shm-size=8g ... (with docker compose: shm_size), or --ipc=host to \
             use the host's /dev/shm (tmpfs pages count against --memory: leave room for them \
             there).",
            container.short_name()
        );
    }
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

/// `shm_leftover_segments`: what a container found in its /dev/shm when it started.
pub fn shm_leftovers(r: &ShmReading, l: &Leftovers) -> String {
    let container = ContainerRef::of(r);
    let named = l
        .largest
        .iter()
        // A file name is the container's to choose: no raw escape or newline reaches a
        // terminal or an Event note.
        .map(|(name, bytes)| format!("{} {}", printable(name), human_bytes(*bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let more = if l.count > l.largest.len() as u64 || l.truncated {
        ", ..."
    } else {
        ""
    };
    format!(
        "Container {}: its /dev/shm held {}{} file{} written before it started, {} in all, which \
         count against its memory limit: {named}{more}. A crashed run's segments (NCCL's nccl-*, \
         PSM's psm_*, PyTorch's torch_*) survive a restart in a Pod's memory emptyDir, or come \
         from another container sharing it, and a restarted job can fail on them again. Fix: \
         remove them as the container starts (rm -f /dev/shm/nccl-* /dev/shm/psm_* \
         /dev/shm/torch_* before the program runs), or give each container its own /dev/shm.",
        container.short_name(),
        if l.truncated { "at least " } else { "" },
        l.count,
        if l.count == 1 { "" } else { "s" },
        human_bytes(l.bytes),
    )
}

/// `shm_evicted`: kubelet evicted the Pod because its /dev/shm volume outgrew the volume's own
/// `sizeLimit` (`volume` and `limit` as kubelet's message names them, when it could be read).
pub fn shm_evicted(
    who: &str,
    at: &str,
    volume: Option<(&str, &str)>,
    shm: Option<&crate::model::ShmThen>,
) -> String {
    let (name, limit) = volume.unwrap_or(("?", "?"));
    let mut out = format!(
        "kubelet evicted the Pod of container {who} at {at}: its /dev/shm volume \"{name}\" held \
         more than the volume's sizeLimit {limit}, and every container of the Pod was killed"
    );
    let peak = shm.and_then(|s| s.peak_bytes.or(s.used_bytes));
    if let Some(p) = peak {
        out.push_str(&format!(
            " (/dev/shm at the last scan: {} used)",
            human_bytes(p)
        ));
    }
    let want = crate::units::parse_size("sizeLimit", limit)
        .ok()
        .map(|l| l.max(peak.unwrap_or(0)).saturating_mul(2));
    out.push_str(&format!(
        ". Fix: raise sizeLimit of \"{name}\"{} and the memory limit of the containers that \
         mount it by as much (tmpfs pages count against it); or find what fills /dev/shm: files \
         a crashed run left there stay until the Pod is deleted.",
        want.map_or(String::new(), |w| format!(
            " to {}",
            crate::units::k8s_quantity(w)
        ))
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{in_pod, shm_reading, MIB};

    /// Names a container chose for its /dev/shm files: ESC, BEL, a C1 CSI and a newline that
    /// would put its own line under the finding's.
    #[test]
    fn leftover_names_carry_no_control_character() {
        let r = in_pod(shm_reading("c", 64 * MIB, 8 * MIB), "ml", "p", "u", "main");
        let l = Leftovers {
            count: 3,
            bytes: 3 * MIB,
            largest: vec![
                ("nccl-\u{1b}[2J\u{1b}[H".into(), MIB),
                ("x\u{7}\u{9b}31m".into(), MIB),
                ("y\nCRITICAL all GPUs lost".into(), MIB),
            ],
            truncated: false,
        };
        let text = shm_leftovers(&r, &l);
        assert!(!text.chars().any(char::is_control), "{text}");
        assert!(
            text.contains(
                "nccl-\\x1b[2J\\x1b[H 1.0 MiB, x\\x07\\x9b31m 1.0 MiB, \
                           y\\x0aCRITICAL all GPUs lost"
            ),
            "{text}"
        );
    }
}

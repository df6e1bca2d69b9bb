//! Pure: the exact change for where the container runs: a Pod spec's emptyDir and memory
//! limit, docker's flags, or the GPUs to avoid.

use super::need::{Need, DEFAULT_GPU_SHM_BYTES};
use super::observe::{GpuObs, IpcObs, MemObs, RunsIn, ShmObs};
use super::problem::{Problem, ProblemKind};
use crate::model::EventReason;
use crate::units::{docker_size, k8s_quantity, MIB};

/// The /dev/shm size to ask for: the need, rounded up to whole MiB.
fn target_size(need: Option<&Need>) -> u64 {
    need.map_or(DEFAULT_GPU_SHM_BYTES, |n| n.bytes)
        .div_ceil(MIB)
        .max(1)
        * MIB
}

#[allow(clippy::too_many_arguments)]
pub(super) fn fix_text(
    runs_in: RunsIn,
    shm: &ShmObs,
    memory: &MemObs,
    ipc: &IpcObs,
    gpus: &GpuObs,
    need: Option<&Need>,
    shm_short: bool,
    mem_short: bool,
    problems: &[Problem],
) -> Option<String> {
    let mut out = String::new();
    if shm_short || mem_short {
        let growth = Growth::new(need, memory, shm_short, mem_short);
        if ipc.host == Some(true) && shm_short {
            out.push_str(&host_ipc_note(shm, growth.size));
        }
        match runs_in {
            RunsIn::Kubernetes => out.push_str(&pod_spec(&growth)),
            RunsIn::Docker => out.push_str(&docker_flags(&growth)),
        }
    }
    if problems.iter().any(|p| p.kind == ProblemKind::GpuPair) {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&avoid_gpus(runs_in, gpus));
    }
    (!out.is_empty()).then_some(out)
}

/// What the fix grows: /dev/shm to `size` when it is short, and the memory limit when it matters.
struct Growth {
    size: u64,
    shm_short: bool,
    /// The memory limit seen today.
    limit: Option<u64>,
    /// The memory limit that leaves room: today's limit plus the /dev/shm the workload will fill
    /// (tmpfs pages are charged to it on top of the workload's own memory).
    memory_to: Option<u64>,
    memory_matters: bool,
}

impl Growth {
    fn new(need: Option<&Need>, memory: &MemObs, shm_short: bool, mem_short: bool) -> Growth {
        let size = target_size(need);
        Growth {
            size,
            shm_short,
            limit: memory.limit_bytes,
            memory_to: memory.limit_bytes.map(|l| l.saturating_add(size)),
            memory_matters: mem_short || (shm_short && memory.limit_bytes.is_some()),
        }
    }
}

/// The host's /dev/shm is the one to grow, or to stop sharing.
fn host_ipc_note(shm: &ShmObs, size: u64) -> String {
    format!(
        "This container shares the host's IPC namespace and so the host's /dev/shm: grow \
         that one on the node (mount -o remount,size={} /dev/shm), or stop sharing it and \
         give the container its own as below.\n",
        docker_size(shm.used_bytes.unwrap_or(0).saturating_add(size))
    )
}

/// The Pod spec's emptyDir at /dev/shm and the container's memory limit.
fn pod_spec(g: &Growth) -> String {
    let mut out = String::from(
        "In the Pod spec, mount a memory-backed emptyDir at /dev/shm sized for the need, \
         and give the container a memory limit with room for it:\n\n",
    );
    out.push_str("spec:\n");
    if g.shm_short {
        out.push_str(&format!(
            "  volumes:\n    - name: dshm\n      emptyDir:\n        medium: Memory\n        \
             sizeLimit: {}\n",
            k8s_quantity(g.size)
        ));
    }
    out.push_str("  containers:\n    - name: <this container>\n");
    if g.shm_short {
        out.push_str("      volumeMounts:\n        - name: dshm\n          mountPath: /dev/shm\n");
    }
    if g.memory_matters {
        if let (Some(limit), Some(to)) = (g.limit, g.memory_to) {
            out.push_str(&format!(
                "      resources:\n        limits:\n          memory: {}   # today {}, plus the {} of /dev/shm it must hold\n",
                k8s_quantity(to),
                k8s_quantity(limit),
                k8s_quantity(g.size)
            ));
        }
    } else if g.shm_short && g.limit.is_none() {
        out.push_str(&format!(
            "      # no memory limit seen; if you set one, add {} to it: tmpfs pages count against it\n",
            k8s_quantity(g.size)
        ));
    }
    if g.shm_short {
        out.push_str(
            "\n(An initContainer sees the emptyDir too: give it the same memory limit \
             as the container it checks for.)\n",
        );
    }
    out
}

/// docker run's --shm-size and --memory.
fn docker_flags(g: &Growth) -> String {
    let mut args = Vec::new();
    if g.shm_short {
        args.push(format!("--shm-size={}", docker_size(g.size)));
    }
    if g.memory_matters {
        if let Some(to) = g.memory_to {
            args.push(format!("--memory={}", docker_size(to)));
        }
    }
    let mut out = format!("docker run {} ...\n", args.join(" "));
    if g.shm_short {
        out.push_str("(or --ipc=host to use the host's /dev/shm; with docker compose: shm_size)\n");
    }
    if g.memory_matters && g.memory_to.is_some() {
        out.push_str(&format!(
            "tmpfs pages count against --memory: the limit needs room for the {} of /dev/shm on top of the workload's own memory\n",
            docker_size(g.size)
        ));
    }
    out
}

/// The GPUs whose pairs fail: where the Pod must go, or which GPUs to run on instead.
fn avoid_gpus(runs_in: RunsIn, gpus: &GpuObs) -> String {
    let avoid = gpus
        .avoid
        .iter()
        .map(|g| format!("GPU {g}"))
        .collect::<Vec<_>>()
        .join(", ");
    match runs_in {
        RunsIn::Kubernetes => format!(
            "Avoid {avoid}: the device plugin gave this Pod a GPU whose links fail. Cordon the \
             node (kubectl cordon <node>) and delete the Pod so it is scheduled elsewhere; \
             have the GPU reset or replaced before uncordoning (shmlink serve on the node \
             reports it as {}/{}).\n",
            EventReason::GpuLinkDegraded,
            EventReason::GpuLinkDown
        ),
        RunsIn::Docker => {
            let n = gpus.visible.len().max(1);
            let choice: Vec<String> = gpus.healthy.iter().take(n).map(|g| g.to_string()).collect();
            if choice.len() == n {
                let c = choice.join(",");
                format!(
                    "Avoid {avoid}: run on GPUs whose pairs are healthy, e.g. docker run --gpus '\"device={c}\"' ... \
                     (or CUDA_VISIBLE_DEVICES={c}).\n"
                )
            } else {
                format!(
                    "Avoid {avoid}: too few healthy GPUs are left on this machine for this job; have the GPU reset or replaced.\n"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::preflight::{memory, mounted, no_gpus, private_ipc};
    use crate::preflight::need::NeedSpec;
    use crate::preflight::render::render_text;
    use crate::preflight::verdict::{judge, Verdict};
    use crate::units::{GIB, MIB};

    #[test]
    fn the_runtime_default_fails_a_1gi_need_with_the_docker_fix() {
        let r = judge(
            RunsIn::Docker,
            mounted(64 * MIB, 0),
            memory(None, 10 * MIB),
            private_ipc(),
            no_gpus(),
            NeedSpec::MinShm(GIB),
        );
        assert_eq!((r.verdict, r.exit_code), (Verdict::NotFit, 1));
        assert_eq!(r.available_bytes, Some(64 * MIB));
        assert!(r
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::ShmTooSmall));
        let fix = r.fix.as_deref().unwrap();
        assert!(fix.contains("docker run --shm-size=1g ..."), "{fix}");
        assert!(fix.contains("--ipc=host"), "{fix}");
        assert!(
            !fix.contains("--memory"),
            "no memory limit, none to raise: {fix}"
        );
    }

    #[test]
    fn kubernetes_gets_an_emptydir_with_the_sizelimit_and_a_memory_limit_with_room() {
        let r = judge(
            RunsIn::Kubernetes,
            mounted(64 * MIB, 0),
            memory(Some(16 * GIB), GIB),
            private_ipc(),
            no_gpus(),
            NeedSpec::Sizing {
                workers: 6,
                prefetch_factor: 2,
                batch_bytes: 128 * MIB,
            },
        );
        assert_eq!(r.verdict, Verdict::NotFit);
        let fix = r.fix.as_deref().unwrap();
        for want in [
            "medium: Memory",
            "sizeLimit: 1536Mi",
            "mountPath: /dev/shm",
            "memory: 17920Mi",
        ] {
            assert!(fix.contains(want), "{want}: {fix}");
        }
        let text = render_text(&r);
        assert!(
            text.starts_with("shmlink preflight: NOT FIT (runs in Kubernetes)"),
            "{text}"
        );
        assert!(text.contains("Fix (Kubernetes):"), "{text}");
    }
}

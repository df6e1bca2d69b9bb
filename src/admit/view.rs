//! Pure: what `shmlink preflight` would report inside a container of this Pod, built from the
//! spec instead of measured. The webhook's decision is this judgement, so a Pod it lets through
//! unchanged is one preflight would pass, and a Pod it patches is one preflight then passes.

use clap::Parser as _;
use serde_json::Value;

use super::pod::{self, Container};
use crate::cgroup::CgroupVersion;
use crate::cli::{Cli, Command};
use crate::preflight::gpus::{SelectorSource, VisibleGpu};
use crate::preflight::need::{spec_of, NeedSpec};
use crate::preflight::observe::{ipc_verdict, GpuObs, MemObs, NvmlState, RunsIn, ShmObs, ShmState};
use crate::preflight::verdict::{judge, ProblemKind, Report};
use crate::units::{parse_quantity_bytes, MIB};

/// What a container runtime mounts at /dev/shm when nothing else is (containerd, CRI-O, Docker).
pub const RUNTIME_SHM_BYTES: u64 = 64 * MIB;

/// What the whole Pod says, reckoned once per decision (a Pod may have thousands of
/// containers): its stated need and its largest GPU count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodNeed {
    pub spec: NeedSpec,
    pub gpus: u64,
}

impl PodNeed {
    pub fn of(pod: &Value) -> PodNeed {
        PodNeed {
            spec: need_spec(pod),
            gpus: pod_gpus(pod),
        }
    }
}

/// Preflight's report for `container` of `pod` at its start: /dev/shm as the spec makes it (the
/// runtime's 64Mi tmpfs, or the memory emptyDir's sizeLimit), the memory limit (the container's
/// and the Pod-level one, the tighter), its GPUs (a container without any checks for the Pod's
/// GPU containers: their count), and the Pod's stated need ([`need_spec`]).
pub fn preflight_view(pod: &Value, container: &Value) -> Report {
    judged(pod, container, &PodNeed::of(pod))
}

fn judged(pod: &Value, container: &Value, need: &PodNeed) -> Report {
    let own = pod::gpus(container);
    let gpus = if own > 0 { own } else { need.gpus };
    judge(
        RunsIn::Kubernetes,
        shm_obs(pod, container),
        memory_obs(pod, container),
        ipc_verdict(None, None),
        gpu_obs(gpus),
        need.spec,
    )
}

/// What the Pod says it needs, as preflight's need: the size annotation (when `pod::read_size`
/// takes it) as `--min-shm`, else
/// the options of a `shmlink preflight` one of its containers runs, read by preflight's own
/// command line (so the webhook sizes /dev/shm for exactly what that preflight will ask), else
/// nothing said (the GPU default).
pub fn need_spec(pod: &Value) -> NeedSpec {
    if let Some(pod::SizeAnnotation::Taken { bytes, .. }) = pod::shm_size(pod) {
        return NeedSpec::MinShm(bytes);
    }
    preflight_need_spec(pod)
}

/// What a `shmlink preflight` one of the Pod's containers runs asks for (its options, else its
/// `SHMLINK_MIN_SHM`), whatever the annotation says.
pub fn preflight_need_spec(pod: &Value) -> NeedSpec {
    pod::containers(pod)
        .iter()
        .filter_map(|c| pod::preflight_options(c.value))
        .find_map(|options| preflight_spec(&options))
        .unwrap_or(NeedSpec::Unspecified)
}

/// Preflight's need from its options; `None` when they do not parse (preflight would exit 2).
fn preflight_spec(options: &[String]) -> Option<NeedSpec> {
    let words = ["shmlink", "preflight"]
        .into_iter()
        .map(str::to_string)
        .chain(options.iter().cloned());
    let Ok(Cli {
        command: Command::Preflight(args),
    }) = Cli::try_parse_from(words)
    else {
        return None;
    };
    let spec = spec_of(
        args.min_shm.as_deref(),
        args.dataloader_workers,
        args.batch_bytes.as_deref(),
        args.prefetch_factor,
    )
    .ok()?;
    (spec != NeedSpec::Unspecified).then_some(spec)
}

/// The same, for one container of [`pod::containers`].
pub fn view_of(pod: &Value, c: &Container<'_>, need: &PodNeed) -> Report {
    judged(pod, c.value, need)
}

/// The largest GPU count of any container of the Pod.
pub fn pod_gpus(pod: &Value) -> u64 {
    pod::containers(pod)
        .iter()
        .map(|c| pod::gpus(c.value))
        .max()
        .unwrap_or(0)
}

/// Whether preflight finds /dev/shm or the memory behind it short: the tmpfs too small (or
/// absent) for the need, or the memory limit leaving too little room for it.
pub fn is_short(report: &Report) -> bool {
    report
        .problems
        .iter()
        .any(|p| short_shm(p.kind) || p.kind == ProblemKind::MemoryTooSmall)
}

/// Whether the tmpfs itself is what falls short.
pub fn shm_short(report: &Report) -> bool {
    report.problems.iter().any(|p| short_shm(p.kind))
}

fn short_shm(kind: ProblemKind) -> bool {
    matches!(
        kind,
        ProblemKind::ShmAbsent | ProblemKind::ShmTooSmall | ProblemKind::ShmSmallForGpus
    )
}

fn shm_obs(pod: &Value, container: &Value) -> ShmObs {
    let tmpfs = |size: Option<u64>| ShmObs {
        path: pod::SHM_PATH.to_string(),
        state: ShmState::Mounted,
        fs_type: Some("tmpfs".to_string()),
        size_bytes: size,
        used_bytes: size.map(|_| 0),
        free_bytes: size,
        error: None,
    };
    let Some(mount) = pod::shm_mount(container) else {
        return tmpfs(Some(RUNTIME_SHM_BYTES));
    };
    let volume = mount
        .get("name")
        .and_then(Value::as_str)
        .and_then(|name| pod::volume(pod, name));
    match volume.and_then(pod::memory_empty_dir_limit) {
        // The kubelet sizes a memory emptyDir's tmpfs by its sizeLimit; without one the node's
        // memory and the cgroup's limit bound it.
        Some(limit) => tmpfs(limit.and_then(|s| parse_quantity_bytes(s).ok())),
        // Anything else (a disk emptyDir, a hostPath, all of /dev): the user chose it; nothing
        // the spec tells can be judged.
        None => ShmObs {
            fs_type: None,
            ..tmpfs(None)
        },
    }
}

fn memory_obs(pod: &Value, container: &Value) -> MemObs {
    let limit = |r: Option<&Value>| {
        pod::memory_text(r, "limits").and_then(|s| parse_quantity_bytes(s).ok())
    };
    let own = limit(container.get("resources"));
    let pod_level = limit(pod::pod_resources(pod));
    let limit = match (own, pod_level) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    MemObs {
        cgroup: None,
        version: Some(CgroupVersion::V2),
        visible: true,
        limit_bytes: limit,
        usage_bytes: Some(0),
        headroom_bytes: limit,
        note: None,
    }
}

fn gpu_obs(count: u64) -> GpuObs {
    let visible = (0..count.min(1024) as u32)
        .map(|i| VisibleGpu {
            index: i,
            uuid: format!("GPU-spec-{i}"),
            name: "GPU".to_string(),
            cuda_ordinal: i,
        })
        .collect();
    GpuObs {
        nvml: NvmlState::Loaded,
        visible,
        ..GpuObs::unchecked(SelectorSource::Nvml, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::verdict::Verdict;
    use crate::units::GIB;
    use serde_json::json;

    fn gpu_pod(volumes: Value, mounts: Value, limit: &str) -> Value {
        json!({"spec": {"volumes": volumes, "containers": [{"name": "t",
            "volumeMounts": mounts,
            "resources": {"limits": {"nvidia.com/gpu": "8", "memory": limit}}}]}})
    }

    #[test]
    fn the_runtime_default_is_short_for_a_gpu_container() {
        let p = gpu_pod(json!([]), json!([]), "32Gi");
        let r = preflight_view(&p, &p["spec"]["containers"][0]);
        assert_eq!(r.shm.size_bytes, Some(64 * MIB));
        assert_eq!(r.need.as_ref().map(|n| n.bytes), Some(GIB));
        assert!(is_short(&r) && shm_short(&r));
        assert_eq!(r.verdict, Verdict::Fit, "the GPU default only warns");
    }

    #[test]
    fn a_memory_empty_dir_of_the_size_with_room_is_fit() {
        let v = json!([{"name": "d", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]);
        let m = json!([{"name": "d", "mountPath": "/dev/shm"}]);
        let p = gpu_pod(v.clone(), m.clone(), "33Gi");
        let r = preflight_view(&p, &p["spec"]["containers"][0]);
        assert!(!is_short(&r), "{:?}", r.problems);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        // The same tmpfs under a 512Mi limit: the memory is short, not the tmpfs.
        let p = gpu_pod(v, m, "512Mi");
        let r = preflight_view(&p, &p["spec"]["containers"][0]);
        assert!(is_short(&r) && !shm_short(&r), "{:?}", r.problems);
    }

    #[test]
    fn the_annotation_is_min_shm_and_enforced() {
        let mut p = gpu_pod(json!([]), json!([]), "32Gi");
        p["metadata"] = json!({"annotations": {"shmlink.io/shm-size": "32Mi"}});
        let r = preflight_view(&p, &p["spec"]["containers"][0]);
        assert!(!is_short(&r), "64Mi holds the 32Mi asked for");
        p["metadata"]["annotations"]["shmlink.io/shm-size"] = json!("4Gi");
        let r = preflight_view(&p, &p["spec"]["containers"][0]);
        assert!(is_short(&r));
        assert_eq!(r.verdict, Verdict::NotFit);
    }

    #[test]
    fn a_container_without_gpus_checks_for_the_pods() {
        let p = json!({"spec": {"initContainers": [{"name": "pre"}],
            "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "16"}}}]}});
        let r = preflight_view(&p, &p["spec"]["initContainers"][0]);
        assert_eq!(r.gpus.visible.len(), 16);
        assert_eq!(r.need.map(|n| n.bytes), Some(2206 * MIB));
    }
}

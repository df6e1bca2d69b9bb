//! Pure: a cgroup path -> Kubernetes pod UID, container ID, QoS class and runtime.

/// Kubernetes QoS class, from the pod cgroup's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Who named the container's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    /// A cgroup leaf that no known runtime prefix matched (plain runc, cgroupfs-driver kubelet).
    Unknown,
}

/// What a container's cgroup path says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupIdentity {
    /// Pod UID in its canonical form (dashes, as in `metadata.uid`; 32-hex static-pod UIDs as is).
    pub pod_uid: Option<String>,
    /// Container ID without runtime prefix or `.scope` suffix; the cgroup leaf name outside Kubernetes.
    pub container_id: String,
    pub qos: Option<QosClass>,
    pub runtime: Runtime,
}

/// Parses a cgroup path relative to its hierarchy root, e.g. `/kubepods/burstable/pod<uid>/<id>`.
/// Returns `None` for the root cgroup, pod-level cgroups and CRI-O's conmon cgroups.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupIdentity> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let leaf = *segments.last()?;
    if leaf.starts_with("crio-conmon-") {
        return None;
    }
    let (runtime, id) = leaf_id(leaf);
    let pod_at = segments.iter().rposition(|s| pod_uid_of(s).is_some());
    match pod_at {
        Some(i) if i + 1 == segments.len() => None, // the pod's own cgroup
        Some(i) => Some(CgroupIdentity {
            pod_uid: pod_uid_of(segments[i]),
            container_id: id.to_string(),
            qos: Some(qos_of(&segments[..=i])),
            runtime,
        }),
        None if is_kubepods_level(leaf) => None,
        None => Some(CgroupIdentity {
            pod_uid: None,
            container_id: id.to_string(),
            qos: None,
            runtime,
        }),
    }
}

fn leaf_id(leaf: &str) -> (Runtime, &str) {
    let unscoped = leaf.strip_suffix(".scope");
    for (prefix, runtime) in [
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
        ("docker-", Runtime::Docker),
    ] {
        if let Some(id) = unscoped.unwrap_or(leaf).strip_prefix(prefix) {
            return (runtime, id);
        }
    }
    (Runtime::Unknown, leaf)
}

fn is_kubepods_level(seg: &str) -> bool {
    matches!(seg, "kubepods" | "burstable" | "besteffort" | "guaranteed")
        || (seg.starts_with("kubepods") && seg.ends_with(".slice"))
}

fn qos_of(segments: &[&str]) -> QosClass {
    let pod = segments.last().copied().unwrap_or("");
    let parent = segments
        .len()
        .checked_sub(2)
        .map(|i| segments[i])
        .unwrap_or("");
    if parent == "burstable" || pod.contains("-burstable-") {
        QosClass::Burstable
    } else if parent == "besteffort" || pod.contains("-besteffort-") {
        QosClass::BestEffort
    } else {
        QosClass::Guaranteed
    }
}

/// `pod<uid>` (cgroupfs) or `kubepods[-qos]-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of(seg: &str) -> Option<String> {
    let raw = if let Some(slice) = seg.strip_suffix(".slice") {
        slice.rsplit_once("-pod")?.1
    } else {
        seg.strip_prefix("pod")?
    };
    let uid = raw.replace('_', "-");
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let dashed = uid.len() == 36
        && uid.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && hex(&uid.replace('-', ""));
    let static_pod = uid.len() == 32 && hex(&uid);
    (dashed || static_pod).then(|| uid.to_ascii_lowercase())
}

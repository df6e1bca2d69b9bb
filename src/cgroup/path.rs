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

impl CgroupIdentity {
    /// Whether it is surely a container's: a Pod's, a runtime's, or a leaf that is a container
    /// ID. A host service's cgroup (`/system.slice/sshd.service`) parses too, as its leaf.
    pub fn is_surely_a_container(&self) -> bool {
        self.pod_uid.is_some() || self.runtime != Runtime::Unknown || is_hex_id(&self.container_id)
    }
}

/// Parses a cgroup path relative to its hierarchy root, e.g. `/kubepods/burstable/pod<uid>/<id>`.
/// Returns `None` for the root cgroup, kubepods and QoS-level cgroups, pod-level cgroups and
/// CRI-O's conmon cgroups.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupIdentity> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let leaf = *segments.last()?;
    if let Some(identity) = parse_colon_leaf(leaf) {
        // The runtime makes these beside the pods (under its own service), never inside a
        // container: one there is a cgroup a container made, naming another container.
        let parent = &segments[..segments.len() - 1];
        let inside = (0..parent.len()).any(|i| {
            let s = parent[i];
            pod_uid_of(s).is_some()
                || is_hex_id(s)
                || parse_colon_leaf(s).is_some()
                || runtime_named(parent, i).is_some()
        });
        if !inside {
            return identity;
        }
        // Its enclosing container's: the path without the colon leaves it ends with.
        let mut end = parent.len();
        while end > 0 && parse_colon_leaf(parent[end - 1]).is_some() {
            end -= 1;
        }
        return parse_segments(&parent[..end]);
    }
    parse_segments(&segments)
}

/// The identity of a path's segments whose leaf is no colon leaf.
fn parse_segments(segments: &[&str]) -> Option<CgroupIdentity> {
    let leaf = *segments.last()?;
    let pod_at = segments.iter().rposition(|s| pod_uid_of(s).is_some());
    if pod_at.is_none() && is_kubepods_level(leaf) {
        return None;
    }
    // Only what lies below the pod names the container: above it sits the node (a kind node's
    // own `docker-<id>.scope`), which is not this container.
    let below = &segments[pod_at.map_or(0, |i| i + 1)..];
    if below.is_empty() {
        return None; // the pod's own cgroup
    }
    // In a Pod the kubelet's runtime makes one cgroup per container, right below the Pod's:
    // whatever lies deeper was made inside that container (by it, if it may write its
    // cgroups) and is that container's, whatever name it took (`cri-containerd-<other>.scope`).
    let own = if pod_at.is_some() { &below[..1] } else { below };
    let (runtime, id) = container_of(own)?;
    Some(CgroupIdentity {
        pod_uid: pod_at.and_then(|i| pod_uid_of(segments[i])),
        container_id: id.to_string(),
        qos: pod_at.map(|i| qos_of(&segments[..=i])),
        runtime,
    })
}

/// The container named by the segments below the pod (or the whole path outside Kubernetes);
/// `None` for CRI-O's conmon.
fn container_of<'a>(segments: &[&'a str]) -> Option<(Runtime, &'a str)> {
    let last = segments.len().checked_sub(1)?;
    let leaf = segments[last];
    if is_conmon(leaf) {
        return None;
    }
    if let Some(named) = runtime_named(segments, last) {
        return Some(named);
    }
    // A non-ID leaf below a runtime's cgroup belongs to that container: crun's `container`
    // child of `crio-<id>.scope` on cgroup v2, or `init.scope` of systemd run inside a container.
    // A 64-hex leaf is a container of its own (docker-in-docker), so it keeps its name.
    if !is_hex_id(leaf) {
        for i in (0..last).rev() {
            if is_conmon(segments[i]) {
                return None;
            }
            if let Some(named) = runtime_named(segments, i) {
                return Some(named);
            }
        }
    }
    Some((Runtime::Unknown, leaf))
}

/// The runtime and ID that segment `i` names: by its prefix (`cri-containerd-<id>.scope`,
/// `crio-<id>`, `docker-<id>.scope`) or, for Docker's cgroupfs driver, by a `docker` parent.
fn runtime_named<'a>(segments: &[&'a str], i: usize) -> Option<(Runtime, &'a str)> {
    let seg = segments[i];
    let unscoped = seg.strip_suffix(".scope").unwrap_or(seg);
    for (prefix, runtime) in [
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
        ("docker-", Runtime::Docker),
    ] {
        if let Some(id) = unscoped.strip_prefix(prefix).filter(|id| !id.is_empty()) {
            return Some((runtime, id));
        }
    }
    (i > 0 && segments[i - 1] == "docker").then_some((Runtime::Docker, seg))
}

/// `<pod slice>:<prefix>:<id>`: a systemd-driver kubelet's cgroupsPath that a cgroupfs-driver
/// runtime created literally, e.g. under `/system.slice/containerd.service`. `None` when the
/// leaf is not of this form; `Some(None)` when it is but names no container.
fn parse_colon_leaf(leaf: &str) -> Option<Option<CgroupIdentity>> {
    let (slice, rest) = leaf.split_once(':')?;
    let (prefix, id) = rest.split_once(':')?;
    if !slice.ends_with(".slice") {
        return None;
    }
    let runtime = match prefix {
        "cri-containerd" => Runtime::Containerd,
        "crio" => Runtime::CriO,
        "docker" => Runtime::Docker,
        "crio-conmon" => return Some(None),
        _ => Runtime::Unknown,
    };
    if id.is_empty() || id.contains(':') {
        return Some(None);
    }
    let pod_uid = pod_uid_of(slice);
    Some(Some(CgroupIdentity {
        qos: pod_uid.as_ref().map(|_| qos_of(&[slice])),
        pod_uid,
        container_id: id.to_string(),
        runtime,
    }))
}

fn is_conmon(seg: &str) -> bool {
    seg.starts_with("crio-conmon-")
}

/// The 64-hex IDs containerd, CRI-O and Docker give containers.
fn is_hex_id(seg: &str) -> bool {
    seg.len() == 64 && seg.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_kubepods_level(seg: &str) -> bool {
    matches!(seg, "kubepods" | "burstable" | "besteffort" | "guaranteed")
        // `kubepods.slice`, `kubepods-burstable.slice`, kind's `kubelet-kubepods-besteffort.slice`
        || (seg.contains("kubepods") && seg.ends_with(".slice"))
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

/// Whether a cgroup directory's name is kubelet's for a pod (`pod<uid>`, or the systemd
/// driver's `kubepods[-qos]-pod<uid>.slice`).
pub fn is_pod_cgroup(name: &str) -> bool {
    pod_uid_of(name).is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A container that may write its cgroup makes a child named as the runtime names a
    /// container beside the pods: it stays the enclosing container's, never the one it names.
    #[test]
    fn a_colon_leaf_inside_a_container_is_that_containers_not_the_one_it_names() {
        let own = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
        let victim = "b".repeat(64);
        let uid = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
        let forged = format!(
            "/kubepods/burstable/pod{uid}/{own}/kubepods-burstable-pod9d9d9d9d_0000_4000_8000_000000000000.slice:cri-containerd:{victim}"
        );
        let id = parse_cgroup_path(&forged).unwrap();
        assert_eq!(id.container_id, own);
        assert_eq!(id.pod_uid.as_deref(), Some(uid));
        // Where the runtime puts it, it names the container.
        let real = format!(
            "/system.slice/containerd.service/kubepods-burstable-pod9d9d9d9d_0000_4000_8000_000000000000.slice:cri-containerd:{victim}"
        );
        assert_eq!(parse_cgroup_path(&real).unwrap().container_id, victim);
    }
    use QosClass::{BestEffort, Burstable, Guaranteed};
    use Runtime::{Containerd, CriO, Docker, Unknown};

    const UID: &str = "0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d";
    const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
    /// A kube-apiserver mirror pod: static pods take the manifest hash as UID, 32 hex, no dashes.
    const STATIC_UID: &str = "6a3b0f3c2e8d4b1a9c7e5f3d1b2a4c6e";
    /// A kind node's own container ID, as Docker names it on the host.
    const NODE_ID: &str = "9c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d";

    /// Expected identity: (pod UID, container ID, QoS, runtime); `None` for "not a container".
    type Want = Option<(
        Option<&'static str>,
        &'static str,
        Option<QosClass>,
        Runtime,
    )>;

    /// The path part of a /proc/PID/cgroup line (`hierarchy-ID:controllers:path`); the path itself
    /// may hold colons.
    fn path_of(line: &str) -> &str {
        line.splitn(3, ':').nth(2).expect("a /proc/PID/cgroup line")
    }

    fn check(rows: &[(&str, String, Want)]) {
        for (why, line, want) in rows {
            let got = parse_cgroup_path(path_of(line));
            let got = got.as_ref().map(|i| {
                (
                    i.pod_uid.as_deref(),
                    i.container_id.as_str(),
                    i.qos,
                    i.runtime,
                )
            });
            assert_eq!(got, *want, "{why}: {line}");
        }
    }

    /// `kubepods-<qos>-pod<uid with underscores>.slice`, as the systemd driver names a pod.
    fn pod_slice(qos: &str, uid: &str) -> String {
        let uid = uid.replace('-', "_");
        match qos {
            "" => format!("kubepods-pod{uid}.slice"),
            qos => format!("kubepods-{qos}-pod{uid}.slice"),
        }
    }

    #[test]
    fn cgroupfs_driver_paths_on_v1_and_v2_for_every_qos_class() {
        check(&[
            (
                "v1 Guaranteed",
                format!("9:memory:/kubepods/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(Guaranteed), Unknown)),
            ),
            (
                "v1 Burstable",
                format!("9:memory:/kubepods/burstable/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(Burstable), Unknown)),
            ),
            (
                "v1 BestEffort",
                format!("9:memory:/kubepods/besteffort/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(BestEffort), Unknown)),
            ),
            (
                "v2 Guaranteed",
                format!("0::/kubepods/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(Guaranteed), Unknown)),
            ),
            (
                "v2 Burstable",
                format!("0::/kubepods/burstable/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(Burstable), Unknown)),
            ),
            (
                "v2 BestEffort",
                format!("0::/kubepods/besteffort/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(BestEffort), Unknown)),
            ),
            (
                "dockershim-era kubelet: a Docker ID under a cgroupfs pod",
                format!("4:memory:/kubepods/burstable/pod{UID}/{NODE_ID}"),
                Some((Some(UID), NODE_ID, Some(Burstable), Unknown)),
            ),
        ]);
    }

    #[test]
    fn systemd_driver_paths_on_v1_and_v2_for_every_qos_class() {
        let g = pod_slice("", UID);
        let b = pod_slice("burstable", UID);
        let be = pod_slice("besteffort", UID);
        check(&[
            (
                "v2 Guaranteed",
                format!("0::/kubepods.slice/{g}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(Guaranteed), Containerd)),
            ),
            (
                "v2 Burstable",
                format!("0::/kubepods.slice/kubepods-burstable.slice/{b}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(Burstable), Containerd)),
            ),
            (
                "v2 BestEffort",
                format!("0::/kubepods.slice/kubepods-besteffort.slice/{be}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(BestEffort), Containerd)),
            ),
            (
                "v1 Guaranteed",
                format!("11:memory:/kubepods.slice/{g}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(Guaranteed), Containerd)),
            ),
            (
                "v1 Burstable",
                format!("11:memory:/kubepods.slice/kubepods-burstable.slice/{b}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(Burstable), Containerd)),
            ),
            (
                "v1 BestEffort, Docker as the kubelet's runtime (dockershim)",
                format!("11:memory:/kubepods.slice/kubepods-besteffort.slice/{be}/docker-{CID}.scope"),
                Some((Some(UID), CID, Some(BestEffort), Docker)),
            ),
        ]);
    }

    #[test]
    fn cri_o_containers_are_named_by_their_scope_and_conmon_is_not_a_container() {
        let b = pod_slice("burstable", UID);
        let pod = format!("/kubepods.slice/kubepods-burstable.slice/{b}");
        check(&[
            (
                "systemd driver",
                format!("0::{pod}/crio-{CID}.scope"),
                Some((Some(UID), CID, Some(Burstable), CriO)),
            ),
            (
                "crun on cgroup v2 runs the processes in a `container` child of the scope",
                format!("0::{pod}/crio-{CID}.scope/container"),
                Some((Some(UID), CID, Some(Burstable), CriO)),
            ),
            (
                "conmon watches the container from the host's mount namespace",
                format!("0::{pod}/crio-conmon-{CID}.scope"),
                None,
            ),
            (
                "cgroupfs driver",
                format!("9:memory:/kubepods/besteffort/pod{UID}/crio-{CID}"),
                Some((Some(UID), CID, Some(BestEffort), CriO)),
            ),
            (
                "cgroupfs driver, conmon",
                format!("9:memory:/kubepods/besteffort/pod{UID}/crio-conmon-{CID}"),
                None,
            ),
        ]);
    }

    #[test]
    fn docker_outside_kubernetes_with_either_driver() {
        check(&[
            (
                "systemd driver",
                format!("0::/system.slice/docker-{CID}.scope"),
                Some((None, CID, None, Docker)),
            ),
            (
                "cgroupfs driver",
                format!("4:memory:/docker/{CID}"),
                Some((None, CID, None, Docker)),
            ),
            (
                "systemd run inside the container moved its processes to init.scope",
                format!("0::/system.slice/docker-{CID}.scope/init.scope"),
                Some((None, CID, None, Docker)),
            ),
            (
                "docker-in-docker: the inner container keeps its own ID",
                format!("0::/system.slice/docker-{NODE_ID}.scope/docker/{CID}"),
                Some((None, CID, None, Docker)),
            ),
        ]);
    }

    /// Issue 36: a cgroup made inside a Pod's container, under any name, is that container's.
    #[test]
    fn a_cgroup_nested_in_a_pods_container_is_that_container_whatever_its_name() {
        let victim = "b".repeat(64);
        let pod = format!("/kubepods/burstable/pod{UID}");
        for nested in [
            format!("{pod}/{CID}/cri-containerd-{victim}.scope"),
            format!("{pod}/{CID}/crio-{victim}"),
            format!("{pod}/{CID}/docker/{victim}"),
            format!("{pod}/{CID}/{victim}"),
            format!("{pod}/{CID}/anything/deeper"),
        ] {
            let id = parse_cgroup_path(&nested).unwrap();
            assert_eq!(
                (id.container_id.as_str(), id.pod_uid.as_deref()),
                (CID, Some(UID)),
                "{nested}"
            );
        }
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{CID}.scope/cri-containerd-{victim}.scope",
            UID.replace('-', "_")
        );
        let id = parse_cgroup_path(&systemd).unwrap();
        assert_eq!((id.container_id.as_str(), id.runtime), (CID, Containerd));
    }

    #[test]
    fn static_pod_uids_are_32_hex_without_dashes() {
        check(&[
            (
                "cgroupfs",
                format!("9:memory:/kubepods/burstable/pod{STATIC_UID}/{CID}"),
                Some((Some(STATIC_UID), CID, Some(Burstable), Unknown)),
            ),
            (
                "systemd",
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{CID}.scope"
                ),
                Some((Some(STATIC_UID), CID, Some(Burstable), Containerd)),
            ),
        ]);
    }

    #[test]
    fn kind_and_other_nested_nodes_report_the_pod_container_not_the_node() {
        let be = pod_slice("besteffort", UID);
        let kubelet = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-{be}"
        );
        check(&[
            (
                "kind node seen with its own cgroup namespace",
                format!("0::{kubelet}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(BestEffort), Containerd)),
            ),
            (
                "kind node seen from the host",
                format!("0::/system.slice/docker-{NODE_ID}.scope{kubelet}/cri-containerd-{CID}.scope"),
                Some((Some(UID), CID, Some(BestEffort), Containerd)),
            ),
            (
                "cgroupfs kubelet in a systemd-driver Docker container",
                format!("0::/system.slice/docker-{NODE_ID}.scope/kubepods/burstable/pod{UID}/{CID}"),
                Some((Some(UID), CID, Some(Burstable), Unknown)),
            ),
            (
                "minikube: CRI-O node in a cgroupfs-driver Docker container",
                format!(
                    "4:memory:/docker/{NODE_ID}/kubepods.slice/kubepods-besteffort.slice/{be}/crio-{CID}.scope"
                ),
                Some((Some(UID), CID, Some(BestEffort), CriO)),
            ),
            (
                "the kind node itself, whose systemd sits in init.scope",
                format!("0::/system.slice/docker-{NODE_ID}.scope/init.scope"),
                Some((None, NODE_ID, None, Docker)),
            ),
            (
                "a kind node's QoS cgroup",
                format!("0::/system.slice/docker-{NODE_ID}.scope/kubepods/besteffort"),
                None,
            ),
        ]);
    }

    #[test]
    fn a_systemd_cgroups_path_taken_literally_by_a_cgroupfs_runtime_still_names_pod_and_container()
    {
        // kubelet on the systemd driver, containerd on cgroupfs: runc makes one directory of
        // `<slice>:<prefix>:<id>` beside containerd.service.
        check(&[
            (
                "static pod",
                format!(
                    "11:memory:/system.slice/containerd.service/kubepods-burstable-pod{STATIC_UID}.slice:cri-containerd:{CID}"
                ),
                Some((Some(STATIC_UID), CID, Some(Burstable), Containerd)),
            ),
            (
                "Guaranteed",
                format!("0::/{}:cri-containerd:{CID}", pod_slice("", UID)),
                Some((Some(UID), CID, Some(Guaranteed), Containerd)),
            ),
        ]);
    }

    #[test]
    fn root_kubepods_qos_and_pod_cgroups_are_not_containers() {
        let b = pod_slice("burstable", UID);
        check(&[
            ("v2 root", "0::/".into(), None),
            ("v1 root", "9:memory:/".into(), None),
            ("cgroupfs kubepods", "9:memory:/kubepods".into(), None),
            ("cgroupfs QoS", "9:memory:/kubepods/burstable".into(), None),
            ("cgroupfs QoS", "9:memory:/kubepods/besteffort".into(), None),
            ("systemd kubepods", "0::/kubepods.slice".into(), None),
            (
                "systemd QoS",
                "0::/kubepods.slice/kubepods-besteffort.slice".into(),
                None,
            ),
            (
                "kind QoS",
                "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice".into(),
                None,
            ),
            (
                "cgroupfs pod",
                format!("9:memory:/kubepods/burstable/pod{UID}"),
                None,
            ),
            (
                "systemd pod",
                format!("0::/kubepods.slice/kubepods-burstable.slice/{b}"),
                None,
            ),
            (
                "systemd Guaranteed pod",
                format!("0::/kubepods.slice/{}", pod_slice("", UID)),
                None,
            ),
        ]);
    }

    #[test]
    fn a_plain_runc_container_is_named_by_its_cgroup_leaf() {
        check(&[
            (
                "runc with a cgroupsPath of its own",
                "0::/mygroup/trainer-1".into(),
                Some((None, "trainer-1", None, Unknown)),
            ),
            (
                "v1, a 64-hex ID",
                format!("4:memory:/mygroup/{CID}"),
                Some((None, CID, None, Unknown)),
            ),
            (
                "`podman` is not `pod<uid>`",
                "0::/podman/abc".into(),
                Some((None, "abc", None, Unknown)),
            ),
        ]);
    }

    #[test]
    fn odd_input_never_panics_and_reads_as_little_as_it_says() {
        let upper = UID.to_ascii_uppercase();
        let long = format!("/{}", "a/".repeat(10_000));
        check(&[
            ("empty", "0::".into(), None),
            ("only slashes", "0:://".into(), None),
            (
                "very long",
                format!("0::{long}"),
                Some((None, "a", None, Unknown)),
            ),
            (
                "replacement characters where bytes were not UTF-8",
                "0::/\u{fffd}\u{fffd}/ctr\\xff".into(),
                Some((None, "ctr\\xff", None, Unknown)),
            ),
            (
                "uppercase UID, normalised",
                format!("0::/kubepods/pod{upper}/{CID}"),
                Some((Some(UID), CID, Some(Guaranteed), Unknown)),
            ),
            (
                "a UID one digit short is no UID",
                format!("0::/kubepods/pod{}/{CID}", &UID[..35]),
                Some((None, CID, None, Unknown)),
            ),
            (
                "a UID of the right length in multi-byte characters",
                format!("0::/kubepods/pod{}/c", "é".repeat(18)),
                Some((None, "c", None, Unknown)),
            ),
            (
                "a runtime prefix with no ID",
                "0::/system.slice/docker-.scope".into(),
                Some((None, "docker-.scope", None, Unknown)),
            ),
            (
                "an empty pod slice",
                "0::/kubepods.slice/kubepods-burstable-pod.slice/x".into(),
                Some((None, "x", None, Unknown)),
            ),
            (
                "a colon leaf naming no ID",
                "0::/kubepods-pod.slice:crio:".into(),
                None,
            ),
            (
                "a colon leaf naming conmon",
                format!("0::/{}:crio-conmon:{CID}", pod_slice("", UID)),
                None,
            ),
        ]);
    }

    #[test]
    fn every_mix_of_real_and_odd_segments_parses_without_panic() {
        let b = pod_slice("burstable", UID);
        let vocab: Vec<String> = vec![
            "kubepods".into(),
            "burstable".into(),
            "kubepods.slice".into(),
            b,
            format!("pod{UID}"),
            format!("cri-containerd-{CID}.scope"),
            format!("crio-conmon-{CID}.scope"),
            "crio-.scope".into(),
            "container".into(),
            "docker".into(),
            "a:b:c".into(),
            ":".into(),
            "pod".into(),
            "é".into(),
        ];
        let n = vocab.len();
        for k in 0..n.pow(4) {
            let mut path = String::new();
            let mut rest = k;
            for _ in 0..4 {
                path.push('/');
                path.push_str(&vocab[rest % n]);
                rest /= n;
            }
            if let Some(id) = parse_cgroup_path(&path) {
                assert!(!id.container_id.is_empty(), "{path}");
                assert!(!id.container_id.contains('/'), "{path}");
                assert_eq!(id.pod_uid.is_some(), id.qos.is_some(), "{path}");
            }
        }
    }
}

//! Pure: kubelet evicted the Pod because its /dev/shm volume outgrew the volume's own
//! `sizeLimit`. The eviction manager's local-storage check (pkg/kubelet/eviction) writes
//! `status.reason: Evicted` and a message `Usage of EmptyDir volume "dshm" exceeds the limit
//! "1Gi". ` (its `emptyDirMessageFmt`) and kills every container: their own statuses then say
//! only exit 137, which is told nowhere else. Only a volume mounted at /dev/shm is ours: an
//! emptyDir elsewhere outgrowing its limit is the workload's disk, not its shared memory.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::model::{ContainerRef, Detected, FailureSource, FindingKind};

/// The eviction's text up to the volume's name, and between the name and the limit.
const HEAD: &str = "Usage of EmptyDir volume \"";
const MIDDLE: &str = "\" exceeds the limit \"";

/// The instance part of an eviction's death key (`exits::DeathKey`): a Pod is evicted once
/// (Failed is final).
pub const EVICTION: &str = "evicted";

/// The volume and the limit kubelet's message names, if it is the emptyDir eviction's.
pub fn parse_message(message: &str) -> Option<(&str, &str)> {
    let rest = &message[message.find(HEAD)? + HEAD.len()..];
    let (volume, rest) = rest.split_once(MIDDLE)?;
    let (limit, _) = rest.split_once('"')?;
    (!volume.is_empty() && !volume.contains('"')).then_some((volume, limit))
}

/// The Pod's eviction for its /dev/shm volume's size limit, as a failure of the (first)
/// container that mounts the volume at /dev/shm; None for any other Pod.
pub fn shm_eviction(pod: &Pod) -> Option<Detected> {
    let uid = pod.metadata.uid.clone()?;
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() != Some("Evicted") {
        return None;
    }
    let message = status.message.as_deref()?;
    let (volume, _limit) = parse_message(message)?;
    let container = shm_mounter(pod, volume)?;
    let at = evicted_at(pod)?;
    let who = ContainerRef {
        namespace: Some(pod.namespace().unwrap_or_default()),
        pod: Some(pod.name_any()),
        pod_uid: Some(uid),
        container: Some(container),
        container_id: None,
    };
    let evidence = format!("status.message of the Pod (Evicted): {}", message.trim());
    Some(Detected::new(
        who,
        FindingKind::ShmEvicted,
        at,
        FailureSource::PodStatus,
        &evidence,
    ))
}

/// The first container (init containers first, as they ran) that mounts `volume` at /dev/shm.
fn shm_mounter(pod: &Pod, volume: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == volume && m.mount_path.trim_end_matches('/') == "/dev/shm")
        })
        .map(|c| c.name.clone())
}

/// When it happened: the last container end the status records, else the latest condition
/// change (kubelet turns Ready false as it kills them). None: the status cannot place it, and
/// an eviction that cannot be placed would be told again at every restart.
fn evicted_at(pod: &Pod) -> Option<SystemTime> {
    let status = pod.status.as_ref()?;
    let ends = [
        status.container_statuses.as_ref(),
        status.init_container_statuses.as_ref(),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|cs| cs.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
    .map(|t| SystemTime::from(t.0));
    let changes = status
        .conditions
        .iter()
        .flatten()
        .filter_map(|c| c.last_transition_time.as_ref())
        .map(|t| SystemTime::from(t.0));
    ends.max().or_else(|| changes.max())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6d1f9a20-7c1e-4b8e-9f51-1a2b3c4d5e6f";

    /// A Pod as kubelet leaves it after the eviction: Failed, `Evicted`, the message with its
    /// trailing space, the containers killed (exit 137, no reason of memory).
    fn evicted(message: &str, mount: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": UID},
            "spec": {"nodeName": "node-a",
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                "containers": [
                    {"name": "sidecar"},
                    {"name": "trainer", "volumeMounts": [{"name": "dshm", "mountPath": mount}]}]},
            "status": {"phase": "Failed", "reason": "Evicted", "message": message,
                "conditions": [{"type": "Ready", "status": "False",
                                "lastTransitionTime": "2026-11-24T10:00:03Z"}],
                "containerStatuses": [
                    {"name": "trainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 137, "reason": "Error",
                        "startedAt": "2026-11-24T09:00:00Z", "finishedAt": "2026-11-24T10:00:02Z"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn kubelets_message_names_the_volume_and_its_limit() {
        assert_eq!(
            parse_message("Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". "),
            Some(("dshm", "1Gi"))
        );
        // Other evictions (node pressure, a container's ephemeral storage) are not this one.
        assert_eq!(
            parse_message("The node was low on resource: memory. Threshold quantity: 100Mi."),
            None
        );
        assert_eq!(
            parse_message("Container x exceeded its local ephemeral storage limit \"1Gi\". "),
            None
        );
        assert_eq!(parse_message("Usage of EmptyDir volume \"dshm"), None);
    }

    #[test]
    fn an_eviction_for_the_dev_shm_volume_is_a_death_of_the_container_that_mounts_it() {
        let pod = evicted(
            "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
            "/dev/shm",
        );
        let d = shm_eviction(&pod).expect("told");
        assert_eq!(d.kind, FindingKind::ShmEvicted);
        assert_eq!(d.source, FailureSource::PodStatus);
        // The container's own end, not the later condition change.
        assert_eq!(
            d.at,
            SystemTime::from(
                "2026-11-24T10:00:02Z"
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .unwrap()
            )
        );
        assert!(
            d.evidence.contains("exceeds the limit \"1Gi\""),
            "{}",
            d.evidence
        );
        assert!(d.who.pod_uid.is_some() && d.who.container.as_deref() == Some("trainer"));
        // A trailing slash is the same mount.
        assert!(shm_eviction(&evicted(
            "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
            "/dev/shm/"
        ))
        .is_some());
    }

    #[test]
    fn other_evictions_and_volumes_elsewhere_stay_quiet() {
        // The same volume mounted somewhere else: a scratch directory, not /dev/shm.
        let elsewhere = evicted(
            "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
            "/scratch",
        );
        assert!(shm_eviction(&elsewhere).is_none());
        // Another volume's eviction.
        let other = evicted(
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Gi\". ",
            "/dev/shm",
        );
        assert!(shm_eviction(&other).is_none());
        // Node pressure.
        let pressure = evicted("The node was low on resource: memory. ", "/dev/shm");
        assert!(shm_eviction(&pressure).is_none());
        // Not evicted at all (a Pod whose message mentions it).
        let mut running = evicted(
            "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
            "/dev/shm",
        );
        running.status.as_mut().unwrap().reason = None;
        assert!(shm_eviction(&running).is_none());
    }

    #[test]
    fn an_eviction_that_cannot_be_placed_in_time_is_not_told() {
        let mut pod = evicted(
            "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
            "/dev/shm",
        );
        let status = pod.status.as_mut().unwrap();
        status.container_statuses = None;
        assert!(shm_eviction(&pod).is_some(), "the condition places it");
        pod.status.as_mut().unwrap().conditions = None;
        assert!(shm_eviction(&pod).is_none());
    }
}

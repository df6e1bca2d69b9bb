//! Deaths that print nothing, as this node's Pods record them: a container whose
//! `state.terminated` or `lastState.terminated` says `OOMKilled`, or exit status 135 / signal 7
//! (SIGBUS). Pure: a Pod in, [`Detected`] out; [`Exits`] tells each death once.
//!
//! And kubelet's eviction of a Pod whose /dev/shm volume outgrew its `sizeLimit` (`evicted.rs`).
//!
//! Exit 137 without `OOMKilled` is not told: a SIGKILL comes from anyone (a failed liveness
//! probe, preemption, a person), and naming it a memory death would blame the wrong thing.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use kube::ResourceExt;

use crate::model::{
    strip_runtime_prefix, ContainerRef, Detected, Exit, FailureSource, FindingKind, MemorySource,
    MemorySplit,
};
use crate::units::parse_size;

/// A death older than this when first seen is history, not news (a relist after a watch
/// outage, a Pod that reached the cache late).
pub const FRESH: Duration = Duration::from_secs(600);
/// How long after a death its Pod's status may reach the agent (the kubelet's status sync and
/// the watch): a restart looks back this far before its checkpoint for deaths not yet told.
pub const STATUS_LAG: Duration = Duration::from_secs(60);

/// Which death of which container: a restart's container has a new ID (else a new finish time).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DeathKey {
    pub pod_uid: String,
    pub container: String,
    pub instance: String,
}

/// Every memory death the Pod's statuses record, as found, with its key.
pub fn deaths(pod: &Pod) -> Vec<(DeathKey, Detected)> {
    let Some(uid) = pod.metadata.uid.clone() else {
        return Vec::new();
    };
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let lists = [
        status.container_statuses.as_ref(),
        status.init_container_statuses.as_ref(),
        status.ephemeral_container_statuses.as_ref(),
    ];
    let mut out = Vec::new();
    for cs in lists.into_iter().flatten().flatten() {
        let ended = [
            (
                "state",
                cs.state.as_ref().and_then(|s| s.terminated.as_ref()),
            ),
            (
                "lastState",
                cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()),
            ),
        ];
        for (field, t) in ended {
            if let Some(found) = death(pod, &uid, cs, field, t) {
                out.push(found);
            }
        }
    }
    out.extend(super::evicted::shm_eviction(pod).map(|d| {
        let container = d.who.container.clone().unwrap_or_default();
        let key = DeathKey {
            pod_uid: uid.clone(),
            container,
            instance: super::evicted::EVICTION.to_string(),
        };
        (key, d)
    }));
    out
}

fn death(
    pod: &Pod,
    uid: &str,
    cs: &ContainerStatus,
    field: &str,
    t: Option<&ContainerStateTerminated>,
) -> Option<(DeathKey, Detected)> {
    let t = t?;
    let exit = Exit {
        code: Some(t.exit_code),
        signal: t.signal.filter(|s| *s != 0),
        reason: t.reason.clone().filter(|r| !r.is_empty()),
    };
    let kind = exit.death()?;
    // Without a finish time a death cannot be placed in time, nor told from the next one.
    let finished = t.finished_at.as_ref()?;
    let at = SystemTime::from(finished.0);
    let container_id = t
        .container_id
        .as_deref()
        .map(strip_runtime_prefix)
        .filter(|id| !id.is_empty())
        .map(str::to_string);
    let key = DeathKey {
        pod_uid: uid.to_string(),
        container: cs.name.clone(),
        instance: container_id
            .clone()
            .unwrap_or_else(|| finished.0.to_string()),
    };
    let evidence = format!(
        "{field}.terminated of container {}: {} at {}",
        cs.name,
        exit.describe(),
        finished.0
    );
    let who = ContainerRef {
        namespace: Some(pod.namespace().unwrap_or_default()),
        pod: Some(pod.name_any()),
        pod_uid: Some(uid.to_string()),
        container: Some(cs.name.clone()),
        container_id,
    };
    let mut d = Detected::new(who, kind, at, FailureSource::PodStatus, &evidence);
    if kind == FindingKind::WorkloadOomKilled {
        // Judged by the container's last /dev/shm reading (correlate.rs): kubelet gives no split.
        d.memory = Some(MemorySplit {
            limit_bytes: memory_limit(pod, &cs.name),
            usage_bytes: None,
            shm_bytes: None,
            anon_bytes: None,
            source: MemorySource::PodStatus,
        });
    }
    d.exit = Some(exit);
    Some((key, d))
}

/// The container's memory limit as its spec asks (the cgroup's, when the scan read one, wins
/// in correlate: this is for a container that died before any scan).
fn memory_limit(pod: &Pod, container: &str) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)?;
    let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    parse_size("memory limit", &q.0).ok()
}

/// Tells each death once: those that ended after the agent started and are fresh when seen.
#[derive(Debug)]
pub struct Exits {
    started: SystemTime,
    seen: HashMap<DeathKey, SystemTime>,
    /// Started again from a checkpoint taken then: a death after it is news however old when
    /// first seen (it ended while the agent was down).
    resumed_from: Option<SystemTime>,
}

impl Exits {
    /// `started`: deaths before it are not told (an agent restart must not tell them again).
    pub fn new(started: SystemTime) -> Exits {
        Exits {
            // Kubernetes stamps whole seconds: a death in the second the agent started counts.
            started: started - Duration::from_secs(1),
            seen: HashMap::new(),
            resumed_from: None,
        }
    }

    /// Started again from a checkpoint taken at `saved_at` with the deaths `told` then: those
    /// after it are told (found late), none of `told` again.
    pub fn resume(saved_at: SystemTime, told: Vec<(DeathKey, SystemTime)>) -> Exits {
        // A death the kubelet reported after the checkpoint may have ended before it.
        let mut exits = Exits::new(saved_at.checked_sub(STATUS_LAG).unwrap_or(saved_at));
        exits.seen = told.into_iter().collect();
        exits.resumed_from = Some(exits.started);
        exits
    }

    /// The deaths told and still remembered, for a checkpoint.
    pub fn told(&self) -> Vec<(DeathKey, SystemTime)> {
        self.seen.iter().map(|(k, at)| (k.clone(), *at)).collect()
    }

    /// The deaths this version of the Pod records that were not told before, with their keys
    /// (the follower keeps those it told in its checkpoint).
    pub fn observe(&mut self, pod: &Pod, now: SystemTime) -> Vec<(DeathKey, Detected)> {
        let mut out = Vec::new();
        for (key, d) in deaths(pod) {
            let fresh = now.duration_since(d.at).map_or(true, |age| age <= FRESH)
                || self.resumed_from.is_some_and(|from| d.at >= from);
            if d.at < self.started || !fresh || self.seen.contains_key(&key) {
                continue;
            }
            self.seen.insert(key.clone(), d.at);
            out.push((key, d));
        }
        // A key can go once its death is too old to be told again (after a restart, once
        // older than the checkpoint too).
        let from = self.resumed_from;
        self.seen.retain(|_, at| {
            now.duration_since(*at).map_or(true, |age| age <= FRESH * 2)
                || from.is_some_and(|from| *at >= from)
        });
        out
    }

    /// The Pod is gone: its deaths need no remembering.
    pub fn forget(&mut self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.seen.retain(|k, _| k.pod_uid != uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
    const ID: &str = "3f4e8a1b2c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f";

    fn at(s: &str) -> SystemTime {
        SystemTime::from(s.parse::<k8s_openapi::jiff::Timestamp>().unwrap())
    }

    /// A Pod as kubelet reports it after the container `trainer` ended as `terminated` says
    /// and was restarted (CrashLoopBackOff), and a healthy `sidecar`.
    fn pod(terminated: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": UID},
            "spec": {"nodeName": "node-a", "containers": [
                {"name": "trainer", "resources": {"limits": {"memory": "128Mi"}}},
                {"name": "sidecar"}]},
            "status": {"containerStatuses": [
                {"name": "trainer", "containerID": "containerd://ffff", "image": "x", "imageID": "",
                 "ready": false, "restartCount": 1,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": terminated}},
                {"name": "sidecar", "containerID": "containerd://eeee", "image": "x", "imageID": "",
                 "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-11-24T09:00:00Z"}}}]}
        }))
        .unwrap()
    }

    fn oom_killed(finished: &str) -> serde_json::Value {
        serde_json::json!({"exitCode": 137, "reason": "OOMKilled", "containerID": format!("containerd://{ID}"),
                           "startedAt": "2026-11-24T09:59:00Z", "finishedAt": finished})
    }

    #[test]
    fn kubelets_oomkilled_is_an_oom_death_of_that_container_instance() {
        let found = deaths(&pod(oom_killed("2026-11-24T10:00:00Z")));
        assert_eq!(found.len(), 1, "the sidecar runs; no death");
        let (key, d) = &found[0];
        assert_eq!(key.instance, ID);
        assert_eq!(d.kind, FindingKind::WorkloadOomKilled);
        assert_eq!(d.source, FailureSource::PodStatus);
        assert_eq!(d.at, at("2026-11-24T10:00:00Z"));
        assert_eq!(
            d.who,
            ContainerRef {
                namespace: Some("ml".into()),
                pod: Some("trainer-0".into()),
                pod_uid: Some(UID.into()),
                container: Some("trainer".into()),
                container_id: Some(ID.into())
            }
        );
        let m = d.memory.expect("an OOM kill carries its split");
        assert_eq!(m.limit_bytes, Some(128 << 20), "the spec's limit");
        assert_eq!((m.shm_bytes, m.source), (None, MemorySource::PodStatus));
        assert_eq!(
            d.evidence,
            "lastState.terminated of container trainer: OOMKilled, exit status 137 at 2026-11-24T10:00:00Z"
        );
    }

    #[test]
    fn exit_135_or_signal_7_is_a_bus_error_and_other_ends_are_nothing() {
        let bus = |t: serde_json::Value| {
            deaths(&pod(t))
                .into_iter()
                .map(|(_, d)| d.kind)
                .collect::<Vec<_>>()
        };
        let finished = "2026-11-24T10:00:00Z";
        assert_eq!(
            bus(serde_json::json!({"exitCode": 135, "reason": "Error", "finishedAt": finished})),
            vec![FindingKind::WorkloadBusError]
        );
        assert_eq!(
            bus(serde_json::json!({"exitCode": 0, "signal": 7, "finishedAt": finished})),
            vec![FindingKind::WorkloadBusError]
        );
        for other in [
            serde_json::json!({"exitCode": 137, "reason": "Error", "finishedAt": finished}),
            serde_json::json!({"exitCode": 1, "reason": "Error", "finishedAt": finished}),
            serde_json::json!({"exitCode": 0, "reason": "Completed", "finishedAt": finished}),
            serde_json::json!({"exitCode": 135, "reason": "Error"}),
        ] {
            assert_eq!(bus(other.clone()), vec![], "{other}");
        }
    }

    #[test]
    fn each_death_is_told_once_and_none_from_before_the_agent_started() {
        let mut exits = Exits::new(at("2026-11-24T10:00:00Z"));
        let now = at("2026-11-24T10:00:05Z");
        let before = pod(oom_killed("2026-11-24T09:58:00Z"));
        assert!(exits.observe(&before, now).is_empty(), "history");
        let p = pod(oom_killed("2026-11-24T10:00:02Z"));
        assert_eq!(exits.observe(&p, now).len(), 1);
        assert!(
            exits.observe(&p, now).is_empty(),
            "every later status update shows it again"
        );
        // The restart's container dies too: a new instance, a new death.
        let mut again = oom_killed("2026-11-24T10:00:40Z");
        again["containerID"] = serde_json::json!("containerd://abcd");
        assert_eq!(
            exits.observe(&pod(again), at("2026-11-24T10:00:41Z")).len(),
            1
        );
        // Seen for the first time long after it ended (a relist): not news.
        let mut exits = Exits::new(at("2026-11-24T10:00:00Z"));
        assert!(exits.observe(&p, at("2026-11-24T11:00:00Z")).is_empty());
    }

    #[test]
    fn a_restart_tells_the_deaths_while_down_and_none_told_before() {
        let mut exits = Exits::new(at("2026-11-24T10:00:00Z"));
        let told = pod(oom_killed("2026-11-24T10:00:02Z"));
        assert_eq!(exits.observe(&told, at("2026-11-24T10:00:03Z")).len(), 1);
        let saved = exits.told();
        // Down from 10:00:05 to 11:00:00; meanwhile the restart's container died too.
        let mut exits = Exits::resume(at("2026-11-24T10:00:05Z"), saved);
        assert!(exits.observe(&told, at("2026-11-24T11:00:00Z")).is_empty());
        let mut again = oom_killed("2026-11-24T10:30:00Z");
        again["containerID"] = serde_json::json!("containerd://abcd");
        let p = pod(again);
        assert_eq!(exits.observe(&p, at("2026-11-24T11:00:00Z")).len(), 1);
        assert!(exits.observe(&p, at("2026-11-24T11:00:01Z")).is_empty());
        // The keys survive a checkpoint's JSON; the death from just before the checkpoint is
        // kept (within the status lag its key, not its time, keeps it from being told again).
        let json = serde_json::to_string(&exits.told()).unwrap();
        let back: Vec<(DeathKey, SystemTime)> = serde_json::from_str(&json).unwrap();
        assert_eq!(back.len(), 2);
        assert!(exits.observe(&told, at("2026-11-24T11:00:02Z")).is_empty());
        // A death the kubelet reported only after the checkpoint, though it ended just before,
        // is told after the restart; one older than the lag is history.
        let mut exits = Exits::resume(at("2026-11-24T10:00:05Z"), Vec::new());
        let mut late = oom_killed("2026-11-24T10:00:04Z");
        late["containerID"] = serde_json::json!("containerd://late");
        assert_eq!(
            exits.observe(&pod(late), at("2026-11-24T10:05:00Z")).len(),
            1
        );
        let mut old = oom_killed("2026-11-24T09:58:00Z");
        old["containerID"] = serde_json::json!("containerd://old");
        assert!(exits
            .observe(&pod(old), at("2026-11-24T10:05:00Z"))
            .is_empty());
    }

    #[test]
    fn a_pod_without_uid_status_or_times_tells_nothing() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "namespace": "ml"},
        }))
        .unwrap();
        assert!(deaths(&p).is_empty());
        let mut p = pod(oom_killed("2026-11-24T10:00:00Z"));
        p.status = None;
        assert!(deaths(&p).is_empty());
    }

    #[test]
    fn an_eviction_for_the_dev_shm_volume_is_one_death_keyed_by_its_pod() {
        let evicted: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": UID},
            "spec": {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                     "containers": [{"name": "trainer",
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]},
            "status": {"phase": "Failed", "reason": "Evicted",
                "message": "Usage of EmptyDir volume \"dshm\" exceeds the limit \"1Gi\". ",
                "conditions": [{"type": "Ready", "status": "False",
                                "lastTransitionTime": "2026-11-24T10:00:03Z"}]}
        }))
        .unwrap();
        let found = deaths(&evicted);
        assert_eq!(found.len(), 1);
        let (key, d) = &found[0];
        assert_eq!(
            key,
            &DeathKey {
                pod_uid: UID.into(),
                container: "trainer".into(),
                instance: crate::kube::evicted::EVICTION.into(),
            }
        );
        assert_eq!(d.kind, FindingKind::ShmEvicted);
        // Told once.
        let mut exits = Exits::new(at("2026-11-24T09:00:00Z"));
        assert_eq!(exits.observe(&evicted, at("2026-11-24T10:00:05Z")).len(), 1);
        assert!(exits
            .observe(&evicted, at("2026-11-24T10:00:10Z"))
            .is_empty());
    }
}

//! Kubernetes Events (`events.k8s.io/v1`) for what a scan found.
//!
//! [`EventPlanner`] is pure: each scan's snapshot in, the Events to publish out. A condition
//! (one reason on one subject: a Pod, or the Node for one GPU finding) gets one Event when it
//! begins; while it lasts, a heartbeat updates that Event's series; when it ends it is forgotten,
//! so a recurrence is a new Event. Levels are separate reasons (ShmNearlyFull, ShmExhausted;
//! GpuLinkDegraded, GpuLinkDown), so a change of severity is a new Event too.
//!
//! [`EventQueue`] carries them to a task that publishes them: a bounded queue (what does not fit
//! is dropped and counted), a rate limit, retries with backoff while the API server is away.
//! kube's `Recorder` is not used: its series key ignores the note and has no place for the GPU a
//! Node Event is about, so two GPUs failing on one node would collapse into one series that keeps
//! the first GPU's note. Names are fixed per occurrence, so a create retried after a lost answer
//! meets 409 Conflict instead of making a duplicate.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::pods::PodIndex;
use crate::findings::on_runtime_default;
use crate::units::human_bytes;
use crate::gpu::pairs::{KIND_GPU_LOST, KIND_LINK_DOWN, KIND_LINK_ERRORS, KIND_PAIR_DEGRADED};
use crate::metrics::Metrics;
use crate::snapshot::{ShmReading, ShmStatus, Snapshot};

pub const SHM_NEARLY_FULL: &str = "ShmNearlyFull";
pub const SHM_EXHAUSTED: &str = "ShmExhausted";
pub const SHM_RUNTIME_DEFAULT: &str = "ShmRuntimeDefault";
pub const GPU_LINK_DEGRADED: &str = "GpuLinkDegraded";
pub const GPU_LINK_DOWN: &str = "GpuLinkDown";
pub const GPU_LINK_ERRORS: &str = "GpuLinkErrors";
pub const GPU_LINK_RECOVERED: &str = "GpuLinkRecovered";
pub const GPU_XID: &str = "GpuXid";

/// The Events API's limit on a note.
const NOTE_MAX: usize = 1024;
/// How long after its last increase an XID stays one condition (one Event series).
const XID_LASTS: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// One Event to create, or the next occurrence of one already created (same `id`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventSpec {
    /// One occurrence of one condition; its heartbeats share it.
    pub id: u64,
    /// The Event's object name, fixed for the occurrence.
    pub name: String,
    pub regarding: ObjectReference,
    pub reason: &'static str,
    pub type_: EventType,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventMsg {
    Publish(Box<EventSpec>),
    /// The condition is over: its Event will not be updated again.
    Ended(u64),
}

pub use super::podresources::GpuHolders;

/// (subject, reason, what about): e.g. ("pod/<uid>", ShmExhausted, "") or ("node", GpuLinkDown, "GPU 7").
type ConditionKey = (String, &'static str, String);

struct Active {
    id: u64,
    name: String,
    last_sent: Instant,
}

/// Turns snapshots into Events; keeps which conditions are active.
pub struct EventPlanner {
    node: String,
    heartbeat: Duration,
    /// Distinguishes this agent's Event names from an earlier run's on the same node.
    run: u64,
    next_id: u64,
    active: HashMap<ConditionKey, Active>,
    xids: BTreeMap<(u32, u64), (u64, Instant)>,
}

/// A condition seen in this scan.
struct Condition {
    key: ConditionKey,
    regarding: ObjectReference,
    type_: EventType,
    note: String,
    /// It happened again since the last scan (an XID counted again): update the series now.
    again: bool,
}

impl EventPlanner {
    /// `heartbeat`: how often a lasting condition's series is updated.
    pub fn new(node: &str, heartbeat: Duration) -> EventPlanner {
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        EventPlanner {
            node: node.to_string(),
            heartbeat,
            run,
            next_id: 0,
            active: HashMap::new(),
            xids: BTreeMap::new(),
        }
    }

    pub fn node_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            ..ObjectReference::default()
        }
    }

    /// The Events this snapshot calls for. `pods`: None until the pod cache has synced (no Pod
    /// Events then: they need the Pod's name).
    pub fn plan(
        &mut self,
        snapshot: &Snapshot,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
        now: Instant,
    ) -> Vec<EventMsg> {
        let mut conditions = Vec::new();
        if let Some(pods) = pods {
            self.shm_conditions(snapshot, pods, &mut conditions);
        }
        self.gpu_conditions(snapshot, pods, holders, &mut conditions);
        self.xid_conditions(snapshot, pods, holders, now, &mut conditions);

        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for c in conditions {
            if !seen.insert(c.key.clone()) {
                continue;
            }
            let reason = c.key.1;
            let (id, name) = match self.active.get_mut(&c.key) {
                Some(a) if !c.again && now.duration_since(a.last_sent) < self.heartbeat => continue,
                Some(a) => {
                    a.last_sent = now;
                    (a.id, a.name.clone())
                }
                None => {
                    let (id, name) = self.new_occurrence(&c.regarding);
                    let active = Active {
                        id,
                        name: name.clone(),
                        last_sent: now,
                    };
                    self.active.insert(c.key.clone(), active);
                    (id, name)
                }
            };
            out.push(EventMsg::Publish(Box::new(EventSpec {
                id,
                name,
                regarding: c.regarding,
                reason,
                type_: c.type_,
                note: truncate(c.note),
            })));
        }

        // Conditions that ended: forget them; a GPU one that left nothing behind on its subject
        // is a recovery.
        let ended: Vec<ConditionKey> = self
            .active
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in ended {
            let Some(a) = self.active.remove(&key) else {
                continue;
            };
            out.push(EventMsg::Ended(a.id));
            let (subject, reason, about) = &key;
            let gpu_reason = [GPU_LINK_DEGRADED, GPU_LINK_DOWN].contains(reason);
            let still = seen.iter().any(|(s, r, ab)| {
                s == subject && ab == about && [GPU_LINK_DEGRADED, GPU_LINK_DOWN].contains(r)
            });
            if gpu_reason && !still {
                if let Some(regarding) = self.regarding_of(subject, pods) {
                    let (id, name) = self.new_occurrence(&regarding);
                    out.push(EventMsg::Publish(Box::new(EventSpec {
                        id,
                        name,
                        regarding,
                        reason: GPU_LINK_RECOVERED,
                        type_: EventType::Normal,
                        note: format!("{about}: GPU links healthy again"),
                    })));
                    out.push(EventMsg::Ended(id));
                }
            }
        }
        out
    }

    fn new_occurrence(&mut self, regarding: &ObjectReference) -> (u64, String) {
        self.next_id += 1;
        let base = regarding.name.as_deref().unwrap_or("shmlink");
        (
            self.next_id,
            format!("{base}.shmlink.{:x}.{:x}", self.run, self.next_id),
        )
    }

    fn regarding_of(&self, subject: &str, pods: Option<&PodIndex>) -> Option<ObjectReference> {
        if subject == "node" {
            return Some(self.node_ref());
        }
        let uid = subject.strip_prefix("pod/")?;
        pods?
            .by_uid(uid)
            .map(|m| pod_ref(&m.namespace, &m.name, &m.uid))
    }

    fn shm_conditions(&self, snapshot: &Snapshot, pods: &PodIndex, out: &mut Vec<Condition>) {
        // Worst first, so the note of a pod's condition names its fullest container.
        let mut readings: Vec<&ShmReading> = snapshot.shm.iter().collect();
        readings.sort_by(|a, b| {
            b.fullness()
                .unwrap_or(0.0)
                .total_cmp(&a.fullness().unwrap_or(0.0))
        });
        for r in readings {
            let Some(meta) = r.pod_uid.as_deref().and_then(|u| pods.by_uid(u)) else {
                continue;
            };
            let regarding = pod_ref(&meta.namespace, &meta.name, &meta.uid);
            let subject = format!("pod/{}", meta.uid);
            let reason = match r.status {
                ShmStatus::Warning => Some(SHM_NEARLY_FULL),
                ShmStatus::Critical => Some(SHM_EXHAUSTED),
                ShmStatus::Ok => None,
            };
            if let Some(reason) = reason {
                out.push(Condition {
                    key: (subject.clone(), reason, String::new()),
                    regarding: regarding.clone(),
                    type_: EventType::Warning,
                    note: shm_note(r),
                    again: false,
                });
            }
            if meta.requests_gpu && on_runtime_default(r) {
                out.push(Condition {
                    key: (subject, SHM_RUNTIME_DEFAULT, String::new()),
                    regarding,
                    type_: EventType::Warning,
                    note: runtime_default_note(r),
                    again: false,
                });
            }
        }
    }

    fn gpu_conditions(
        &self,
        snapshot: &Snapshot,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
        out: &mut Vec<Condition>,
    ) {
        for f in &snapshot.findings {
            let reason = match f.kind {
                k if k == KIND_PAIR_DEGRADED => GPU_LINK_DEGRADED,
                k if k == KIND_LINK_DOWN || k == KIND_GPU_LOST => GPU_LINK_DOWN,
                k if k == KIND_LINK_ERRORS => GPU_LINK_ERRORS,
                _ => continue,
            };
            let gpus = gpus_of_subject(&f.subject, snapshot.gpus.len() as u32);
            for (subject, regarding) in self.subjects(snapshot, &gpus, pods, holders) {
                out.push(Condition {
                    key: (subject, reason, f.subject.clone()),
                    regarding,
                    type_: EventType::Warning,
                    note: f.message.clone(),
                    again: false,
                });
            }
        }
    }

    fn xid_conditions(
        &mut self,
        snapshot: &Snapshot,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
        now: Instant,
        out: &mut Vec<Condition>,
    ) {
        for x in &snapshot.xids {
            let seen = self.xids.entry((x.gpu, x.xid)).or_insert((0, now));
            let again = seen.0 > 0 && x.count > seen.0;
            if x.count > seen.0 {
                *seen = (x.count, now);
            }
            if now.duration_since(seen.1) >= XID_LASTS {
                continue;
            }
            let count = seen.0;
            let about = format!("GPU {} XID {}", x.gpu, x.xid);
            let note = format!(
                "XID {} on GPU {} ({count} since the agent started): see NVIDIA's XID catalogue; \
                 XIDs 48, 63, 64, 74, 79, 92, 94, 95 usually need the GPU reset or the node drained.",
                x.xid, x.gpu
            );
            for (subject, regarding) in self.subjects(snapshot, &[x.gpu], pods, holders) {
                out.push(Condition {
                    key: (subject, GPU_XID, about.clone()),
                    regarding,
                    type_: EventType::Warning,
                    note: note.clone(),
                    again,
                });
            }
        }
    }

    /// The Node, and each Pod that holds one of `gpus`.
    fn subjects(
        &self,
        snapshot: &Snapshot,
        gpus: &[u32],
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
    ) -> Vec<(String, ObjectReference)> {
        let mut out = vec![("node".to_string(), self.node_ref())];
        let Some(pods) = pods else { return out };
        let mut uids = HashSet::new();
        for g in gpus {
            let Some(uuid) = snapshot
                .gpus
                .iter()
                .find(|r| r.index == *g)
                .map(|r| &r.uuid)
            else {
                continue;
            };
            // Device plugins name GPUs by UUID, or by index.
            let held_by = holders
                .get(uuid)
                .into_iter()
                .chain(holders.get(&g.to_string()));
            for (ns, name) in held_by.flatten() {
                if let Some(meta) = pods.by_name(ns, name) {
                    if uids.insert(meta.uid.clone()) {
                        out.push((
                            format!("pod/{}", meta.uid),
                            pod_ref(&meta.namespace, &meta.name, &meta.uid),
                        ));
                    }
                }
            }
        }
        out
    }
}

/// The GPUs a GPU finding is about, from its subject: `GPU 7`, `GPU 0 <-> GPU 7`, `all GPUs`.
pub fn gpus_of_subject(subject: &str, gpu_count: u32) -> Vec<u32> {
    if subject == "all GPUs" {
        return (0..gpu_count).collect();
    }
    subject
        .split("<->")
        .filter_map(|part| part.trim().strip_prefix("GPU ")?.trim().parse().ok())
        .collect()
}

pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

fn shm_note(r: &ShmReading) -> String {
    let bytes = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), human_bytes);
    let container = r.container.as_deref().unwrap_or(&r.container_id);
    let pct = r.fullness().map_or(0.0, |f| f * 100.0);
    let effective = r.used_bytes.zip(r.available_bytes).map(|(u, a)| u + a);
    let size = r
        .size_bytes
        .map_or_else(|| "unlimited".to_string(), human_bytes);
    let memory = r
        .memory_limit_bytes
        .map_or_else(|| "none".to_string(), human_bytes);
    format!(
        "/dev/shm of container {container} is {pct:.0}% full: {} used of an effective {} \
         (tmpfs size {size}, memory limit {memory}; effective = used + min(tmpfs free, memory \
         headroom)). Fix: mount an emptyDir with medium: Memory and a larger sizeLimit at \
         /dev/shm; tmpfs pages count against the container's memory limit, so raise that limit \
         by as much.",
        bytes(r.used_bytes),
        bytes(effective),
    )
}

fn runtime_default_note(r: &ShmReading) -> String {
    let container = r.container.as_deref().unwrap_or(&r.container_id);
    format!(
        "Container {container} requests GPUs but runs on the container runtime's default 64 MiB \
         /dev/shm: PyTorch DataLoader workers and NCCL fail with bus errors once it fills. Add to \
         the pod spec:\n\
         volumes:\n- name: dshm\n  emptyDir:\n    medium: Memory\n    sizeLimit: 8Gi\n\
         and to the container:\n\
         volumeMounts:\n- name: dshm\n  mountPath: /dev/shm\n\
         (tmpfs pages count against the memory limit: raise it by the sizeLimit)."
    )
}

fn truncate(mut note: String) -> String {
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// The scan thread's end of the queue to the publishing task.
#[derive(Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<EventMsg>,
    metrics: Arc<Metrics>,
}

impl EventQueue {
    /// Queues without waiting; what does not fit is dropped and counted.
    pub fn send(&self, msgs: Vec<EventMsg>) {
        for msg in msgs {
            if self.tx.try_send(msg).is_err() {
                self.metrics.kube_events_dropped.inc();
            }
        }
    }
}

/// Settings of the publishing task.
#[derive(Debug, Clone, Copy)]
pub struct PublishSettings {
    pub capacity: usize,
    /// At least this long between two API calls.
    pub min_gap: Duration,
    pub backoff_start: Duration,
    pub backoff_max: Duration,
    /// One API call that takes longer is abandoned and retried: a hung API server must not
    /// hold the queue for the client's own read timeout (minutes).
    pub request_timeout: Duration,
}

impl Default for PublishSettings {
    fn default() -> Self {
        PublishSettings {
            capacity: 512,
            min_gap: Duration::from_millis(50),
            backoff_start: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Starts the task that publishes queued Events; it ends when every [`EventQueue`] is dropped.
pub fn spawn_publisher(
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    settings: PublishSettings,
    runtime: &tokio::runtime::Handle,
) -> EventQueue {
    let (tx, rx) = mpsc::channel(settings.capacity);
    runtime.spawn(publish_loop(client, node, metrics.clone(), settings, rx));
    EventQueue { tx, metrics }
}

/// An Event created, and how many times it has been seen.
struct Created {
    namespace: String,
    name: String,
    count: i32,
}

enum Outcome {
    Done,
    /// Will not succeed by retrying (forbidden, invalid): dropped.
    Rejected(kube::Error),
    Retry(String),
}

async fn publish_loop(
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    settings: PublishSettings,
    mut rx: mpsc::Receiver<EventMsg>,
) {
    let mut created: HashMap<u64, Created> = HashMap::new();
    let mut node_uid: Option<String> = None;
    let mut failing = false;
    while let Some(msg) = rx.recv().await {
        let spec = match msg {
            EventMsg::Ended(id) => {
                created.remove(&id);
                continue;
            }
            EventMsg::Publish(spec) => spec,
        };
        let mut backoff = settings.backoff_start;
        loop {
            if node_uid.is_none() && spec.regarding.kind.as_deref() == Some("Node") {
                let nodes = Api::<Node>::all(client.clone());
                let get = nodes.get_opt(&node);
                node_uid = tokio::time::timeout(settings.request_timeout, get)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
                    .and_then(|n| n.metadata.uid);
            }
            let publish = publish_one(&client, &node, node_uid.as_deref(), &spec, &mut created);
            let outcome = tokio::time::timeout(settings.request_timeout, publish)
                .await
                .unwrap_or_else(|_| {
                    Outcome::Retry(format!(
                        "no answer from the API server within {:?}",
                        settings.request_timeout
                    ))
                });
            match outcome {
                Outcome::Done => {
                    if failing {
                        tracing::info!("publishing Events again");
                        failing = false;
                    }
                    metrics.count_kube_event(spec.reason);
                    break;
                }
                Outcome::Rejected(e) => {
                    tracing::warn!(reason = spec.reason, "Event rejected, dropped: {e}");
                    metrics.kube_events_dropped.inc();
                    break;
                }
                Outcome::Retry(e) => {
                    if !failing {
                        tracing::warn!("publishing Events failed, retrying with backoff: {e}");
                        failing = true;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(settings.backoff_max);
                }
            }
        }
        tokio::time::sleep(settings.min_gap).await;
    }
}

async fn publish_one(
    client: &Client,
    node: &str,
    node_uid: Option<&str>,
    spec: &EventSpec,
    created: &mut HashMap<u64, Created>,
) -> Outcome {
    let now = MicroTime(Timestamp::now());
    if let Some(c) = created.get_mut(&spec.id) {
        let api: Api<K8sEvent> = Api::namespaced(client.clone(), &c.namespace);
        let series = EventSeries {
            count: c.count + 1,
            last_observed_time: now,
        };
        let patch = serde_json::json!({ "series": series });
        return match api
            .patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                c.count += 1;
                Outcome::Done
            }
            // Expired (Events live an hour by default): the next occurrence starts anew.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                created.remove(&spec.id);
                Outcome::Done
            }
            Err(e) => classify(e),
        };
    }
    let mut regarding = spec.regarding.clone();
    if regarding.kind.as_deref() == Some("Node") && regarding.uid.is_none() {
        regarding.uid = node_uid.map(str::to_string);
    }
    // Node Events live in `default`, as the kubelet's do.
    let namespace = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(now),
        action: Some("Scan".into()),
        reason: Some(spec.reason.into()),
        note: Some(spec.note.clone()),
        regarding: Some(regarding),
        reporting_controller: Some("shmlink".into()),
        reporting_instance: Some(node.into()),
        type_: Some(
            match spec.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        ..K8sEvent::default()
    };
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), &event).await {
        // 409: an earlier try was created though its answer was lost.
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return classify(e),
    }
    created.insert(
        spec.id,
        Created {
            namespace,
            name: spec.name.clone(),
            count: 1,
        },
    );
    Outcome::Done
}

fn classify(e: kube::Error) -> Outcome {
    match &e {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => Outcome::Retry(e.to_string()),
        kube::Error::Api(_) => Outcome::Rejected(e),
        _ => Outcome::Retry(e.to_string()),
    }
}

#[cfg(test)]
mod tests;

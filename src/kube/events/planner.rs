//! Pure: findings -> Events. Keeps which conditions are active, so a lasting condition is one
//! Event with a series, not one Event per scan.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;

use super::{pod_ref, EventIds, EventMsg, EventSpec, EventType, GpuHolders};
use crate::kube::pods::PodIndex;
use crate::model::Snapshot;
use crate::model::{cut, Failure};
use crate::model::{EventReason, Finding, Subject};
use crate::text;

/// The Events API's limit on a note.
pub(super) const NOTE_MAX: usize = 1024;
/// How long a workload failure's series stays open after its last repeat: a Pod that fails the
/// same way on every restart (CrashLoopBackOff backs off up to 5 minutes) keeps one series.
pub const FAILURE_LASTS: Duration = Duration::from_secs(3600);

/// Who an Event regards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Node,
    /// By UID.
    Pod(String),
}

/// (who, reason, what about): e.g. (Pod <uid>, ShmExhausted, None) or (Node, GpuLinkDown,
/// GPU 7). A Pod's /dev/shm conditions are one per Pod, whichever container is fullest.
type ConditionKey = (Target, EventReason, Option<Subject>);

struct Active {
    id: u64,
    name: String,
    last_sent: Instant,
}

/// A condition seen in this scan.
struct Condition {
    key: ConditionKey,
    regarding: ObjectReference,
    note: String,
    /// It happened again since the last scan (an XID counted again): update the series now.
    again: bool,
}

/// Turns snapshots into Events; keeps which conditions are active.
pub struct EventPlanner {
    node: String,
    heartbeat: Duration,
    /// Each occurrence's ID and name, shared with the agent's other sources of Events.
    ids: EventIds,
    active: HashMap<ConditionKey, Active>,
    /// The last count of each (GPU, XID), to tell a repeat.
    xid_counts: HashMap<(u32, u64), u64>,
    /// Workload failures: told once, not lasting; a repeat within [`FAILURE_LASTS`] updates
    /// the series at once.
    failures: HashMap<ConditionKey, Series>,
}

/// A workload failure's open Event series.
struct Series {
    id: u64,
    name: String,
    regarding: ObjectReference,
    note: String,
    /// The occurrences it counts: one per failure told.
    count: i32,
    last_sent: Instant,
    /// The same moment on the wall clock, which a restart can carry over.
    last_wall: SystemTime,
}

/// A workload failure's open Event series as the state store keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpenSeries {
    pub name: String,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub reason: String,
    pub note: String,
    /// The series count assigned: the failures told on it.
    pub count: i32,
    pub last_sent: SystemTime,
}

impl EventPlanner {
    /// `heartbeat`: how often a lasting condition's series is updated. Its IDs are a new
    /// run's; [`EventPlanner::ids`] lends them to the agent's other sources of Events.
    pub fn new(node: &str, heartbeat: Duration) -> EventPlanner {
        EventPlanner {
            node: node.to_string(),
            heartbeat,
            ids: EventIds::new(),
            active: HashMap::new(),
            xid_counts: HashMap::new(),
            failures: HashMap::new(),
        }
    }

    /// The one allocator of this run's Event IDs and names (shared, not copied).
    pub fn ids(&self) -> EventIds {
        self.ids.clone()
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
        let conditions = self.conditions(snapshot, pods, holders);
        let mut out = Vec::new();
        let seen = self.publish_conditions(conditions, now, &mut out);
        self.end_conditions(&seen, pods, &mut out);
        self.expire_failures(now, &mut out);
        out
    }

    /// An Event for each condition not yet published, or published more than a heartbeat ago
    /// (or wanting to be told again); the conditions seen, each once.
    fn publish_conditions(
        &mut self,
        conditions: Vec<Condition>,
        now: Instant,
        out: &mut Vec<EventMsg>,
    ) -> HashSet<ConditionKey> {
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
                type_: EventType::Warning,
                note: truncate(c.note),
            })));
        }
        seen
    }

    /// Conditions that ended: forget them; a GPU link one that left no other behind on its
    /// subject is a recovery.
    fn end_conditions(
        &mut self,
        seen: &HashSet<ConditionKey>,
        pods: Option<&PodIndex>,
        out: &mut Vec<EventMsg>,
    ) {
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
            let (target, reason, about) = &key;
            let still = seen
                .iter()
                .any(|(t, r, ab)| t == target && ab == about && r.is_link_failure());
            let Some(about) = about
                .as_ref()
                .filter(|_| reason.is_link_failure() && !still)
            else {
                continue;
            };
            if let Some(regarding) = self.regarding_of(target, pods) {
                let (id, name) = self.new_occurrence(&regarding);
                out.push(EventMsg::Publish(Box::new(EventSpec {
                    id,
                    name,
                    regarding,
                    reason: EventReason::GpuLinkRecovered,
                    type_: EventType::Normal,
                    note: text::gpu_links_recovered(&about.to_string()),
                })));
                out.push(EventMsg::Ended(id));
            }
        }
    }

    /// The Events for workload failures as they are told (between scans): each on its Pod, a
    /// repeat on the same Pod with the same reason updates that Event's series.
    pub fn plan_failures(&mut self, failures: &[Failure], now: Instant) -> Vec<EventMsg> {
        let mut out = Vec::new();
        self.expire_failures(now, &mut out);
        let wall = SystemTime::now();
        for f in failures {
            let Some(reason) = f.kind.event_reason() else {
                continue;
            };
            // The Pod was resolved where the failure was made (`failures::correlate`).
            let (Some(namespace), Some(name), Some(uid)) = (
                f.placed.namespace.as_deref(),
                f.placed.pod.as_deref(),
                f.placed.pod_uid.as_deref(),
            ) else {
                // No Pod to regard: a plain Docker container, or a process not placed.
                continue;
            };
            let regarding = pod_ref(namespace, name, uid);
            let key = (Target::Pod(uid.to_string()), reason, None);
            let note = truncate(f.message.clone());
            let series = match self.failures.get_mut(&key) {
                Some(s) => {
                    s.count = s.count.saturating_add(1);
                    s.note = note;
                    s.regarding = regarding;
                    s
                }
                None => {
                    let (id, name) = self.new_occurrence(&regarding);
                    let s = Series {
                        id,
                        name,
                        regarding,
                        note,
                        count: 1,
                        last_sent: now,
                        last_wall: wall,
                    };
                    self.failures.entry(key).or_insert(s)
                }
            };
            series.last_sent = now;
            series.last_wall = wall;
            out.push(EventMsg::Publish(Box::new(series.spec(reason))));
        }
        out
    }

    fn expire_failures(&mut self, now: Instant, out: &mut Vec<EventMsg>) {
        self.failures.retain(|_, a| {
            let open = now.duration_since(a.last_sent) < FAILURE_LASTS;
            if !open {
                out.push(EventMsg::Ended(a.id));
            }
            open
        });
    }

    /// Every finding that is an Event, on each object it regards.
    fn conditions(
        &mut self,
        snapshot: &Snapshot,
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
    ) -> Vec<Condition> {
        // Fullest container first, so the note of a Pod's condition names its fullest container.
        let fullness: HashMap<&str, f64> = snapshot
            .shm
            .iter()
            .map(|r| (r.container_id.as_str(), r.fullness().unwrap_or(0.0)))
            .collect();
        let fullness_of = |f: &Finding| match &f.subject {
            Subject::Container(c) => fullness.get(c.id_or_empty()).copied(),
            _ => None,
        };
        let mut findings: Vec<(f64, &Finding)> = snapshot
            .findings
            .iter()
            .map(|f| (fullness_of(f).unwrap_or(0.0), f))
            .collect();
        findings.sort_by(|a, b| b.0.total_cmp(&a.0));

        let mut out = Vec::new();
        for (_, f) in findings {
            let Some(reason) = f.kind.event_reason() else {
                continue;
            };
            match &f.subject {
                Subject::Container(c) => {
                    let Some(meta) = pods
                        .zip(c.pod_uid.as_deref())
                        .and_then(|(p, u)| p.by_uid(u))
                    else {
                        continue;
                    };
                    out.push(Condition {
                        key: (Target::Pod(meta.uid.clone()), reason, None),
                        regarding: pod_ref(&meta.namespace, &meta.name, &meta.uid),
                        note: f.message.clone(),
                        again: false,
                    });
                }
                subject => {
                    let again = match subject {
                        Subject::Xid { gpu, xid } => self.xid_again(snapshot, *gpu, *xid),
                        _ => false,
                    };
                    let gpus = subject.gpus(snapshot.gpus.iter().map(|g| g.index));
                    for (target, regarding) in self.targets(snapshot, &gpus, pods, holders) {
                        out.push(Condition {
                            key: (target, reason, Some(subject.clone())),
                            regarding,
                            note: f.message.clone(),
                            again,
                        });
                    }
                }
            }
        }
        out
    }

    /// Whether this XID was counted again since the last scan.
    fn xid_again(&mut self, snapshot: &Snapshot, gpu: u32, xid: u64) -> bool {
        let count = snapshot
            .xids
            .iter()
            .find(|x| x.gpu == Some(gpu) && x.xid == xid)
            .map_or(0, |x| x.count);
        let last = self.xid_counts.entry((gpu, xid)).or_insert(0);
        let again = *last > 0 && count > *last;
        *last = (*last).max(count);
        again
    }

    /// The open failure series, for the state store (with the failures told on them).
    pub fn open_series(&self) -> Vec<OpenSeries> {
        let mut out: Vec<OpenSeries> = self
            .failures
            .iter()
            .map(|((_, reason, _), s)| OpenSeries {
                name: s.name.clone(),
                namespace: s.regarding.namespace.clone().unwrap_or_default(),
                pod: s.regarding.name.clone().unwrap_or_default(),
                uid: s.regarding.uid.clone().unwrap_or_default(),
                reason: reason.as_str().to_string(),
                note: s.note.clone(),
                count: s.count,
                last_sent: s.last_wall,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Goes on with the series a stored run left open (`wall`/`now`: the same moment on both
    /// clocks): a failure on the same Pod with the same reason updates that Event. Returns what
    /// the API server may not have yet: each series whose assigned count exceeds the count
    /// it confirmed (`confirmed`, by Event name), to be sent again idempotently.
    pub fn resume_failures(
        &mut self,
        saved: Vec<OpenSeries>,
        confirmed: &HashMap<String, i32>,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<Resend> {
        let mut out = Vec::new();
        for o in saved {
            let Some(reason) = EventReason::from_name(&o.reason) else {
                continue;
            };
            let age = wall.duration_since(o.last_sent).unwrap_or_default();
            let series = Series {
                id: self.ids.id(),
                name: o.name,
                regarding: pod_ref(&o.namespace, &o.pod, &o.uid),
                note: o.note,
                count: o.count.max(1),
                last_sent: now.checked_sub(age).unwrap_or(now),
                last_wall: o.last_sent,
            };
            let done = confirmed.get(&series.name).copied().unwrap_or(0);
            if series.count > done {
                out.push(Resend {
                    spec: series.spec(reason),
                    assigned: series.count,
                    confirmed: done,
                });
            }
            // Past its time the series is not gone on with (its Event, if owed, is still sent).
            if age < FAILURE_LASTS {
                self.failures
                    .insert((Target::Pod(o.uid), reason, None), series);
            }
        }
        out
    }

    fn new_occurrence(&mut self, regarding: &ObjectReference) -> (u64, String) {
        self.ids.occurrence(regarding)
    }

    fn regarding_of(&self, target: &Target, pods: Option<&PodIndex>) -> Option<ObjectReference> {
        match target {
            Target::Node => Some(self.node_ref()),
            Target::Pod(uid) => pods?
                .by_uid(uid)
                .map(|m| pod_ref(&m.namespace, &m.name, &m.uid)),
        }
    }

    /// The Node, and each Pod that holds one of `gpus`.
    fn targets(
        &self,
        snapshot: &Snapshot,
        gpus: &[u32],
        pods: Option<&PodIndex>,
        holders: &GpuHolders,
    ) -> Vec<(Target, ObjectReference)> {
        let mut out = vec![(Target::Node, self.node_ref())];
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
                            Target::Pod(meta.uid.clone()),
                            pod_ref(&meta.namespace, &meta.name, &meta.uid),
                        ));
                    }
                }
            }
        }
        out
    }
}

/// A stored series' Event to send again: created with its whole count (or that count set, when
/// it exists), never counting a failure twice.
#[derive(Debug, Clone, PartialEq)]
pub struct Resend {
    pub spec: EventSpec,
    /// The series count assigned.
    pub assigned: i32,
    /// The count the API server confirmed (0: its creation was not confirmed).
    pub confirmed: i32,
}

impl Series {
    fn spec(&self, reason: EventReason) -> EventSpec {
        EventSpec {
            id: self.id,
            name: self.name.clone(),
            regarding: self.regarding.clone(),
            reason,
            type_: EventType::Warning,
            note: self.note.clone(),
        }
    }
}

pub(super) fn truncate(note: String) -> String {
    if note.len() > NOTE_MAX {
        cut(&note, NOTE_MAX - 3) + "..."
    } else {
        note
    }
}

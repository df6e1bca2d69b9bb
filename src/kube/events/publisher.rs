//! The publishing task: what the scan thread sends waits in [`Pending`] (repeats merged, taken
//! round robin by the object an Event regards, bounded); the task takes one call at a time,
//! rate-limited, retried with backoff while the API server is away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::Notify;

use super::pending::{Call, CallKind, Finished, Pending};
use super::planner::{Resend, FAILURE_LASTS};
use super::{EventMsg, EventType, CONFIRMED_KEY};
use crate::metrics::Metrics;
use crate::state::StoreSender;

/// What the queues and the task share.
struct Shared {
    pending: Mutex<Pending>,
    /// Something was sent, or the last queue was dropped.
    wake: Notify,
    /// With a state store: the series counts the API server confirmed, kept there.
    kept: Mutex<Option<Confirmed>>,
}

/// The series count each failure Event has on the API server as far as its answers said, by
/// name, and when (forgotten some time after a failure series would have ended).
struct Confirmed {
    store: StoreSender,
    counts: HashMap<String, (i32, Instant)>,
    /// The failure Events' names (only theirs are kept: a condition's Event is not resumed).
    wanted: HashMap<String, Instant>,
}

impl Confirmed {
    fn want<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let now = Instant::now();
        for name in names {
            self.wanted.insert(name.to_string(), now);
        }
        self.wanted
            .retain(|_, at| now.duration_since(*at) < FAILURE_LASTS * 2);
    }

    /// A call's answer: the count it set, put to the store (coalesced there).
    fn note(&mut self, call: &Call, finished: &Finished) {
        if !self.wanted.contains_key(&call.spec.name) {
            return;
        }
        let count = match (&call.kind, finished) {
            (CallKind::Create { count }, Finished::Created { .. }) => *count,
            (CallKind::Update { count, .. }, Finished::Updated) => *count,
            (_, Finished::Gone) => {
                self.counts.remove(&call.spec.name);
                return;
            }
            _ => return,
        };
        let now = Instant::now();
        self.counts.insert(call.spec.name.clone(), (count, now));
        self.counts
            .retain(|_, (_, at)| now.duration_since(*at) < FAILURE_LASTS * 2);
        let kept: HashMap<&str, i32> = self
            .counts
            .iter()
            .map(|(name, (n, _))| (name.as_str(), *n))
            .collect();
        self.store.put(
            CONFIRMED_KEY,
            serde_json::to_value(kept).unwrap_or_default(),
        );
    }
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        // Every change to `Pending` is whole before it can panic; what a panic left is usable.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Held by every clone of one [`EventQueue`]: when the last goes, the task is told to end.
struct Sender(Arc<Shared>);

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.pending().close();
        self.0.wake.notify_one();
    }
}

/// The scan thread's end of the queue to the publishing task.
#[derive(Clone)]
pub struct EventQueue {
    sender: Arc<Sender>,
    metrics: Arc<Metrics>,
}

impl EventQueue {
    /// Queues without waiting on the API server (a short lock shared with the task); what does
    /// not fit is dropped and counted, an `Ended` never.
    pub fn send(&self, msgs: Vec<EventMsg>) {
        if msgs.is_empty() {
            return;
        }
        let shared = &self.sender.0;
        let mut dropped = 0;
        {
            let mut pending = shared.pending();
            for msg in msgs {
                if pending.push(msg).dropped() {
                    dropped += 1;
                }
            }
        }
        self.metrics.kube_events_dropped.inc_by(dropped as u64);
        shared.wake.notify_one();
    }

    /// Keeps the counts the API server confirms in the state store, starting from those it
    /// held (`confirmed`, by Event name).
    pub fn keep_confirmed(&self, store: StoreSender, confirmed: &HashMap<String, i32>) {
        let now = Instant::now();
        let counts = confirmed
            .iter()
            .map(|(name, n)| (name.clone(), (*n, now)))
            .collect();
        let wanted = confirmed.keys().map(|n| (n.clone(), now)).collect();
        *lock(&self.sender.0.kept) = Some(Confirmed {
            store,
            counts,
            wanted,
        });
    }

    /// [`EventQueue::send`] for failure Events: the counts the API server confirms of them are
    /// kept (with a store).
    pub fn send_kept(&self, msgs: Vec<EventMsg>) {
        if let Some(kept) = lock(&self.sender.0.kept).as_mut() {
            kept.want(msgs.iter().filter_map(|m| match m {
                EventMsg::Publish(spec) => Some(spec.name.as_str()),
                EventMsg::Ended(_) => None,
            }));
        }
        self.send(msgs);
    }

    /// Stored series whose Events the API server may not have: sent again, idempotently.
    pub fn resend(&self, resend: Vec<Resend>) {
        if resend.is_empty() {
            return;
        }
        let shared = &self.sender.0;
        if let Some(kept) = lock(&shared.kept).as_mut() {
            kept.want(resend.iter().map(|r| r.spec.name.as_str()));
        }
        {
            let mut pending = shared.pending();
            for r in resend {
                if pending.resume(r.spec, r.assigned, r.confirmed).dropped() {
                    self.metrics.kube_events_dropped.inc();
                }
            }
        }
        shared.wake.notify_one();
    }

    /// Events remembered for their series (created and not yet ended), for tests.
    #[doc(hidden)]
    pub fn remembered(&self) -> usize {
        self.sender.0.pending().created_len()
    }
}

/// Settings of the publishing task.
#[derive(Debug, Clone, Copy)]
pub struct PublishSettings {
    /// At most this many distinct Events waiting; repeats of one take no more room.
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
            // Distinct conditions, not messages: repeats merge. A burst (the agent starting on
            // a node of 250 Pods, several failing in several ways, or a GPU fault regarding
            // every Pod holding it) must not lose first Events. An entry is at most ~1.5 KiB
            // (the note is cut at 1 KiB): ~6 MiB in the worst case, when all are waiting.
            capacity: 4096,
            min_gap: Duration::from_millis(50),
            backoff_start: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Starts the task that publishes queued Events; it ends when every [`EventQueue`] is dropped
/// and what they sent is published.
pub fn spawn_publisher(
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    settings: PublishSettings,
    runtime: &tokio::runtime::Handle,
) -> EventQueue {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::new(settings.capacity)),
        wake: Notify::new(),
        kept: Mutex::new(None),
    });
    runtime.spawn(publish_loop(
        client,
        node,
        metrics.clone(),
        settings,
        shared.clone(),
    ));
    EventQueue {
        sender: Arc::new(Sender(shared)),
        metrics,
    }
}

enum Outcome {
    Done(Finished),
    /// Will not succeed by retrying (forbidden, invalid): dropped.
    Rejected(kube::Error),
    Retry(String),
}

async fn publish_loop(
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    settings: PublishSettings,
    shared: Arc<Shared>,
) {
    let mut publisher = Publisher {
        client,
        node,
        metrics,
        settings,
        shared,
        node_uid: None,
        failing: false,
    };
    while let Some(call) = publisher.next_call().await {
        publisher.publish(call).await;
        tokio::time::sleep(publisher.settings.min_gap).await;
    }
}

/// The task's state between calls.
struct Publisher {
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    settings: PublishSettings,
    shared: Arc<Shared>,
    /// The Node's UID, for the Events that regard it (asked for once it is needed).
    node_uid: Option<String>,
    /// Whether the last call failed and was retried: the failure and the recovery are logged
    /// once each.
    failing: bool,
}

impl Publisher {
    /// The next call, waiting for one; `None` once every queue is dropped and nothing is left.
    async fn next_call(&self) -> Option<Call> {
        loop {
            let (next, closed) = {
                let mut pending = self.shared.pending();
                (pending.take(), pending.is_closed())
            };
            match next {
                Some(call) => return Some(call),
                None if closed => return None,
                // A send between the lock and here leaves a permit: no wake-up is lost.
                None => self.shared.wake.notified().await,
            }
        }
    }

    /// One call until it is done or rejected, retried with backoff while the API server fails.
    async fn publish(&mut self, mut call: Call) {
        let mut backoff = self.settings.backoff_start;
        loop {
            self.learn_node_uid(&call).await;
            let publish = publish_one(&self.client, &self.node, self.node_uid.as_deref(), &call);
            let outcome = tokio::time::timeout(self.settings.request_timeout, publish)
                .await
                .unwrap_or_else(|_| {
                    Outcome::Retry(format!(
                        "no answer from the API server within {:?}",
                        self.settings.request_timeout
                    ))
                });
            match outcome {
                Outcome::Done(finished) => return self.done(&call, finished),
                Outcome::Rejected(e) => return self.rejected(&call, e),
                Outcome::Retry(e) => {
                    if !self.failing {
                        tracing::warn!("publishing Events failed, retrying with backoff: {e}");
                        self.failing = true;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.settings.backoff_max);
                    // The same Event again, with its repeats sent meanwhile.
                    match self.shared.pending().retry() {
                        Some(again) => call = again,
                        None => return,
                    }
                }
            }
        }
    }

    /// The Node's UID, asked for before the first Event that regards the Node (a failure leaves
    /// it unknown, asked again next time).
    async fn learn_node_uid(&mut self, call: &Call) {
        if self.node_uid.is_some() || call.spec.regarding.kind.as_deref() != Some("Node") {
            return;
        }
        let nodes = Api::<Node>::all(self.client.clone());
        let get = nodes.get_opt(&self.node);
        self.node_uid = tokio::time::timeout(self.settings.request_timeout, get)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .and_then(|n| n.metadata.uid);
    }

    fn done(&mut self, call: &Call, finished: Finished) {
        if self.failing {
            tracing::info!("publishing Events again");
            self.failing = false;
        }
        if finished != Finished::Gone {
            self.metrics.count_kube_event(call.spec.reason.as_str());
        }
        if let Some(kept) = lock(&self.shared.kept).as_mut() {
            kept.note(call, &finished);
        }
        self.shared.pending().finish(finished);
    }

    fn rejected(&self, call: &Call, e: kube::Error) {
        tracing::warn!(
            reason = call.spec.reason.as_str(),
            "Event rejected, dropped: {e}"
        );
        self.metrics.kube_events_dropped.inc();
        self.shared.pending().finish(Finished::Rejected);
    }
}

async fn publish_one(client: &Client, node: &str, node_uid: Option<&str>, call: &Call) -> Outcome {
    let now = MicroTime(Timestamp::now());
    let spec = &call.spec;
    let count = match &call.kind {
        CallKind::Update {
            namespace,
            name,
            count,
        } => {
            let api: Api<K8sEvent> = Api::namespaced(client.clone(), namespace);
            let series = EventSeries {
                count: *count,
                last_observed_time: now,
            };
            let patch = serde_json::json!({ "series": series });
            return match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Outcome::Done(Finished::Updated),
                // Expired (Events live an hour by default): the next occurrence starts anew.
                Err(kube::Error::Api(s)) if s.code == 404 => Outcome::Done(Finished::Gone),
                Err(e) => classify(e),
            };
        }
        CallKind::Create { count } => *count,
    };
    let mut regarding = spec.regarding.clone();
    if regarding.kind.as_deref() == Some("Node") && regarding.uid.is_none() {
        regarding.uid = node_uid.map(str::to_string);
    }
    // Node Events live in `default`, as the kubelet's do.
    let namespace = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    // Repeats merged before the first call: created with its series, in one call. The API
    // server takes a series on create when its count is at least 2 and lastObservedTime is
    // set, as client-go's recorder does when it creates an Event whose series patch met 404.
    let series = (count > 1).then(|| EventSeries {
        count,
        last_observed_time: now.clone(),
    });
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(now),
        action: Some("Scan".into()),
        reason: Some(spec.reason.as_str().into()),
        note: Some(spec.note.clone()),
        regarding: Some(regarding),
        reporting_controller: Some("shmlink".into()),
        reporting_instance: Some(node.into()),
        series,
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
        Ok(_) => Outcome::Done(Finished::Created { namespace }),
        // 409: an earlier try (or run, killed before it knew) created it with fewer
        // occurrences, perhaps: its series is set to this count, never added to.
        Err(kube::Error::Api(s)) if s.code == 409 => match event.series {
            Some(series) => set_series(&api, &spec.name, series, namespace).await,
            None => Outcome::Done(Finished::Created { namespace }),
        },
        Err(e) => classify(e),
    }
}

/// The Event that exists (409 on its create) gets the series it was to be created with.
async fn set_series(
    api: &Api<K8sEvent>,
    name: &str,
    series: EventSeries,
    namespace: String,
) -> Outcome {
    let patch = serde_json::json!({ "series": series });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Outcome::Done(Finished::Created { namespace }),
        Err(kube::Error::Api(s)) if s.code == 404 => Outcome::Done(Finished::Gone),
        Err(e) => classify(e),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn classify(e: kube::Error) -> Outcome {
    match &e {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => Outcome::Retry(e.to_string()),
        kube::Error::Api(_) => Outcome::Rejected(e),
        _ => Outcome::Retry(e.to_string()),
    }
}

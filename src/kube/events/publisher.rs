//! The publishing task: a bounded queue from the scan thread, a rate limit, retries with
//! backoff while the API server is away, one series per occurrence.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::{EventMsg, EventSpec, EventType};
use crate::metrics::Metrics;

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
                    metrics.count_kube_event(spec.reason.as_str());
                    break;
                }
                Outcome::Rejected(e) => {
                    tracing::warn!(
                        reason = spec.reason.as_str(),
                        "Event rejected, dropped: {e}"
                    );
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
        reason: Some(spec.reason.as_str().into()),
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

//! The writer task: the latest desired conditions in (a watch channel), strategic merge patches
//! of the Node's status out, only when something changed or the heartbeat is due.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use super::{desired, taint, Desired, Status};
use crate::metrics::Metrics;
use crate::model::Snapshot;

/// How the writer behaves.
#[derive(Debug, Clone, Copy)]
pub struct WriterSettings {
    /// Unchanged conditions are written again this often (their `lastHeartbeatTime`).
    pub heartbeat: Duration,
    /// Keep a NoSchedule taint of ours while `GpuFault` is True.
    pub taint: bool,
    pub backoff_start: Duration,
    pub backoff_max: Duration,
    /// One API call that takes longer is abandoned and retried.
    pub request_timeout: Duration,
}

impl WriterSettings {
    pub fn new(heartbeat: Duration, taint: bool) -> WriterSettings {
        WriterSettings {
            heartbeat,
            taint,
            backoff_start: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The scan thread's end: decides and hands over, never waits.
pub struct ConditionFeed {
    tx: watch::Sender<Option<Desired>>,
}

impl ConditionFeed {
    /// Decides this snapshot's conditions; wakes the writer only when they differ from the last.
    pub fn update(&mut self, snapshot: &Snapshot) {
        let desired = desired(snapshot);
        self.tx.send_if_modified(|current| {
            if current.as_ref() == Some(&desired) {
                return false;
            }
            *current = Some(desired);
            true
        });
    }
}

/// Starts the writer on `runtime`; the feed is the scan thread's.
pub fn spawn_writer(
    client: Client,
    node: String,
    settings: WriterSettings,
    metrics: Arc<Metrics>,
    runtime: &tokio::runtime::Handle,
) -> ConditionFeed {
    let (tx, rx) = watch::channel(None);
    runtime.spawn(run(Api::all(client), node, rx, settings, metrics));
    ConditionFeed { tx }
}

/// What the Node holds of one of our conditions, as far as the writer knows.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    status: String,
    reason: String,
    message: String,
    since: Option<Time>,
}

impl Held {
    fn of(c: &NodeCondition) -> Held {
        Held {
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            since: c.last_transition_time.clone(),
        }
    }
}

/// Our two conditions on the Node, as last read or written.
#[derive(Debug, Default)]
struct Known {
    held: std::collections::HashMap<String, Held>,
    written_at: Option<Instant>,
    /// Whether our taint is known to be as `GpuFault` wants it.
    tainted: Option<bool>,
}

async fn run(
    api: Api<Node>,
    node: String,
    mut rx: watch::Receiver<Option<Desired>>,
    settings: WriterSettings,
    metrics: Arc<Metrics>,
) {
    let mut known: Option<Known> = None;
    let mut backoff = settings.backoff_start;
    let mut failing = false;
    loop {
        let desired = loop {
            if let Some(d) = rx.borrow_and_update().clone() {
                break d;
            }
            if rx.changed().await.is_err() {
                return;
            }
        };
        let step = tokio::time::timeout(
            settings.request_timeout,
            write_once(&api, &node, &desired, &mut known, &settings),
        )
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", settings.request_timeout)));
        match step {
            Ok(wrote) => {
                if wrote {
                    metrics.node_condition_writes.inc();
                }
                if failing {
                    tracing::info!("writing the Node's GPU conditions again");
                    failing = false;
                }
                backoff = settings.backoff_start;
            }
            Err(e) => {
                metrics.node_condition_write_errors.inc();
                if !failing {
                    tracing::warn!(
                        "writing the Node's GPU conditions failed, retrying with backoff: {e}"
                    );
                    failing = true;
                }
                // Whatever arrives meanwhile replaces what is waiting: the latest state wins.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.backoff_max);
                continue;
            }
        }
        let next_heartbeat = known
            .as_ref()
            .and_then(|k| k.written_at)
            .map_or_else(Instant::now, |t| t + settings.heartbeat);
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(next_heartbeat.into()) => {}
        }
    }
}

/// Brings the Node to `desired`: learns what it holds first (once), patches when needed, then
/// the taint. Ok(true) when a status patch was made.
async fn write_once(
    api: &Api<Node>,
    node: &str,
    desired: &Desired,
    known: &mut Option<Known>,
    settings: &WriterSettings,
) -> Result<bool, String> {
    if known.is_none() {
        // A restarted agent keeps the transition times the Node already holds.
        let current = api.get_opt(node).await.map_err(|e| e.to_string())?;
        *known = Some(read_known(current.as_ref()));
    }
    let k = known.as_mut().expect("just set");
    let now = Instant::now();
    let due = k
        .written_at
        .is_none_or(|t| now.duration_since(t) >= settings.heartbeat);
    let differs = desired
        .iter()
        .into_iter()
        .any(|c| match k.held.get(c.type_) {
            Some(h) => {
                h.status != c.status.as_str() || h.reason != c.reason || h.message != c.message
            }
            None => true,
        });
    let mut wrote = false;
    if differs || due {
        let stamp = Time(Timestamp::now());
        let conditions: Vec<NodeCondition> = desired
            .iter()
            .into_iter()
            .map(|c| {
                let since = match k.held.get(c.type_) {
                    Some(h) if h.status == c.status.as_str() && h.since.is_some() => {
                        h.since.clone()
                    }
                    _ => Some(stamp.clone()),
                };
                NodeCondition {
                    type_: c.type_.into(),
                    status: c.status.as_str().into(),
                    reason: Some(c.reason.clone()),
                    message: Some(c.message.clone()),
                    last_heartbeat_time: Some(stamp.clone()),
                    last_transition_time: since,
                }
            })
            .collect();
        let patch = json!({"status": {"conditions": conditions}});
        let params = PatchParams {
            field_manager: Some("shmlink".into()),
            ..PatchParams::default()
        };
        api.patch_status(node, &params, &Patch::Strategic(&patch))
            .await
            .map_err(|e| e.to_string())?;
        for c in &conditions {
            k.held.insert(c.type_.clone(), Held::of(c));
        }
        k.written_at = Some(now);
        wrote = true;
    }
    if settings.taint {
        let on = desired.fault.status == Status::True;
        if k.tainted != Some(on) {
            taint::reconcile(api, node, on)
                .await
                .map_err(|e| format!("the {} taint: {e}", crate::kube::NODE_TAINT_KEY))?;
            k.tainted = Some(on);
        }
    }
    Ok(wrote)
}

/// Our conditions as the Node holds them (none when it has none, or there is no Node).
fn read_known(node: Option<&Node>) -> Known {
    let mut known = Known::default();
    let conditions = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref());
    for c in conditions.into_iter().flatten() {
        if c.type_ == super::GPU_FAULT || c.type_ == super::GPU_LINK_DEGRADED {
            known.held.insert(c.type_.clone(), Held::of(c));
        }
    }
    known
}

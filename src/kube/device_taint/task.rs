//! The scan thread's feed and the task that keeps the agent's DeviceTaintRules as the judge
//! wants them: on every change of the wanted GPUs, and again every `resync` (a rule deleted by
//! hand while its GPU is still blamed comes back; a slice published late is found). Failed calls
//! are retried with capped backoff; the latest wanted set is what is applied.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::sync::watch;

use super::api::{discover, is_absent, is_conflict, DraApi};
use super::judge::{blamed, TaintJudge, Wanted};
use super::rules::{plan, Action, Desired, Stored};
use super::slices::SliceIndex;
use super::Effect;
use crate::kube::events::{EventIds, EventQueue, EventType};
use crate::metrics::DeviceTaintMetrics;
use crate::model::{EventReason, Snapshot};
use crate::text;

#[derive(Debug, Clone, Copy)]
pub struct DeviceTaintSettings {
    pub effect: Effect,
    /// How long a GPU stays out after it was last blamed (`--gpu-fault-hold`).
    pub hold: Duration,
    /// The rules are brought to what is wanted again this often when nothing changed.
    pub resync: Duration,
    /// Where no DeviceTaintRule is served, the cluster is asked again this often (an upgrade,
    /// or the API switched on).
    pub rediscover: Duration,
    pub backoff_start: Duration,
    pub backoff_max: Duration,
    /// One pass that takes longer is abandoned and retried.
    pub request_timeout: Duration,
}

impl DeviceTaintSettings {
    pub fn new(effect: Effect, hold: Duration) -> DeviceTaintSettings {
        DeviceTaintSettings {
            effect,
            hold,
            resync: Duration::from_secs(300),
            rediscover: Duration::from_secs(600),
            backoff_start: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// The scan thread's end: decides and hands over, never waits.
pub struct DeviceTaintFeed {
    judge: TaintJudge,
    tx: watch::Sender<Option<Vec<Wanted>>>,
}

impl DeviceTaintFeed {
    /// This snapshot's GPUs wanted out; wakes the task only when they differ from the last.
    pub fn update(&mut self, snapshot: &Snapshot, now: Instant) {
        let wanted = self.judge.decide(blamed(snapshot), now, SystemTime::now());
        self.tx.send_if_modified(|current| {
            if current.as_ref() == Some(&wanted) {
                return false;
            }
            *current = Some(wanted);
            true
        });
    }
}

/// Starts the task on `runtime`; `events` carries its Node Events, named by the agent's one
/// allocator of Event IDs (the planner's, [`EventIds`]).
pub fn spawn_device_taints(
    client: Client,
    node: String,
    settings: DeviceTaintSettings,
    (metrics, events): (DeviceTaintMetrics, Option<(EventQueue, EventIds)>),
    runtime: &tokio::runtime::Handle,
) -> DeviceTaintFeed {
    let (tx, rx) = watch::channel(None);
    let keeper = Keeper {
        client,
        node,
        settings,
        metrics,
        events,
        api: None,
        asked_at: None,
        node_uid: None,
        started: Instant::now(),
        adopted: None,
        said: HashSet::new(),
    };
    runtime.spawn(run(keeper, rx));
    DeviceTaintFeed {
        judge: TaintJudge::new(settings.hold),
        tx,
    }
}

/// The task's state between passes.
struct Keeper {
    client: Client,
    node: String,
    settings: DeviceTaintSettings,
    metrics: DeviceTaintMetrics,
    events: Option<(EventQueue, EventIds)>,
    api: Option<DraApi>,
    /// When discovery last found no API (asked again after `rediscover`).
    asked_at: Option<Instant>,
    node_uid: Option<String>,
    started: Instant,
    /// The agent's rules found at its start: kept for one hold unless wanted, as if their GPU
    /// was last blamed at the start (a restart loses no hold; none outlives one).
    adopted: Option<HashSet<String>>,
    /// What was logged once (the missing API, GPUs no slice lists, names others hold).
    said: HashSet<String>,
}

async fn run(mut k: Keeper, mut rx: watch::Receiver<Option<Vec<Wanted>>>) {
    let mut backoff = k.settings.backoff_start;
    let mut failing = false;
    loop {
        // Nothing is known before the first scan's decision: nothing is touched.
        let wanted = loop {
            if let Some(w) = rx.borrow_and_update().clone() {
                break w;
            }
            if rx.changed().await.is_err() {
                return;
            }
        };
        let timeout = k.settings.request_timeout;
        let pass = tokio::time::timeout(timeout, k.pass(&wanted))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")));
        match pass {
            Ok(()) => {
                if failing {
                    tracing::info!("keeping the GPUs' DeviceTaintRules again");
                    failing = false;
                }
                backoff = k.settings.backoff_start;
            }
            Err(e) => {
                k.metrics.errors.inc();
                if !failing {
                    tracing::warn!("keeping the GPUs' DeviceTaintRules failed, retrying: {e}");
                    failing = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(k.settings.backoff_max);
                continue;
            }
        }
        let resync = k.settings.resync;
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(resync) => {}
        }
    }
}

impl Keeper {
    /// One pass: the API found, the rules listed, the plan applied.
    async fn pass(&mut self, wanted: &[Wanted]) -> Result<(), String> {
        let Some(api) = self.api().await? else {
            self.set_gauge(&[]);
            return Ok(());
        };
        if self.node_uid.is_none() {
            // The owner reference that deletes the rules with the Node: not made without it.
            let nodes: Api<Node> = Api::all(self.client.clone());
            let node = nodes
                .get_opt(&self.node)
                .await
                .map_err(|e| format!("reading Node {}: {e}", self.node))?;
            self.node_uid = node.and_then(|n| n.metadata.uid);
        }
        let stored = match api.own_rules(&self.node).await {
            Ok(s) => s,
            Err(e) => return Err(self.lost_api(e, "listing the agent's DeviceTaintRules")),
        };
        let adopted = self
            .adopted
            .get_or_insert_with(|| stored.iter().map(|s| s.name.clone()).collect())
            .clone();
        let index = if wanted.is_empty() {
            SliceIndex::default()
        } else {
            match api.node_slices(&self.node).await {
                Ok(slices) => SliceIndex::from_slices(&slices, &self.node),
                Err(e) => return Err(self.lost_api(e, "listing this node's ResourceSlices")),
            }
        };
        let within_hold = self.started.elapsed() < self.settings.hold;
        let keep = |name: &str| within_hold && adopted.contains(name);
        let planned = plan(
            wanted,
            &index,
            &stored,
            (&self.node, self.settings.effect),
            keep,
        );
        for (gpu, uuid) in &planned.unmatched {
            let message = text::no_slice_device(*gpu, uuid, &self.node);
            self.say_once(uuid.clone(), || message);
        }
        let mut in_force: BTreeMap<String, String> = stored
            .iter()
            .map(|s| (s.name.clone(), s.effect.clone()))
            .collect();
        let mut first_error = None;
        for action in planned.actions {
            if let Err(e) = self.apply(&api, action, &mut in_force).await {
                first_error.get_or_insert(e);
            }
        }
        let effects: Vec<String> = in_force.into_values().collect();
        self.set_gauge(&effects);
        first_error.map_or(Ok(()), Err)
    }

    /// The served API, discovered once (and again after `rediscover` while there is none).
    async fn api(&mut self) -> Result<Option<DraApi>, String> {
        if let Some(api) = &self.api {
            return Ok(Some(api.clone()));
        }
        if self
            .asked_at
            .is_some_and(|t| t.elapsed() < self.settings.rediscover)
        {
            return Ok(None);
        }
        let found = discover(&self.client)
            .await
            .map_err(|e| format!("asking which resource.k8s.io versions are served: {e}"))?;
        self.asked_at = Some(Instant::now());
        match found {
            Some(api) => {
                tracing::info!(
                    api_version = %api.rules_version,
                    effect = self.settings.effect.as_str(),
                    "taking blamed GPUs out with DeviceTaintRules"
                );
                self.api = Some(api.clone());
                Ok(Some(api))
            }
            None => {
                self.say_once("no api".into(), || text::no_taint_api().to_string());
                Ok(None)
            }
        }
    }

    /// A 404 on a kind discovered before: the API went (disabled, or a downgrade); found again
    /// on a later pass.
    fn lost_api(&mut self, e: kube::Error, doing: &str) -> String {
        if is_absent(&e) {
            self.api = None;
        }
        format!("{doing}: {e}")
    }

    async fn apply(
        &mut self,
        api: &DraApi,
        action: Action,
        in_force: &mut BTreeMap<String, String>,
    ) -> Result<(), String> {
        let owner = self.node_uid.clone();
        let owner = owner.as_deref().map(|uid| (self.node.as_str(), uid));
        match action {
            Action::Create(d) => match api.create(d.object(&self.node, owner)).await {
                Ok(()) => {
                    in_force.insert(d.name.clone(), d.effect.as_str().into());
                    self.tainted(&d);
                    Ok(())
                }
                // Not in our list, yet there: ours if a pass's answer was lost (the next pass
                // finds it), else someone else's, left alone.
                Err(e) if is_conflict(&e) => {
                    if !api.is_ours(&d.name, &self.node).await {
                        self.say_once(format!("foreign {}", d.name), || foreign(&d.name));
                    }
                    Ok(())
                }
                Err(e) => Err(format!("creating DeviceTaintRule {}: {e}", d.name)),
            },
            Action::Update {
                desired,
                stored,
                effect_changed,
            } => {
                let object = desired.update_of(&stored);
                match api.replace(&desired.name, object).await {
                    Ok(()) => {
                        in_force.insert(desired.name.clone(), desired.effect.as_str().into());
                        if effect_changed {
                            self.tainted(&desired);
                        }
                        Ok(())
                    }
                    Err(e) => Err(format!("updating DeviceTaintRule {}: {e}", desired.name)),
                }
            }
            Action::Delete(stored) => self.lift(api, &stored, in_force).await,
        }
    }

    /// The Event of a rule made, or of its new effect.
    fn tainted(&mut self, d: &Desired) {
        let device = d.device.to_string();
        let note = text::taint_made(&d.name, &device, d.effect.as_str(), &d.description);
        let reason = EventReason::GpuDeviceTainted;
        self.event(reason, EventType::Warning, note);
    }

    async fn lift(
        &mut self,
        api: &DraApi,
        stored: &Stored,
        in_force: &mut BTreeMap<String, String>,
    ) -> Result<(), String> {
        api.delete(stored)
            .await
            .map_err(|e| format!("deleting DeviceTaintRule {}: {e}", stored.name))?;
        in_force.remove(&stored.name);
        let device = stored
            .selector
            .as_ref()
            .map_or_else(|| "?".to_string(), |d| d.to_string());
        let hold = humantime::format_duration(self.settings.hold).to_string();
        let note = text::taint_lifted(&stored.name, &device, &hold);
        self.event(EventReason::GpuDeviceTaintLifted, EventType::Normal, note);
        Ok(())
    }

    fn set_gauge(&self, effects: &[String]) {
        for e in Effect::ALL {
            let n = effects.iter().filter(|x| x.as_str() == e.as_str()).count();
            self.metrics.set_in_force(e.as_str(), n as i64);
        }
    }

    fn say_once(&mut self, key: String, message: impl FnOnce() -> String) {
        if self.said.len() < 1_000 && self.said.insert(key) {
            tracing::warn!("{}", message());
        }
    }

    /// A Node Event of its own occurrence (told once, never updated).
    fn event(&mut self, reason: EventReason, type_: EventType, note: String) {
        let Some((queue, ids)) = &self.events else {
            return;
        };
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: self.node_uid.clone(),
            ..Default::default()
        };
        queue.send(ids.once(regarding, reason, type_, note));
    }
}

fn foreign(name: &str) -> String {
    format!(
        "a DeviceTaintRule named {name} exists without shmlink's labels: it is someone else's \
         and is left alone, so this GPU is not taken out by a rule of the agent"
    )
}

//! `serve` as a cluster citizen: the Pod reflector, the pod-resources refresher, the Event
//! publisher and the Node condition writer, started on the runtime; the scan thread's view of
//! them reads caches without waiting and hands over to queues it never blocks on.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use kube::Client;

use crate::cli::KubeMode;
use crate::failures::sources::ClusterCaches;
use crate::kube::conditions::{spawn_writer, ConditionFeed, WriterSettings};
use crate::kube::device_taint::{
    spawn_device_taints, DeviceTaintFeed, DeviceTaintSettings, Effect,
};
use crate::kube::events::{
    spawn_publisher, EventMsg, EventPlanner, EventQueue, OpenSeries, PublishSettings, SERIES_KEY,
};
use crate::kube::exits::{DeathKey, Exits};
use crate::kube::podresources::PodResourcesWatcher;
use crate::kube::pods::{PodIndex, PodWatcher};
use crate::metrics::Metrics;
use crate::model::{Detected, Failure, Snapshot};
use crate::state::StoreSender;

/// What the cluster side goes on with after a restart (from the state store).
pub(super) struct KubeResume {
    /// The Pod-status deaths told before (or `Exits::new(now)` without a checkpoint).
    pub(super) exits: Exits,
    /// The failure Event series left open, and the counts the API server confirmed of them.
    pub(super) series: Vec<OpenSeries>,
    pub(super) confirmed: HashMap<String, i32>,
    /// Where the confirmed counts are kept; None without a store.
    pub(super) store: Option<StoreSender>,
}

/// What serve needs to be a cluster citizen.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub mode: KubeMode,
    pub node: String,
    /// How often a lasting condition's Event series is updated.
    pub event_heartbeat: Duration,
    /// The kubelet's pod-resources socket: which Pod holds which GPU.
    pub pod_resources_socket: PathBuf,
    /// How long a fatal XID keeps GpuFault True.
    pub gpu_fault_hold: Duration,
    /// How often unchanged Node conditions are written again.
    pub condition_heartbeat: Duration,
    pub taint_on_gpu_fault: bool,
    /// The effect of the DeviceTaintRules for blamed GPUs; None: no rules.
    pub gpu_device_taint: Option<Effect>,
    /// How long the first scan (and so `/readyz`) waits for the Pod cache.
    pub pod_cache_wait: Duration,
}

/// The scan thread's view of Kubernetes.
pub(super) struct KubeView {
    pub(super) pods: PodWatcher,
    gpu_holders: PodResourcesWatcher,
    planner: EventPlanner,
    queue: EventQueue,
    conditions: ConditionFeed,
    device_taints: Option<DeviceTaintFeed>,
    pub(super) pod_cache_wait: Duration,
}

impl KubeView {
    /// Starts the cluster's tasks on `runtime`; the deaths new Pod statuses record go to
    /// `deaths` (the failure follower) as the watch delivers them.
    pub(super) fn spawn(
        client: Client,
        settings: &KubeSettings,
        (interval, metrics, runtime): (Duration, &Arc<Metrics>, &tokio::runtime::Handle),
        deaths: mpsc::Sender<Vec<(DeathKey, Detected)>>,
        resume: KubeResume,
    ) -> KubeView {
        tracing::info!(node = %settings.node, "watching this node's pods; publishing Events");
        let on_deaths = Box::new(move |found| {
            let _ = deaths.send(found);
        });
        let queue = spawn_publisher(
            client.clone(),
            settings.node.clone(),
            metrics.clone(),
            PublishSettings::default(),
            runtime,
        );
        // One allocator of Event IDs and names: the planner's, lent to the device taints.
        let planner = EventPlanner::new(&settings.node, settings.event_heartbeat);
        let mut view = KubeView {
            pods: PodWatcher::spawn(
                client.clone(),
                &settings.node,
                runtime,
                resume.exits,
                on_deaths,
            ),
            gpu_holders: PodResourcesWatcher::spawn(
                settings.pod_resources_socket.clone(),
                interval,
                metrics.clone(),
                runtime,
            ),
            device_taints: settings.gpu_device_taint.map(|effect| {
                spawn_device_taints(
                    client.clone(),
                    settings.node.clone(),
                    DeviceTaintSettings::new(effect, settings.gpu_fault_hold),
                    (
                        metrics.device_taints.clone(),
                        Some((queue.clone(), planner.ids())),
                    ),
                    runtime,
                )
            }),
            planner,
            queue,
            conditions: spawn_writer(
                client,
                settings.node.clone(),
                WriterSettings::new(settings.condition_heartbeat, settings.taint_on_gpu_fault),
                metrics.clone(),
                runtime,
            ),
            pod_cache_wait: settings.pod_cache_wait,
        };
        if let Some(store) = resume.store {
            view.queue.keep_confirmed(store, &resume.confirmed);
            let resend = view.planner.resume_failures(
                resume.series,
                &resume.confirmed,
                Instant::now(),
                SystemTime::now(),
            );
            if !resend.is_empty() {
                tracing::info!(
                    events = resend.len(),
                    "sending again the failure Events the API server may not have (stored, \
                     not confirmed)"
                );
            }
            view.queue.resend(resend);
        }
        view
    }

    /// The caches the failure follower reads.
    pub(super) fn caches(&self) -> ClusterCaches {
        ClusterCaches {
            pods: self.pods.cache(),
            gpu_holders: self.gpu_holders.clone(),
            sync_wait: self.pod_cache_wait,
        }
    }

    pub(super) fn after_scan(&mut self, snapshot: &Snapshot, pods: Option<&PodIndex>) {
        let holders = self.gpu_holders.holders();
        let msgs = self.planner.plan(snapshot, pods, &holders, Instant::now());
        self.queue.send(msgs);
        self.conditions.update(snapshot);
        if let Some(d) = self.device_taints.as_mut() {
            d.update(snapshot, Instant::now());
        }
    }

    /// The Events for failures just told, to be published (at once, or once the failures are
    /// durable) by [`KubeView::publish`].
    pub(super) fn plan_failures(&mut self, failures: &[Failure]) -> Vec<EventMsg> {
        self.planner.plan_failures(failures, Instant::now())
    }

    /// Failure Events (their confirmed counts kept, with a store).
    pub(super) fn publish(&self, msgs: Vec<EventMsg>) {
        self.queue.send_kept(msgs);
    }

    /// The open failure series, as stored with the failures told.
    pub(super) fn series_state(&self) -> (String, serde_json::Value) {
        let series = serde_json::to_value(self.planner.open_series()).unwrap_or_default();
        (SERIES_KEY.to_string(), series)
    }
}

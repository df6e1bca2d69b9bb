//! `serve` as a cluster citizen: the Pod reflector, the pod-resources refresher, the Event
//! publisher and the Node condition writer, started on the runtime; the scan thread's view of
//! them reads caches without waiting and hands over to queues it never blocks on.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kube::Client;

use crate::cli::KubeMode;
use crate::failures::sources::ClusterCaches;
use crate::gpu::xid::HeldAges;
use crate::kube::conditions::{spawn_writer, ConditionFeed, WriterSettings};
use crate::kube::events::{spawn_publisher, EventPlanner, EventQueue, PublishSettings};
use crate::kube::podresources::PodResourcesWatcher;
use crate::kube::pods::{PodIndex, PodWatcher};
use crate::metrics::Metrics;
use crate::model::{Detected, Failure, Snapshot};

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
    pub(super) pod_cache_wait: Duration,
}

impl KubeView {
    /// Starts the cluster's tasks on `runtime`; the deaths new Pod statuses record go to
    /// `deaths` (the failure follower) as the watch delivers them.
    pub(super) fn spawn(
        client: Client,
        settings: &KubeSettings,
        interval: Duration,
        metrics: &Arc<Metrics>,
        runtime: &tokio::runtime::Handle,
        deaths: mpsc::Sender<Vec<Detected>>,
    ) -> KubeView {
        tracing::info!(node = %settings.node, "watching this node's pods; publishing Events");
        let on_deaths = Box::new(move |found| {
            let _ = deaths.send(found);
        });
        KubeView {
            pods: PodWatcher::spawn(client.clone(), &settings.node, runtime, on_deaths),
            gpu_holders: PodResourcesWatcher::spawn(
                settings.pod_resources_socket.clone(),
                interval,
                metrics.clone(),
                runtime,
            ),
            planner: EventPlanner::new(&settings.node, settings.event_heartbeat),
            queue: spawn_publisher(
                client.clone(),
                settings.node.clone(),
                metrics.clone(),
                PublishSettings::default(),
                runtime,
            ),
            conditions: spawn_writer(
                client,
                settings.node.clone(),
                settings.gpu_fault_hold,
                WriterSettings::new(settings.condition_heartbeat, settings.taint_on_gpu_fault),
                metrics.clone(),
                runtime,
            ),
            pod_cache_wait: settings.pod_cache_wait,
        }
    }

    /// The caches the failure follower reads.
    pub(super) fn caches(&self) -> ClusterCaches {
        ClusterCaches {
            pods: self.pods.cache(),
            gpu_holders: self.gpu_holders.clone(),
        }
    }

    pub(super) fn after_scan(&mut self, snapshot: &Snapshot, pods: Option<&PodIndex>) {
        let holders = self.gpu_holders.holders();
        let msgs = self.planner.plan(snapshot, pods, &holders, Instant::now());
        self.queue.send(msgs);
        self.conditions.update(snapshot, Instant::now());
    }

    /// The fatal XIDs holding `GpuFault`, for a restart to carry.
    pub(super) fn held_ages(&self, now: Instant) -> Vec<HeldAges> {
        self.conditions.held_ages(now)
    }

    /// Holds again what the last run held (before the first scan).
    pub(super) fn resume_held(&mut self, held: Vec<HeldAges>, now: Instant) {
        self.conditions.resume_held(held, now);
    }

    /// Failures are Events at once, not at the next scan.
    pub(super) fn after_failures(&mut self, failures: &[Failure]) {
        let msgs = self.planner.plan_failures(failures, Instant::now());
        self.queue.send(msgs);
    }
}

//! `shmlink serve`: a scan thread that stores snapshots, and the HTTP server that reads them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::cli::KubeMode;
use crate::failures::same_pci_device;
use crate::gpu::xid::kernel::{KernelGpu, KernelXids};
use crate::incidents::correlate::{correlate, Known};
use crate::incidents::ledger::Ledger;
use crate::incidents::watch::{self, Sources};
use crate::kube::conditions::{spawn_writer, ConditionFeed, WriterSettings};
use crate::kube::events::GpuHolders;
use crate::kube::events::{spawn_publisher, EventPlanner, EventQueue, PublishSettings};
use crate::kube::podresources::PodResourcesWatcher;
use crate::kube::pods::PodWatcher;
use crate::kube::{self as k8s, KubeError};
use crate::metrics::{Metrics, SharedSnapshot};
use crate::model::Snapshot;
use crate::model::{Detected, Failure};
use crate::scan::Scanner;
use crate::server::{self, AppState, Health};

/// What serve needs to be a cluster citizen.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub mode: KubeMode,
    pub node: String,
    /// How often a lasting condition's Event series is updated.
    pub event_heartbeat: Duration,
    /// The kubelet's pod-resources socket: which Pod holds which GPU.
    pub pod_resources_socket: std::path::PathBuf,
    /// How long a fatal XID keeps GpuFault True.
    pub gpu_fault_hold: Duration,
    /// How often unchanged Node conditions are written again.
    pub condition_heartbeat: Duration,
    pub taint_on_gpu_fault: bool,
    /// How long the first scan (and so `/readyz`) waits for the Pod cache.
    pub pod_cache_wait: Duration,
}

/// The scan thread's view of Kubernetes: caches it reads without waiting, a queue it never
/// blocks on.
struct KubeView {
    pods: PodWatcher,
    gpu_holders: PodResourcesWatcher,
    planner: EventPlanner,
    queue: EventQueue,
    conditions: ConditionFeed,
    pod_cache_wait: Duration,
}

impl KubeView {
    fn after_scan(
        &mut self,
        snapshot: &crate::model::Snapshot,
        pods: Option<&crate::kube::pods::PodIndex>,
    ) {
        let holders = self.gpu_holders.holders();
        let msgs = self.planner.plan(snapshot, pods, &holders, Instant::now());
        self.queue.send(msgs);
        self.conditions.update(snapshot, Instant::now());
    }

    /// Failures are Events at once, not at the next scan.
    fn after_failures(&mut self, failures: &[Failure], pods: Option<&crate::kube::pods::PodIndex>) {
        let msgs = self.planner.plan_failures(failures, pods, Instant::now());
        self.queue.send(msgs);
    }
}

/// What wakes the scan thread between scans.
enum Wake {
    Stop,
    /// The failure watcher found something.
    Failures(watch::Told),
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Http(#[source] std::io::Error),
    #[error("starting the scan thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Runs until SIGTERM or SIGINT.
pub async fn serve(
    scanner: Scanner,
    listen: std::net::SocketAddr,
    interval: Duration,
    kube: KubeSettings,
    sources: Sources,
) -> Result<(), AgentError> {
    let snapshot: SharedSnapshot = Arc::new(ArcSwapOption::empty());
    let metrics = Arc::new(Metrics::new(snapshot.clone()));
    let health = Arc::new(Health::new(interval));

    let runtime = tokio::runtime::Handle::current();
    let kube = k8s::connect(kube.mode).await?.map(|client| {
        tracing::info!(node = %kube.node, "watching this node's pods; publishing Events");
        KubeView {
            pods: PodWatcher::spawn(client.clone(), &kube.node, &runtime),
            gpu_holders: PodResourcesWatcher::spawn(
                kube.pod_resources_socket.clone(),
                interval,
                metrics.clone(),
                &runtime,
            ),
            planner: EventPlanner::new(&kube.node, kube.event_heartbeat),
            queue: spawn_publisher(
                client.clone(),
                kube.node.clone(),
                metrics.clone(),
                PublishSettings::default(),
                &runtime,
            ),
            conditions: spawn_writer(
                client,
                kube.node.clone(),
                kube.gpu_fault_hold,
                WriterSettings::new(kube.condition_heartbeat, kube.taint_on_gpu_fault),
                metrics.clone(),
                &runtime,
            ),
            pod_cache_wait: kube.pod_cache_wait,
        }
    });

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().unwrap_or(listen);
    tracing::info!(addr = %local, interval = ?interval, "serving /metrics, /healthz, /readyz");

    let (wake_tx, wake_rx) = mpsc::channel::<Wake>();
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = watch::spawn(
        sources,
        watch::channel(wake_tx.clone(), Wake::Failures),
        {
            let metrics = metrics.clone();
            let mut last = None;
            move |now: &crate::model::SourceStats| {
                metrics.record_sources(now, last.as_ref());
                last = Some(*now);
            }
        },
        stop_watching.clone(),
    );
    let scan_thread = thread::Builder::new()
        .name("scan".into())
        .spawn({
            let (snapshot, metrics, health) = (snapshot.clone(), metrics.clone(), health.clone());
            move || {
                scan_loop(
                    scanner, kube, interval, &snapshot, &metrics, &health, &wake_rx,
                )
            }
        })
        .map_err(AgentError::Thread)?;

    let state = Arc::new(AppState {
        metrics,
        snapshot,
        health,
    });
    let served = server::run(listener, state, shutdown_signal()).await;

    let _ = wake_tx.send(Wake::Stop);
    stop_watching.store(true, Ordering::Relaxed);
    // The scan thread finishes its current scan (if any) and exits; the watcher its poll.
    let _ = tokio::task::spawn_blocking(move || {
        let _ = scan_thread.join();
        watcher.map(|w| w.join())
    })
    .await;
    tracing::info!("stopped");
    served.map_err(AgentError::Http)
}

/// Scans every `interval` until told to stop. A slow scan delays the next one rather than
/// piling up; missed periods are skipped, not caught up. Failures the watcher finds between
/// scans are correlated with the last snapshot and published at once.
fn scan_loop(
    mut scanner: Scanner,
    mut kube: Option<KubeView>,
    interval: Duration,
    snapshot: &SharedSnapshot,
    metrics: &Metrics,
    health: &Health,
    wake: &mpsc::Receiver<Wake>,
) {
    let mut next = Instant::now();
    let mut first = true;
    let mut ledger = Ledger::default();
    let mut recent = RecentReadings::default();
    let mut kernel_xids = KernelXids::default();
    // Series born before the Pod cache syncs carry empty names and are renamed moments later,
    // which resets every alert's `for:`: the first scan (and so /readyz) waits, boundedly.
    if let Some(k) = kube.as_mut() {
        let started = Instant::now();
        while !k.pods.is_synced() {
            let left = k.pod_cache_wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                tracing::warn!(
                    waited = ?k.pod_cache_wait,
                    "the pod cache has not synced; scanning without pod names until it does \
                     (shmlink_kube_pod_cache_synced 0)"
                );
                break;
            }
            match wake.recv_timeout(left.min(Duration::from_millis(20))) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(Wake::Failures(told)) => {
                    if !told.gpus.is_empty() {
                        on_kernel_gpus(told.gpus, &mut kernel_xids, &scanner, snapshot);
                    }
                    if !told.failures.is_empty() {
                        on_failures(
                            &told.failures,
                            Some(&mut *k),
                            &mut ledger,
                            &recent,
                            snapshot,
                        );
                    }
                }
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
    loop {
        let pods = kube.as_ref().and_then(|k| k.pods.index());
        if kube.is_some() {
            metrics.set_pod_cache_synced(pods.is_some());
        }
        let mut out = scanner.scan_with(pods.as_ref());
        metrics.record_scan(&out.runs);
        if let Some(k) = kube.as_mut() {
            k.after_scan(&out.snapshot, pods.as_ref());
        }
        if first {
            tracing::info!(
                containers = out.snapshot.shm.len(),
                findings = out.snapshot.findings.len(),
                "first scan done"
            );
            first = false;
        }
        out.snapshot.failures = ledger.recent();
        out.snapshot.failure_counts = ledger.counts();
        recent.remember(&out.snapshot.shm, Instant::now());
        snapshot.store(Some(Arc::new(out.snapshot)));
        health.mark_scanned();

        next += interval;
        loop {
            let now = Instant::now();
            if next <= now {
                next = now + interval;
                break;
            }
            match wake.recv_timeout(next - now) {
                Err(RecvTimeoutError::Timeout) => break,
                Ok(Wake::Failures(told)) => {
                    if !told.gpus.is_empty() {
                        on_kernel_gpus(told.gpus, &mut kernel_xids, &scanner, snapshot);
                    }
                    if !told.failures.is_empty() {
                        on_failures(
                            &told.failures,
                            kube.as_mut(),
                            &mut ledger,
                            &recent,
                            snapshot,
                        );
                    }
                }
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// XIDs the kernel logged: counted with NVML's (one count), on the GPU of the last snapshot at
/// that PCI address; seen at the next scan. An address no GPU of NVML's has is logged once.
fn on_kernel_gpus(
    events: Vec<KernelGpu>,
    kernel_xids: &mut KernelXids,
    scanner: &Scanner,
    snapshot: &SharedSnapshot,
) {
    let last = snapshot.load_full();
    let gpus = last.as_deref().map_or(&[][..], |s| s.gpus.as_slice());
    let counts = scanner.xid_counts();
    for event in events {
        let Some((pci, xid)) = kernel_xids.observe(event, Instant::now()) else {
            continue;
        };
        match gpus.iter().find(|g| same_pci_device(&g.pci_bus_id, &pci)) {
            Some(gpu) => {
                tracing::warn!(
                    gpu = gpu.index,
                    xid,
                    "the kernel log reports XID {xid} on GPU {} ({pci})",
                    gpu.index
                );
                counts.record_kernel(gpu.index, xid);
            }
            None => tracing::warn!(
                xid,
                "the kernel log reports XID {xid} on PCI {pci}, which is none of NVML's GPUs"
            ),
        }
    }
}

/// Correlates failures with the last snapshot, counts them, publishes their Events and swaps
/// in a snapshot that carries them (so /metrics counts them before the next scan).
fn on_failures(
    found: &[Detected],
    kube: Option<&mut KubeView>,
    ledger: &mut Ledger,
    recent: &RecentReadings,
    snapshot: &SharedSnapshot,
) {
    let last = snapshot.load_full();
    let with_recent = last.as_deref().map(|s| recent.added_to(s));
    let pods = kube.as_ref().and_then(|k| k.pods.index());
    let holders = kube
        .as_ref()
        .map_or_else(|| Arc::new(GpuHolders::new()), |k| k.gpu_holders.holders());
    let known = Known {
        snapshot: with_recent.as_ref(),
        pods: pods.as_ref(),
        holders: &holders,
    };
    let failures: Vec<Failure> = found.iter().map(|d| correlate(d, known)).collect();
    for f in &failures {
        tracing::warn!(kind = f.kind.as_str(), "{}", f.message);
    }
    ledger.record(&failures, Instant::now());
    if let Some(k) = kube {
        k.after_failures(&failures, pods.as_ref());
    }
    if let Some(last) = last {
        let mut next = Snapshot::clone(&last);
        next.failures = ledger.recent();
        next.failure_counts = ledger.counts();
        snapshot.store(Some(Arc::new(next)));
    }
}

/// Containers seen in the last minute: a job that dies takes its container (and its /dev/shm)
/// with it, often before the next scan, and the failure is told just after. What it had then,
/// and which host PIDs were its, come from here.
#[derive(Default)]
struct RecentReadings {
    by_id: std::collections::HashMap<String, (crate::model::ShmReading, Instant)>,
}

impl RecentReadings {
    const KEEP: Duration = Duration::from_secs(60);

    fn remember(&mut self, readings: &[crate::model::ShmReading], now: Instant) {
        for r in readings {
            self.by_id.insert(r.container_id.clone(), (r.clone(), now));
        }
        self.by_id
            .retain(|_, (_, seen)| now.duration_since(*seen) < Self::KEEP);
    }

    /// The snapshot with the recently gone containers' last readings after its own.
    fn added_to(&self, s: &Snapshot) -> Snapshot {
        let mut out = s.clone();
        for (id, (r, _)) in &self.by_id {
            if !s.shm.iter().any(|x| &x.container_id == id) {
                out.shm.push(r.clone());
            }
        }
        out
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

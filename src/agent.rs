//! `shmlink serve`: a scan thread that stores snapshots, and the HTTP server that reads them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::cli::KubeMode;
use crate::failures::memcg::OomCounters;
use crate::failures::tell::Teller;
use crate::failures::watch::{self, Sources, Told};
use crate::findings::changes::{Changed, FindingChanges};
use crate::gpu::xid::kernel::KernelXids;
use crate::kube::conditions::{spawn_writer, ConditionFeed, WriterSettings};
use crate::kube::events::GpuHolders;
use crate::kube::events::{spawn_publisher, EventPlanner, EventQueue, PublishSettings};
use crate::kube::podresources::PodResourcesWatcher;
use crate::kube::pods::{PodIndex, PodWatcher};
use crate::kube::{self as k8s, KubeError};
use crate::metrics::{Metrics, SharedSnapshot};
use crate::model::{Failure, Snapshot};
use crate::probe::ProbeOptions;
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
    fn after_scan(&mut self, snapshot: &Snapshot, pods: Option<&PodIndex>) {
        let holders = self.gpu_holders.holders();
        let msgs = self.planner.plan(snapshot, pods, &holders, Instant::now());
        self.queue.send(msgs);
        self.conditions.update(snapshot, Instant::now());
    }

    /// Failures are Events at once, not at the next scan.
    fn after_failures(&mut self, failures: &[Failure], pods: Option<&PodIndex>) {
        let msgs = self.planner.plan_failures(failures, pods, Instant::now());
        self.queue.send(msgs);
    }
}

/// What wakes the scan thread between scans.
enum Wake {
    Stop,
    /// The failure watcher found something.
    Failures(Told),
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
    oom_counters: Option<OomCounters>,
    probe: Option<(ProbeOptions, Duration)>,
) -> Result<(), AgentError> {
    let snapshot: SharedSnapshot = Arc::new(ArcSwapOption::empty());
    let metrics = Arc::new(Metrics::new(snapshot.clone()));
    let health = Arc::new(Health::new(interval));

    let runtime = tokio::runtime::Handle::current();
    let (wake_tx, wake_rx) = mpsc::channel::<Wake>();
    let kube = k8s::connect(kube.mode).await?.map(|client| {
        tracing::info!(node = %kube.node, "watching this node's pods; publishing Events");
        // Deaths the Pods' statuses record are told like the watcher's failures, at once.
        let deaths = wake_tx.clone();
        let on_deaths = Box::new(move |failures| {
            let _ = deaths.send(Wake::Failures(Told {
                failures,
                gpus: Vec::new(),
            }));
        });
        KubeView {
            pods: PodWatcher::spawn(client.clone(), &kube.node, &runtime, on_deaths),
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

    let stop_watching = Arc::new(AtomicBool::new(false));
    let rules = sources.rules;
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
    let prober = match probe {
        Some((opts, every)) => Some(
            crate::probe::schedule::spawn(
                opts,
                every,
                snapshot.clone(),
                scanner.probe_results(),
                stop_watching.clone(),
            )
            .map_err(AgentError::Thread)?,
        ),
        None => None,
    };
    let scan_thread = thread::Builder::new()
        .name("scan".into())
        .spawn({
            let (snapshot, metrics, health) = (snapshot.clone(), metrics.clone(), health.clone());
            move || {
                let between = Between {
                    scanner,
                    findings_told: kube.is_none().then(FindingChanges::default),
                    kube,
                    failures: Teller::new(rules),
                    kernel_xids: KernelXids::default(),
                    oom_counters,
                };
                scan_loop(between, interval, &snapshot, &metrics, &health, &wake_rx)
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
        if let Some(p) = prober {
            let _ = p.join();
        }
        watcher.map(|w| w.join())
    })
    .await;
    tracing::info!("stopped");
    served.map_err(AgentError::Http)
}

/// What the scan thread keeps between scans besides the snapshot.
struct Between {
    scanner: Scanner,
    kube: Option<KubeView>,
    failures: Teller,
    kernel_xids: KernelXids,
    /// OOM kills as the memory cgroups count them, when the kernel log is off.
    oom_counters: Option<OomCounters>,
    /// Without Kubernetes, the findings said in the log as they begin and end.
    findings_told: Option<FindingChanges>,
}

impl Between {
    /// What the watcher told: the kernel's XIDs counted with NVML's (seen at the next scan),
    /// the workloads' failures told at once.
    fn on_told(&mut self, told: Told, snapshot: &SharedSnapshot) {
        let last = snapshot.load_full();
        if !told.gpus.is_empty() {
            let gpus = last.as_deref().map_or(&[][..], |s| s.gpus.as_slice());
            let counts = self.scanner.xid_counts();
            self.kernel_xids
                .count(told.gpus, gpus, &counts, Instant::now());
        }
        if told.failures.is_empty() {
            return;
        }
        let pods = self.kube.as_ref().and_then(|k| k.pods.index());
        let holders = self
            .kube
            .as_ref()
            .map_or_else(|| Arc::new(GpuHolders::new()), |k| k.gpu_holders.holders());
        let (failures, next) = self.failures.tell(
            &told.failures,
            last.as_deref(),
            pods.as_ref(),
            &holders,
            Instant::now(),
        );
        if let Some(k) = self.kube.as_mut() {
            k.after_failures(&failures, pods.as_ref());
        }
        if let Some(next) = next {
            snapshot.store(Some(Arc::new(next)));
        }
    }

    /// Waits until `deadline`, handling what the watcher tells meanwhile; false: stop.
    fn wait(
        &mut self,
        deadline: Instant,
        wake: &mpsc::Receiver<Wake>,
        snapshot: &SharedSnapshot,
    ) -> bool {
        loop {
            let now = Instant::now();
            if deadline <= now {
                return true;
            }
            match wake.recv_timeout(deadline - now) {
                Err(RecvTimeoutError::Timeout) => return true,
                Ok(Wake::Failures(told)) => self.on_told(told, snapshot),
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}

/// Scans every `interval` until told to stop. A slow scan delays the next one rather than
/// piling up; missed periods are skipped, not caught up. Failures the watcher finds between
/// scans are correlated with the last snapshot and published at once.
fn scan_loop(
    mut b: Between,
    interval: Duration,
    snapshot: &SharedSnapshot,
    metrics: &Metrics,
    health: &Health,
    wake: &mpsc::Receiver<Wake>,
) {
    // Series born before the Pod cache syncs carry empty names and are renamed moments later,
    // which resets every alert's `for:`: the first scan (and so /readyz) waits, boundedly.
    if let Some(wait) = b.kube.as_ref().map(|k| k.pod_cache_wait) {
        let started = Instant::now();
        while !b.kube.as_ref().is_some_and(|k| k.pods.is_synced()) {
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                tracing::warn!(
                    waited = ?wait,
                    "the pod cache has not synced; scanning without pod names until it does \
                     (shmlink_kube_pod_cache_synced 0)"
                );
                break;
            }
            if !b.wait(
                Instant::now() + left.min(Duration::from_millis(20)),
                wake,
                snapshot,
            ) {
                return;
            }
        }
    }
    let mut next = Instant::now();
    let mut first = true;
    loop {
        let pods = b.kube.as_ref().and_then(|k| k.pods.index());
        if b.kube.is_some() {
            metrics.set_pod_cache_synced(pods.is_some());
        }
        let began = Instant::now();
        let mut out = b.scanner.scan_with(pods.as_ref());
        metrics.record_scan(&out.runs);
        // The kernel log's GPUs fallen off the bus, against what NVML just said of them.
        let counts = b.scanner.xid_counts();
        b.kernel_xids
            .confirm(&out.snapshot.gpus, out.snapshot.nvml_up, began, &counts);
        if let Some(k) = b.kube.as_mut() {
            k.after_scan(&out.snapshot, pods.as_ref());
        }
        if let Some(told) = b.findings_told.as_mut() {
            log_changes(told.update(&out.snapshot.findings));
        }
        if first {
            tracing::info!(
                containers = out.snapshot.shm.len(),
                findings = out.snapshot.findings.len(),
                "first scan done"
            );
            first = false;
        }
        b.failures.after_scan(&mut out.snapshot, Instant::now());
        let counted = b.oom_counters.as_mut().map_or_else(Vec::new, |c| {
            c.after_scan(&out.snapshot.shm, std::time::SystemTime::now())
        });
        snapshot.store(Some(Arc::new(out.snapshot)));
        health.mark_scanned();
        if !counted.is_empty() {
            b.on_told(
                Told {
                    failures: counted,
                    gpus: Vec::new(),
                },
                snapshot,
            );
        }

        next += interval;
        let now = Instant::now();
        if next <= now {
            next = now + interval;
        } else if !b.wait(next, wake, snapshot) {
            return;
        }
    }
}

/// A finding's beginning and end in the log, with the words its Event would carry.
fn log_changes(changed: Changed) {
    for f in changed.began {
        tracing::warn!(
            kind = f.kind.as_str(),
            subject = %f.subject,
            severity = ?f.severity,
            "finding began: {}",
            f.message
        );
    }
    for f in changed.ended {
        tracing::warn!(
            kind = f.kind.as_str(),
            subject = %f.subject,
            "finding ended: {}",
            f.message
        );
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

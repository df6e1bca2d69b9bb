//! `shmlink serve`: a scan thread that stores snapshots, a follower thread that tells failures
//! through the one pipeline, the HTTP server that reads the snapshots, and the cluster's tasks.
//!
//! - `cluster.rs`: the Kubernetes side (Pods, GPU holders, Events, Node conditions);
//! - `scan_loop.rs`: the scan thread, the only writer of the shared snapshot.

mod changes;
mod cluster;
mod death_trace;
mod holds;
mod job_links;
mod resume;
mod scan_loop;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::net::TcpListener;

pub use cluster::KubeSettings;
use cluster::KubeView;
pub use death_trace::DeathTraceSettings;
use scan_loop::{scan_loop, Between, Wake};

use crate::failures::ledger::Ledger;
use crate::failures::oom_counters::OomCounters;
use crate::failures::sources::{self, Follow};
use crate::failures::{Mode, Pipeline, Sources};
use crate::gpu::xid::kernel::KernelXids;
use crate::host::HostError;
use crate::kube::{self as k8s, KubeError};
use crate::metrics::{Metrics, SharedSnapshot};
use crate::probe::ProbeOptions;
use crate::scan::{ScanSettings, Scanner, ServeScan};
use crate::server::{self, AppState, Health};
use crate::state;
use changes::FindingChanges;

/// How often a container's /dev/shm is sampled between scans while it is half full or growing.
pub const PEAK_PERIOD: Duration = Duration::from_millis(200);

/// Everything `serve` is asked.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub scan: ScanSettings,
    pub listen: SocketAddr,
    pub interval: Duration,
    pub kube: KubeSettings,
    pub sources: Sources,
    /// The GPU pair probe and how often it runs, if asked for.
    pub probe: Option<(ProbeOptions, Duration)>,
    /// The kernel's tracepoints of deaths (`--death-trace`).
    pub death_trace: DeathTraceSettings,
    /// The state store's directory (`--state-dir`); None: no store.
    pub state_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Host(#[from] HostError),
    // The source is said after it by the chain printer (main's `{:#}`), once.
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP server")]
    Http(#[source] std::io::Error),
    #[error("starting the {0} thread")]
    Thread(&'static str, #[source] std::io::Error),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("--death-trace on: {0}")]
    DeathTrace(crate::death_trace::Refused),
}

/// `--gpu-device-taint`'s effect; None when off.
pub fn device_taint_effect(
    mode: crate::cli::DeviceTaintMode,
) -> Option<crate::kube::device_taint::Effect> {
    use crate::cli::DeviceTaintMode as M;
    use crate::kube::device_taint::Effect;
    match mode {
        M::Off => None,
        M::None => Some(Effect::None),
        M::NoSchedule => Some(Effect::NoSchedule),
        M::NoExecute => Some(Effect::NoExecute),
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn serve(settings: ServeSettings) -> Result<(), AgentError> {
    #[rustfmt::skip]
    let ServeSettings { scan, listen, interval, kube, sources, probe, death_trace, state_dir } =
        settings;
    let (mut scanner, pipeline) = scanner_and_pipeline(&scan, &sources)?;
    // Bound first: a serve that cannot listen exits without touching the state store.
    let listener = bind(listen, interval).await?;
    let on = (&scan, kube.gpu_device_taint.is_some());
    let (store, metrics, snapshot) = open_store(state_dir.as_deref(), on, &mut scanner).await;
    let health = Arc::new(Health::new(interval));
    let runtime = tokio::runtime::Handle::current();
    let (wake_tx, wake_rx) = mpsc::channel::<Wake>();
    let (deaths_tx, deaths_rx) = mpsc::channel();
    let (resume, kube_resume) = resume::resumes(store.as_ref());
    let on = (interval, &metrics, &runtime);
    let kube = k8s::connect(kube.mode)
        .await?
        .map(|c| KubeView::spawn(c, &kube, on, deaths_tx, kube_resume));
    let holds = holds::resume(store.as_ref(), &scan, &mut scanner);
    let (stop, host) = (Arc::new(AtomicBool::new(false)), &scan.host);
    let traced = death_trace::start(&death_trace, host, &sources, &stop, &metrics)?;
    let follower = spawn_follower(
        Follow {
            sources,
            pipeline,
            snapshot: snapshot.clone(),
            cluster: kube.as_ref().map(KubeView::caches),
            exits: deaths_rx,
            traced: traced.deaths,
            stop: stop.clone(),
            resume,
        },
        wake_tx.clone(),
        metrics.clone(),
    )?;
    let prober = spawn_prober(probe, &scanner, &snapshot, &stop)?;
    let between = Between {
        scanner,
        findings_told: kube.is_none().then(FindingChanges::default),
        blind_told: Vec::new(),
        kube,
        ledger: Ledger::default(),
        kernel_xids: KernelXids::default(),
        store: store
            .as_ref()
            .map(|s| (s.sender(), FindingChanges::default())),
        holds,
        job_links: job_links::Keeper::resume(store.as_ref()),
        slow_commits: 0,
        death_trace_off: traced.off,
    };
    let scan_thread = thread::Builder::new()
        .name("scan".into())
        .spawn({
            let (snapshot, metrics, health) = (snapshot.clone(), metrics.clone(), health.clone());
            move || scan_loop(between, interval, &snapshot, &metrics, &health, &wake_rx)
        })
        .map_err(|e| AgentError::Thread("scan", e))?;
    let threads = [Some(scan_thread), prober, Some(follower), traced.handle];

    let state = Arc::new(AppState {
        metrics,
        snapshot,
        health,
        history: store.as_ref().and(state_dir),
    });
    let served = server::run(listener, state, server::shutdown_signal()).await;

    let _ = wake_tx.send(Wake::Stop);
    stop.store(true, Ordering::Relaxed);
    join(threads, store).await;
    tracing::info!("stopped");
    served.map_err(AgentError::Http)
}

/// How long the start waits for the state store before it goes on without one.
pub const STORE_OPEN_WAIT: Duration = Duration::from_secs(10);

/// The state store, opened (and checked) off the runtime, waited for at most
/// [`STORE_OPEN_WAIT`]; None without one (the reasons are said by the store, once). The scanner takes up the link counters it kept. With the
/// metrics (their families, the device taints' too when on) and the snapshot they export.
async fn open_store(
    dir: Option<&std::path::Path>,
    (scan, device_taints): (&ScanSettings, bool),
    scanner: &mut Scanner,
) -> (Option<state::Store>, Arc<Metrics>, SharedSnapshot) {
    let snapshot: SharedSnapshot = Arc::new(ArcSwapOption::empty());
    let mut metrics = Metrics::new(snapshot.clone());
    if device_taints {
        metrics.register_device_taints();
    }
    let Some(dir) = dir else {
        tracing::info!("--state-dir none: no state kept across restarts");
        return (None, Arc::new(metrics), snapshot);
    };
    // Only with a store asked for: `none` has no series to say.
    let state_metrics = state::StateMetrics::default();
    metrics.register_more(|r| state_metrics.register(r));
    let identity = state::Identity {
        node: scan.node.clone(),
        boot_id: state::boot_id(&scan.host.proc_root),
    };
    let dir = dir.to_path_buf();
    let mut store = tokio::task::spawn_blocking(move || {
        let options = state::Options::default();
        state::Store::open_within(&dir, &identity, options, &state_metrics, STORE_OPEN_WAIT).ok()
    })
    .await
    .ok()
    .flatten();
    if let Some(s) = store.as_mut() {
        scanner.resume_link_samples(s.take_link_samples());
    }
    (store, Arc::new(metrics), snapshot)
}

/// How long stopping waits for the threads: a kubelet sends SIGKILL 30 s after SIGTERM (by
/// default), and an agent stuck Terminating blocks rollouts and drains.
const JOIN_WAIT: Duration = Duration::from_secs(5);

/// The scan thread finishes its current scan (if any) and exits; the follower its poll. A
/// thread that has not ended within [`JOIN_WAIT`] is left (said once): returning ends the
/// process, threads and all. The joins run on a thread of their own, not the runtime's
/// blocking pool, which the runtime's shutdown would wait for. The state store closes last
/// (its writer commits the last batch, with what the stopped threads sent).
async fn join(
    threads: impl IntoIterator<Item = Option<thread::JoinHandle<()>>> + Send + 'static,
    store: Option<state::Store>,
) {
    let (done, joined) = tokio::sync::oneshot::channel::<()>();
    let joiner = thread::Builder::new().name("join".into()).spawn(move || {
        for t in threads.into_iter().flatten() {
            let _ = t.join();
        }
        drop(store);
        let _ = done.send(());
    });
    if joiner.is_err() {
        return;
    }
    if tokio::time::timeout(JOIN_WAIT, joined).await.is_err() {
        tracing::warn!(waited = ?JOIN_WAIT, "a thread did not stop in time: exiting without it");
    }
}

/// The pair probe's own thread, when `--p2p-probe-interval` asks for one.
fn spawn_prober(
    probe: Option<(ProbeOptions, Duration)>,
    scanner: &Scanner,
    snapshot: &SharedSnapshot,
    stop: &Arc<AtomicBool>,
) -> Result<Option<thread::JoinHandle<()>>, AgentError> {
    probe
        .map(|(opts, every)| {
            let results = scanner.probe_results();
            crate::probe::schedule::spawn(opts, every, snapshot.clone(), results, stop.clone())
                .map_err(|e| AgentError::Thread("probe", e))
        })
        .transpose()
}

async fn bind(listen: SocketAddr, interval: Duration) -> Result<TcpListener, AgentError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().unwrap_or(listen);
    tracing::info!(addr = %local, interval = ?interval, "serving /metrics, /healthz, /readyz");
    Ok(listener)
}

/// `serve`'s scanner and failure pipeline; without the kernel log, OOM kills are told from the
/// memory cgroups' counters, which each scan then reads.
fn scanner_and_pipeline(
    scan: &ScanSettings,
    sources: &Sources,
) -> Result<(Scanner, Pipeline), AgentError> {
    let oom_counters = match (&sources.kmsg, scan.host.memory_hierarchy()) {
        (None, Ok((hierarchy, version))) => Some(OomCounters::new(
            hierarchy,
            version,
            sources.rules.oom_shm_share,
        )),
        _ => None,
    };
    let serve_scan = ServeScan {
        peak_period: PEAK_PERIOD,
        oom_kills: oom_counters.is_some(),
    };
    let scanner = Scanner::for_serve(scan, serve_scan)?;
    let mut pipeline = Pipeline::new(sources, Mode::Follow);
    if let Some(counters) = oom_counters {
        pipeline = pipeline.with_oom_counters(counters);
    }
    Ok((scanner, pipeline))
}

/// The failure follower, handing what it tells to the scan thread and its sources' counts to
/// the metrics.
fn spawn_follower(
    follow: Follow,
    wake: mpsc::Sender<Wake>,
    metrics: Arc<Metrics>,
) -> Result<thread::JoinHandle<()>, AgentError> {
    let mut last = None;
    let report = move |now: &crate::model::SourceStats| {
        metrics.record_sources(now, last.as_ref());
        last = Some(*now);
    };
    let deliver = move |followed| wake.send(Wake::Followed(followed)).is_ok();
    sources::follow(follow, deliver, report).map_err(|e| AgentError::Thread("failures", e))
}

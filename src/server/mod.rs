//! HTTP: `/metrics` from the last snapshot, `/healthz` (the scan loop is alive: a scan finished
//! within the grace, before the first one too, so a scan thread stuck anywhere fails it), `/readyz`
//! (a first scan has completed, and the last could see: not blind), `/api/v1/failures` (the
//! stored history, written as it is read). GET (and HEAD) only; everything else is 404 or 405.
//!
//! What a client may hold (connections, deadlines, the probes' reserve) is `listen.rs`, shared
//! with `admit`; the heavy answers take turns (`heavy.rs`); the history is `failures.rs`.

pub mod failures;
pub mod heavy;
pub mod listen;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::metrics::http::Shed;
use crate::metrics::{Metrics, SharedSnapshot, CONTENT_TYPE};
use crate::model::Snapshot;
use heavy::Heavy;
use listen::{Client, Limits, Plain, PROBE_PATHS};

/// Liveness of the scan loop, shared between the scan thread and the HTTP handlers.
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` at which the last scan finished; 0 before the first.
    last_scan_ms: AtomicU64,
    /// How long without a finished scan before /healthz fails.
    stale_after: Duration,
}

impl Health {
    pub fn new(interval: Duration) -> Self {
        Health {
            started: Instant::now(),
            last_scan_ms: AtomicU64::new(0),
            // A few missed periods, and never less than a minute: a slow scan is not a dead agent.
            stale_after: (interval * 5).max(Duration::from_secs(60)),
        }
    }

    pub fn mark_scanned(&self) {
        let ms = self.started.elapsed().as_millis().max(1) as u64;
        self.last_scan_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the last finished scan (or since start, before the first).
    fn since_last_scan(&self) -> Duration {
        let last = Duration::from_millis(self.last_scan_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn is_live(&self) -> bool {
        self.since_last_scan() < self.stale_after
    }
}

pub struct AppState {
    pub metrics: Arc<Metrics>,
    pub snapshot: SharedSnapshot,
    pub health: Arc<Health>,
    /// The state directory `/api/v1/failures` reads (`serve --state-dir`), if any.
    pub history: Option<std::path::PathBuf>,
}

/// What the handlers share: the agent's state and the turns of the heavy answers.
pub struct Served {
    pub app: Arc<AppState>,
    /// `/metrics`: a few scrapes at once, one per client.
    scrapes: Arc<Heavy>,
    /// `/api/v1/failures`: fewer, each a reading of the store.
    reads: Arc<Heavy>,
}

/// How long a heavy answer waits for its turn before a 503: a scrape or a reading takes
/// milliseconds, so a turn that does not come in this long is held by clients that do not read.
pub const TURN_WAIT: Duration = Duration::from_secs(5);

pub fn router(state: Arc<AppState>) -> Router {
    let served = Arc::new(Served {
        app: state,
        scrapes: Heavy::new(4, 1, TURN_WAIT),
        reads: Heavy::new(2, 1, TURN_WAIT),
    });
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/v1/failures", get(failures::failures))
        .route("/api/v1/gpus", get(gpus))
        .with_state(served)
}

/// What one client may hold of `serve`'s port: Prometheus holds one connection per scraper,
/// the kubelet one per probe, kube-rbac-proxy (in front, where used) a few; an agent exposed on
/// every node gives no one more than that, and keeps room for the probes.
pub fn limits() -> Limits {
    Limits {
        max_connections: 64,
        per_client: 8,
        probe_reserve: 16,
        probe_reserve_per_client: 2,
        probe_paths: PROBE_PATHS,
        first_request: Duration::from_secs(5),
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        // Keep-alive scrapers reconnect: a TCP handshake a minute is nothing.
        lifetime: Some(Duration::from_secs(60)),
        grace: Duration::from_secs(5),
        h2_max_streams: 1,
        h2_window: 65_535,
        max_buf: 64 << 10,
        http2: false,
    }
}

/// Serves until `shutdown` resolves, then finishes the requests in flight.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_with(listener, state, limits(), shutdown).await
}

/// `run` with explicit limits.
pub async fn run_with(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = state.metrics.http.clone();
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let served = listen::serve(listener, Plain, router(state), limits, metrics, closing);
    let signal = async move {
        shutdown.await;
        let _ = closing_tx.send(true);
    };
    tokio::join!(served, signal);
    Ok(())
}

/// Resolves at SIGTERM or SIGINT (what `serve` and `admit` stop on).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
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

/// A turn's 503: the client may come back in a second.
pub(crate) fn busy(served: &Served) -> Response {
    served.app.metrics.http.shed(Shed::Busy);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        "busy: too many answers of this kind are being written; try again\n",
    )
        .into_response()
}

/// The client a request came from (none when the router is called directly, as in tests).
pub(crate) fn client_of(client: Option<Extension<Client>>) -> Client {
    client.map_or(
        Client::of(std::net::Ipv4Addr::UNSPECIFIED.into()),
        |Extension(c)| c,
    )
}

async fn metrics(State(served): State<Arc<Served>>, client: Option<Extension<Client>>) -> Response {
    let Some(turn) = served.scrapes.turn(client_of(client)).await else {
        return busy(&served);
    };
    match served.app.metrics.encode() {
        Ok(text) => {
            let length = text.len();
            let body = heavy::in_pieces(Bytes::from(text), turn);
            let headers = [
                (header::CONTENT_TYPE, CONTENT_TYPE.to_string()),
                (header::CONTENT_LENGTH, length.to_string()),
            ];
            (headers, body).into_response()
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// `GET /api/v1/gpus`: the node, its driver, fabric manager and kernel, and each GPU's NVLink
/// domain, chassis and VBIOS from the last scan (`shmlink fleet` groups by them); 503 before it.
/// Small (a few KiB), built from the snapshot alone: no turn is taken.
async fn gpus(State(served): State<Arc<Served>>) -> Response {
    let Some(snapshot) = served.app.snapshot.load_full() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "first scan not finished\n").into_response();
    };
    match serde_json::to_string(&crate::model::NodeKeys::of(&snapshot)) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

async fn healthz(State(served): State<Arc<Served>>) -> (StatusCode, &'static str) {
    if served.app.health.is_live() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no scan finished recently\n",
        )
    }
}

async fn readyz(State(served): State<Arc<Served>>) -> (StatusCode, String) {
    match readiness(served.app.snapshot.load().as_deref()) {
        Ok(detail) => (StatusCode::OK, format!("ready\n{detail}")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// Ready once a scan finished that could see: an agent blind to every container (wrong
/// --proc-root, no cgroups, no permission) is not ready, with the reasons as the body.
/// Ready: what the agent does not see though ready (`death_trace_off`), one line each; not
/// ready: why.
fn readiness(snapshot: Option<&Snapshot>) -> Result<String, String> {
    let Some(snapshot) = snapshot else {
        return Err("first scan not finished\n".into());
    };
    let mut why = String::new();
    for reason in snapshot.blind_totally() {
        why.push_str(&crate::text::blind(reason, &snapshot.sight));
        why.push('\n');
    }
    if why.is_empty() {
        let off = snapshot
            .findings
            .iter()
            .filter(|f| f.kind == crate::model::FindingKind::DeathTraceOff);
        Ok(off.map(|f| format!("{}\n", f.message)).collect())
    } else {
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_before_a_scan_nor_while_blind() {
        use crate::model::Blind;
        assert_eq!(
            readiness(None),
            Err("first scan not finished\n".to_string())
        );
        let mut s = Snapshot::default();
        assert_eq!(readiness(Some(&s)), Ok(String::new()));
        s.blind = vec![Blind::SomeContainersUnreadable];
        assert_eq!(
            readiness(Some(&s)),
            Ok(String::new()),
            "partly blind is still ready"
        );
        // The moment of death unread: ready, and said.
        let off = crate::text::death_trace_off("no tracefs");
        s.findings.push(crate::model::Finding::new(
            crate::model::FindingKind::DeathTraceOff,
            crate::model::Subject::Node,
            off.clone(),
        ));
        assert_eq!(readiness(Some(&s)), Ok(format!("{off}\n")));
        s.blind = vec![Blind::NoProcesses, Blind::NoCgroups];
        let why = readiness(Some(&s)).unwrap_err();
        assert!(why.contains("blind (no_processes)"), "{why}");
        assert!(why.contains("blind (no_cgroups)"), "{why}");
        assert_eq!(why.lines().count(), 2);
    }

    #[test]
    fn a_scan_thread_stuck_before_or_after_its_first_scan_fails_health_after_the_grace() {
        let mut h = Health::new(Duration::from_secs(5));
        assert_eq!(h.stale_after, Duration::from_secs(60), "the grace");
        let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(61)) else {
            return; // a machine up for less than a minute has no past to stand in
        };
        // Stuck in its first scan (or the wait for the Pod cache) for over the grace.
        h.started = long_ago;
        assert!(!h.is_live());
        h.mark_scanned();
        assert!(h.is_live());
        // Its last scan finished 61 s ago and none since: stuck in a later one.
        h.last_scan_ms.store(1, Ordering::Relaxed);
        assert!(!h.is_live());
    }

    #[test]
    fn health_goes_stale_without_scans() {
        let mut h = Health::new(Duration::from_millis(100));
        assert!(h.is_live());
        h.stale_after = Duration::ZERO;
        assert!(!h.is_live());
        h.stale_after = Duration::from_secs(60);
        h.mark_scanned();
        assert!(h.is_live());
    }
}

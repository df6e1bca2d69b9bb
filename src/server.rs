//! HTTP: `/metrics` from the last snapshot, `/healthz` (the scan loop is alive: a scan finished
//! within the grace, before the first one too, so a scan thread stuck anywhere fails it), `/readyz`
//! (a first scan has completed, and the last could see: not blind). GET (and HEAD) only; everything else is 404 or 405.
//!
//! The accept loop is our own rather than `axum::serve`, which has no knobs for what a node
//! agent exposed on every node needs: a bounded number of connections (the rest wait in the
//! listen backlog), a deadline for a client's request head (slowloris), and a cap on a
//! connection's lifetime (a client that never reads its answer).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::task::JoinSet;

use crate::metrics::{Metrics, SharedSnapshot, CONTENT_TYPE};
use crate::model::Snapshot;
use crate::state::Filter;

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

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/v1/failures", get(failures))
        .route("/api/v1/gpus", get(gpus))
        .with_state(state)
}

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// From a connection's start (or the end of its last answer) to the end of a request head.
    pub header_timeout: Duration,
    /// A connection is closed after this long, gracefully: an answer in flight gets `grace`.
    pub connection_lifetime: Duration,
    /// How long an answer in flight may take once its connection is closing.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Prometheus holds one per scraper; a few scrapers and probes fit many times over.
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            // Keep-alive scrapers reconnect: a TCP handshake a minute is nothing.
            connection_lifetime: Duration::from_secs(60),
            grace: Duration::from_secs(5),
        }
    }
}

/// Serves until `shutdown` resolves, then finishes the requests in flight.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_with(listener, state, Limits::default(), shutdown).await
}

/// `run` with explicit limits.
pub async fn run_with(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // A slot first, then accept: at the limit, new clients wait in the backlog.
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            stream = accept(&listener) => stream,
        };
        let service = TowerToHyperService::new(app.clone());
        let mut closing = closing_rx.clone();
        connections.spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = tokio::time::sleep(limits.connection_lifetime) => {}
                _ = closing.wait_for(|c| *c) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.grace, connection).await;
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let _ = tokio::time::timeout(limits.grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// The next connection (no Nagle: answers are small and whole). An error (out of file
/// descriptors and the like) is logged and waited out, never spun on.
pub async fn accept(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                return stream;
            }
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
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

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

async fn healthz(State(state): State<Arc<AppState>>) -> (StatusCode, &'static str) {
    if state.health.is_live() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no scan finished recently\n",
        )
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, String) {
    match readiness(state.snapshot.load().as_deref()) {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// The rows of each kind `/api/v1/failures` answers at most (the newest): a bounded answer.
pub const FAILURES_LIMIT: usize = 1000;

/// `GET /api/v1/failures?since=1h&namespace=NS&pod=NAME`: the stored history as `history
/// --json` prints it, read on a blocking thread (SQLite's reads are file I/O).
async fn failures(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    let Some(dir) = state.history.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "no state store (serve --state-dir none)\n",
        )
            .into_response();
    };
    let filter = match failures_filter(query.as_deref().unwrap_or(""), SystemTime::now()) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let read = tokio::task::spawn_blocking(move || crate::state::read_history(&dir, &filter)).await;
    match read {
        Ok(Ok(history)) => match serde_json::to_string(&history) {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
        },
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "the read failed\n").into_response(),
    }
}

/// `GET /api/v1/gpus`: the node, its driver, fabric manager and kernel, and each GPU's NVLink
/// domain, chassis and VBIOS from the last scan (`shmlink fleet` groups by them); 503 before it.
async fn gpus(State(state): State<Arc<AppState>>) -> Response {
    let Some(snapshot) = state.snapshot.load_full() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "first scan not finished\n").into_response();
    };
    match serde_json::to_string(&crate::model::NodeKeys::of(&snapshot)) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// Pure: the query string's filter (`since` default 1h). Names are DNS labels, so an escaped
/// character is refused rather than decoded.
pub fn failures_filter(query: &str, now: SystemTime) -> Result<Filter, String> {
    let mut filter = Filter {
        since: now.checked_sub(Duration::from_secs(3600)),
        limit: FAILURES_LIMIT,
        ..Filter::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if value.contains(['%', '+']) {
            return Err(format!("{key}: escaped characters are not accepted\n"));
        }
        match key {
            "since" => {
                let d = humantime::parse_duration(value)
                    .map_err(|e| format!("since={value}: {e} (examples: 30m, 1h, 2d)\n"))?;
                filter.since = now.checked_sub(d);
            }
            "namespace" => filter.namespace = Some(value.to_string()),
            "pod" => filter.pod = Some(value.to_string()),
            _ => return Err(format!("unknown parameter {key} (since, namespace, pod)\n")),
        }
    }
    Ok(filter)
}

/// Ready once a scan finished that could see: an agent blind to every container (wrong
/// --proc-root, no cgroups, no permission) is not ready, with the reasons as the body.
fn readiness(snapshot: Option<&Snapshot>) -> Result<(), String> {
    let Some(snapshot) = snapshot else {
        return Err("first scan not finished\n".into());
    };
    let mut why = String::new();
    for reason in snapshot.blind_totally() {
        why.push_str(&crate::text::blind(reason, &snapshot.sight));
        why.push('\n');
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failures_query_takes_since_namespace_and_pod_and_refuses_the_rest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let f = failures_filter("", now).unwrap();
        assert_eq!(f.since, Some(now - Duration::from_secs(3600)));
        assert_eq!(f.limit, FAILURES_LIMIT);
        let f = failures_filter("since=2d&namespace=ml&pod=trainer-0", now).unwrap();
        assert_eq!(f.since, Some(now - Duration::from_secs(2 * 86400)));
        assert_eq!(f.namespace.as_deref(), Some("ml"));
        assert_eq!(f.pod.as_deref(), Some("trainer-0"));
        assert!(failures_filter("since=soon", now).is_err());
        assert!(failures_filter("pod=a%2Fb", now).is_err());
        assert!(failures_filter("limit=5", now).is_err());
    }

    #[test]
    fn not_ready_before_a_scan_nor_while_blind() {
        use crate::model::Blind;
        assert_eq!(
            readiness(None),
            Err("first scan not finished\n".to_string())
        );
        let mut s = Snapshot::default();
        assert_eq!(readiness(Some(&s)), Ok(()));
        s.blind = vec![Blind::SomeContainersUnreadable];
        assert_eq!(readiness(Some(&s)), Ok(()), "partly blind is still ready");
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

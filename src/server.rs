//! HTTP: `/metrics` from the last snapshot, `/healthz` (the scan loop is alive), `/readyz`
//! (a first scan has completed). GET only; everything else is 404 or 405.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::metrics::{Metrics, SharedSnapshot, CONTENT_TYPE};

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
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then finishes the requests in flight.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
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

async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, &'static str) {
    if state.snapshot.load().is_some() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "first scan not finished\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

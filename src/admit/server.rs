//! `shmlink admit`'s servers: the webhook over HTTPS (HTTP/2 or HTTP/1.1, as ALPN chose), and
//! `/metrics` over plain HTTP; the certificate read again every `--tls-reload-interval`.
//!
//! Every request body goes to `review::answer`, which alone decides; this file reads bodies
//! (bounded in size, in time, and in bytes held by all requests together), counts, logs and
//! writes what `answer` says. What a client may hold of each listener (connections per client
//! and in all, the probes' reserve, a first request's deadline, idle and slow connections
//! closed) is `crate::server::listen`'s, shared with `serve`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::server::listen::{self, Handshake, Plain};

use super::dra::DraView;
use super::dra_lookup::DraResolver;
use super::metrics::AdmissionMetrics;
use super::review;
use super::tls::{self, Reload, Resolver, TlsError, Watcher};
use super::{Mode, Outcome};

/// The largest AdmissionReview read: a Pod is far smaller, and the API server's own request
/// limit is 3 MiB; past this the answer is 413.
pub const MAX_BODY: usize = 8 << 20;

/// Bodies past this size are decided on a blocking thread (parsing megabytes of JSON takes
/// milliseconds the runtime's other connections should not wait for).
const BLOCKING_BODY: usize = 256 << 10;

/// What `shmlink admit` was asked to do.
#[derive(Debug, Clone)]
pub struct AdmitSettings {
    pub listen: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The mode of `POST /mutate`.
    pub mode: Mode,
    /// Plain HTTP `/metrics` and `/healthz`, or none.
    pub metrics_listen: Option<SocketAddr>,
    pub reload_interval: Duration,
    pub limits: Limits,
    /// Looks up what a Pod's DRA claims give (none: DRA Pods count by their device-plugin
    /// resources only).
    pub dra: Option<Arc<DraResolver>>,
}

/// Request bytes held at once by all requests being read or decided, together: past it a
/// request waits (within its body deadline), then is answered 503.
pub const BODY_BUDGET: usize = 16 << 20;

/// Decisions of large bodies (on blocking threads) at once: each holds its body's parse.
const DECIDING_AT_ONCE: usize = 2;

/// What `admit` lets its clients hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The webhook's HTTPS listener (the plain `/metrics` one takes the same, HTTP/1.1 only).
    pub conns: listen::Limits,
    /// A request body, read whole, at most.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            conns: listen::Limits {
                // The API servers hold a few connections each (HTTP/2 multiplexes reviews):
                // room for many, not a limit they meet. A connection costs tens of KiB (TLS
                // and HTTP/2 buffers), so this is also what keeps admit in its 64 MiB.
                max_connections: 256,
                // An API server behind one address (or a NAT of several) bursting on
                // HTTP/1.1 opens one connection per review in flight.
                per_client: 64,
                probe_reserve: 16,
                probe_reserve_per_client: 2,
                probe_paths: &["/healthz"],
                // A TLS handshake and the request head, from accept: the API server and the
                // kubelet send both at once.
                first_request: Duration::from_secs(5),
                // Also how long an HTTP/1.1 connection may idle between requests: longer than
                // the API server's (Go's) 90 s idle timeout, so the client closes first and
                // never sends on a connection the server is closing (the request would fail,
                // the Pod go unjudged).
                header_timeout: Duration::from_secs(120),
                idle_timeout: Duration::from_secs(120),
                // The API server gives up on a webhook after timeoutSeconds (3 s, at most 30 s).
                request_timeout: Duration::from_secs(30),
                lifetime: None,
                grace: Duration::from_secs(10),
                h2_max_streams: 32,
                h2_window: 64 << 10,
                max_buf: 64 << 10,
                http2: true,
            },
            body_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

struct AppState {
    mode: Mode,
    metrics: Arc<AdmissionMetrics>,
    body_timeout: Duration,
    /// [`BODY_BUDGET`] in KiB.
    budget: Arc<Semaphore>,
    deciding: Arc<Semaphore>,
    dra: Option<Arc<DraResolver>>,
}

/// Serves until `shutdown` resolves, then stops accepting and finishes what is in flight.
/// Errors only at start: a certificate that does not load, an address taken.
pub async fn serve(
    settings: AdmitSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdmitError> {
    let (watcher, loaded) = Watcher::start(settings.cert_file.clone(), settings.key_file.clone())?;
    let metrics = AdmissionMetrics::new();
    metrics.serving_until(loaded.not_after);
    let resolver = Arc::new(Resolver::new(loaded.key));
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(resolver.clone())?));
    let https = bind(settings.listen).await?;
    let plain = match settings.metrics_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    tracing::info!(
        listen = %settings.listen,
        metrics = ?settings.metrics_listen,
        mode = %settings.mode,
        "serving admission reviews"
    );
    let (closing_tx, closing) = watch::channel(false);
    let reload = tokio::spawn(reload_loop(
        watcher,
        resolver,
        metrics.clone(),
        settings.reload_interval,
    ));
    let state = Arc::new(AppState {
        mode: settings.mode,
        metrics: metrics.clone(),
        body_timeout: settings.limits.body_timeout,
        budget: Arc::new(Semaphore::new(BODY_BUDGET >> 10)),
        deciding: Arc::new(Semaphore::new(DECIDING_AT_ONCE)),
        dra: settings.dra.clone(),
    });
    let limits = settings.limits.conns;
    let tls = Tls {
        acceptor,
        metrics: metrics.clone(),
    };
    let http = metrics.http.clone();
    let webhook = listen::serve(
        https,
        tls,
        webhook_router(state),
        limits,
        http.clone(),
        closing.clone(),
    );
    let scrapes = async move {
        if let Some(listener) = plain {
            let limits = listen::Limits {
                http2: false,
                ..limits
            };
            let app = metrics_router(metrics);
            listen::serve(listener, Plain, app, limits, http, closing).await;
        }
    };
    let signal = async move {
        shutdown.await;
        let _ = closing_tx.send(true);
    };
    tokio::join!(webhook, scrapes, signal);
    reload.abort();
    tracing::info!("admission server stopped");
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, AdmitError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AdmitError::Bind { addr, source })
}

fn webhook_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/mutate",
            post(|s: State<Arc<AppState>>, b: Body| async move {
                let mode = s.mode;
                admission(s, mode, b).await
            }),
        )
        .route("/mutate/warn", post(|s, b| admission(s, Mode::Warn, b)))
        .route("/mutate/mutate", post(|s, b| admission(s, Mode::Mutate, b)))
        .route("/healthz", get(healthz))
        .with_state(state)
}

fn metrics_router(metrics: Arc<AdmissionMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(encode_metrics))
        .route("/healthz", get(healthz))
        .with_state(metrics)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn encode_metrics(State(metrics): State<Arc<AdmissionMetrics>>) -> Response {
    match metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// One AdmissionReview: read, answered by `review::answer`, counted, logged.
async fn admission(State(state): State<Arc<AppState>>, mode: Mode, body: Body) -> Response {
    let started = Instant::now();
    let answer = match read_body(body, state.body_timeout, &state.budget).await {
        Ok((bytes, held)) => {
            let dra = match &state.dra {
                Some(r) => r.resolve(&bytes).await,
                None => DraView::default(),
            };
            if bytes.len() > BLOCKING_BODY {
                let turn = state.deciding.clone().acquire_owned().await;
                let decided = tokio::task::spawn_blocking(move || {
                    let answer = review::answer_with(&bytes, mode, &dra);
                    drop((bytes, held, turn));
                    answer
                });
                match decided.await {
                    Ok(answer) => answer,
                    Err(_) => refused(
                        mode,
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the decision failed",
                    ),
                }
            } else {
                review::answer_with(&bytes, mode, &dra)
            }
        }
        Err(BodyError::TooLarge) => refused(
            mode,
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the request body is over {MAX_BODY} bytes"),
        ),
        Err(BodyError::Slow) => refused(
            mode,
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        ),
        Err(BodyError::Busy) => refused(
            mode,
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is busy reading other requests",
        ),
        Err(BodyError::Broken(why)) => refused(
            mode,
            StatusCode::BAD_REQUEST,
            &format!("the request body could not be read: {why}"),
        ),
    };
    let took = started.elapsed();
    state.metrics.decided(answer.mode, answer.outcome, took);
    tracing::info!(
        pod = answer.pod.as_deref().unwrap_or("-"),
        mode = answer.mode.as_str(),
        outcome = answer.outcome.as_str(),
        micros = took.as_micros() as u64,
        "{}",
        answer.summary
    );
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        answer.body,
    )
        .into_response()
}

/// An answer for a request `review::answer` never saw: a JSON error, counted as `error`.
fn refused(mode: Mode, status: StatusCode, why: &str) -> review::Answer {
    review::Answer {
        status: status.as_u16(),
        body: serde_json::to_vec(&serde_json::json!({ "error": why })).unwrap_or_default(),
        mode,
        outcome: Outcome::Error,
        pod: None,
        summary: why.to_string(),
    }
}

enum BodyError {
    TooLarge,
    Slow,
    Busy,
    Broken(String),
}

/// The whole body, at most [`MAX_BODY`] bytes and within `timeout`, each piece charged to the
/// `budget` (KiB) before it is kept; the charge is given back when the permit is dropped.
async fn read_body(
    mut body: Body,
    timeout: Duration,
    budget: &Arc<Semaphore>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut kib = 0u32;
    let mut bytes = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Slow),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Broken(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = bytes.len() + data.len();
        if len > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        let need = len.div_ceil(1024) as u32 - kib;
        if need > 0 {
            let more = budget.clone().acquire_many_owned(need);
            let Ok(Ok(more)) = tokio::time::timeout_at(deadline, more).await else {
                return Err(BodyError::Busy);
            };
            kib += need;
            match held.as_mut() {
                Some(h) => h.merge(more),
                None => held = Some(more),
            }
        }
        if bytes.is_empty() {
            bytes.reserve_exact(body_hint(&body).min(MAX_BODY).max(data.len()));
        }
        bytes.extend_from_slice(&data);
    }
    Ok((Bytes::from(bytes), held))
}

/// What the body says it will be (its Content-Length), for one allocation of that size.
fn body_hint(body: &Body) -> usize {
    use hyper::body::Body as _;
    let hint = body.size_hint();
    usize::try_from(hint.exact().unwrap_or(hint.lower())).unwrap_or(0)
}

/// Every `interval`, the files read again off the runtime; a new pair is stored for the next
/// handshakes, a broken one logged once and counted.
async fn reload_loop(
    mut watcher: Watcher,
    resolver: Arc<Resolver>,
    metrics: Arc<AdmissionMetrics>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let checked = tokio::task::spawn_blocking(move || {
            let reload = watcher.check();
            (watcher, reload)
        })
        .await;
        let Ok((back, reload)) = checked else {
            tracing::error!("the certificate reload stopped: its thread panicked");
            return;
        };
        watcher = back;
        match reload {
            Reload::Unchanged => {}
            Reload::Loaded(loaded) => {
                resolver.store(loaded.key);
                metrics.serving_until(loaded.not_after);
                metrics.reloaded(true);
                tracing::info!(not_after = loaded.not_after, "serving a new certificate");
            }
            Reload::Broken(e) => {
                metrics.reloaded(false);
                tracing::warn!("keeping the certificate served: {e}");
            }
        }
    }
}

/// The webhook's TLS: a handshake under the connection's first deadline, its failures counted
/// (a scanner, or an API server whose caBundle is not our CA: with failurePolicy Ignore the
/// latter admits every Pod unchecked, so the first is logged, then every 1,000th).
#[derive(Clone)]
struct Tls {
    acceptor: TlsAcceptor,
    metrics: Arc<AdmissionMetrics>,
}

impl Handshake for Tls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    async fn handshake(&self, tcp: TcpStream, deadline: tokio::time::Instant) -> Option<Self::Io> {
        let failed = match tokio::time::timeout_at(deadline, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => return Some(stream),
            // A port probe (connected, closed, said nothing) is no handshake.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        let n = self.metrics.handshake_failed();
        if n == 1 || n.is_multiple_of(1000) {
            tracing::warn!(failures = n, "TLS handshake failed: {failed}");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use tower::ServiceExt;

    fn app(metrics: &Arc<AdmissionMetrics>) -> Router {
        webhook_router(Arc::new(AppState {
            mode: Mode::Warn,
            metrics: metrics.clone(),
            body_timeout: Duration::from_millis(100),
            budget: Arc::new(Semaphore::new(BODY_BUDGET >> 10)),
            deciding: Arc::new(Semaphore::new(DECIDING_AT_ONCE)),
            dra: None,
        }))
    }

    async fn call(app: Router, method: &str, path: &str, body: Body) -> (u16, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn bodies_too_large_or_too_slow_are_json_errors_counted_in_the_routes_mode() {
        let metrics = AdmissionMetrics::new();
        let huge = Body::from(vec![b' '; MAX_BODY + 1]);
        let (status, body) = call(app(&metrics), "POST", "/mutate/mutate", huge).await;
        assert_eq!(status, 413);
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"], "the request body is over 8388608 bytes");
        // A body that never ends: the deadline answers, not the client.
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
        let (status, body) = call(app(&metrics), "POST", "/mutate", stalled).await;
        assert_eq!(status, 408, "{body}");
        // Exactly the limit is read and handed on (here: not JSON, so `answer` says 400).
        let full = Body::from(vec![b' '; MAX_BODY]);
        let (status, _) = call(app(&metrics), "POST", "/mutate/warn", full).await;
        assert_eq!(status, 400);
        let text = metrics.encode().unwrap();
        for line in [
            r#"shmlink_admission_decisions_total{mode="mutate",outcome="error"} 1"#,
            r#"shmlink_admission_decisions_total{mode="warn",outcome="error"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[tokio::test]
    async fn only_post_reviews_and_get_health() {
        let metrics = AdmissionMetrics::new();
        assert_eq!(
            call(app(&metrics), "GET", "/mutate", Body::empty()).await.0,
            405
        );
        assert_eq!(
            call(app(&metrics), "PUT", "/mutate/warn", Body::empty())
                .await
                .0,
            405
        );
        assert_eq!(
            call(app(&metrics), "POST", "/healthz", Body::empty())
                .await
                .0,
            405
        );
        assert_eq!(
            call(app(&metrics), "POST", "/mutate/off", Body::empty())
                .await
                .0,
            404
        );
        assert_eq!(
            call(app(&metrics), "GET", "/healthz", Body::empty()).await,
            (200, "ok\n".into())
        );
        assert!(
            !metrics.encode().unwrap().contains("outcome="),
            "nothing decided"
        );
    }
}

//! `shmlink admit`'s servers: the webhook over HTTPS (HTTP/2 or HTTP/1.1, as ALPN chose), and
//! `/metrics` over plain HTTP; the certificate read again every `--tls-reload-interval`.
//!
//! Every request body goes to `review::answer`, which alone decides; this file reads bodies
//! (bounded in size and time), counts, logs and writes what `answer` says. Like `crate::server`
//! the accept loop is our own: a bounded number of connections, deadlines for a TLS handshake,
//! a request head and a body, so one client that stalls holds only its own connection.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

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

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once (both listeners each); more wait in the listen backlog.
    pub max_connections: usize,
    /// A TLS handshake, a request head (and an HTTP/1.1 keep-alive idle), a request body: each
    /// at most.
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// After SIGTERM, how long the requests in flight may take.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The API servers hold a few connections each; this is room for many, not a limit
            // they meet.
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            // Also how long an HTTP/1.1 connection may idle between requests: longer than the
            // API server's (Go's) 90 s idle timeout, so the client closes first and never sends
            // on a connection the server is closing (the request would fail, the Pod go
            // unjudged).
            header_timeout: Duration::from_secs(120),
            // The API server gives up on a webhook after timeoutSeconds (3 s, at most 30 s).
            body_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(10),
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
        dra: settings.dra.clone(),
    });
    let limits = settings.limits;
    let webhook = accept_loop(
        https,
        Some((acceptor, metrics.clone())),
        webhook_router(state),
        limits,
        closing.clone(),
    );
    let scrapes = async move {
        if let Some(listener) = plain {
            accept_loop(listener, None, metrics_router(metrics), limits, closing).await;
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
    let answer = match read_body(body, state.body_timeout).await {
        Ok(bytes) => {
            let dra = match &state.dra {
                Some(r) => r.resolve(&bytes).await,
                None => DraView::default(),
            };
            if bytes.len() > BLOCKING_BODY {
                let decided =
                    tokio::task::spawn_blocking(move || review::answer_with(&bytes, mode, &dra));
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
    Broken(String),
}

/// The whole body, at most [`MAX_BODY`] bytes and within `timeout`.
async fn read_body(body: Body, timeout: Duration) -> Result<axum::body::Bytes, BodyError> {
    let limited = Limited::new(body, MAX_BODY);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(BodyError::Slow),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Ok(Err(e)) => Err(BodyError::Broken(e.to_string())),
    }
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

/// Accepts until `closing` turns true, then lets each connection finish its requests in flight
/// within the grace.
async fn accept_loop(
    listener: TcpListener,
    tls: Option<(TlsAcceptor, Arc<AdmissionMetrics>)>,
    app: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    loop {
        // A slot first, then accept: at the limit, new clients wait in the backlog.
        let slot = tokio::select! {
            _ = closing.wait_for(|c| *c) => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = closing.wait_for(|c| *c) => break,
            stream = crate::server::accept(&listener) => stream,
        };
        let app = app.clone();
        let closing = closing.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => connection(TokioIo::new(stream), app, limits, closing).await,
                Some((acceptor, metrics)) => {
                    let handshake =
                        tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            connection(TokioIo::new(stream), app, limits, closing).await
                        }
                        // A port probe (connected, closed, said nothing) is no handshake.
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                        // A scanner, or an API server whose caBundle is not our CA: with
                        // failurePolicy Ignore the latter admits every Pod unchecked, so say it
                        // (the first, then every 1,000th) and count each.
                        failed => {
                            let n = metrics.handshake_failed();
                            if n == 1 || n % 1000 == 0 {
                                let why = match failed {
                                    Ok(Err(e)) => e.to_string(),
                                    _ => "timed out".to_string(),
                                };
                                tracing::warn!(failures = n, "TLS handshake failed: {why}");
                            }
                        }
                    }
                }
            }
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// One connection, HTTP/2 or HTTP/1.1 (hyper tells them by the HTTP/2 preface, which is what
/// ALPN's `h2` promises), until it ends or the server closes.
async fn connection<I>(
    io: TokioIo<I>,
    app: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.header_timeout));
    let served = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(served);
    tokio::select! {
        _ = served.as_mut() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    served.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.grace, served).await;
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

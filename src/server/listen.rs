//! One home for what a client may hold of a listener, shared by `serve`'s HTTP and `admit`'s
//! HTTPS: connections per client address and in all, a reserve kept for the probes, a deadline
//! for a connection's first request, a time limit per request (its answer written whole),
//! idle connections closed (HTTP/1.1 keep-alive and HTTP/2 alike), bounded buffers.
//!
//! hyper gives the per-request parts (the HTTP/1.1 head deadline, buffer sizes, HTTP/2 streams,
//! windows and pings); the rest is ours because neither hyper, axum nor tower has it: tower's
//! limits count requests, not connections, and cannot refuse a client by its address before it
//! says anything; hyper has no idle timeout for HTTP/2 nor a deadline for a first request, and
//! its HTTP/1.1 head deadline also times the idle wait between requests.
//!
//! A connection is accepted, then admitted by the [`Gate`]: within its client's share and the
//! total, it is served; past either, while the probes' reserve has room, it is served the probe
//! paths only and closed after one answer; else it is closed at once, counted. The accept loop
//! never waits for a slot, so the listen backlog never fills with attackers ahead of a probe.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode, Version};
use axum::response::IntoResponse;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::metrics::http::{Dropped, HttpMetrics, Shed};

/// What one listener lets its clients hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once, all clients together.
    pub max_connections: usize,
    /// Of which one client address may hold (an IPv6 client by its /64).
    pub per_client: usize,
    /// Connections beyond either share, served only [`Limits::probe_paths`] and closed after
    /// one answer: the kubelet's probes get in whatever the other connections do.
    pub probe_reserve: usize,
    /// Of the reserve, what one client address may hold.
    pub probe_reserve_per_client: usize,
    pub probe_paths: &'static [&'static str],
    /// From accept to the first request's head read whole (a TLS handshake included).
    pub first_request: Duration,
    /// HTTP/1.1: the idle wait after an answer and the next request's head, together (hyper's
    /// `header_read_timeout` times both).
    pub header_timeout: Duration,
    /// No request in flight for this long: the connection is closed gracefully (HTTP/2: GOAWAY).
    pub idle_timeout: Duration,
    /// One request, from its head to its answer's last byte handed to the socket: past this the
    /// connection is dropped (a client that never reads its answer holds nothing longer).
    pub request_timeout: Duration,
    /// A connection is closed gracefully after this long, if set.
    pub lifetime: Option<Duration>,
    /// How long requests in flight may take once their connection or the server is closing.
    pub grace: Duration,
    /// HTTP/2 (when offered): streams at once per connection.
    pub h2_max_streams: u32,
    /// HTTP/2 flow-control windows, per stream and per connection: what a client can make the
    /// server buffer before the handler reads it.
    pub h2_window: u32,
    /// HTTP/1.1 read and write buffer (hyper's `max_buf_size`): a request head must fit.
    pub max_buf: usize,
    /// Whether HTTP/2 is served (by ALPN or prior knowledge), or HTTP/1.x only.
    pub http2: bool,
}

/// The probes of both servers.
pub const PROBE_PATHS: &[&str] = &["/healthz", "/readyz"];

/// The client address a request came from (a request extension), for shares per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client(pub IpAddr);

impl Client {
    /// The key a client is counted by: an IPv4 address (an IPv4-mapped IPv6 one as IPv4), or
    /// an IPv6 /64, which one host usually holds whole.
    pub fn of(ip: IpAddr) -> Client {
        match ip {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) if v6.is_loopback() => Client(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let s = v6.segments();
                    let prefix = [s[0], s[1], s[2], s[3], 0, 0, 0, 0];
                    Client(IpAddr::V6(prefix.into()))
                }
            },
        }
    }
}

impl Client {
    /// Whether shares per client apply: not to 127.0.0.1 and ::1, the Pod's own containers
    /// (kube-rbac-proxy in front of the agent carries every outside client on one such
    /// connection pool); only the totals bound them.
    pub fn has_share(&self) -> bool {
        !matches!(self.0, IpAddr::V4(v4) if v4 == std::net::Ipv4Addr::LOCALHOST)
            && self.0 != IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
    }
}

/// Which kind of slot a connection was admitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Normal,
    /// The probes' reserve: probe paths only, one answer.
    Probe,
}

#[derive(Debug, Default)]
struct Held {
    normal: usize,
    probe: usize,
}

/// Who holds what: the connection counts, per client and in all.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    held: Mutex<(Held, HashMap<Client, Held>)>,
}

/// A connection's place at the gate, given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    client: Client,
    pub slot: Slot,
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            held: Mutex::new((Held::default(), HashMap::new())),
        })
    }

    /// A slot for a new connection from `client`, or why not.
    pub fn admit(self: &Arc<Gate>, client: Client) -> Result<Ticket, Dropped> {
        let l = &self.limits;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let (all, clients) = &mut *held;
        let shared = client.has_share();
        let mine = clients.entry(client).or_default();
        let slot = if all.normal < l.max_connections && (!shared || mine.normal < l.per_client) {
            all.normal += 1;
            mine.normal += 1;
            Slot::Normal
        } else if all.probe < l.probe_reserve
            && (!shared || mine.probe < l.probe_reserve_per_client)
        {
            all.probe += 1;
            mine.probe += 1;
            Slot::Probe
        } else {
            let why = if shared && mine.normal >= l.per_client {
                Dropped::PerClient
            } else {
                Dropped::Full
            };
            if mine.normal == 0 && mine.probe == 0 {
                clients.remove(&client);
            }
            return Err(why);
        };
        Ok(Ticket {
            gate: self.clone(),
            client,
            slot,
        })
    }

    /// Connections held now: (normal, probe).
    pub fn held(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        (held.0.normal, held.0.probe)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().unwrap_or_else(|p| p.into_inner());
        let (all, clients) = &mut *held;
        let count = |h: &mut Held| match self.slot {
            Slot::Normal => h.normal = h.normal.saturating_sub(1),
            Slot::Probe => h.probe = h.probe.saturating_sub(1),
        };
        count(all);
        if let Some(mine) = clients.get_mut(&self.client) {
            count(mine);
            if mine.normal == 0 && mine.probe == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// How a connection becomes a byte stream: as it is (plain HTTP), or after a TLS handshake.
pub trait Handshake: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The stream, or None (said and counted by the implementation) when the handshake failed
    /// or did not end by `deadline`.
    fn handshake(
        &self,
        tcp: TcpStream,
        deadline: tokio::time::Instant,
    ) -> impl Future<Output = Option<Self::Io>> + Send;
}

/// Plain HTTP.
#[derive(Debug, Clone, Copy)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    async fn handshake(&self, tcp: TcpStream, _: tokio::time::Instant) -> Option<TcpStream> {
        Some(tcp)
    }
}

/// Serves `app` on `listener` until `closing` turns true, then lets each connection finish
/// its requests in flight within the grace.
pub async fn serve<H: Handshake>(
    listener: TcpListener,
    handshake: H,
    app: Router,
    limits: Limits,
    metrics: HttpMetrics,
    mut closing: watch::Receiver<bool>,
) {
    let gate = Gate::new(limits);
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = closing.wait_for(|c| *c) => break,
            accepted = accept(&listener) => accepted,
        };
        let accepted_at = tokio::time::Instant::now();
        let ticket = match gate.admit(Client::of(peer.ip())) {
            Ok(t) => t,
            Err(why) => {
                say_dropped(&metrics, why, peer);
                continue;
            }
        };
        let (app, closing, handshake, metrics) = (
            app.clone(),
            closing.clone(),
            handshake.clone(),
            metrics.clone(),
        );
        connections.spawn(async move {
            let deadline = accepted_at + limits.first_request;
            let Some(io) = handshake.handshake(stream, deadline).await else {
                return;
            };
            let conn = Conn {
                client: ticket.client,
                slot: ticket.slot,
                opened: accepted_at.into_std(),
            };
            drive(io, conn, app, &limits, &metrics, closing).await;
            drop(ticket);
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// Counts a dropped connection; logs the first of each reason and every 1,000th.
pub fn say_dropped(metrics: &HttpMetrics, why: Dropped, peer: SocketAddr) {
    let n = metrics.dropped(why);
    if n == 1 || n.is_multiple_of(1000) {
        tracing::warn!(
            client = %peer.ip(),
            reason = why.as_str(),
            count = n,
            "connection dropped"
        );
    }
}

/// The next connection and its peer (no Nagle: answers are written whole or in large
/// pieces). An error (out of file descriptors and the like) is logged and waited out, never
/// spun on.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One admitted connection.
#[derive(Debug, Clone, Copy)]
struct Conn {
    client: Client,
    slot: Slot,
    opened: Instant,
}

/// Serves one connection until it ends, the server closes, or [`judge`] ends it.
async fn drive<I>(
    io: I,
    conn: Conn,
    app: Router,
    limits: &Limits,
    metrics: &HttpMetrics,
    mut closing: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Mutex::new(Activity::new(conn.opened)));
    let service = Tracked {
        app,
        activity: activity.clone(),
        client: conn.client,
        probes_only: (conn.slot == Slot::Probe).then_some(limits.probe_paths),
        metrics: metrics.clone(),
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_buf)
        .keep_alive(conn.slot == Slot::Normal);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_streams)
        .initial_stream_window_size(limits.h2_window)
        .initial_connection_window_size(limits.h2_window)
        .max_send_buf_size(limits.max_buf)
        .max_header_list_size(limits.max_buf as u32)
        // A dead peer's connection ends; a live idle one is closed by `judge`.
        .keep_alive_interval(Some(limits.idle_timeout))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = if limits.http2 {
        builder
    } else {
        builder.http1_only()
    };
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    loop {
        let now = Instant::now();
        let verdict = judge(&lock(&activity), now, limits);
        let wake = match verdict {
            Verdict::Wait(at) => at,
            Verdict::Close => break,
            Verdict::Drop(why) => {
                metrics.dropped(why);
                return;
            }
        };
        tokio::select! {
            _ = served.as_mut() => return,
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = closing.wait_for(|c| *c) => break,
        }
    }
    served.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.grace, served).await;
}

fn lock(activity: &Mutex<Activity>) -> std::sync::MutexGuard<'_, Activity> {
    activity.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a connection has done: requests begun, those in flight and since when, idle since.
#[derive(Debug, Clone)]
pub struct Activity {
    opened: Instant,
    begun: u64,
    in_flight: Vec<(u64, Instant)>,
    idle_since: Instant,
}

impl Activity {
    pub fn new(opened: Instant) -> Activity {
        Activity {
            opened,
            begun: 0,
            in_flight: Vec::new(),
            idle_since: opened,
        }
    }

    fn begin(&mut self, now: Instant) -> u64 {
        self.begun += 1;
        self.in_flight.push((self.begun, now));
        self.begun
    }

    fn end(&mut self, id: u64, now: Instant) {
        self.in_flight.retain(|(i, _)| *i != id);
        if self.in_flight.is_empty() {
            self.idle_since = now;
        }
    }
}

/// What becomes of a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing until then (when it is looked at again).
    Wait(Instant),
    /// Closed gracefully: idle, or at the end of its lifetime.
    Close,
    /// Dropped at once, counted.
    Drop(Dropped),
}

/// Pure: the connection's fate at `now`.
pub fn judge(a: &Activity, now: Instant, limits: &Limits) -> Verdict {
    let past = |at: Instant| now >= at;
    let mut wake = now + Duration::from_secs(3600);
    if let Some(lifetime) = limits.lifetime {
        let end = a.opened + lifetime;
        if past(end) {
            return Verdict::Close;
        }
        wake = wake.min(end);
    }
    if let Some(oldest) = a.in_flight.iter().map(|(_, at)| *at).min() {
        let end = oldest + limits.request_timeout;
        if past(end) {
            return Verdict::Drop(Dropped::RequestTimeout);
        }
        return Verdict::Wait(wake.min(end));
    }
    if a.begun == 0 {
        let end = a.opened + limits.first_request;
        if past(end) {
            return Verdict::Drop(Dropped::NoRequest);
        }
        return Verdict::Wait(wake.min(end));
    }
    let end = a.idle_since + limits.idle_timeout;
    if past(end) {
        return Verdict::Close;
    }
    Verdict::Wait(wake.min(end))
}

/// The app, with each request counted in its connection's [`Activity`] from its head to its
/// answer's end (the body dropped), tagged with its [`Client`]; on a connection of the probes'
/// reserve, only the probe paths.
#[derive(Clone)]
struct Tracked {
    app: Router,
    activity: Arc<Mutex<Activity>>,
    client: Client,
    probes_only: Option<&'static [&'static str]>,
    metrics: HttpMetrics,
}

/// Ends a request's part in its connection's activity when dropped.
struct InFlight {
    activity: Arc<Mutex<Activity>>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.activity).end(self.id, Instant::now());
    }
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        let id = lock(&self.activity).begin(Instant::now());
        let in_flight = InFlight {
            activity: self.activity.clone(),
            id,
        };
        let http1 = request.version() <= Version::HTTP_11;
        if let Some(paths) = self.probes_only {
            if !paths.contains(&request.uri().path()) {
                self.metrics.shed(Shed::Reserve);
                let mut busy = (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "busy: every connection is held; only the probes are served on this one\n",
                )
                    .into_response();
                if http1 {
                    busy.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                return Box::pin(std::future::ready(Ok(busy)));
            }
        }
        request.extensions_mut().insert(self.client);
        let app = self.app.clone();
        let close = self.probes_only.is_some() && http1;
        Box::pin(async move {
            let Ok(mut response) = app.oneshot(request).await;
            if close {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // The request stays in flight until its answer's body is dropped: written whole, or
            // given up with its connection.
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _in_flight = &in_flight;
                    frame
                }))
            }))
        })
    }
}

#[cfg(test)]
mod tests;

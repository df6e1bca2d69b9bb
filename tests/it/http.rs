//! The HTTP endpoint under hostile or careless clients: slow request heads, idle connections,
//! connections beyond a client's share and the limit (the probes still served), methods and
//! paths it does not serve, and clean shutdown with clients attached. In process, with short
//! limits; no root needed. (The attacks at full scale, in the DaemonSet's memory limit:
//! tests/e2e_containers/bounded.rs.)

use crate::common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::{connect_from, get, get_from, sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use shmlink::metrics::Metrics;
use shmlink::server::listen::Limits;
use shmlink::server::{limits as serve_limits, run_with, AppState, Health};
use tokio::sync::oneshot;

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    fn start(limits: Limits) -> Server {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let snapshot = Arc::default();
                let state = Arc::new(AppState {
                    history: None,
                    metrics: Arc::new(Metrics::new(Arc::clone(&snapshot))),
                    snapshot,
                    health: Arc::new(Health::new(Duration::from_secs(5))),
                });
                run_with(listener, state, limits, async {
                    let _ = stopped.await;
                })
                .await
            })
        });
        Server {
            addr: addr_rx.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops it; returns how long that took.
    fn shut_down(&mut self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap().unwrap();
        started.elapsed()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the server closes the connection; how long that took.
fn time_until_closed(s: &mut TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
}

fn status_of(s: &mut TcpStream, request: &str) -> u16 {
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

fn limits() -> Limits {
    Limits {
        max_connections: 4,
        per_client: 4,
        probe_reserve: 2,
        probe_reserve_per_client: 1,
        first_request: Duration::from_millis(500),
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(500),
        lifetime: Some(Duration::from_secs(3)),
        grace: Duration::from_millis(500),
        ..serve_limits()
    }
}

#[test]
fn a_client_that_sends_nothing_or_half_a_head_is_dropped() {
    let server = Server::start(limits());
    let started = Instant::now();
    let mut silent = connect(server.addr);
    let mut half = connect(server.addr);
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    for s in [&mut silent, &mut half] {
        time_until_closed(s);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }
}

#[test]
fn past_every_slot_a_connection_is_served_the_probes_only_then_none_is() {
    let server = Server::start(Limits {
        per_client: 2,
        first_request: Duration::from_secs(30),
        header_timeout: Duration::from_secs(30),
        ..limits()
    });
    // Four idle clients on 127.0.0.1 take every slot: the Pod's own loopback (kube-rbac-proxy
    // in front) has no share of its own, only the total bounds it.
    let _idle: Vec<TcpStream> = (0..4).map(|_| connect(server.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    // Another client's next gets the probes' reserve: a probe is answered, anything else is
    // 503, and the connection is closed after one answer.
    let a = IpAddr::from([127, 0, 0, 5]);
    let mut reserve = connect_from(a, server.addr).unwrap();
    reserve
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    reserve.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    // (Each closed connection's place is given back as its task ends, a moment after.)
    std::thread::sleep(Duration::from_millis(200));
    let status = status_of(
        &mut connect_from(a, server.addr).unwrap(),
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert_eq!(status, 503);
    std::thread::sleep(Duration::from_millis(200));
    // The reserve has one place per client: held, the same client's next is closed at once,
    // unanswered; another client's is served.
    let _held = connect_from(a, server.addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut refused = connect_from(a, server.addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = refused.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let took = time_until_closed(&mut refused);
    assert!(took < Duration::from_secs(1), "{took:?}");
    let other = IpAddr::from([127, 0, 0, 9]);
    assert_eq!(
        get_from(Some(other), server.addr, "/healthz").map(|(s, _)| s),
        Some(200)
    );
}

#[test]
fn a_client_past_its_share_is_refused_while_others_are_served() {
    let server = Server::start(Limits {
        max_connections: 8,
        per_client: 2,
        probe_reserve: 0,
        first_request: Duration::from_secs(30),
        header_timeout: Duration::from_secs(30),
        ..limits()
    });
    let greedy = IpAddr::from([127, 0, 0, 7]);
    let _held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from(greedy, server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut third = connect_from(greedy, server.addr).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let took = time_until_closed(&mut third);
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(get(server.addr, "/healthz").map(|(s, _)| s), Some(200));
}

#[test]
fn a_kept_alive_connection_is_closed_after_its_lifetime() {
    let server = Server::start(Limits {
        header_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        lifetime: Some(Duration::from_millis(800)),
        ..limits()
    });
    let mut s = connect(server.addr);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let took = time_until_closed(&mut s);
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn only_get_and_head_on_the_known_paths() {
    let server = Server::start(limits());
    let req = |method: &str, path: &str| {
        status_of(
            &mut connect(server.addr),
            &format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    assert_eq!(req("GET", "/metrics"), 200);
    assert_eq!(req("HEAD", "/metrics"), 200);
    assert_eq!(req("GET", "/healthz"), 200);
    // No scan has run in this server: not ready.
    assert_eq!(req("GET", "/readyz"), 503);
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        assert_eq!(req(method, "/metrics"), 405, "{method}");
    }
    for path in [
        "/",
        "/metrics/",
        "/debug/pprof",
        "/../etc/passwd",
        "/metrics?x=1%00",
    ] {
        let code = req("GET", path);
        assert!(
            code == 404 || (path.starts_with("/metrics?") && code == 200),
            "{path}: {code}"
        );
    }
    // Garbage instead of HTTP: a 400, and the server goes on.
    assert_eq!(
        status_of(&mut connect(server.addr), "\x16\x03\x01 not http\r\n\r\n"),
        400
    );
    assert_eq!(req("GET", "/healthz"), 200);
}

#[test]
fn shutdown_does_not_wait_for_idle_clients() {
    let mut server = Server::start(Limits {
        first_request: Duration::from_secs(30),
        header_timeout: Duration::from_secs(30),
        lifetime: Some(Duration::from_secs(300)),
        ..limits()
    });
    let _idle: Vec<TcpStream> = (0..3).map(|_| connect(server.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let took = server.shut_down();
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// `serve` itself (the binary, scanning every 200 ms, with the 8-GPU NVSwitch fake so /metrics
/// is large) while 16 clients (16 addresses) scrape as fast as they can: scans keep the pace
/// they had with no client, measured just before on the same machine (a scan's pace is the
/// machine's: it reads every process there).
#[test]
fn many_concurrent_scrapes_do_not_delay_scans() {
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let agent = Agent::start_gpu(&fake, &[]);
    let scans = || {
        sample(
            &agent.metrics(),
            "shmlink_scan_duration_seconds_count",
            &[("collector", "shm")],
        )
        .unwrap()
    };
    let run_for = Duration::from_secs(3);
    let before = scans();
    std::thread::sleep(run_for);
    let alone = scans() - before;
    let before = scans();
    let started = Instant::now();
    let addr = agent.addr;
    let clients: Vec<_> = (0..16u8)
        .map(|i| {
            std::thread::spawn(move || {
                let (mut ok, mut failed) = (0u32, 0u32);
                let from = IpAddr::from([127, 0, 0, 100 + i]);
                while started.elapsed() < run_for {
                    match get_from(Some(from), addr, "/metrics") {
                        Some((200, body)) if body.contains("shmlink_gpu_pair_healthy") => ok += 1,
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.join().unwrap();
        ok += o;
        failed += f;
    }
    let elapsed = started.elapsed();
    let done = scans() - before;
    // As many as in the same time alone, within the rounding of two counts.
    let expected = alone * elapsed.as_secs_f64() / run_for.as_secs_f64();
    eprintln!(
        "{ok} scrapes ({failed} failed) in {elapsed:?} from 16 clients; {done} scans, {alone} \
         in {run_for:?} alone"
    );
    assert_eq!(failed, 0);
    assert!(ok > 16, "{ok}");
    assert!(
        alone >= 2.0,
        "serve scanned {alone} times in {run_for:?} alone"
    );
    assert!(
        done >= (expected * 0.6).floor(),
        "{done} scans, ~{expected:.0} expected from {alone} alone"
    );
    assert!(agent.terminate().success());
}

//! The two servers under the attacks of issue 51, each run as the built binary in a memory
//! cgroup at its manifest's own limit (64 MiB: the admission Deployment's and the DaemonSet's):
//! `shmlink admit` given a Pod of 20,000 GPU containers, and 1,100 idle, half-shaken-hands and
//! slowloris connections from one client; `shmlink serve` read by 8 clients of
//! `/api/v1/failures` at once over a large history, and held by 70 slow or non-reading
//! connections. During each attack the probes answer, a normal request is served, and after
//! it the process is alive with its peak charge under the limit and no OOM kill.
//!
//! Needs root (a memory cgroup); loopback only. The attackers and the honest clients come from
//! different loopback addresses (127.0.0.x), as different hosts would.

use crate::admit_tls;
use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use admit_tls::{Client, Http, SecretVolume, TestCa};
use common::agent::{get, Agent};
use common::memcg::MemCgroup;

/// The admission Deployment's and the agent DaemonSet's memory limit
/// (deploy/components/admission/deployment.yaml, deploy/base/daemonset.yaml).
const LIMIT: u64 = 64 << 20;

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

const ATTACKER: u8 = 2;
const PROBER: u8 = 3;
const HONEST: u8 = 4;

/// A memory cgroup at the limit, or None (SKIPPED) where none can be made; a failure under
/// `SHMLINK_E2E=require`.
fn cgroup(name: &str) -> Option<MemCgroup> {
    let made = rustix::process::geteuid()
        .is_root()
        .then(|| MemCgroup::new(name, LIMIT))
        .flatten();
    if made.is_none() {
        if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
            panic!("no memory cgroup can be made here (root, a memory controller)");
        }
        eprintln!("SKIPPED: no memory cgroup can be made here (needs root)");
    }
    made
}

/// What the attack left: the process alive, no OOM kill, the peak under the limit.
fn assert_survived(cg: &MemCgroup, alive: bool, what: &str, log: &str) {
    let peak = cg.peak();
    eprintln!(
        "{what}: peak {:.1} MiB of {} MiB, OOM kills {}, alive {alive}",
        peak as f64 / (1 << 20) as f64,
        LIMIT >> 20,
        cg.oom_kills()
    );
    assert!(alive, "{what}: the process died; its log:\n{log}");
    assert_eq!(cg.oom_kills(), 0, "{what}: OOM-killed");
    assert!(peak < LIMIT, "{what}: peak {peak} at the limit");
}

// ---------------------------------------------------------------------------------------------
// shmlink admit

struct Admit {
    child: Child,
    https: SocketAddr,
    metrics: SocketAddr,
    log: std::path::PathBuf,
    ca: TestCa,
    _volume: SecretVolume,
}

impl Admit {
    async fn start(dir: &Path, cg: &MemCgroup) -> Admit {
        let ca = TestCa::new();
        let leaf = ca.leaf((2031, 5, 17));
        let volume = SecretVolume::new(dir, &leaf.cert_pem, &leaf.key_pem);
        let (https, metrics) = (common::free_local_addr(), common::free_local_addr());
        let log = dir.join("admit.log");
        let wrapper = cg.wrapper();
        let child = Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_shmlink"))
            .arg("admit")
            .arg(format!("--listen={https}"))
            .arg(format!("--metrics-listen={metrics}"))
            .arg("--tls-cert-file")
            .arg(volume.cert())
            .arg("--tls-key-file")
            .arg(volume.key())
            .arg("--mode=mutate")
            .env_remove("SHMLINK_LOG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let admit = Admit {
            child,
            https,
            metrics,
            log,
            ca,
            _volume: volume,
        };
        // Answering, not merely listening.
        let deadline = Instant::now() + Duration::from_secs(20);
        while admit.health(None).await != Some(200) {
            assert!(
                Instant::now() < deadline,
                "admit never answered: {}",
                admit.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        admit
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// `GET /healthz` over HTTPS on a fresh connection, as the kubelet probes (1 s).
    async fn health(&self, from: Option<IpAddr>) -> Option<u16> {
        let probe = async {
            let mut c = Client::connect_from(from, self.https, &self.ca.pem, Http::One)
                .await
                .ok()?;
            Some(c.request("GET", "/healthz", "").await.ok()?.status)
        };
        tokio::time::timeout(Duration::from_secs(1), probe)
            .await
            .ok()
            .flatten()
    }

    /// One review on a fresh HTTP/2 connection, as an API server sends it (within its 3 s).
    async fn review(&self, from: Option<IpAddr>, path: &str, body: Vec<u8>) -> Option<Value> {
        let send = async {
            let mut c = Client::connect_from(from, self.https, &self.ca.pem, Http::Two)
                .await
                .ok()?;
            let reply = c.request("POST", path, body).await.ok()?;
            (reply.status == 200).then(|| reply.json())
        };
        tokio::time::timeout(Duration::from_secs(3), send)
            .await
            .ok()
            .flatten()
    }

    async fn metrics_text(&self) -> String {
        let mut tcp = tokio::net::TcpStream::connect(self.metrics).await.unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        tcp.read_to_string(&mut text).await.unwrap();
        text
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture_review() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/admission/pytorch-8gpu.json"
    ))
    .unwrap()
}

/// The review of a Pod of `n` tiny containers, each asking for a GPU.
fn crowded_review(uid: &str, n: usize) -> Vec<u8> {
    let containers: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("c{i}"), "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
        .collect();
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "crowd", "namespace": "ml"},
                       "spec": {"containers": containers}}
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_allows_a_pod_of_20000_gpu_containers_with_one_warning_under_its_limit() {
    let Some(cg) = cgroup("admit-crowd") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut admit = Admit::start(dir.path(), &cg).await;
    let body = crowded_review("crowd", 20_000);
    eprintln!(
        "the review: {:.2} MiB",
        body.len() as f64 / (1 << 20) as f64
    );
    // Four at once, in both modes, as an API server retrying would send them.
    let sent = (0..4).map(|i| {
        let path = if i % 2 == 0 {
            "/mutate/mutate"
        } else {
            "/mutate/warn"
        };
        admit.review(Some(loopback(HONEST)), path, body.clone())
    });
    let answers = futures::future::join_all(sent).await;
    let alive = admit.alive();
    assert_survived(
        &cg,
        alive,
        "admit, 4 x 20,000 containers",
        &admit.log_text(),
    );
    for answer in answers {
        let review = answer.expect("the crowded Pod answered 200 within 3 s");
        let response = &review["response"];
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "not patched: {response}");
        let warnings = response["warnings"].as_array().expect("warnings");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let warning = warnings[0].as_str().unwrap();
        assert!(
            warning.contains("20000 containers") && warning.contains("shmlink preflight"),
            "{warning}"
        );
    }
    // A normal Pod is still judged, and the probe answers.
    let normal = admit
        .review(None, "/mutate/mutate", fixture_review())
        .await
        .expect("a normal review answered");
    assert!(normal["response"]["patch"].is_string(), "{normal}");
    assert_eq!(admit.health(None).await, Some(200));
}

/// One attacking connection: idle TCP, a TLS ClientHello begun and never finished, or a
/// request head a byte every 2 s after the handshake (slowloris). Holds it until `until`, or
/// until the server closes it; whether the server did.
async fn hold(kind: usize, admit: SocketAddr, ca: String, until: Instant) -> bool {
    let from = Some(loopback(ATTACKER));
    let deadline = tokio::time::Instant::from_std(until);
    let held = async {
        match kind % 3 {
            0 => {
                let mut tcp = admit_tls::tcp_from(from, admit).await.ok()?;
                let mut buf = [0u8; 64];
                let _ = tcp.read(&mut buf).await;
            }
            1 => {
                let mut tcp = admit_tls::tcp_from(from, admit).await.ok()?;
                // A handshake record promising 512 bytes, then its bytes one at a time.
                tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                    .await
                    .ok()?;
                loop {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    tcp.write_all(&[0x00]).await.ok()?;
                }
            }
            _ => {
                let connector = admit_tls::connector(&ca, Http::One);
                let mut tls = admit_tls::tls_connect_from(from, admit, &connector)
                    .await
                    .ok()?;
                for byte in b"POST /mutate HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
                    tls.write_all(&[*byte]).await.ok()?;
                    tls.flush().await.ok()?;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
        Some(())
    };
    tokio::time::timeout_at(deadline, held).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_answers_probes_and_reviews_while_one_client_holds_1100_connections() {
    let Some(cg) = cgroup("admit-flood") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut admit = Admit::start(dir.path(), &cg).await;
    let until = Instant::now() + Duration::from_secs(12);
    let attackers: Vec<_> = (0..1100)
        .map(|i| tokio::spawn(hold(i, admit.https, admit.ca.pem.clone(), until)))
        .collect();
    // Let the flood land, then probe and review from other hosts for 6 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut probes, mut reviews, mut failed) = (0, 0, Vec::new());
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        let started = Instant::now();
        match admit.health(Some(loopback(PROBER))).await {
            Some(200) => probes += 1,
            other => failed.push(format!("probe: {other:?} after {:?}", started.elapsed())),
        }
        let body = fixture_review();
        match admit
            .review(Some(loopback(HONEST)), "/mutate/mutate", body)
            .await
        {
            Some(r) if r["response"]["patch"].is_string() => reviews += 1,
            other => failed.push(format!("review: {other:?} after {:?}", started.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let alive = admit.alive();
    let closed = futures::future::join_all(attackers)
        .await
        .into_iter()
        .filter(|done| done.as_ref().is_ok_and(|&closed| closed))
        .count();
    let metrics = admit.metrics_text().await;
    eprintln!(
        "{probes} probes and {reviews} reviews answered, {} failed; {closed} of 1100 attacking connections closed by the server",
        failed.len()
    );
    assert_survived(&cg, alive, "admit, 1100 connections", &admit.log_text());
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        probes >= 5 && reviews >= 5,
        "{probes} probes, {reviews} reviews"
    );
    // The client past its share was refused at once, and said so.
    let refused = common::promtext::value(
        &metrics,
        "shmlink_http_connections_dropped_total",
        &[("reason", "per_client")],
    )
    .unwrap_or(0.0);
    assert!(refused > 0.0, "{metrics}");
    assert!(closed > 1000, "{closed} closed");
}

// ---------------------------------------------------------------------------------------------
// shmlink serve

/// A store for node `bounded` with `n` failures and `n` findings of about 1.5 KiB each, one a
/// second up to now: made by the agent's own code, the failures as it writes them, then filled
/// by SQL (a real history takes days to grow this large).
fn large_history(dir: &Path, n: usize) {
    use shmlink::model::{Failure, FailureSource, FindingKind};
    use shmlink::state::history::FailureRow;
    use shmlink::state::{self, Identity, Options, StateMetrics, Store};
    let identity = Identity {
        node: "bounded".into(),
        boot_id: state::boot_id(Path::new("/proc")),
    };
    drop(Store::open(dir, &identity, Options::default(), &StateMetrics::default()).unwrap());
    let mut conn = rusqlite::Connection::open(dir.join("state.sqlite3")).unwrap();
    let tx = conn.transaction().unwrap();
    let evidence = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm). ".repeat(4);
    let message = "the DataLoader's workers ran out of /dev/shm: it was full (64 MiB of 64 MiB). Fix: mount an emptyDir (medium: Memory, sizeLimit: 8Gi) at /dev/shm and add 8Gi to the container's memory limit. ".repeat(4);
    for i in 0..n {
        let at = SystemTime::now() - Duration::from_secs((n - i) as u64);
        let pod = format!("trainer-{}", i % 50);
        let failure = Failure {
            placed: shmlink::model::ContainerRef {
                namespace: Some("ml".into()),
                pod: Some(pod.clone()),
                pod_uid: None,
                container: Some("trainer".into()),
                container_id: Some(format!("{i:064x}")),
            },
            image: None,
            kind: FindingKind::ShmAllocationFailed,
            at: at.into(),
            source: FailureSource::Log,
            evidence: evidence.clone(),
            pid: None,
            shm: None,
            gpus: vec![0, 1, 2, 3],
            gpus_from: None,
            gpu_pairs: Vec::new(),
            gpu_links: None,
            memory: None,
            pid_in_container: None,
            told_by_workload: None,
            worker_pids: Vec::new(),
            found_late: false,
            named_from: None,
            hang: None,
            message: message.clone(),
        };
        let row = FailureRow::new(&failure, false);
        tx.execute(
            "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json) VALUES (?1, 'ml', ?2, ?3, 0, ?4)",
            rusqlite::params![row.at_ms, pod, row.kind, row.json],
        )
        .unwrap();
        let finding = json!({"severity": "critical", "kind": "shm_nearly_full",
            "subject": format!("ml/{pod}/trainer"), "message": message, "event": "began",
            "at": failure.at});
        tx.execute(
            "INSERT INTO findings (at_ms, event, namespace, pod, kind, json) VALUES (?1, 'began', 'ml', ?2, 'shm_nearly_full', ?3)",
            rusqlite::params![row.at_ms, pod, finding.to_string()],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// `serve` with the store in `dir`, as the `bounded` node, in the cgroup.
fn serve_in(cg: &MemCgroup, dir: &Path) -> Agent {
    let wrapper = cg.wrapper();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let state = dir.to_str().unwrap();
    let agent = Agent::start_under(
        &wrapper,
        &[
            "--no-gpu",
            "--interval",
            "1s",
            "--node-name",
            "bounded",
            "--state-dir",
            state,
        ],
        &[],
    );
    agent.wait_ready();
    agent
}

/// A GET from loopback address `from` (a fresh connection, `Connection: close`) within `within`:
/// the status and the body.
async fn get_from(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    within: Duration,
) -> Option<(u16, Vec<u8>)> {
    let fetch = async {
        let mut tcp = admit_tls::tcp_from(Some(from), addr).await.ok()?;
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        tcp.write_all(head.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await.ok()?;
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&raw[..at]).to_string();
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let body = raw[at + 4..].to_vec();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Some((
            status,
            if chunked {
                common::agent::dechunk(&body)?
            } else {
                body
            },
        ))
    };
    tokio::time::timeout(within, fetch).await.ok().flatten()
}

/// As a client that honours the server's 503 and its `Retry-After` would read: asked again a
/// second after each busy answer, until `within` is spent. The answer and the busy ones before it.
async fn get_patiently(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    within: Duration,
) -> (Option<(u16, Vec<u8>)>, usize) {
    let deadline = Instant::now() + within;
    let mut busy = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match get_from(from, addr, path, left).await {
            Some((503, _)) if Instant::now() + Duration::from_secs(1) < deadline => {
                busy += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            answer => return (answer, busy),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_8_readers_of_a_large_history_under_its_limit() {
    let Some(cg) = cgroup("serve-readers") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    large_history(dir.path(), 5000);
    let mut agent = serve_in(&cg, dir.path());
    let addr = agent.addr;
    let started = Instant::now();
    let readers: Vec<_> = (0..8)
        .map(|i| {
            // Two are written at once (the reads' turns): the others wait theirs, and on a
            // loaded machine some are told to come back (503, Retry-After), as they should.
            tokio::spawn(get_patiently(
                loopback(10 + i),
                addr,
                "/api/v1/failures?since=3h",
                Duration::from_secs(40),
            ))
        })
        .collect();
    // The probes answer while they read.
    let mut probes = Vec::new();
    while readers.iter().any(|r| !r.is_finished()) && started.elapsed() < Duration::from_secs(40) {
        probes.push(get_from(loopback(PROBER), addr, "/healthz", Duration::from_secs(1)).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answers = futures::future::join_all(readers).await;
    let took = started.elapsed();
    let alive = agent.is_running();
    assert_survived(
        &cg,
        alive,
        "serve, 8 readers of /api/v1/failures",
        &agent.log_text(),
    );
    let busy: usize = answers.iter().map(|a| a.as_ref().map_or(0, |a| a.1)).sum();
    eprintln!(
        "8 answers in {took:?}, {busy} busy answers before them; {} probes",
        probes.len()
    );
    for answer in answers {
        let (status, body) = answer.unwrap().0.expect("an answer within 40 s");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let history: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(history["failures"].as_array().unwrap().len(), 1000);
        assert_eq!(history["findings"].as_array().unwrap().len(), 1000);
        assert_eq!(history["truncated"], true);
        // Oldest first, the newest kept.
        let at = |i: usize| history["failures"][i]["at"].as_str().unwrap().to_string();
        assert!(at(0) < at(999), "{} {}", at(0), at(999));
    }
    assert!(
        probes
            .iter()
            .all(|p| p.as_ref().is_some_and(|(s, _)| *s == 200)),
        "{probes:?}"
    );
    assert!(get(addr, "/metrics").is_some_and(|(s, _)| s == 200));
}

/// One of 70 attacking connections to `serve`: idle, a head trickled a byte every 2 s, or a
/// request whose answer is never read (`/metrics` or `/api/v1/failures`).
async fn hang_on(kind: usize, addr: SocketAddr, until: Instant) {
    let deadline = tokio::time::Instant::from_std(until);
    let held = async {
        let mut tcp = admit_tls::tcp_from(Some(loopback(ATTACKER)), addr)
            .await
            .ok()?;
        match kind % 4 {
            0 => {
                let mut buf = [0u8; 64];
                let _ = tcp.read(&mut buf).await;
            }
            1 => {
                for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
                    tcp.write_all(&[*byte]).await.ok()?;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            k => {
                let path = if k == 2 {
                    "/metrics"
                } else {
                    "/api/v1/failures?since=3h"
                };
                // Pipelined requests, never read: the answers pile up on the server's side.
                let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").repeat(50);
                tcp.write_all(head.as_bytes()).await.ok()?;
                std::future::pending::<()>().await;
            }
        }
        Some(())
    };
    let _ = tokio::time::timeout_at(deadline, held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_probes_and_scrapes_while_one_client_holds_70_connections() {
    let Some(cg) = cgroup("serve-flood") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    large_history(dir.path(), 2000);
    let mut agent = serve_in(&cg, dir.path());
    let addr = agent.addr;
    // Held past the watch below, however slowly a loaded machine answers it; ended by abort.
    let until = Instant::now() + Duration::from_secs(120);
    let attackers: Vec<_> = (0..70)
        .map(|i| tokio::spawn(hang_on(i, addr, until)))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut answered, mut failed) = (0, Vec::new());
    // Five rounds while the 70 are held. A probe has 2 s; a scrape or a reading (milliseconds,
    // but it waits for a CPU on a loaded 2-core machine) 10 s: a connection starved by the
    // attacker's never answers at all.
    for _ in 0..5 {
        for (from, path, within) in [
            (PROBER, "/healthz", 2),
            (PROBER, "/readyz", 2),
            (HONEST, "/metrics", 10),
            (HONEST, "/api/v1/failures?since=10m", 10),
        ] {
            let started = Instant::now();
            let within = Duration::from_secs(within);
            match get_from(loopback(from), addr, path, within).await {
                Some((200, _)) => answered += 1,
                other => failed.push(format!(
                    "{path}: {:?} after {:?}",
                    other.map(|(s, b)| (s, String::from_utf8_lossy(&b).to_string())),
                    started.elapsed()
                )),
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let alive = agent.is_running();
    let metrics = get(addr, "/metrics").map(|(_, b)| b).unwrap_or_default();
    for a in attackers {
        a.abort();
    }
    eprintln!("{answered} answered, {} failed", failed.len());
    assert_survived(&cg, alive, "serve, 70 connections", &agent.log_text());
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(answered >= 20, "{answered}");
    let refused = common::promtext::value(
        &metrics,
        "shmlink_http_connections_dropped_total",
        &[("reason", "per_client")],
    )
    .unwrap_or(0.0);
    assert!(refused > 0.0, "{metrics}");
}

//! `shmlink admit` as the API server meets it: the built binary over real HTTPS (a CA made
//! here, a client that trusts only it), HTTP/1.1 and HTTP/2, a certificate rotated on disk the
//! way the kubelet updates a Secret volume, bad input, stalled clients, SIGTERM.
//!
//! Needs nothing but loopback; no root.

use crate::admit_tls;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use admit_tls::{served_cert, Client, Http, Leaf, SecretVolume, TestCa};
use shmlink::admit::review::answer;
use shmlink::admit::{Mode, Outcome};

const RELOAD: Duration = Duration::from_millis(300);

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A running `shmlink admit`, killed if a test ends before it exits.
struct Admit {
    child: Child,
    https: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Admit {
    fn start(cert: &Path, key: &Path, log: &Path, extra: &[&str]) -> Admit {
        let (https, metrics) = (free_addr(), free_addr());
        let child = admit_command(cert, key, https, metrics, log)
            .args(extra)
            .spawn()
            .unwrap();
        let mut admit = Admit {
            child,
            https,
            metrics,
            log: log.to_path_buf(),
        };
        // Until it answers, not until it listens: the plain port's /healthz (bound after the
        // webhook's port, both before either serves).
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers_healthz(metrics) {
            if let Ok(Some(status)) = admit.child.try_wait() {
                panic!("admit exited {status} at start: {}", admit.log_text());
            }
            assert!(Instant::now() < deadline, "admit never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        admit
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A GET on the plain HTTP port: the whole answer, status line first.
    async fn plain_get(&self, path: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(self.metrics).await.unwrap();
        let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut text = String::new();
        tcp.read_to_string(&mut text).await.unwrap();
        text
    }

    /// `/metrics` over plain HTTP.
    async fn metrics(&self) -> String {
        let text = self.plain_get("/metrics").await;
        assert!(text.starts_with("HTTP/1.0 200"), "{text}");
        text
    }

    /// The value of one series (its name and labels exactly as written), 0 when absent.
    async fn series(&self, series: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    fn sigterm(&self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }

    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "admit did not exit: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a plain GET /healthz at `addr` is answered 200.
fn answers_healthz(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut tcp) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = String::new();
    tcp.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
        .is_ok()
        && tcp.read_to_string(&mut answer).is_ok()
        && answer.split_whitespace().nth(1) == Some("200")
}

fn admit_command(
    cert: &Path,
    key: &Path,
    https: SocketAddr,
    metrics: SocketAddr,
    log: &Path,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shmlink"));
    command
        .arg("admit")
        .arg(format!("--listen={https}"))
        .arg(format!("--metrics-listen={metrics}"))
        .arg("--tls-cert-file")
        .arg(cert)
        .arg("--tls-key-file")
        .arg(key)
        .arg(format!("--tls-reload-interval={}ms", RELOAD.as_millis()))
        .env_remove("SHMLINK_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    command
}

/// A CA, a leaf valid until 2031, written as a Secret volume; and a running server on it.
fn setup(dir: &Path) -> (TestCa, Leaf, SecretVolume, Admit) {
    setup_with(dir, &[])
}

fn setup_with(dir: &Path, extra: &[&str]) -> (TestCa, Leaf, SecretVolume, Admit) {
    let ca = TestCa::new();
    let leaf = ca.leaf((2031, 5, 17));
    let volume = SecretVolume::new(dir, &leaf.cert_pem, &leaf.key_pem);
    let admit = Admit::start(&volume.cert(), &volume.key(), &dir.join("admit.log"), extra);
    (ca, leaf, volume, admit)
}

fn configmap_review(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}}
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_health_and_reviews_over_http1_and_http2_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup(dir.path());
    for http in [Http::One, Http::Two] {
        let mut client = Client::connect(admit.https, &ca.pem, http).await.unwrap();
        let health = client.request("GET", "/healthz", "").await.unwrap();
        assert_eq!((health.status, health.body.as_slice()), (200, &b"ok\n"[..]));
        for path in ["/mutate", "/mutate/warn", "/mutate/mutate"] {
            let uid = format!("{http:?}-{path}");
            let reply = client
                .request("POST", path, configmap_review(&uid))
                .await
                .unwrap();
            assert_eq!(reply.status, 200, "{http:?} {path}: {reply:?}");
            assert_eq!(reply.content_type, "application/json");
            let review = reply.json();
            assert_eq!(review["kind"], "AdmissionReview");
            assert_eq!(review["response"]["uid"], uid.as_str());
            assert_eq!(review["response"]["allowed"], true);
            assert!(review["response"].get("patch").is_none(), "{review}");
        }
    }
    let health = admit.plain_get("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.0 200") && health.ends_with("ok\n"),
        "{health}"
    );
    // /mutate is the server's --mode (warn by default); the other two their own.
    let warn = r#"shmlink_admission_decisions_total{mode="warn",outcome="not_pod"}"#;
    let mutate = r#"shmlink_admission_decisions_total{mode="mutate",outcome="not_pod"}"#;
    assert_eq!(admit.series(warn).await, 4.0);
    assert_eq!(admit.series(mutate).await, 2.0);
    assert_eq!(
        admit
            .series("shmlink_admission_duration_seconds_count")
            .await,
        6.0
    );
    // 2031-05-17T00:00:00Z
    let not_after = "shmlink_admission_tls_not_after_timestamp_seconds";
    assert_eq!(admit.series(not_after).await, 1_936_742_400.0);
    // One log line per decision, with its pod, mode, outcome and time.
    let log = admit.log_text();
    let decided: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("outcome=\"not_pod\""))
        .collect();
    assert_eq!(decided.len(), 6, "{log}");
    assert!(
        decided
            .iter()
            .all(|l| l.contains("micros=") && l.contains("INFO")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_mutate_is_what_post_mutate_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup_with(dir.path(), &["--mode", "mutate"]);
    let mut client = Client::connect(admit.https, &ca.pem, Http::Two)
        .await
        .unwrap();
    let reply = client
        .request("POST", "/mutate", configmap_review("m"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let mutate = r#"shmlink_admission_decisions_total{mode="mutate",outcome="not_pod"}"#;
    let warn = r#"shmlink_admission_decisions_total{mode="warn",outcome="not_pod"}"#;
    assert_eq!(admit.series(mutate).await, 1.0);
    assert_eq!(admit.series(warn).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_counted_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup(dir.path());
    for http in [Http::One, Http::Two] {
        let mut client = Client::connect(admit.https, &ca.pem, http).await.unwrap();
        let bad = client
            .request("POST", "/mutate", "{\"request\": ")
            .await
            .unwrap();
        assert_eq!(bad.status, 400, "{bad:?}");
        assert!(
            bad.json()["error"].as_str().unwrap().contains("not JSON"),
            "{bad:?}"
        );
        // The same connection goes on.
        let next = client
            .request("POST", "/mutate", configmap_review("after"))
            .await
            .unwrap();
        assert_eq!(next.status, 200);
        let wrong = client.request("GET", "/mutate", "").await.unwrap();
        assert_eq!(wrong.status, 405);
        let lost = client.request("POST", "/validate", "{}").await.unwrap();
        assert_eq!(lost.status, 404);
        let huge = client
            .request("POST", "/mutate/mutate", vec![b' '; 9 << 20])
            .await;
        match huge {
            Ok(reply) => {
                assert_eq!(reply.status, 413, "{http:?}");
                assert!(reply.json()["error"]
                    .as_str()
                    .unwrap()
                    .contains("over 8388608 bytes"));
            }
            // HTTP/1.1 may close the connection while the client still writes the body: the
            // answer is then read back on a fresh connection below (the count).
            Err(e) => {
                eprintln!("{http:?}: 413 not read back: {e}");
                assert_eq!(http, Http::One, "{e}");
            }
        }
    }
    // And a fresh connection is served.
    let mut client = Client::connect(admit.https, &ca.pem, Http::Two)
        .await
        .unwrap();
    let ok = client
        .request("POST", "/mutate", configmap_review("fresh"))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    let errors_warn = r#"shmlink_admission_decisions_total{mode="warn",outcome="error"}"#;
    let errors_mutate = r#"shmlink_admission_decisions_total{mode="mutate",outcome="error"}"#;
    assert_eq!(
        admit.series(errors_warn).await,
        2.0,
        "the two malformed bodies"
    );
    assert_eq!(
        admit.series(errors_mutate).await,
        2.0,
        "the two bodies too large"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_holds_only_its_own_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup(dir.path());
    // One connects and never says hello; one sends a head and half a body, then waits.
    let _silent = tokio::net::TcpStream::connect(admit.https).await.unwrap();
    let connector = admit_tls::connector(&ca.pem, Http::One);
    let mut half = admit_tls::tls_connect(admit.https, &connector)
        .await
        .unwrap();
    let body = configmap_review("half");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    half.write_all(head.as_bytes()).await.unwrap();
    half.write_all(&body[..body.len() / 2]).await.unwrap();
    half.flush().await.unwrap();
    for http in [Http::One, Http::Two] {
        let started = Instant::now();
        let mut client = Client::connect(admit.https, &ca.pem, http).await.unwrap();
        for i in 0..20 {
            let reply = client.request("POST", "/mutate", configmap_review(&i.to_string()));
            assert_eq!(reply.await.unwrap().status, 200);
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // The stalled one is still waited for: its rest arrives, its answer comes.
    half.write_all(&body[body.len() / 2..]).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), half.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, first, mut volume, admit) = setup(dir.path());
    assert_eq!(served_cert(admit.https, &ca.pem).await.unwrap(), first.der);
    let mut kept = Client::connect(admit.https, &ca.pem, Http::Two)
        .await
        .unwrap();

    // cert-manager renews: the kubelet swaps ..data to the new pair.
    let second = ca.leaf((2032, 1, 2));
    volume.update(&second.cert_pem, &second.key_pem);
    let swapped = Instant::now();
    let seen = wait_for_cert(admit.https, &ca.pem, &second.der, RELOAD * 4).await;
    assert!(
        seen,
        "still served the first certificate {:?} after the swap",
        swapped.elapsed()
    );
    let took = swapped.elapsed();
    assert!(took < RELOAD * 4, "{took:?}");
    // The connection opened before goes on.
    let reply = kept
        .request("POST", "/mutate", configmap_review("kept"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let not_after = "shmlink_admission_tls_not_after_timestamp_seconds";
    assert_eq!(admit.series(not_after).await, 1_956_614_400.0, "2032-01-02");

    // A broken pair: a new certificate with the old key, then a half-written certificate.
    let third = ca.leaf((2033, 3, 4));
    volume.update(&third.cert_pem, &second.key_pem);
    tokio::time::sleep(RELOAD * 3).await;
    assert_eq!(served_cert(admit.https, &ca.pem).await.unwrap(), second.der);
    let half = &third.cert_pem[..third.cert_pem.len() / 2];
    volume.update(half, &third.key_pem);
    tokio::time::sleep(RELOAD * 3).await;
    assert_eq!(served_cert(admit.https, &ca.pem).await.unwrap(), second.der);
    assert_eq!(admit.series(not_after).await, 1_956_614_400.0);
    let ok = r#"shmlink_admission_tls_reloads_total{result="ok"}"#;
    let error = r#"shmlink_admission_tls_reloads_total{result="error"}"#;
    assert_eq!(admit.series(ok).await, 1.0);
    assert_eq!(
        admit.series(error).await,
        2.0,
        "each broken content counted once"
    );
    let log = admit.log_text();
    let kept_lines = log.matches("keeping the certificate served").count();
    assert_eq!(kept_lines, 2, "logged once per broken content: {log}");

    // Mended: served.
    volume.update(&third.cert_pem, &third.key_pem);
    assert!(wait_for_cert(admit.https, &ca.pem, &third.der, RELOAD * 4).await);
    assert_eq!(admit.series(ok).await, 2.0);
}

async fn wait_for_cert(addr: SocketAddr, ca: &str, der: &[u8], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if served_cert(addr, ca).await.unwrap() == der {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, mut admit) = setup(dir.path());
    let connector = admit_tls::connector(&ca.pem, Http::One);
    let mut tls = admit_tls::tls_connect(admit.https, &connector)
        .await
        .unwrap();
    let body = configmap_review("in-flight");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body[..10]).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    admit.sigterm();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // No new connections...
    let refused = tokio::net::TcpStream::connect(admit.https).await;
    assert!(refused.is_err(), "still accepting after SIGTERM");
    // ...but the request in flight is answered.
    tls.write_all(&body[10..]).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut tls))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"uid\":\"in-flight\""), "{answer}");
    let status = admit.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{}", admit.log_text());
}

#[test]
fn a_pair_that_does_not_load_at_start_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (a, b) = (ca.leaf((2031, 1, 1)), ca.leaf((2031, 1, 1)));
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, &a.cert_pem).unwrap();
    std::fs::write(&key, &b.key_pem).unwrap();
    std::fs::write(dir.path().join("good.key"), &a.key_pem).unwrap();
    let good = dir.path().join("good.key");
    let missing = dir.path().join("missing.key");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let cases = [
        (&key, free_addr(), "does not go with"),
        (&missing, free_addr(), "missing.key"),
        (&good, busy, "listening on"),
    ];
    for (key, https, says) in cases {
        let log = dir.path().join("start.log");
        let out = admit_command(&cert, key, https, free_addr(), &log)
            .output()
            .unwrap();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("shmlink: ") && stderr.contains(says),
            "{stderr}"
        );
    }
}

/// Every real Pod of tests/fixtures/admission over HTTPS (HTTP/2, as the API server speaks), on
/// each route: the server is only the transport, so each answer is byte for byte what the
/// decision gives in that route's mode (`/mutate` the server's `--mode`, here warn); the
/// 8-GPU Pod's patch, applied, mounts the volume; every answer is counted by mode and outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_real_pod_is_answered_as_the_decision_says_on_each_route() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission");
    let mut reviews: Vec<(String, Vec<u8>)> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    reviews.sort();
    assert!(reviews.len() >= 10, "{} fixtures", reviews.len());
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup(dir.path());
    let mut client = Client::connect(admit.https, &ca.pem, Http::Two)
        .await
        .unwrap();
    let mut mutated = 0.0;
    for (name, body) in &reviews {
        for (path, mode) in [
            ("/mutate", Mode::Warn),
            ("/mutate/warn", Mode::Warn),
            ("/mutate/mutate", Mode::Mutate),
        ] {
            let reply = client.request("POST", path, body.clone()).await.unwrap();
            let want = answer(body, mode);
            assert_eq!(reply.status, want.status, "{name} {path}");
            assert_eq!(
                String::from_utf8_lossy(&reply.body),
                String::from_utf8_lossy(&want.body),
                "{name} {path}"
            );
            if want.outcome == Outcome::Mutated {
                mutated += 1.0;
            }
            if name == "pytorch-8gpu" && mode == Mode::Mutate {
                let response = &reply.json()["response"];
                let patch = base64::engine::general_purpose::STANDARD
                    .decode(response["patch"].as_str().unwrap())
                    .unwrap();
                let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
                let mut pod: Value =
                    serde_json::from_slice::<Value>(body).unwrap()["request"]["object"].clone();
                json_patch::patch(&mut pod, &patch).unwrap();
                let mounts = &pod["spec"]["containers"][0]["volumeMounts"];
                assert!(
                    mounts
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|m| m["mountPath"] == "/dev/shm" && m["name"] == "shmlink-dshm"),
                    "{mounts}"
                );
            }
        }
    }
    assert!(mutated >= 5.0, "{mutated} mutated");
    let series = r#"shmlink_admission_decisions_total{mode="mutate",outcome="mutated"}"#;
    assert_eq!(admit.series(series).await, mutated);
    let warned = r#"shmlink_admission_decisions_total{mode="warn",outcome="warned"}"#;
    assert!(admit.series(warned).await >= 2.0 * 5.0);
}

/// What arrives until the other end closes (with or without TLS's close_notify).
async fn read_until_closed(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = stream.read(&mut buf).await {
        all.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// An API server whose caBundle is not the served certificate's CA fails every handshake, and
/// with failurePolicy Ignore admits every Pod unchecked: each failure is counted, the first is
/// logged, and a client with the right CA is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_another_ca_is_counted_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _, admit) = setup(dir.path());
    let stranger = TestCa::new();
    for _ in 0..3 {
        let refused = Client::connect(admit.https, &stranger.pem, Http::Two).await;
        assert!(refused.is_err(), "a certificate of another CA was trusted");
    }
    let series = "shmlink_admission_tls_handshake_failures_total";
    let deadline = Instant::now() + Duration::from_secs(5);
    while admit.series(series).await < 3.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(admit.series(series).await, 3.0);
    let log = admit.log_text();
    assert_eq!(log.matches("TLS handshake failed").count(), 1, "{log}");
    let mut client = Client::connect(admit.https, &ca.pem, Http::Two)
        .await
        .unwrap();
    let reply = client.request("GET", "/healthz", Vec::new()).await.unwrap();
    assert_eq!(reply.status, 200);
}

/// The listener's deadlines over real TLS, in process with short ones (the binary's are 5 s and
/// 120 s): a connection that says nothing after its handshake is closed at its first request's
/// deadline; an HTTP/2 connection idle after its answer is closed (GOAWAY) at the idle one; a
/// request that arrived in time is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_at_their_deadlines() {
    use hyper::client::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use shmlink::admit::server::{serve, AdmitSettings, Limits};

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let leaf = ca.leaf((2031, 5, 17));
    let volume = SecretVolume::new(dir.path(), &leaf.cert_pem, &leaf.key_pem);
    let mut limits = Limits::default();
    limits.conns.first_request = Duration::from_millis(500);
    limits.conns.idle_timeout = Duration::from_millis(800);
    limits.conns.header_timeout = Duration::from_millis(800);
    let addr = free_addr();
    let settings = AdmitSettings {
        listen: addr,
        cert_file: volume.cert(),
        key_file: volume.key(),
        mode: Mode::Warn,
        metrics_listen: None,
        reload_interval: Duration::from_secs(60),
        limits,
        dra: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(settings, async {
        let _ = stopped.await;
    }));
    let connector = admit_tls::connector(&ca.pem, Http::Two);
    let mut tls = loop {
        match admit_tls::tls_connect(addr, &connector).await {
            Ok(tls) => break tls,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    // Said nothing after the handshake: closed at the first request's deadline.
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // One review over HTTP/2, then idle: answered, then closed.
    let tls = admit_tls::tls_connect(addr, &connector).await.unwrap();
    let (mut send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method("POST")
        .uri("https://shmlink-admission.shmlink.svc/mutate")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            configmap_review("idle"),
        )))
        .unwrap();
    let answered = send.send_request(request).await.unwrap();
    assert_eq!(answered.status(), 200);
    drop(answered);
    let idle = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection was kept");
    assert!(
        idle.elapsed() >= Duration::from_millis(500),
        "closed before its idle deadline: {:?}",
        idle.elapsed()
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

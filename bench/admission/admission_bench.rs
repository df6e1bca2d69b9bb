//! `shmlink admit` under an API server's load: an open loop of AdmissionReviews of an 8-GPU
//! PyTorch Pod over HTTPS keep-alive connections, at a fixed rate whatever the answers take.
//!
//! Each request has an intended send time (start + i / rate); its latency runs from then to the
//! end of its answer, so a stall delays the requests behind it and shows in their latencies
//! (no coordinated omission). The server is the binary given, started here with a certificate
//! of a CA made here; its CPU (utime + stime) and RSS are read from /proc around the run.
//!
//!     admission_bench --shmlink target/release/shmlink [--rate 200] [--seconds 60]
//!                     [--connections 4] [--http 2|1] [--json FILE]

#[path = "../../tests/common/admit_tls.rs"]
mod admit_tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admit_tls::{Client, Http, SecretVolume, TestCa};
use hyper::body::Bytes;
use serde_json::json;
use tokio::sync::Mutex;

struct Options {
    shmlink: PathBuf,
    rate: f64,
    seconds: f64,
    connections: usize,
    http: Http,
    json: Option<PathBuf>,
}

fn options() -> Options {
    let mut o = Options {
        shmlink: PathBuf::from("target/release/shmlink"),
        rate: 200.0,
        seconds: 60.0,
        connections: 4,
        http: Http::Two,
        json: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--shmlink" => o.shmlink = value.into(),
            "--rate" => o.rate = value.parse().expect("--rate"),
            "--seconds" => o.seconds = value.parse().expect("--seconds"),
            "--connections" => o.connections = value.parse().expect("--connections"),
            "--http" => o.http = if value == "1" { Http::One } else { Http::Two },
            "--json" => o.json = Some(value.into()),
            other => panic!("unknown option {other}"),
        }
    }
    o
}

fn main() {
    let o = options();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let leaf = ca.leaf((2031, 1, 1));
    let volume = SecretVolume::new(dir.path(), &leaf.cert_pem, &leaf.key_pem);
    let free = || -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (addr, metrics) = (free(), free());
    let mut server = Command::new(&o.shmlink)
        .arg("admit")
        .arg(format!("--listen={addr}"))
        .arg(format!("--metrics-listen={metrics}"))
        .arg("--tls-cert-file")
        .arg(volume.cert())
        .arg("--tls-key-file")
        .arg(volume.key())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // The log at info, one line per decision, as deployed; written to a file.
        .stderr(std::fs::File::create(dir.path().join("admit.log")).unwrap())
        .spawn()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut report = runtime.block_on(run(&o, addr, &ca.pem, &server));
    // The server's own view: its mean time from a body's first byte read to the answer.
    let text = scrape(metrics);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let mean = value("shmlink_admission_duration_seconds_sum")
        / value("shmlink_admission_duration_seconds_count");
    report["server_handler_mean_us"] = json!(mean * 1e6);
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&server),
        rustix::process::Signal::TERM,
    );
    let status = server.wait().unwrap();
    let errors = report["errors"].as_u64().unwrap_or(u64::MAX);
    let report = json!({"server_exit": status.code(), "result": report});
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    }
    // A harness failure (errors, an unclean exit) fails the run; a slow answer never does.
    if errors > 0 || status.code() != Some(0) {
        eprintln!("admission_bench: {errors} errors, server exit {status}");
        std::process::exit(1);
    }
}

/// `/metrics` over plain HTTP/1.0.
fn scrape(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).unwrap();
    text
}

type Pool = Arc<(tokio::sync::Semaphore, Mutex<Vec<Client>>)>;

/// `--connections` keep-alive connections, once the server answers (at most 20 s).
async fn connect_all(o: &Options, addr: SocketAddr, ca: &str) -> Vec<Client> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut clients = Vec::new();
    while clients.len() < o.connections {
        match Client::connect(addr, ca, o.http).await {
            Ok(c) => clients.push(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the server never answered: {e}"),
        }
    }
    clients
}

async fn run(o: &Options, addr: SocketAddr, ca: &str, server: &Child) -> serde_json::Value {
    let clients = connect_all(o, addr, ca).await;
    // The real 8-GPU PyTorch Pod of the decision's tests, as it reaches admission.
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/admission/pytorch-8gpu.json"
    );
    let body = Bytes::from(std::fs::read(fixture).expect("the pytorch-8gpu fixture"));
    // HTTP/2 multiplexes: every connection is free to take any request at any time.
    let permits = match o.http {
        Http::Two => tokio::sync::Semaphore::MAX_PERMITS,
        Http::One => clients.len(),
    };
    let pool: Pool = Arc::new((tokio::sync::Semaphore::new(permits), Mutex::new(clients)));
    // Warm up (first requests, allocator, caches), not measured.
    for _ in 0..50 {
        send(&pool, body.clone(), o.http).await.unwrap();
    }
    let pid = server.id();
    let cpu_before = cpu_seconds(pid);
    let total = (o.rate * o.seconds).round() as u64;
    let period = Duration::from_secs_f64(1.0 / o.rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(10);
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let intended = start + period.mul_f64(i as f64);
        tokio::time::sleep_until(intended).await;
        let (pool, body, http) = (pool.clone(), body.clone(), o.http);
        tasks.push(tokio::spawn(async move {
            let lag = intended.elapsed();
            let sent = send(&pool, body, http).await;
            if let Err(e) = &sent {
                eprintln!("admission_bench: {e}");
            }
            (sent.is_ok(), intended.elapsed(), lag)
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    let mut lags = Vec::with_capacity(tasks.len());
    let mut errors = 0u64;
    for task in tasks {
        match task.await {
            Ok((true, took, lag)) => {
                latencies.push(took);
                lags.push(lag);
            }
            _ => errors += 1,
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    latencies.sort();
    lags.sort();
    let ms = |all: &[Duration], q: f64| {
        let i = ((all.len() as f64 * q).ceil() as usize).clamp(1, all.len().max(1)) - 1;
        all.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    json!({
        "http": format!("{:?}", o.http),
        "rate_per_s": o.rate,
        "seconds": o.seconds,
        "connections": o.connections,
        "requests": total,
        "body_bytes": body.len(),
        "errors": errors,
        "latency_ms": {"p50": ms(&latencies, 0.50), "p90": ms(&latencies, 0.90),
                       "p99": ms(&latencies, 0.99), "max": ms(&latencies, 1.0)},
        // How late the client's timer started each request (part of the latency above).
        "send_lag_ms": {"p50": ms(&lags, 0.50), "p99": ms(&lags, 0.99), "max": ms(&lags, 1.0)},
        "server_cpu_seconds": cpu,
        "server_cpu_percent_of_one_core": 100.0 * cpu / wall,
        "server_rss_mib": status_kib(pid, "VmRSS:") / 1024.0,
        "server_peak_rss_mib": status_kib(pid, "VmHWM:") / 1024.0,
    })
}

/// One review on a pooled connection; an answer other than 200 with `allowed` is an error.
async fn send(pool: &Pool, body: Bytes, http: Http) -> Result<(), String> {
    let _permit = pool.0.acquire().await.map_err(|e| e.to_string())?;
    let mut client = {
        let mut idle = pool.1.lock().await;
        match http {
            // One connection at a time per request: the pool holds it while in use.
            Http::One if idle.is_empty() => return Err("no idle connection".into()),
            Http::One => idle.remove(0),
            // Shared: a clone of a sender on the least recently used connection.
            Http::Two => {
                let first = idle.remove(0);
                let clone = match &first {
                    Client::Two(send) => Client::Two(send.clone()),
                    Client::One(_) => unreachable!(),
                };
                idle.push(first);
                clone
            }
        }
    };
    let reply = client.request("POST", "/mutate/mutate", body).await;
    if http == Http::One {
        pool.1.lock().await.push(client);
    }
    let reply = reply.map_err(|e| e.to_string())?;
    if reply.status != 200 || !reply.body.windows(14).any(|w| w == b"\"allowed\":true") {
        return Err(format!(
            "{}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(())
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    (fields.get(11).unwrap_or(&0.0) + fields.get(12).unwrap_or(&0.0)) / ticks
}

fn status_kib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

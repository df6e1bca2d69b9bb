//! A benchmark, not a check: the delay from a failure line written to a Pod's log to its Event
//! at the API server. N Pods at the in-process fake API server, each with a kubelet-layout CRI
//! log under a temporary pod log root; `shmlink serve --kube on --pod-log-root <root>
//! --interval 5s` follows them; one `ShmAllocationFailed` line per Pod is appended at a random
//! moment over the spread (distinct Pods, so each is a new Event), and the fake API server is
//! polled every 10 ms for each Pod's Event. Prints the count, p50, p90, p99 and max; fails only
//! when an Event never arrives (within 10 s of its line), never on a time.
//!
//! ```text
//! cargo test --release --test bench_failures -- --ignored --nocapture
//! BENCH_PODS=100 BENCH_SPREAD_SECS=30 BENCH_SEED=1 cargo test --release --test bench_failures -- --ignored --nocapture
//! ```
//!
//! No containers are needed: the lines alone are the workload's output, and the Pod they are
//! about is told by the log's path. Run by `bench/run.sh failures`, which reads the `BENCH_JSON`
//! line.

// The end-to-end harness of tests/ (the fake API server, serve's scraper).
#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use common::kube_api::{pod, FakeApi};
use serde_json::json;
use serve::{Serve, NODE};

const REASON: &str = "ShmAllocationFailed";
/// What PyTorch 2.15 printed when its DataLoader outgrew a 64 MiB /dev/shm.
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";
/// An Event later than this after its line counts as never arrived.
const GIVE_UP: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One CRI record as containerd writes it.
fn cri_line(text: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{} stderr F {text}\n",
        now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Nearest rank: the smallest sample with at least `p` of them at or below it.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

struct Target {
    name: String,
    uid: String,
    log: PathBuf,
}

#[test]
#[ignore = "a benchmark (bench/run.sh failures runs it)"]
fn failure_line_to_event_delay() {
    let pods: usize = env_or("BENCH_PODS", 100);
    let spread = Duration::from_secs_f64(env_or("BENCH_SPREAD_SECS", 30.0));
    let seed: u64 = env_or(
        "BENCH_SEED",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );

    let api = FakeApi::start();
    let logs = tempfile::tempdir().unwrap();
    let targets = running_pods(&api, logs.path(), pods);

    let serve = Serve::start(logs.path(), &api.kubeconfig_path(), "off");
    serve.wait_ready();
    // The Pod watch's first list, and the watcher's first look at the logs.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        api.events().iter().all(|e| e["reason"] != REASON),
        "a failure Event before any failure: {:#?}",
        api.events()
    );

    let t0 = Instant::now();
    let (writer, rx) = write_failures(&targets, spread, seed, t0);
    let (written, arrived) = watch_events(&api, &targets, &rx, t0);
    writer.join().unwrap();

    let d = delays(&targets, &written, &arrived);
    let events = api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == REASON)
        .count();
    print_report(pods, spread, seed, events, &d);
    let Delays { missing, early, .. } = d;
    assert!(
        early.is_empty(),
        "Events before their line was written: {early:?}"
    );
    assert!(
        missing.is_empty(),
        "no Event within {GIVE_UP:?} for {} Pods: {missing:?}; serve's log:\n{}",
        missing.len(),
        std::fs::read_to_string(&serve.log).unwrap_or_default()
    );
}

/// `pods` Pods at the API server, each with a container whose log under `root` has been
/// written to for a while (and is followed from its end).
fn running_pods(api: &FakeApi, root: &Path, pods: usize) -> Vec<Target> {
    let mut targets = Vec::new();
    for i in 0..pods {
        let (uid, id) = (common::random_pod_uid(), common::random_container_id());
        let name = format!("trainer-{i}");
        api.apply_pod(pod(NODE, "ml", &name, &uid, &[("trainer", &id)]));
        let dir = root.join(format!("ml_{name}_{uid}/trainer"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("0.log");
        let history: String = (0..20)
            .map(|s| {
                cri_line(&format!(
                    "step {s}: loss 2.{s:02} 48 MiB of /dev/shm in use"
                ))
            })
            .collect();
        std::fs::write(&log, history).unwrap();
        targets.push(Target { name, uid, log });
    }
    targets
}

/// A thread that appends one failure line to each Pod's log at a random moment over `spread`
/// from `t0`, and tells which and when.
fn write_failures(
    targets: &[Target],
    spread: Duration,
    seed: u64,
    t0: Instant,
) -> (JoinHandle<()>, mpsc::Receiver<(usize, Instant)>) {
    let mut rng = Rng(seed | 1);
    let mut schedule: Vec<(Duration, usize)> = (0..targets.len())
        .map(|i| (spread.mul_f64(rng.next_f64()), i))
        .collect();
    schedule.sort();
    let (tx, rx) = mpsc::channel::<(usize, Instant)>();
    let paths: Vec<PathBuf> = targets.iter().map(|t| t.log.clone()).collect();
    let writer = std::thread::spawn(move || {
        for (at, i) in schedule {
            if let Some(wait) = (t0 + at).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let record = cri_line(TORCH_LINE);
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&paths[i])
                .unwrap();
            // One write, as containerd appends a record.
            file.write_all(record.as_bytes()).unwrap();
            let _ = tx.send((i, Instant::now()));
        }
    });
    (writer, rx)
}

/// When each Pod's line was written and when its Event was first seen at the API server,
/// polled until every Event arrived or the last line is [`GIVE_UP`] old.
#[allow(clippy::type_complexity)]
fn watch_events(
    api: &FakeApi,
    targets: &[Target],
    rx: &mpsc::Receiver<(usize, Instant)>,
    t0: Instant,
) -> (Vec<Option<Instant>>, Vec<Option<Instant>>) {
    let by_uid: HashMap<&str, usize> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.uid.as_str(), i))
        .collect();
    let mut written: Vec<Option<Instant>> = vec![None; targets.len()];
    let mut arrived: Vec<Option<Instant>> = vec![None; targets.len()];
    let mut writer_done = false;
    let mut last_write = t0;
    loop {
        loop {
            match rx.try_recv() {
                Ok((i, at)) => {
                    written[i] = Some(at);
                    last_write = at;
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    writer_done = true;
                    break;
                }
            }
        }
        let now = Instant::now();
        for e in api.events() {
            if e["reason"] != REASON {
                continue;
            }
            let Some(&i) = e["regarding"]["uid"].as_str().and_then(|u| by_uid.get(u)) else {
                continue;
            };
            arrived[i].get_or_insert(now);
        }
        let all = arrived.iter().all(Option::is_some);
        if all || (writer_done && now.duration_since(last_write) > GIVE_UP) {
            return (written, arrived);
        }
        std::thread::sleep(POLL);
    }
}

/// Each Pod's delay from line to Event, sorted; the Pods without one in time, and those whose
/// Event came before their line.
struct Delays {
    ms: Vec<f64>,
    missing: Vec<String>,
    early: Vec<String>,
}

fn delays(targets: &[Target], written: &[Option<Instant>], arrived: &[Option<Instant>]) -> Delays {
    let mut d = Delays {
        ms: Vec::new(),
        missing: Vec::new(),
        early: Vec::new(),
    };
    for (i, t) in targets.iter().enumerate() {
        match (written[i], arrived[i]) {
            // Seen before its line was written (beyond the writer's own lag between its write
            // and its clock reading): a bug, not a delay.
            (Some(w), Some(a)) if a + Duration::from_millis(50) < w => d.early.push(t.name.clone()),
            (Some(w), Some(a)) if a.saturating_duration_since(w) <= GIVE_UP => {
                d.ms.push(a.saturating_duration_since(w).as_secs_f64() * 1e3)
            }
            _ => d.missing.push(t.name.clone()),
        }
    }
    d.ms.sort_by(f64::total_cmp);
    d
}

/// The delays as a person reads them, and as `bench/run.sh` reads them (`BENCH_JSON`).
fn print_report(pods: usize, spread: Duration, seed: u64, events: usize, d: &Delays) {
    let (delays_ms, missing, early) = (&d.ms, &d.missing, &d.early);
    let n = delays_ms.len();
    let (p50, p90, p99, max, min, mean) = if n > 0 {
        (
            percentile(delays_ms, 0.50),
            percentile(delays_ms, 0.90),
            percentile(delays_ms, 0.99),
            delays_ms[n - 1],
            delays_ms[0],
            delays_ms.iter().sum::<f64>() / n as f64,
        )
    } else {
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN)
    };
    println!(
        "failure line -> {REASON} Event at the API server, {pods} Pods, lines over {:.0} s \
         (seed {seed}), polled every {} ms:",
        spread.as_secs_f64(),
        POLL.as_millis()
    );
    println!(
        "  count {n} of {pods}; p50 {p50:.0} ms, p90 {p90:.0} ms, p99 {p99:.0} ms, max {max:.0} \
         ms (min {min:.0} ms, mean {mean:.0} ms); {events} {REASON} Events at the server"
    );
    println!(
        "BENCH_JSON {}",
        json!({
            "mode": "event_delay", "pods": pods, "spread_s": spread.as_secs_f64(), "seed": seed,
            "poll_ms": POLL.as_millis() as u64, "count": n, "events": events,
            "missing": missing, "early": early,
            "ms": {"p50": p50, "p90": p90, "p99": p99, "max": max, "min": min, "mean": mean},
            "samples_ms": delays_ms.iter().map(|d| (d * 10.0).round() / 10.0).collect::<Vec<_>>(),
        })
    );
}

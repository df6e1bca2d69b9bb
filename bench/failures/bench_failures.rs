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
#[path = "../common/env.rs"]
mod env;
#[path = "../common/rng.rs"]
mod rng;
mod serve;
#[path = "../common/stats.rs"]
mod stats;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use common::kube_api::{pod, FakeApi};
use env::env_or;
use rng::Rng;
use serde_json::json;
use serve::{Serve, NODE};
use stats::percentile;

const REASON: &str = "ShmAllocationFailed";
/// What PyTorch 2.15 printed when its DataLoader outgrew a 64 MiB /dev/shm.
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";
/// An Event later than this after its line counts as never arrived.
const GIVE_UP: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

/// One CRI record as containerd writes it.
fn cri_line(text: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{} stderr F {text}\n",
        now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
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
    let targets = pods_with_logs(&api, logs.path(), pods);
    let serve = Serve::start(logs.path(), &api.kubeconfig_path(), "off");
    serve.wait_ready();
    // The Pod watch's first list, and the watcher's first look at the logs.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        api.events().iter().all(|e| e["reason"] != REASON),
        "a failure Event before any failure: {:#?}",
        api.events()
    );

    let (written, arrived) = measure(&api, &targets, spread, seed);
    let delays = Delays::of(&targets, &written, &arrived);
    let events = api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == REASON)
        .count();
    report(pods, spread, seed, events, &delays);
    let Delays { missing, early, .. } = delays;
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

/// `pods` Pods at the API server, each with a CRI log of 20 lines under `root`: the container
/// has been running, so its log exists (and is followed from its end).
fn pods_with_logs(api: &FakeApi, root: &Path, pods: usize) -> Vec<Target> {
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

/// The measured loop: one failure line per target at a random moment over `spread`, written
/// on a thread of its own, while the API server is polled every `POLL` for their Events. When
/// each line was written and when its Pod's Event was first seen, by target.
fn measure(
    api: &FakeApi,
    targets: &[Target],
    spread: Duration,
    seed: u64,
) -> (Vec<Option<Instant>>, Vec<Option<Instant>>) {
    let pods = targets.len();
    let by_uid: HashMap<String, usize> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.uid.clone(), i))
        .collect();
    let mut rng = Rng(seed | 1);
    let mut schedule: Vec<(Duration, usize)> = (0..pods)
        .map(|i| (spread.mul_f64(rng.next_f64()), i))
        .collect();
    schedule.sort();
    let (tx, rx) = mpsc::channel::<(usize, Instant)>();
    let paths: Vec<PathBuf> = targets.iter().map(|t| t.log.clone()).collect();
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || write_lines(schedule, &paths, t0, tx));

    let mut written: Vec<Option<Instant>> = vec![None; pods];
    let mut arrived: Vec<Option<Instant>> = vec![None; pods];
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
            break;
        }
        std::thread::sleep(POLL);
    }
    writer.join().unwrap();
    (written, arrived)
}

/// The failure line appended to `paths[i]` at `t0 + at`, for each of `schedule`; each write's
/// target and time sent on `tx`.
fn write_lines(
    schedule: Vec<(Duration, usize)>,
    paths: &[PathBuf],
    t0: Instant,
    tx: mpsc::Sender<(usize, Instant)>,
) {
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
}

/// The delays from line to Event, sorted, and the Pods whose Event never came or came early.
struct Delays {
    ms: Vec<f64>,
    missing: Vec<String>,
    /// Seen before its line was written (beyond the writer's own lag between its write and its
    /// clock reading): a bug, not a delay.
    early: Vec<String>,
}

impl Delays {
    fn of(targets: &[Target], written: &[Option<Instant>], arrived: &[Option<Instant>]) -> Delays {
        let mut ms = Vec::new();
        let mut missing = Vec::new();
        let mut early = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            match (written[i], arrived[i]) {
                (Some(w), Some(a)) if a + Duration::from_millis(50) < w => {
                    early.push(t.name.clone())
                }
                (Some(w), Some(a)) if a.saturating_duration_since(w) <= GIVE_UP => {
                    ms.push(a.saturating_duration_since(w).as_secs_f64() * 1e3)
                }
                _ => missing.push(t.name.clone()),
            }
        }
        ms.sort_by(f64::total_cmp);
        Delays { ms, missing, early }
    }

    /// p50, p90, p99, max, min and mean; NaN when there is none.
    fn summary(&self) -> [f64; 6] {
        let ms = &self.ms;
        let n = ms.len();
        if n == 0 {
            return [f64::NAN; 6];
        }
        [
            percentile(ms, 0.50),
            percentile(ms, 0.90),
            percentile(ms, 0.99),
            ms[n - 1],
            ms[0],
            ms.iter().sum::<f64>() / n as f64,
        ]
    }
}

/// The two lines for people and the `BENCH_JSON` line for bench/run.sh.
fn report(pods: usize, spread: Duration, seed: u64, events: usize, delays: &Delays) {
    let n = delays.ms.len();
    let [p50, p90, p99, max, min, mean] = delays.summary();
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
            "missing": delays.missing, "early": delays.early,
            "ms": {"p50": p50, "p90": p90, "p99": p99, "max": max, "min": min, "mean": mean},
            "samples_ms": delays.ms.iter().map(|d| (d * 10.0).round() / 10.0).collect::<Vec<_>>(),
        })
    );
}

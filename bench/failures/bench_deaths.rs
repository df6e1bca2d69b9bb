//! A benchmark, not a check: what telling deaths that print nothing costs. N real runc
//! containers in kubelet-style cgroups (one Pod each at the in-process fake API server, a CRI
//! log each under a temporary pod log root), followed by two `shmlink serve --kube on
//! --interval 5s`: one with both failure sources on (the pod logs and /dev/kmsg), one with the
//! kernel log off (the memory cgroups' OOM counters instead). It measures
//!
//! 1. each serve's CPU (utime + stime of /proc/PID/stat over a window, as % of one core);
//! 2. the delay from the kernel's OOM report to the Event at the API server: K containers of
//!    Pods the server knows, one after another, each filling a 1 GiB tmpfs /dev/shm past its
//!    32 MiB memory limit, so the real kernel OOM-kills dd. The report's time is the
//!    `oom-kill:` record's /dev/kmsg timestamp (the kernel's local clock, CLOCK_MONOTONIC's base
//!    on this machine); the Event's is CLOCK_MONOTONIC when a 10 ms poll of the fake API server
//!    first saw it, so each delay is at most 10 ms late. Both serves tell each kill; the kernel
//!    log's is the one timed, the counter's (bounded by the scan interval) is reported beside.
//!
//! Prints the figures and one `BENCH_JSON ` line; fails only when a kill is never told (within
//! 20 s), never on a time.
//!
//! ```text
//! cargo test --release --test bench_deaths -- --ignored --nocapture
//! BENCH_CONTAINERS=300 BENCH_KILLS=20 BENCH_CPU_SECS=60 cargo test --release --test bench_deaths -- --ignored --nocapture
//! ```

// The end-to-end harness of tests/ (real containers, the fake API server, serve's scraper).
#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::agent::get;
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec, HostTmpfs, Shm};
use serve::{Serve, NODE};

const MIB: u64 = 1 << 20;
const GIVE_UP: Duration = Duration::from_secs(20);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn monotonic_usec() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// /dev/kmsg from its end, non-blocking: each read is one record.
struct Kmsg(std::fs::File);

impl Kmsg {
    fn open() -> Kmsg {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_nonblock())
            .open("/dev/kmsg")
            .expect("opening /dev/kmsg (root)");
        rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::End(0)).expect("seeking /dev/kmsg");
        Kmsg(f)
    }

    /// The timestamp (µs) of the `oom-kill:` record naming `needle`, waiting up to `within`.
    fn oom_kill_of(&mut self, needle: &str, within: Duration) -> Option<u64> {
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 8192];
        while Instant::now() < deadline {
            match self.0.read(&mut buf) {
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let Some((head, msg)) = rec.split_once(';') else {
                        continue;
                    };
                    if msg.starts_with("oom-kill:") && msg.contains(needle) {
                        return head.split(',').nth(2)?.parse().ok();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                // EPIPE: records were overwritten; go on from the next one.
                Err(_) => {}
            }
        }
        None
    }
}

use std::os::unix::fs::OpenOptionsExt;

fn libc_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// The kernel-log serve's Events about `pod` (the counter serve's say "Counted by").
fn events_with(api: &FakeApi, pod: &str, reasons: &[&str]) -> usize {
    api.events()
        .iter()
        .filter(|e| {
            e["regarding"]["name"] == pod
                && reasons.contains(&e["reason"].as_str().unwrap_or(""))
                && !e["note"].as_str().unwrap_or("").contains("Counted by")
        })
        .count()
}

#[test]
#[ignore = "a benchmark (bench/run.sh deaths runs it)"]
fn deaths_cost_and_delay() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let containers: usize = env_or("BENCH_CONTAINERS", 300);
    let kills: usize = env_or("BENCH_KILLS", 20);
    let cpu_secs: u64 = env_or("BENCH_CPU_SECS", 60);

    let api = FakeApi::start();
    let logs = tempfile::Builder::new()
        .prefix("shmlink-bench-deaths-")
        .tempdir()
        .unwrap();
    eprintln!("== starting {containers} containers");
    let started = Instant::now();
    let (running, log_files) = quiet_pods(&api, logs.path(), containers);
    let (writing, writer) = write_log_lines(log_files);
    eprintln!("   started in {:.0?}", started.elapsed());
    let kubeconfig = api.kubeconfig_path();
    let both = Serve::start(logs.path(), &kubeconfig, "/dev/kmsg");
    let counters = Serve::start(logs.path(), &kubeconfig, "off");
    both.wait_ready();
    counters.wait_ready();

    eprintln!("== serve's CPU over {cpu_secs} s");
    let cpu = cpu_window(&both, &counters, cpu_secs);
    eprintln!(
        "   both sources: {:.2}% of a core; --kmsg off: {:.2}%",
        cpu.both, cpu.counters
    );

    eprintln!("== {kills} OOM kills, one after another");
    let (delays_ms, counter_delays_ms) = oom_kill_delays(&api, &counters, kills);
    let stats = |v: &[f64]| {
        if v.is_empty() {
            return serde_json::json!(null);
        }
        serde_json::json!({"n": v.len(), "p50_ms": percentile(v, 0.5), "p95_ms": percentile(v, 0.95),
                           "p99_ms": percentile(v, 0.99), "max_ms": v[v.len() - 1]})
    };
    let result = serde_json::json!({
        "mode": "deaths", "containers": containers, "cpu_window_s": cpu.secs,
        "cpu_pct_both_sources": cpu.both, "cpu_pct_kmsg_off": cpu.counters,
        "cpu_pct_by_thread_both_sources": cpu.threads_both, "cpu_pct_by_thread_kmsg_off": cpu.threads_counters,
        "kernel_report_to_event": stats(&delays_ms),
        "kernel_report_to_counted_kmsg_off": stats(&counter_delays_ms),
    });
    eprintln!("{result:#}");
    println!("BENCH_JSON {result}");
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.join();
    drop(running);
}

/// `n` quiet containers (a training process does not fork every second), one Pod each at the
/// API server, and the paths of their CRI logs under `root`.
fn quiet_pods(api: &FakeApi, root: &Path, n: usize) -> (Vec<Container>, Vec<PathBuf>) {
    let mut running = Vec::new();
    let mut log_files = Vec::new();
    for i in 0..n {
        let (uid, id) = (common::random_pod_uid(), common::random_container_id());
        let name = format!("worker-{i}");
        api.apply_pod(pod(NODE, "ml", &name, &uid, &[("trainer", &id)]));
        let dir = root.join(format!("ml_{name}_{uid}")).join("trainer");
        std::fs::create_dir_all(&dir).unwrap();
        log_files.push(dir.join("0.log"));
        running.push(Container::start(ContainerSpec {
            pod_uid: Some(uid),
            id: Some(id),
            memory_limit: Some((256 * MIB) as i64),
            ..ContainerSpec::default()
        }));
    }
    (running, log_files)
}

/// A line a second in each container's CRI log, from one thread, as containerd's shims would
/// append them: the logs are followed, not idle. It stops when the flag is cleared.
fn write_log_lines(log_files: Vec<PathBuf>) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let writing = Arc::new(AtomicBool::new(true));
    let writer = std::thread::spawn({
        let writing = writing.clone();
        move || {
            use std::io::Write;
            let mut files: Vec<std::fs::File> = log_files
                .iter()
                .map(|p| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)
                        .unwrap()
                })
                .collect();
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%fZ");
                for f in &mut files {
                    let _ = writeln!(f, "{now} stdout F [rank0] epoch=3 step=1200 loss=1.7342");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    });
    (writing, writer)
}

/// Each serve's CPU over a window, as % of one core, whole and by thread.
struct CpuShare {
    secs: f64,
    both: f64,
    counters: f64,
    threads_both: BTreeMap<String, f64>,
    threads_counters: BTreeMap<String, f64>,
}

fn cpu_window(both: &Serve, counters: &Serve, cpu_secs: u64) -> CpuShare {
    // /proc/PID/stat counts in USER_HZ, 100 on every Linux ABI this runs on.
    let ticks_per_sec = 100.0;
    let (b0, c0, t0) = (both.cpu_ticks(), counters.cpu_ticks(), Instant::now());
    let (bt0, ct0) = (both.thread_ticks(), counters.thread_ticks());
    std::thread::sleep(Duration::from_secs(cpu_secs));
    let secs = t0.elapsed().as_secs_f64();
    let by_thread = |now: BTreeMap<String, u64>, before: &BTreeMap<String, u64>| {
        now.into_iter()
            .map(|(name, n)| {
                let pct =
                    (n - before.get(&name).copied().unwrap_or(0)) as f64 / 100.0 / secs * 100.0;
                (name, (pct * 1000.0).round() / 1000.0)
            })
            .filter(|(_, pct)| *pct > 0.0)
            .collect::<BTreeMap<_, _>>()
    };
    CpuShare {
        secs,
        threads_both: by_thread(both.thread_ticks(), &bt0),
        threads_counters: by_thread(counters.thread_ticks(), &ct0),
        both: (both.cpu_ticks() - b0) as f64 / ticks_per_sec / secs * 100.0,
        counters: (counters.cpu_ticks() - c0) as f64 / ticks_per_sec / secs * 100.0,
    }
}

/// `kills` containers OOM-killed one after another, each filling a 1 GiB tmpfs /dev/shm past
/// its 32 MiB memory limit: the delays (ms, sorted) from the kernel's report to the kernel-log
/// serve's Event, and to the counter serve's count.
fn oom_kill_delays(api: &FakeApi, counters: &Serve, kills: usize) -> (Vec<f64>, Vec<f64>) {
    let mut kmsg = Kmsg::open();
    let volume = HostTmpfs::new(1024 * MIB);
    let mut delays_ms = Vec::new();
    let mut counter_delays_ms = Vec::new();
    for k in 0..kills {
        let (uid, id) = (common::random_pod_uid(), common::random_container_id());
        let name = format!("loader-{k}");
        api.apply_pod(pod(NODE, "ml", &name, &uid, &[("loader", &id)]));
        let file = format!("/dev/shm/batch{k}");
        let c = Container::start(ContainerSpec {
            pod_uid: Some(uid),
            id: Some(id.clone()),
            args: vec![
                "sh".into(),
                "-c".into(),
                format!("dd if=/dev/zero of={file} bs=1M count=64; rm -f {file}; sleep 3600"),
            ],
            shm: Shm::Bind(volume.path.clone()),
            memory_limit: Some((32 * MIB) as i64),
            ..ContainerSpec::default()
        });
        let reported = kmsg
            .oom_kill_of(&id, GIVE_UP)
            .unwrap_or_else(|| panic!("no OOM report for {id}"));
        let seen = event_seen(api, &name)
            .unwrap_or_else(|| panic!("no Event for {name}: {:#?}", api.events()));
        delays_ms.push(seen.saturating_sub(reported) as f64 / 1000.0);
        // The counter path: the same kill, told at a scan (every 5 s).
        if let Some(t) = counted(counters, &name) {
            counter_delays_ms.push(t.saturating_sub(reported) as f64 / 1000.0);
        }
        drop(c);
    }
    delays_ms.sort_by(f64::total_cmp);
    counter_delays_ms.sort_by(f64::total_cmp);
    (delays_ms, counter_delays_ms)
}

/// When (CLOCK_MONOTONIC, µs) a 10 ms poll first saw the kernel-log serve's OOM Event about
/// `pod` at the API server; None within [`GIVE_UP`].
fn event_seen(api: &FakeApi, pod: &str) -> Option<u64> {
    let reasons = ["ShmOomKilled", "WorkloadOomKilled"];
    let deadline = Instant::now() + GIVE_UP;
    while Instant::now() < deadline {
        if events_with(api, pod, &reasons) > 0 {
            return Some(monotonic_usec());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// When (CLOCK_MONOTONIC, µs) a 20 ms poll first saw the counter serve count a failure of
/// `pod`; None within [`GIVE_UP`].
fn counted(counters: &Serve, pod: &str) -> Option<u64> {
    let deadline = Instant::now() + GIVE_UP;
    while Instant::now() < deadline {
        let told = get(counters.addr, "/metrics").is_some_and(|(_, body)| {
            common::promtext::samples(&body).any(|s| {
                s.name == "shmlink_workload_failures_total" && s.has_labels(&[("pod", pod)])
            })
        });
        if told {
            return Some(monotonic_usec());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

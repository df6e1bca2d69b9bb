//! Logs that flood: 30 containers writing 8 MiB of 64 KiB failure lines each, and a writer
//! faster than the agent reads whose rotated files are deleted under it. The agent's memory
//! stays bounded, every container's failure is still told, and no deleted file is held past
//! the cap. Prints the peak RSS figures (run with --nocapture).
//!
//! The log files are written as containerd writes them (CRI lines, a long line in 16 KiB `P`
//! parts) under a kubelet-style tree; no container is needed to write a file.

use crate::common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::{sample, Agent};

const MIB: u64 = 1 << 20;
/// The writer's rotation size.
const ROTATE_AT: u64 = 64 * MIB;
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// One 64 KiB line holding the failure text, in containerd's 16 KiB parts.
fn long_failure_line() -> String {
    let text = format!(
        "{TORCH_LINE} {}",
        "x".repeat(64 * 1024 - TORCH_LINE.len() - 1)
    );
    let at = now();
    let parts: Vec<&str> = text
        .as_bytes()
        .chunks(16 * 1024)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        let tag = if i + 1 == parts.len() { "F" } else { "P" };
        out.push_str(&format!("{at} stderr {tag} {part}\n"));
    }
    out
}

/// `<root>/ml_flood-<i>_<uid>/trainer/0.log`, its directory created.
fn pod_log(root: &Path, i: usize) -> PathBuf {
    let dir = root
        .join(format!("ml_flood-{i}_00000000-0000-4000-8000-{i:012}"))
        .join("trainer");
    fs::create_dir_all(&dir).unwrap();
    dir.join("0.log")
}

/// Starts serve on the pod log tree `root` and returns once its log watcher follows it: files
/// there before the watcher's first look are followed from their end, so a flood must not
/// begin before it.
fn start_following(root: &Path) -> Agent {
    let canary = pod_log(root, 999);
    fs::write(&canary, "").unwrap();
    let agent = Agent::start(&["--no-gpu", "--pod-log-root", root.to_str().unwrap()], &[]);
    agent.wait_ready();
    let mut f = fs::OpenOptions::new().append(true).open(&canary).unwrap();
    let following = common::wait_until(Duration::from_secs(20), || {
        f.write_all(format!("{} stdout F canary\n", now()).as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        sample(&agent.metrics(), "shmlink_log_lines_total", &[]).unwrap_or(0.0) > 0.0
    });
    assert!(following, "{}", agent.log_text());
    agent
}

/// 30 containers each write 8 MiB of 64 KiB lines that hold a failure text (240 MiB in all).
fn flood(root: &Path) -> u64 {
    let line = long_failure_line();
    let per_container = 8 * MIB as usize / line.len();
    let mut written = 0;
    for i in 0..30 {
        let mut f = fs::File::create(pod_log(root, i)).unwrap();
        for _ in 0..per_container {
            f.write_all(line.as_bytes()).unwrap();
        }
        written += (per_container * line.len()) as u64;
    }
    written
}

#[test]
fn thirty_containers_flooding_64k_failure_lines_keep_serve_and_check_small() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("pods");
    fs::create_dir_all(&root).unwrap();
    let root_arg = root.to_str().unwrap();
    let agent = start_following(&root);
    let idle = common::peak_rss_of(agent.pid());
    let written = flood(&root);
    let canary = sample(&agent.metrics(), "shmlink_log_bytes_total", &[]).unwrap_or(0.0);
    // A debug build reads about 16 MB/s of these (a release build 200), far less beside the
    // other tests of this binary: the wait lasts while the reader keeps reading.
    let body = agent.wait_for_counter(
        "shmlink_log_bytes_total",
        canary + written as f64,
        Duration::from_secs(30),
    );
    // Every container's failure is told, whatever its neighbours wrote.
    let told: Vec<f64> = (0..30)
        .filter_map(|i| {
            sample(
                &body,
                "shmlink_workload_failures_total",
                &[
                    ("pod", &format!("flood-{i}")),
                    ("kind", "shm_allocation_failed"),
                ],
            )
        })
        .collect();
    let serve_peak = common::peak_rss_of(agent.pid());
    agent.terminate();
    assert_eq!(told.len(), 30, "{body}");
    assert!(told.iter().all(|&n| n >= 1.0), "{told:?}");

    let (out, check_peak) =
        common::output_and_peak_rss(Command::new(common::shmlink_bin()).args([
            "check",
            "--json",
            "--no-gpu",
            "--kmsg",
            "off",
            "--since",
            "10m",
            "--pod-log-root",
            root_arg,
        ]));
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let failures = report["failures"].as_array().cloned().unwrap_or_default();
    let pods: std::collections::BTreeSet<&str> = failures
        .iter()
        .filter_map(|f| f["pod"].as_str())
        .filter(|p| p.starts_with("flood-"))
        .collect();
    println!(
        "30 containers x 8 MiB of 64 KiB failure lines ({} MiB): serve peak RSS {serve_peak:.1} \
         MiB ({idle:.1} idle), check --since peak RSS {check_peak:.1} MiB, {} failures listed",
        written / MIB,
        failures.len()
    );
    assert_eq!(pods.len(), 30, "every container's failures listed");
    // The lines were held all at once before (146 MB for this flood); matched as read, what is
    // kept of each is its 512-byte evidence.
    assert!(
        serve_peak < idle + 24.0,
        "serve {serve_peak:.1} MiB, idle {idle:.1}"
    );
    assert!(check_peak < 64.0, "check {check_peak:.1} MiB");
}

/// Sizes of the deleted files `pid` holds open under `dir`.
fn deleted_held(pid: u32, dir: &Path) -> u64 {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|e| {
        let link = e.ok()?.path();
        let target = fs::read_link(&link).ok()?.to_string_lossy().into_owned();
        let deleted = target.starts_with(&*dir.to_string_lossy()) && target.ends_with(" (deleted)");
        // The magic link opens the file itself, deleted or not.
        deleted.then(|| fs::metadata(&link).map(|m| m.len()).unwrap_or(0))
    })
    .sum()
}

#[test]
fn a_writer_faster_than_the_reader_leaves_no_deleted_log_held_past_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("pods");
    fs::create_dir_all(&root).unwrap();
    let log = pod_log(&root, 0);
    fs::write(&log, "").unwrap();
    let agent = start_following(&root);
    let idle = common::peak_rss_of(agent.pid());

    // As containerd writes and kubelet rotates: 1 KiB lines at about 100 MB/s, the file renamed
    // at 64 MiB and the one before it deleted (kubelet's container-log-max-files 2). Held until
    // read, as before, the eight rotated files kept to drain would pin 512 MiB.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (log, stop) = (log.clone(), stop.clone());
        move || {
            let line = format!("{} stdout F {}\n", now(), "w".repeat(1000));
            let chunk = line.repeat(1024);
            let mut written = 0u64;
            let mut rotations = 0u32;
            let started = Instant::now();
            let mut f = fs::OpenOptions::new().append(true).open(&log).unwrap();
            while !stop.load(Ordering::Relaxed) {
                f.write_all(chunk.as_bytes()).unwrap();
                written += chunk.len() as u64;
                if fs::metadata(&log).map(|m| m.len()).unwrap_or(0) >= ROTATE_AT {
                    let rotated = log.with_extension(format!("log.{rotations}"));
                    fs::rename(&log, &rotated).unwrap();
                    if rotations > 0 {
                        let older = log.with_extension(format!("log.{}", rotations - 1));
                        let _ = fs::remove_file(older);
                    }
                    rotations += 1;
                    f = fs::File::create(&log).unwrap();
                }
                // About 100 MB/s: more than one container's log is read at.
                let due = Duration::from_secs_f64(written as f64 / (100.0 * MIB as f64));
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            (written, rotations)
        }
    });
    let mut held_max = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        held_max = held_max.max(deleted_held(agent.pid(), tmp.path()));
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let (written, rotations) = writer.join().unwrap();
    let body = agent.wait_for_metrics("bytes skipped", |b| {
        sample(b, "shmlink_log_bytes_skipped_total", &[]).unwrap_or(0.0) > 0.0
    });
    let read = sample(&body, "shmlink_log_bytes_total", &[]).unwrap_or(0.0);
    let skipped = sample(&body, "shmlink_log_bytes_skipped_total", &[]).unwrap_or(0.0);
    let peak = common::peak_rss_of(agent.pid());
    // Said where an operator reads it, naming the container whose deaths may go untold.
    let said = agent.log_text();
    let named = said
        .lines()
        .filter(|l| l.contains("log of ml/flood-0/trainer: ") && l.contains("MiB unread"))
        .count();
    assert_eq!(named, 1, "{said}");
    agent.terminate();
    println!(
        "a writer at 100 MB/s for 8 s ({} MiB, {rotations} rotations): the agent read {:.0} MiB, \
         skipped {:.0} MiB, held at most {:.1} MiB of deleted files; serve peak RSS {peak:.1} \
         MiB ({idle:.1} idle)",
        written / MIB,
        read / MIB as f64,
        skipped / MIB as f64,
        held_max as f64 / MIB as f64,
    );
    assert!(rotations >= 10, "{rotations} rotations");
    // 64 MiB unread of deleted files per log at most, checked before each read; the files
    // deleted since (a rotation every 0.64 s, a poll every 0.2 s plus its reading) are let go
    // by the next poll. Held until read, the eight kept would reach 512 MiB.
    assert!(held_max <= 64 * MIB + 3 * ROTATE_AT, "held {held_max}");
    assert!(skipped > 0.0);
    assert!(peak < idle + 24.0, "serve {peak:.1} MiB, idle {idle:.1}");
}

/// Descriptors `pid` holds open.
fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The descriptors `pid` holds on files beneath `dir`.
fn fds_beneath(pid: u32, dir: &Path) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| fs::read_link(e.path()).is_ok_and(|to| to.starts_with(dir)))
            .count()
    })
}

#[test]
fn three_thousand_log_files_leave_the_dev_shm_scan_its_descriptors() {
    if !common::e2e_available() {
        return;
    }
    let Some(prlimit) = common::tool("prlimit", "util-linux") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("pods");
    // Someone with write access to the log directories makes 3,000 logs, and 3,000 more
    // restart logs in one container's directory.
    for i in 0..3000 {
        fs::write(pod_log(&root, i), format!("{} stdout F hello\n", now())).unwrap();
    }
    let many = pod_log(&root, 3000).with_file_name("");
    for n in 0..3000 {
        fs::write(many.join(format!("{n}.log")), "").unwrap();
    }
    let c = common::Container::start(common::ContainerSpec {
        args: common::write_then_sleep(3),
        ..common::ContainerSpec::default()
    });
    c.wait_ready();
    // The agent as a DaemonSet might run it: 1,024 descriptors.
    let prlimit = prlimit.to_string_lossy().into_owned();
    let agent = Agent::start_under(
        &[&prlimit, "--nofile=1024:1024", "--"],
        &["--no-gpu", "--pod-log-root", root.to_str().unwrap()],
        &[],
    );
    agent.wait_ready();
    let body = agent.wait_for_metrics("the container's /dev/shm and the logs refused", |b| {
        sample(
            b,
            "shmlink_shm_used_bytes",
            &[("container_id", c.id.as_str())],
        ) == Some((3 * MIB) as f64)
            && sample(b, "shmlink_scan_errors_total", &[("collector", "logs")]).unwrap_or(0.0) > 0.0
    });
    let fds = open_fds(agent.pid());
    let logs = fds_beneath(agent.pid(), &root);
    let refused = sample(&body, "shmlink_scan_errors_total", &[("collector", "logs")]);
    println!(
        "6,000 log files under a 1,024-descriptor limit: {fds} descriptors open, {logs} of them \
         logs, {refused:?} log files refused; the /dev/shm scan measured {}",
        c.id
    );
    // A quarter of the limit for logs: 256. The scan keeps an eighth each of cgroup.procs and
    // memory files open (the more cgroups the machine has, the nearer it is to them), and the
    // rest is the servers' and the scan's own.
    assert!(logs <= 256, "{logs} log files open");
    assert!(fds <= 256 + 2 * 128 + 128, "{fds} descriptors");
    assert_eq!(
        sample(&body, "shmlink_scan_errors_total", &[("collector", "shm")]),
        Some(0.0),
        "{body}"
    );
    assert!(agent
        .log_text()
        .contains("log files open, the most allowed"));
    assert!(agent.terminate().success());
}

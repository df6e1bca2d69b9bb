//! Deaths that print nothing, told by the Pod's status, end to end: real runc containers in
//! kubelet-style cgroups die for real (a SIGBUS from a `multiprocessing.shared_memory` block
//! larger than the 64 MiB /dev/shm; a SIGBUS from a truncated mapped file; the kernel's OOM
//! kill of a container's main process), the in-process API server plays kubelet and records
//! each death in `lastState.terminated`, and `serve` names it on the Pod: one Event per death,
//! the kernel's report and kubelet's `OOMKilled` of one container one failure, a restart loop
//! one Event series. Run with --nocapture to see the Events and their delays.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent::{sample, Agent};
use common::kube_api::events::with_reason;
use common::kube_api::{finished_now, pod, restarted, FakeApi};
use common::{Container, ContainerSpec, HostTmpfs, Shm};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";
const MIB: u64 = 1 << 20;
/// Debian's interpreter, bound into the busybox containers with the libraries it needs.
const PYTHON: &str = "/usr/bin/python3";

/// The sum over every series of `metric` with these labels (each container instance of a
/// restarting Pod has its own `container_id`).
fn total(body: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    common::promtext::samples(body)
        .filter(|s| s.name == metric && s.has_labels(labels))
        .map(|s| s.value)
        .sum()
}

/// How many times an Event's series says it happened (1 without a series).
fn occurrences(e: &Value) -> u64 {
    e["series"]["count"].as_u64().unwrap_or(1)
}

fn python_available() -> bool {
    if Path::new(PYTHON).exists() {
        return true;
    }
    if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("{PYTHON} is missing (apt-get install python3)");
    }
    eprintln!(
        "\n##########\n## SKIPPED: {PYTHON} is missing (apt-get install python3); the SIGBUS \
         deaths need a real program that maps shared memory\n##########\n"
    );
    false
}

/// A container that runs `script` with the host's Python (its /usr and libraries bound
/// read-only into the busybox root).
fn python_container(pod_uid: &str, id: &str, script: &str) -> Container {
    with_python(
        pod_uid,
        id,
        vec![PYTHON.into(), "-c".into(), script.into()],
        None,
    )
}

/// A container with the host's Python in reach, running `args`, its output in `cri_log`.
fn with_python(pod_uid: &str, id: &str, args: Vec<String>, cri_log: Option<PathBuf>) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(pod_uid.to_string()),
        id: Some(id.to_string()),
        args,
        cri_log,
        memory_limit: Some((512 * MIB) as i64),
        extra_mounts: common::runc::host_libraries(),
        ..ContainerSpec::default()
    })
}

/// Fills a 100 MiB `multiprocessing.shared_memory` block on the 64 MiB /dev/shm: ftruncate
/// reserves nothing, so the first page past 64 MiB is a SIGBUS. It stops at 60 MiB for a
/// moment first, as a DataLoader between batches, so the scans see /dev/shm nearly full.
const SHM_BLOCK: &str = r#"
import time
from multiprocessing import shared_memory
block = shared_memory.SharedMemory(create=True, size=100 << 20)
mib = b"\1" * (1 << 20)
for i in range(60):
    block.buf[i << 20:(i + 1) << 20] = mib
time.sleep(3)
for i in range(60, 100):
    block.buf[i << 20:(i + 1) << 20] = mib
"#;

/// Another SIGBUS: a mapped file truncated under the process. /dev/shm stays empty.
const TRUNCATED_MAP: &str = r#"
import mmap, os, time
# A job's memory, as a real one holds: its exit takes the milliseconds freeing it takes, so the
# death trace reads its /dev/shm at the moment (an empty process is gone in microseconds).
hold = b"\1" * (256 << 20)
fd = os.open("/tmp/data", os.O_RDWR | os.O_CREAT)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
time.sleep(1)
os.ftruncate(fd, 0)
m[4096] = 1
"#;

/// kubelet's record of a container that died with `exit_code` (`reason`), restarted as `new_id`.
fn record_death(
    api: &FakeApi,
    pod: Value,
    container: &str,
    dead: &str,
    exit_code: i32,
    reason: &str,
    new_id: &str,
) -> (Value, Instant) {
    let terminated = json!({"exitCode": exit_code, "reason": reason,
        "containerID": format!("containerd://{dead}"), "finishedAt": finished_now()});
    let next = restarted(pod, container, terminated, new_id);
    api.apply_pod(next.clone());
    (next, Instant::now())
}

/// Waits for an Event with `reason` on `pod_name` with at least `count` occurrences; returns
/// it and how long after `since` it was seen.
fn wait_event(api: &FakeApi, pod_name: &str, reason: &str, count: u64, since: Instant) -> Value {
    let mut found = None;
    let ok = common::wait_until(Duration::from_secs(20), || {
        found = api
            .events_about(pod_name)
            .into_iter()
            .find(|e| e["reason"] == reason && occurrences(e) >= count);
        found.is_some()
    });
    assert!(
        ok,
        "no {reason} Event on {pod_name} (x{count}); the server holds: {:#?}",
        api.events()
    );
    let e = found.unwrap();
    println!(
        "{:>6} ms after the status change: {} {} regarding Pod/{} (x{}): {}",
        since.elapsed().as_millis(),
        e["type"].as_str().unwrap_or(""),
        reason,
        pod_name,
        occurrences(&e),
        e["note"].as_str().unwrap_or("")
    );
    assert!(
        since.elapsed() < Duration::from_secs(2),
        "{reason} on {pod_name} took {:?}",
        since.elapsed()
    );
    e
}

#[test]
fn sigbus_deaths_are_named_from_the_pods_status_with_their_dev_shm_then() {
    if !common::e2e_available() || !python_available() {
        return;
    }
    let api = FakeApi::start();
    let (fill_uid, fill_id) = (common::random_pod_uid(), common::random_container_id());
    let (map_uid, map_id) = (common::random_pod_uid(), common::random_container_id());
    let (idle_uid, idle_id) = (common::random_pod_uid(), common::random_container_id());
    let fill_pod = pod(NODE, "ml", "shmfill-0", &fill_uid, &[("fill", &fill_id)]);
    let map_pod = pod(NODE, "ml", "mapper-0", &map_uid, &[("mapper", &map_id)]);
    api.apply_pod(fill_pod.clone());
    api.apply_pod(map_pod.clone());
    api.apply_pod(pod(NODE, "ml", "idle-0", &idle_uid, &[("idle", &idle_id)]));
    let kubeconfig = api.kubeconfig_path();
    // The death trace at its default (auto), as installed: the mapper's /dev/shm is read the
    // moment it dies, so its death is told as the workload's.
    let agent = Agent::start_kube(&kubeconfig, NODE, &["--death-trace", "auto"]);
    agent.wait_ready();

    let fill = python_container(&fill_uid, &fill_id, SHM_BLOCK);
    let mapper = python_container(&map_uid, &map_id, TRUNCATED_MAP);
    let _idle = Container::start(ContainerSpec {
        pod_uid: Some(idle_uid.clone()),
        id: Some(idle_id.clone()),
        memory_limit: Some((64 * MIB) as i64),
        ..ContainerSpec::default()
    });
    for c in [&fill, &mapper] {
        assert!(
            c.wait_exited(Duration::from_secs(60)),
            "container {} is still running: {}",
            c.id,
            c.console()
        );
    }

    // Kubelet records exit status 135 (128 + SIGBUS) for each.
    let (_, changed) = record_death(&api, fill_pod, "fill", &fill_id, 135, "Error", "f2f2");
    let e = wait_event(&api, "shmfill-0", "ShmBusError", 1, changed);
    assert_eq!(e["regarding"]["uid"], fill_uid.as_str());
    let note = e["note"].as_str().unwrap();
    common::assert_contains_all(note, &[
        // Told by the tracepoint at the moment, or by kubelet's exit status: one death.
        "container ml/shmfill-0/fill died of a bus error (SIGBUS",
        "with /dev/shm full: its /dev/shm (the container runtime's default, 64.0 MiB) peaked at 6",
        "ftruncate reserves nothing",
        "sizeLimit: 1Gi",
    ]);

    let (map_pod, changed) = record_death(&api, map_pod, "mapper", &map_id, 135, "Error", "m2m2");
    let e = wait_event(&api, "mapper-0", "WorkloadBusError", 1, changed);
    let note = e["note"].as_str().unwrap();
    common::assert_contains_all(
        note,
        &[
            "container ml/mapper-0/mapper died of a bus error",
            "its /dev/shm, read the moment it died, was not full",
            "Not /dev/shm running out",
        ],
    );

    // A restart loop: the mapper's next container dies the same way. One Event series, each
    // death counted.
    let again = python_container(&map_uid, "m2m2", TRUNCATED_MAP);
    assert!(
        again.wait_exited(Duration::from_secs(60)),
        "{}",
        again.console()
    );
    let (_, changed) = record_death(&api, map_pod, "mapper", "m2m2", 135, "Error", "m3m3");
    wait_event(&api, "mapper-0", "WorkloadBusError", 2, changed);
    let events = api.events_about("mapper-0");
    assert_eq!(
        with_reason(&events, "WorkloadBusError").len(),
        1,
        "one series: {events:#?}"
    );

    let body = agent.wait_for_metrics("the deaths counted", |b| {
        total(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "mapper-0"), ("kind", "workload_bus_error")],
        ) == 2.0
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "shmfill-0"), ("kind", "shm_bus_error")]
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "idle-0")]
        ),
        None,
        "the healthy neighbour: {body}"
    );
    assert!(api.events_about("idle-0").is_empty());

    // `check` lists the same Pods and tells the deaths they record, without the scans' readings.
    let out = std::process::Command::new(common::shmlink_bin())
        .args([
            "check",
            "--json",
            "--no-gpu",
            "--kube",
            "on",
            "--node-name",
            NODE,
        ])
        .args(["--since", "5m", "--kmsg", "off", "--pod-log-root", "off"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let failures = report["failures"].as_array().unwrap();
    let mapper: Vec<_> = failures.iter().filter(|f| f["pod"] == "mapper-0").collect();
    assert_eq!(
        mapper.len(),
        1,
        "the Pod records its last death: {failures:#?}"
    );
    // check read the Pod's status alone, after the fact: not read at the moment, not named.
    assert_eq!(mapper[0]["kind"], "bus_error_unmeasured");
    assert_eq!(mapper[0]["source"], "pod_status");
    assert_eq!(mapper[0]["container_id"], "m2m2");
    assert!(
        mapper[0]["message"]
            .as_str()
            .unwrap()
            .contains("it was never measured"),
        "{:#}",
        mapper[0]
    );
    assert_eq!(out.status.code(), Some(1), "failures are findings");
}

/// A shell's word of its child's SIGBUS (`Bus error`, all busybox sh prints) names no cause:
/// told as /dev/shm's only for the container whose /dev/shm was full, and not at all for the
/// one whose mapped file was truncated. The Pods' status is left alone: the line alone tells it.
#[test]
fn a_shells_bus_error_is_told_only_where_dev_shm_was_full() {
    if !common::e2e_available() || !python_available() {
        return;
    }
    let api = FakeApi::start();
    let (fill_uid, fill_id) = (common::random_pod_uid(), common::random_container_id());
    let (map_uid, map_id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(
        NODE,
        "ml",
        "shfill-0",
        &fill_uid,
        &[("fill", &fill_id)],
    ));
    api.apply_pod(pod(NODE, "ml", "shmap-0", &map_uid, &[("mapper", &map_id)]));
    let logs = tempfile::tempdir().unwrap();
    let log_of = |uid: &str, pod: &str, container: &str| {
        let dir = logs.path().join(format!("ml_{pod}_{uid}/{container}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("0.log")
    };
    let (fill_log, map_log) = (
        log_of(&fill_uid, "shfill-0", "fill"),
        log_of(&map_uid, "shmap-0", "mapper"),
    );
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(
        &kubeconfig,
        NODE,
        &["--pod-log-root", logs.path().to_str().unwrap()],
    );
    agent.wait_ready();

    // The shell stays, as an entrypoint script's would after its command: the container (and
    // its /dev/shm reading) lives on.
    let shell = |script: &str| {
        vec![
            "/bin/sh".to_string(),
            "-c".into(),
            // The script quoted for the shell: a quote inside it closes and reopens the quoting.
            format!("{PYTHON} -c '{}'; sleep 20", script.replace('\'', r"'\''")),
        ]
    };
    let _mapper = with_python(
        &map_uid,
        &map_id,
        shell(TRUNCATED_MAP),
        Some(map_log.clone()),
    );
    let _fill = with_python(
        &fill_uid,
        &fill_id,
        shell(SHM_BLOCK),
        Some(fill_log.clone()),
    );
    for log in [&map_log, &fill_log] {
        let mut text = String::new();
        assert!(
            common::wait_until(Duration::from_secs(30), || {
                text = std::fs::read_to_string(log).unwrap_or_default();
                text.contains(" F Bus error")
            }),
            "the shell did not say it in {}: {text}",
            log.display()
        );
    }
    let written = Instant::now();
    let mut found: Vec<Value> = Vec::new();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            found = with_reason(&api.events_about("shfill-0"), "ShmBusError")
                .into_iter()
                .cloned()
                .collect();
            !found.is_empty()
        }),
        "no ShmBusError Event; the server holds: {:#?}",
        api.events()
    );
    let note = found[0]["note"].as_str().unwrap();
    println!(
        "{} ms after the line: {note}",
        written.elapsed().as_millis()
    );
    common::assert_contains_all(note, &[
        "container ml/shfill-0/fill died of a bus error (SIGBUS; its log said \"Bus error\")",
        "with /dev/shm full: its /dev/shm (the container runtime's default, 64.0 MiB) peaked at 6",
    ]);
    // The mapper's line was written first: by now it has been read and judged.
    let body = agent.wait_for_metrics("the fill's death counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "shfill-0"), ("kind", "shm_bus_error")],
        ) == Some(1.0)
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "shmap-0")]
        ),
        None,
        "a bus error with /dev/shm empty is not told from the line: {body}"
    );
    assert!(
        api.events_about("shmap-0").is_empty(),
        "{:#?}",
        api.events()
    );
}

#[test]
fn kubelets_oomkilled_and_the_kernels_report_of_one_container_are_one_failure() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    // One after the other: each agent would see the other's kills in the kernel log.
    oom_scenario(true);
    oom_scenario(false);
}

fn oom_scenario(kernel_log: bool) {
    println!("== kernel log {}", if kernel_log { "on" } else { "off" });
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    let loader_pod = pod(NODE, "ml", "loader-0", &uid, &[("loader", &id)]);
    api.apply_pod(loader_pod.clone());
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(
        &kubeconfig,
        NODE,
        &["--kmsg", if kernel_log { "/dev/kmsg" } else { "off" }],
    );
    agent.wait_ready();

    // The emptyDir fix gone wrong: a 1 GiB /dev/shm under a 128 MiB memory limit, filled 4 MiB
    // at a time; the kernel OOM-kills and the container's main process ends with it.
    let volume = HostTmpfs::new(1024 * MIB);
    let loader = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "i=0; while :; do i=$((i+1)); \
             dd if=/dev/zero of=/dev/shm/batch$i bs=1M count=4 2>/dev/null || exit 137; \
             sleep 0.1; done"
                .into(),
        ],
        shm: Shm::Bind(volume.path.clone()),
        memory_limit: Some((128 * MIB) as i64),
        ..ContainerSpec::default()
    });
    assert!(
        loader.wait_exited(Duration::from_secs(60)),
        "the loader was never killed: {}",
        loader.console()
    );
    // Kubelet notices an exit at its next relist (every second), then writes the status.
    std::thread::sleep(Duration::from_secs(1));
    let (_, changed) = record_death(&api, loader_pod, "loader", &id, 137, "OOMKilled", "l2l2");
    let e = wait_event(&api, "loader-0", "ShmOomKilled", 1, changed);
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains("and /dev/shm was what filled it: /dev/shm held "),
        "{note}"
    );
    assert!(note.contains("of the 128.0 MiB memory limit"), "{note}");
    let by_status = note.contains("(Told by the Pod's status, OOMKilled;");
    if kernel_log {
        assert!(!by_status, "the kernel's report tells it: {note}");
    } else {
        // Without the kernel log two accounts race, both right: the Pod's status, or the
        // memory cgroup's counter when a scan reads it in the moment between the kill of dd and
        // the shell's exit (the cgroup has a process then).
        let by_counter = note.contains("(Counted by the container's memory cgroup;");
        assert!(by_status || by_counter, "{note}");
    }

    // kubelet's OOMKilled is the kernel's kill told again: nothing more is published.
    std::thread::sleep(Duration::from_secs(1));
    let events = api.events_about("loader-0");
    let kills: Vec<_> = events
        .iter()
        .filter(|e| e["reason"].as_str().unwrap().ends_with("OomKilled"))
        .collect();
    assert_eq!(kills.len(), 1, "one failure: {events:#?}");
    assert_eq!(occurrences(kills[0]), 1, "told once: {:#}", kills[0]);
    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "loader-0"), ("kind", "shm_oom_killed")]
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "loader-0"), ("kind", "workload_oom_killed")]
        ),
        None,
        "{body}"
    );
}

/// A DataLoader worker killed for its own memory, as PyTorch's main process tells it: the
/// worker (a fork) takes anonymous memory until the kernel OOM-kills it; the main process
/// waits for it with `WNOWAIT` (its zombie stays, as PyTorch's does) and prints PyTorch's line
/// with the worker's PID in the container.
const WORKER_KILLED: &str = r#"
import os, sys, time
pid = os.fork()
if pid == 0:
    chunks = []
    while True:
        chunks.append(b"\1" * (8 << 20))
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
print(f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Killed. ",
      file=sys.stderr, flush=True)
time.sleep(60)
"#;

#[test]
fn pytorchs_word_of_a_workers_oom_kill_is_told_with_the_kill() {
    if !common::e2e_available() || !common::kmsg_readable() || !python_available() {
        return;
    }
    // The kernel's report (the word comes a moment after it), then the memory cgroup's counter
    // (read by a scan, before or after the word).
    worker_scenario(true);
    worker_scenario(false);
}

fn worker_scenario(kernel_log: bool) {
    println!("== kernel log {}", if kernel_log { "on" } else { "off" });
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(NODE, "ml", "loader-1", &uid, &[("loader", &id)]));
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join(format!("ml_loader-1_{uid}/loader"));
    std::fs::create_dir_all(&dir).unwrap();
    let root = logs.path().to_str().unwrap();
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(
        &kubeconfig,
        NODE,
        &[
            "--kmsg",
            if kernel_log { "/dev/kmsg" } else { "off" },
            "--pod-log-root",
            root,
        ],
    );
    agent.wait_ready();

    let log = dir.join("0.log");
    let _loader = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec![PYTHON.into(), "-c".into(), WORKER_KILLED.into()],
        memory_limit: Some((128 * MIB) as i64),
        extra_mounts: common::runc::host_libraries(),
        cri_log: Some(log.clone()),
        ..ContainerSpec::default()
    });
    let mut word = String::new();
    assert!(
        common::wait_until(Duration::from_secs(60), || {
            word = std::fs::read_to_string(&log).unwrap_or_default();
            word.contains("is killed by signal: Killed.")
        }),
        "the main process never told the worker's death: {word}"
    );
    let line = word
        .lines()
        .find_map(|l| {
            l.split_once(" stderr F ")
                .map(|(_, t)| t.trim_end().to_string())
        })
        .unwrap();
    let told = Instant::now();
    let e = wait_event(&api, "loader-1", "WorkloadOomKilled", 1, told);
    let note = e["note"].as_str().unwrap();
    let tied = note.ends_with(&format!("The workload told it too: {line}"));
    if kernel_log {
        // The kill is held one poll for the line written a moment after it.
        assert!(tied, "{note}");
    } else {
        // The scan that reads the counter may come before or after the poll that reads the
        // line: tied, or the line dropped as the same death. Never a second failure (below).
        assert!(tied || !note.contains("The workload told it too"), "{note}");
    }
    assert!(note.contains("the memory limit"), "{note}");

    // One failure: the line is no second one, and nothing more comes of it.
    std::thread::sleep(Duration::from_secs(1));
    let events = api.events_about("loader-1");
    assert_eq!(events.len(), 1, "{events:#?}");
    let body = agent.metrics();
    assert_eq!(
        total(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "loader-1")]
        ),
        1.0,
        "{body}"
    );

    if !kernel_log {
        return; // check has no memory cgroup counters to read back
    }
    // `check` reads both back and ties them by the worker's PID in the container (its zombie
    // is still there to ask).
    let report = common::binary::shmlink_json(
        &[
            "check",
            "--json",
            "--no-gpu",
            "--kube",
            "on",
            "--node-name",
            NODE,
            "--since",
            "2m",
            "--kmsg",
            "/dev/kmsg",
            "--pod-log-root",
            root,
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let failures: Vec<&Value> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["pod_uid"] == uid.as_str())
        .collect();
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert_eq!(failures[0]["kind"], "workload_oom_killed");
    assert_eq!(failures[0]["told_by_workload"], line.as_str());
    let worker = line
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse::<i64>().ok())
        .unwrap();
    assert_eq!(failures[0]["pid_in_container"], worker, "{:#}", failures[0]);
}

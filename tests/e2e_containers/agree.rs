//! `check` and `serve` tell the same failures, end to end: one failure pipeline. On real runc
//! containers in kubelet-style cgroups, with the in-process API server for the Pods, `serve`
//! follows while things happen: a Pod's CRI log says PyTorch's shm failure, the real kernel
//! OOM-kills two containers (once for /dev/shm pages, once for the workload's own memory),
//! kubelet's status records a SIGBUS death, a plain Docker container's json-file log says the
//! same shm failure and Docker's record of another says it died of SIGBUS. Then `check --since`
//! reads the same sources back. Both must tell the same failures: kind, container, message.
//! What each knows is the same: a container's line is written once a scan has measured it (a
//! `serve` that measured a container `check` no longer can may know more; that is knowledge,
//! not a second way of telling).

use crate::common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent::{sample, Agent};
use common::kube_api::{finished_now, pod, restarted, FakeApi};
use common::{Container, ContainerSpec, HostTmpfs};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";
const MIB: u64 = 1 << 20;
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";
/// One DataLoader death in PyTorch's two lines, 16 microseconds apart in one container's log:
/// the worker's, then the main process's.
const WORKER_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be \
                           caused by insufficient shared memory (shm).";
const MAIN_LINE: &str =
    "RuntimeError: DataLoader worker (pid 3527) is killed by signal: Bus error.";

/// A failure as a person reads it: its kind and its message (which names its container).
type Told = (String, String);

/// What `serve` logged as told: each failure's first telling is a `warn` line with its kind.
fn told_by_serve(log: &str) -> BTreeSet<Told> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| {
            let fields = &l["fields"];
            Some((
                fields["kind"].as_str()?.to_string(),
                fields["message"].as_str()?.to_string(),
            ))
        })
        .collect()
}

fn told_by_check(report: &Value) -> BTreeSet<Told> {
    report["failures"]
        .as_array()
        .expect("failures[]")
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Only the failures of this test's containers: the kernel log holds other tests' deaths.
fn ours(told: &BTreeSet<Told>, names: &[&str]) -> BTreeSet<Told> {
    told.iter()
        .filter(|(_, m)| names.iter().any(|n| m.contains(n)))
        .cloned()
        .collect()
}

/// Now and 16 microseconds later, as RFC 3339 with nanoseconds.
fn two_moments() -> (String, String) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let later = now + k8s_openapi::jiff::SignedDuration::from_micros(16);
    let f = |t: k8s_openapi::jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%S.%fZ").to_string();
    (f(now), f(later))
}

/// Docker's record of a container that stopped just now with `exit_code`.
fn docker_record(root: &std::path::Path, id: &str, name: &str, exit_code: i32) {
    let dir = root.join("containers").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let record = json!({
        "ID": id, "Name": format!("/{name}"),
        "State": {"Running": false, "OOMKilled": false, "ExitCode": exit_code,
                  "StartedAt": now, "FinishedAt": now},
        "Config": {"Image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "Cmd": ["python"]}
    });
    std::fs::write(dir.join("config.v2.json"), record.to_string()).unwrap();
}

#[test]
fn check_and_serve_tell_the_same_failures_of_the_same_containers_logs_and_kernel_records() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let api = FakeApi::start();
    let ids = |n| -> Vec<(String, String)> {
        (0..n)
            .map(|_| (common::random_pod_uid(), common::random_container_id()))
            .collect()
    };
    let pods = ids(5);
    let names = [
        "agree-shm-0",
        "agree-loader-0",
        "agree-trainer-0",
        "agree-bus-0",
        "agree-dataloader-0",
    ];
    for ((uid, id), name) in pods.iter().zip(names) {
        api.apply_pod(pod(NODE, "ml", name, uid, &[("main", id)]));
    }
    let logs = tempfile::tempdir().unwrap();
    let docker = tempfile::tempdir().unwrap();
    let (log_root, docker_root) = (
        logs.path().to_str().unwrap().to_string(),
        docker.path().to_str().unwrap().to_string(),
    );
    let sources = [
        "--kube",
        "on",
        "--node-name",
        NODE,
        "--no-gpu",
        "--pod-log-root",
        &log_root,
        "--docker-root",
        &docker_root,
        "--kmsg",
        "/dev/kmsg",
    ];
    // A plain Docker container, running before the agent starts (so that both commands know
    // its /dev/shm as a scan of a running container measures it).
    let asr = common::random_container_id();
    let cdir = docker.path().join("containers").join(&asr);
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(
        cdir.join("config.v2.json"),
        json!({"ID": asr, "Name": "/agree-asr", "State": {"Running": true},
               "Config": {"Image": "pytorch/pytorch:2.5.1", "Cmd": ["python"]}})
        .to_string(),
    )
    .unwrap();
    let _asr = Container::start(ContainerSpec {
        id: Some(asr.clone()),
        ..ContainerSpec::default()
    });
    let kubeconfig = api.kubeconfig_path();
    let mut serve_args = sources.to_vec();
    serve_args.extend(["--log-format", "json"]);
    let agent = Agent::start(&serve_args, &[("KUBECONFIG", kubeconfig.as_os_str())]);
    agent.wait_ready();

    // A Pod's job fills its /dev/shm, waits for scans to see it, and says PyTorch's line.
    let (uid, id) = &pods[0];
    let dir = logs.path().join(format!("ml_{}_{uid}/main", names[0]));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "dd if=/dev/zero of=/dev/shm/batch bs=1M count=60 2>/dev/null; sleep 2; \
         echo '{TORCH_LINE}'; sleep 3600"
    );
    let _shm = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec!["sh".into(), "-c".into(), script],
        cri_log: Some(dir.join("0.log")),
        ..ContainerSpec::default()
    });
    // The kernel OOM-kills /dev/shm pages past a 64 MiB limit, and a workload's own memory.
    let volume = HostTmpfs::new(1024 * MIB);
    let (uid, id) = &pods[1];
    let _loader = common::oom::shm_past_the_limit(uid, id, &volume);
    let (uid, id) = &pods[2];
    let _trainer = common::oom::own_memory_past_the_limit(uid, id);
    // kubelet records a container that died of SIGBUS (exit 135), restarted.
    let (uid, id) = &pods[3];
    let terminated = json!({"exitCode": 135, "reason": "Error",
        "containerID": format!("containerd://{id}"), "finishedAt": finished_now()});
    let bus = pod(NODE, "ml", names[3], uid, &[("main", id)]);
    api.apply_pod(restarted(
        bus,
        "main",
        terminated,
        &common::random_container_id(),
    ));
    agent.wait_for_metrics("the Docker container scanned", |b| {
        let size = sample(
            b,
            "shmlink_shm_size_bytes",
            &[("container_id", asr.as_str())],
        );
        size == Some((64 * MIB) as f64)
    });
    // It logs the shm failure; Docker records another container's SIGBUS.
    let time = k8s_openapi::jiff::Timestamp::now().to_string();
    std::fs::write(
        cdir.join(format!("{asr}-json.log")),
        json!({"log": format!("{TORCH_LINE}\n"), "stream": "stderr", "time": time}).to_string()
            + "\n",
    )
    .unwrap();
    docker_record(
        docker.path(),
        &common::random_container_id(),
        "agree-sigbus",
        135,
    );

    // One DataLoader death in two lines: in a Pod's CRI log and in a Docker container's log.
    let (uid, _) = &pods[4];
    let dir = logs.path().join(format!("ml_{}_{uid}/main", names[4]));
    std::fs::create_dir_all(&dir).unwrap();
    let (first, second) = two_moments();
    std::fs::write(
        dir.join("0.log"),
        format!("{first} stderr F {WORKER_LINE}\n{second} stderr F {MAIN_LINE}\n"),
    )
    .unwrap();
    let loader = common::random_container_id();
    docker_record(docker.path(), &loader, "agree-docker-loader", 1);
    let line = |at: &str, text: &str| {
        json!({"log": format!("{text}\n"), "stream": "stderr", "time": at}).to_string() + "\n"
    };
    std::fs::write(
        docker
            .path()
            .join(format!("containers/{loader}/{loader}-json.log")),
        line(&first, WORKER_LINE) + &line(&second, MAIN_LINE),
    )
    .unwrap();

    let mine = [
        "ml/agree-dataloader-0/main",
        "agree-docker-loader",
        "ml/agree-shm-0/main",
        "ml/agree-loader-0/main",
        "ml/agree-trainer-0/main",
        "ml/agree-bus-0/main",
        "agree-asr",
        "agree-sigbus",
    ];
    let kinds = [
        "shm_allocation_failed",
        "shm_allocation_failed",
        "shm_allocation_failed",
        "shm_oom_killed",
        "workload_oom_killed",
        "bus_error_unmeasured",
        "shm_allocation_failed",
        "bus_error_unmeasured",
    ];
    let mut by_serve = BTreeSet::new();
    let all_told = common::wait_until(Duration::from_secs(40), || {
        by_serve = ours(&told_by_serve(&agent.log_text()), &mine);
        mine.iter()
            .zip(kinds)
            .all(|(name, kind)| by_serve.iter().any(|(k, m)| k == kind && m.contains(name)))
    });
    assert!(
        all_told,
        "serve told only {by_serve:#?}\n{}",
        agent.log_text()
    );
    // Counted once each, the Docker container by its name.
    let body = agent.metrics();
    for labels in [
        [
            ("pod", "agree-dataloader-0"),
            ("kind", "shm_allocation_failed"),
        ],
        [
            ("container", "agree-docker-loader"),
            ("kind", "shm_allocation_failed"),
        ],
    ] {
        let n = sample(&body, "shmlink_workload_failures_total", &labels);
        assert_eq!(n, Some(1.0), "{labels:?}: {body}");
    }

    let out = Command::new(common::shmlink_bin())
        .args(["check", "--json", "--since", "5m"])
        .args(sources)
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_check = ours(&told_by_check(&report), &mine);
    for (kind, message) in &by_serve {
        println!("{kind}: {message}");
    }
    assert_eq!(by_check, by_serve, "check and serve differ");
    assert_eq!(
        by_serve.len(),
        mine.len(),
        "one failure per death: {by_serve:#?}"
    );
}

//! Which GPUs a crashed job used, end to end: the seed incident. GPU 7's links are down (the
//! fake NVML's 8-GPU NVSwitch board); a real runc container's process, listed by NVML on GPUs 5
//! and 7, crashes in a test-built `libnccl.so.2` and the real kernel logs it. The crash is told
//! with the GPUs the process used and the pair between them: in a Pod that holds all eight GPUs
//! (the kubelet's answer would name all eight), and on plain runc with Kubernetes off (no
//! kubelet at all), where `serve` logs it and the findings as they begin and end.
//! Run with --nocapture to see what was told.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::{on_gpus, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::pod_resources::{gpu_pod, FakePodResources};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

/// The 8-GPU NVSwitch board with GPU 7's links all inactive, and `pid` on GPUs 5 and 7.
fn board(pid: Option<i32>) -> Value {
    let mut config = fake_nvml::preset("nvswitch-8");
    for link in config["gpus"][7]["links"].as_array_mut().unwrap() {
        link["active"] = json!(false);
    }
    if let Some(pid) = pid {
        for g in [5, 7] {
            config["gpus"][g]["processes"] = json!([{"pid": pid, "used_memory": 1u64 << 30}]);
        }
    }
    config
}

/// Waits until a scan has seen the container on GPUs 5 and 7, then lets it crash.
fn crash_once_seen(agent: &Agent, id: &str, nccl: &Path) -> Instant {
    agent.wait_for_metrics("the job on GPUs 5 and 7", |b| on_gpus(b, id, &["5", "7"]));
    std::fs::write(nccl.join("go"), "").unwrap();
    Instant::now()
}

#[test]
fn a_crash_on_gpus_5_and_7_names_them_and_their_down_pair_in_a_pod_holding_all_eight() {
    let nccl = tempfile::tempdir().unwrap();
    if !common::crash::nccl_crash_possible(nccl.path()) {
        return;
    }
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(NODE, "ml", "allreduce-0", &uid, &[("worker", &id)]));
    let fake = FakeNvml::new(&board(None));
    let uuids: Vec<String> = (0..8)
        .map(|g| board(None)["gpus"][g]["uuid"].as_str().unwrap().to_string())
        .collect();
    let kubelet = FakePodResources::start();
    kubelet.set(vec![gpu_pod(
        "ml",
        "allreduce-0",
        "worker",
        &uuids.iter().map(String::as_str).collect::<Vec<_>>(),
    )]);
    let (socket, kubeconfig) = (kubelet.socket(), api.kubeconfig_path());
    let agent = Agent::start_gpu_kube(
        &kubeconfig,
        &fake,
        NODE,
        &[
            "--pod-resources-socket",
            socket.to_str().unwrap(),
            "--kmsg",
            "/dev/kmsg",
        ],
    );
    let worker = common::crash::crashing_when_told(Some(&uid), &id, nccl.path());
    fake.write(&board(Some(worker.pid)));
    let crashed = crash_once_seen(&agent, &id, nccl.path());

    let found = api.wait_events(
        Some("allreduce-0"),
        "GpuJobCrashed",
        Duration::from_secs(20),
    );
    let note = found[0]["note"].as_str().unwrap();
    println!(
        "{} ms after the crash: {note}",
        crashed.elapsed().as_millis()
    );
    common::assert_contains_all(
        note,
        &[
            "crashed in libnccl.so.2",
            "of ml/allreduce-0/worker",
            "while using GPUs 5 and 7; pair 5-7 has been down since ",
            "the hardware, not your code",
            "reset GPU 7 (`nvidia-smi -r -i 7`)",
        ],
    );
    // Not the eight the Pod holds, and no healthy GPU named for a reset.
    assert!(!note.contains("GPUs 0, 1"), "{note}");
    assert!(!note.contains("-r -i 5"), "{note}");
    // The Node condition blames the same GPU, from the same judge.
    let node = api.node(NODE);
    let link = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "GpuLinkDegraded")
        .cloned()
        .unwrap_or(Value::Null);
    let message = link["message"].as_str().unwrap_or("");
    assert!(
        message.contains("GPU 7 fails with every other GPU") && message.contains("-r -i 7"),
        "{link:#}"
    );
    assert!(!message.contains("-r -i 0"), "{message}");
}

#[test]
fn on_plain_runc_without_kubernetes_serve_logs_the_crash_with_its_gpus_and_each_finding() {
    let nccl = tempfile::tempdir().unwrap();
    if !common::crash::nccl_crash_possible(nccl.path()) {
        return;
    }
    let fake = FakeNvml::new(&board(None));
    let agent = Agent::start_gpu(&fake, &["--kmsg", "/dev/kmsg"]);
    let id = common::random_container_id();
    let worker = common::crash::crashing_when_told(None, &id, nccl.path());
    fake.write(&board(Some(worker.pid)));
    crash_once_seen(&agent, &id, nccl.path());
    // The kernel log is the machine's: the other test's crash may be in it too.
    let ours = |l: &&str| l.contains("crashed in libnccl.so.2") && l.contains(&id[..12]);
    let mut log = String::new();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            log = agent.log_text();
            log.lines().any(|l| ours(&l))
        }),
        "the crash was not logged: {log}"
    );
    let crash = log.lines().find(ours).unwrap();
    println!("{crash}");
    assert!(
        crash.contains("while using GPUs 5 and 7; pair 5-7 has been down since ")
            && crash.contains(&id[..12]),
        "{crash}"
    );
    let began = log
        .lines()
        .find(|l| l.contains("finding began: GPU 7 (") && l.contains("fails with every other GPU"))
        .unwrap_or_else(|| panic!("GPU 7's finding was not logged: {log}"));
    assert!(began.contains("WARN"), "{began}");
    // GPU 7 repaired: its finding ends, said once.
    fake.write(&fake_nvml::preset("nvswitch-8"));
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            log = agent.log_text();
            log.contains("finding ended: GPU 7 (")
        }),
        "the end was not logged: {log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("finding began: GPU 7 ("))
            .count(),
        1,
        "{log}"
    );
}

//! `serve` as a cluster citizen, end to end: real runc containers whose cgroup paths carry the
//! fake API server's Pod UIDs and container IDs, the fake NVML library, and Events arriving at
//! the fake API server. Prints every Event it saw (run with --nocapture to read them).

use crate::common;

use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::pod_resources::{gpu_pod, FakePodResources};
use common::{Container, ContainerSpec};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

fn events_with(api: &FakeApi, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

fn wait_for_event(api: &FakeApi, reason: &str) -> Vec<Value> {
    api.wait_events(None, reason, Duration::from_secs(20))
}

#[test]
fn pods_get_names_and_events_as_shm_fills_and_a_gpu_degrades() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let uid = common::random_pod_uid();
    let trainer_id = common::random_container_id();
    let mut trainer_pod = pod(NODE, "ml", "trainer-0", &uid, &[("trainer", &trainer_id)]);
    trainer_pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    api.apply_pod(trainer_pod);

    let trainer = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(trainer_id.clone()),
        ..ContainerSpec::default()
    });
    // The pod's sandbox: same pod cgroup, an ID no container status names.
    let sandbox = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        ..ContainerSpec::default()
    });

    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);

    // The kubelet says trainer-0 holds GPU 7, and another Pod GPU 3.
    let uuid = |i: usize| nvml["gpus"][i]["uuid"].as_str().unwrap().to_string();
    let kubelet = FakePodResources::start();
    kubelet.set(vec![
        gpu_pod("ml", "trainer-0", "trainer", &[&uuid(7)]),
        gpu_pod("ml", "eval-0", "eval", &[&uuid(3)]),
    ]);
    api.apply_pod(pod(NODE, "ml", "eval-0", &common::random_pod_uid(), &[]));

    let kubeconfig = api.kubeconfig_path();
    let socket = kubelet.socket();
    let agent = Agent::start_gpu_kube(
        &kubeconfig,
        &fake,
        NODE,
        &["--pod-resources-socket", socket.to_str().unwrap()],
    );

    let named = [
        ("namespace", "ml"),
        ("pod", "trainer-0"),
        ("container", "trainer"),
        ("container_id", trainer_id.as_str()),
    ];
    let body = agent.wait_for_metrics("the trainer's series with its names", |b| {
        sample(b, "shmlink_shm_size_bytes", &named) == Some(64.0 * 1048576.0)
    });
    assert!(
        !body.contains(&sandbox.id),
        "the pod sandbox is not a workload container"
    );

    // A GPU workload on the runtime's 64 MiB default.
    let default = wait_for_event(&api, "ShmRuntimeDefault");
    assert_eq!(default[0]["regarding"]["name"], "trainer-0");
    assert!(default[0]["note"]
        .as_str()
        .unwrap()
        .contains("mountPath: /dev/shm"));

    // 55 of 64 MiB: past the 0.80 warning ratio, below critical.
    trainer.sh("dd if=/dev/zero of=/dev/shm/a bs=1M count=55 2>/dev/null");
    let nearly = wait_for_event(&api, "ShmNearlyFull");
    assert_eq!(nearly[0]["regarding"]["kind"], "Pod");
    assert_eq!(nearly[0]["regarding"]["name"], "trainer-0");
    assert_eq!(nearly[0]["regarding"]["uid"], uid.as_str());
    assert_eq!(nearly[0]["reportingInstance"], NODE);
    // Scans go on (every 200 ms): still one Event, not one per scan.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events_with(&api, "ShmNearlyFull").len(), 1);

    // 62 of 64 MiB: critical, a new Event of its own.
    trainer.sh("dd if=/dev/zero of=/dev/shm/b bs=1M count=7 2>/dev/null");
    wait_for_event(&api, "ShmExhausted");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(events_with(&api, "ShmExhausted").len(), 1);
    assert_eq!(events_with(&api, "ShmNearlyFull").len(), 1);

    // GPU 7 loses 12 of its 18 NVSwitch links.
    for link in nvml["gpus"][7]["links"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .take(12)
    {
        link["active"] = json!(false);
    }
    fake.write(&nvml);
    let mut degraded = wait_for_event(&api, "GpuLinkDegraded");
    // The Node's and the Pod's Events go out one after the other.
    common::wait_until(Duration::from_secs(10), || {
        degraded = events_with(&api, "GpuLinkDegraded");
        degraded.len() >= 2
    });
    let node_event = degraded
        .iter()
        .find(|e| e["regarding"]["kind"] == "Node")
        .expect("a GpuLinkDegraded Event on the Node");
    assert_eq!(node_event["regarding"]["name"], NODE);
    assert!(node_event["note"].as_str().unwrap().contains("GPU 7"));
    // ... and on the Pod the kubelet says holds GPU 7, not on the one holding GPU 3.
    let pod_events: Vec<_> = degraded
        .iter()
        .filter(|e| e["regarding"]["kind"] == "Pod")
        .collect();
    assert_eq!(pod_events.len(), 1, "{pod_events:#?}");
    assert_eq!(pod_events[0]["regarding"]["name"], "trainer-0");
    assert_eq!(pod_events[0]["regarding"]["uid"], uid.as_str());
    assert_eq!(pod_events[0]["metadata"]["namespace"], "ml");
    assert!(pod_events[0]["note"].as_str().unwrap().contains("GPU 7"));
    assert!(kubelet.calls() >= 1);

    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_kube_events_total",
            &[("reason", "ShmExhausted")]
        ),
        Some(1.0)
    );

    let mut seen = api.events();
    seen.sort_by_key(|e| e["eventTime"].as_str().unwrap_or("").to_string());
    for e in &seen {
        eprintln!(
            "EVENT {} {} {}/{} {}: {}",
            e["type"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            e["regarding"]["kind"].as_str().unwrap_or(""),
            e["regarding"]["name"].as_str().unwrap_or(""),
            e["metadata"]["namespace"].as_str().unwrap_or(""),
            e["note"].as_str().unwrap_or("")
        );
    }
    drop(sandbox);
    assert!(agent.terminate().success());
}

#[test]
fn an_api_server_outage_neither_stops_metrics_nor_loses_or_duplicates_events() {
    if !common::e2e_available() {
        return;
    }
    let mut api = FakeApi::start();
    let uid = common::random_pod_uid();
    let id = common::random_container_id();
    api.apply_pod(pod(NODE, "ml", "loader-0", &uid, &[("loader", &id)]));
    let c = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        ..ContainerSpec::default()
    });
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start(
        &["--kube", "on", "--node-name", NODE, "--no-gpu"],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    agent.wait_ready();
    agent.wait_for_metrics("the loader named", |b| {
        sample(b, "shmlink_shm_used_bytes", &[("pod", "loader-0")]).is_some()
    });

    api.stop();
    c.sh("dd if=/dev/zero of=/dev/shm/a bs=1M count=62 2>/dev/null");
    // Metrics keep flowing and keep changing while the API server is away.
    let t0 = sample(&agent.metrics(), "shmlink_last_scan_timestamp_seconds", &[]).unwrap();
    agent.wait_for_metrics("fresh scans during the outage", |b| {
        sample(b, "shmlink_last_scan_timestamp_seconds", &[]).is_some_and(|t| t > t0 + 1.0)
            && sample(b, "shmlink_shm_used_bytes", &[("pod", "loader-0")])
                .is_some_and(|u| u >= 62.0 * 1048576.0)
    });
    assert!(api.events().is_empty());

    api.resume();
    let exhausted = wait_for_event(&api, "ShmExhausted");
    assert_eq!(exhausted[0]["regarding"]["name"], "loader-0");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events_with(&api, "ShmExhausted").len(), 1, "delivered once");
    assert_eq!(
        api.event_creates()
            .iter()
            .filter(|r| r.body["reason"] == "ShmExhausted")
            .count(),
        1,
        "created once"
    );
    assert!(agent.terminate().success());
}

//! kubelet's eviction of a Pod whose /dev/shm volume outgrew its `sizeLimit`: a real runc
//! container in kubelet's cgroup layout fills its /dev/shm, the in-process API server's Pod
//! then carries the status kubelet's eviction manager writes (Failed, `Evicted`, `Usage of
//! EmptyDir volume "dshm" exceeds the limit "48Mi". `, the containers killed with exit 137),
//! and `serve` tells one `ShmEvicted` Event with /dev/shm as it last read it; `check` the same
//! failure. An eviction for a volume mounted elsewhere stays quiet.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::Agent;
use common::kube_api::{finished_now, pod, FakeApi};
use common::{Container, ContainerSpec};
use serde_json::{json, Value};

const NODE: &str = "node-evicted";
const MIB: u64 = 1 << 20;

/// The Pod as the API server holds it, with the memory emptyDir `dshm` mounted at `mount` in
/// its container.
fn with_dshm(mut pod: Value, mount: &str) -> Value {
    pod["spec"]["volumes"] =
        json!([{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "48Mi"}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dshm", "mountPath": mount}]);
    pod
}

/// What kubelet's eviction manager leaves: the Pod Failed and `Evicted` with its message, each
/// container killed (exit 137, `Error`), Ready false.
fn evicted(mut pod: Value) -> Value {
    let now = finished_now();
    let status = &mut pod["status"];
    status["phase"] = json!("Failed");
    status["reason"] = json!("Evicted");
    status["message"] = json!("Usage of EmptyDir volume \"dshm\" exceeds the limit \"48Mi\". ");
    status["conditions"] = json!([{"type": "Ready", "status": "False", "lastTransitionTime": now}]);
    for cs in status["containerStatuses"].as_array_mut().unwrap() {
        cs["ready"] = json!(false);
        cs["state"] = json!({"terminated": {"exitCode": 137, "reason": "Error",
            "containerID": cs["containerID"].clone(), "finishedAt": now}});
    }
    pod
}

#[test]
fn kubelets_eviction_for_the_dev_shm_volume_is_one_shm_evicted_failure() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    let (other_uid, other_id) = (common::random_pod_uid(), common::random_container_id());
    let loader = with_dshm(
        pod(NODE, "ml", "evict-loader-0", &uid, &[("loader", &id)]),
        "/dev/shm",
    );
    let scratch = with_dshm(
        pod(
            NODE,
            "ml",
            "evict-scratch-0",
            &other_uid,
            &[("main", &other_id)],
        ),
        "/scratch",
    );
    api.apply_pod(loader.clone());
    api.apply_pod(scratch.clone());
    let agent = Agent::start_kube(&api.kubeconfig_path(), NODE, &[]);
    agent.wait_ready();

    // The loader fills 40 MiB of its /dev/shm (a real tmpfs in its own mount namespace).
    let container = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        memory_limit: Some((512 * MIB) as i64),
        ..ContainerSpec::default()
    });
    let out = container.exec(&[
        "dd",
        "if=/dev/zero",
        "of=/dev/shm/batch",
        "bs=1M",
        "count=40",
    ]);
    assert!(out.status.success(), "{out:?}");
    // A scan has read it: waited for, not slept on (a loaded machine's scans run late).
    agent.wait_for_metrics("the 40 MiB read", |b| {
        common::agent::sample(
            b,
            "shmlink_shm_used_bytes",
            &[("container_id", id.as_str())],
        ) == Some((40 * MIB) as f64)
    });

    api.apply_pod(evicted(scratch));
    let changed = Instant::now();
    api.apply_pod(evicted(loader));
    let mut event = None;
    let ok = common::wait_until(Duration::from_secs(20), || {
        event = api
            .events_about("evict-loader-0")
            .into_iter()
            .find(|e| e["reason"] == "ShmEvicted");
        event.is_some()
    });
    assert!(
        ok,
        "no ShmEvicted Event; the server holds: {:#?}\n{}",
        api.events(),
        agent.log_text()
    );
    let e = event.unwrap();
    let note = e["note"].as_str().unwrap();
    println!(
        "{} ms after the status: ShmEvicted: {note}",
        changed.elapsed().as_millis()
    );
    assert_eq!(e["regarding"]["uid"], uid.as_str());
    common::assert_contains_all(
        note,
        &[
            "kubelet evicted the Pod of container ml/evict-loader-0/loader",
            "its /dev/shm volume \"dshm\" held more than the volume's sizeLimit 48Mi",
            "(/dev/shm at the last scan: 40.0 MiB used)",
            "Fix: raise sizeLimit of \"dshm\" to 96Mi",
        ],
    );
    // One death, one failure: the containers' exit 137 says nothing more, and the Pod that
    // evicted a scratch volume is not ours.
    std::thread::sleep(Duration::from_secs(1));
    let ours: Vec<Value> = api
        .events()
        .into_iter()
        .filter(|e| {
            e["regarding"]["name"] == "evict-loader-0"
                || e["regarding"]["name"] == "evict-scratch-0"
        })
        .collect();
    assert_eq!(ours.len(), 1, "{ours:#?}");
    let body = agent.metrics();
    assert_eq!(
        common::agent::sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "evict-loader-0"), ("kind", "shm_evicted")]
        ),
        Some(1.0),
        "{body}"
    );

    // check tells the same failure from the Pod's status.
    let kubeconfig = api.kubeconfig_path();
    let report = common::binary::shmlink_json(
        &[
            "check",
            "--json",
            "--since",
            "5m",
            "--kube",
            "on",
            "--node-name",
            NODE,
            "--no-gpu",
            "--pod-log-root",
            "off",
            "--docker-root",
            "off",
            "--kmsg",
            "off",
            "--state-dir",
            "none",
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let failures: Vec<&Value> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["pod"] == "evict-loader-0" || f["pod"] == "evict-scratch-0")
        .collect();
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert_eq!(failures[0]["kind"], "shm_evicted");
    assert_eq!(failures[0]["source"], "pod_status");
    assert_eq!(failures[0]["container"], "loader");
    assert!(failures[0]["evidence"]
        .as_str()
        .unwrap()
        .contains("Usage of EmptyDir volume \"dshm\" exceeds the limit \"48Mi\""));
    drop(container);
}

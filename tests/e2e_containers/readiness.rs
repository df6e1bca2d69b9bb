//! `/readyz` and the first export wait for this node's Pod cache, boundedly: series are born
//! with their pod names rather than renamed when the cache syncs (which would reset every
//! alert's `for:`), and an API server that never answers delays readiness by `--pod-cache-wait`
//! only, said in the log and in `shmlink_kube_pod_cache_synced 0`. Against the in-process API
//! server, through the real kube client.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::{get, sample, Agent};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec};

const NODE: &str = "gpu-node-7";
const NOT_SYNCED: &str = "the pod cache has not synced";

fn readyz(agent: &Agent) -> Option<u16> {
    get(agent.addr, "/readyz").map(|(status, _)| status)
}

/// The API server is away when the agent starts and answers 1.5 s later: not ready meanwhile,
/// and the first scan that is exported names the container.
/// `serve` with `--kube auto` against `kubeconfig`, no GPUs, waiting up to `wait` for the Pod
/// cache; not waited for.
fn serve_auto(kubeconfig: &std::path::Path, wait: &str) -> Agent {
    Agent::start(
        &[
            "--kube",
            "auto",
            "--node-name",
            NODE,
            "--no-gpu",
            "--pod-cache-wait",
            wait,
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    )
}

#[test]
fn a_slow_api_server_delays_readiness_and_series_are_born_named() {
    if !common::e2e_available() {
        return;
    }
    let mut api = FakeApi::start();
    let uid = common::random_pod_uid();
    let id = common::random_container_id();
    api.apply_pod(pod(NODE, "ml", "trainer-0", &uid, &[("trainer", &id)]));
    let _c = Container::start(ContainerSpec {
        pod_uid: Some(uid),
        id: Some(id.clone()),
        ..ContainerSpec::default()
    });
    api.stop();

    let kubeconfig = api.kubeconfig_path();
    let agent = serve_auto(&kubeconfig, "20s");
    std::thread::sleep(Duration::from_millis(1500));
    // Scans take milliseconds: without the wait it would have been ready long ago.
    assert_eq!(readyz(&agent), Some(503), "log:\n{}", agent.log_text());
    let early = agent.metrics();
    assert!(
        !early.contains("shmlink_shm_used_bytes"),
        "shm series exported before the pod cache synced:\n{early}"
    );

    api.resume();
    agent.wait_ready();
    let body = agent.metrics();
    assert_eq!(
        sample(&body, "shmlink_kube_pod_cache_synced", &[]),
        Some(1.0),
        "{body}"
    );
    let named = sample(
        &body,
        "shmlink_shm_used_bytes",
        &[
            ("container_id", &id),
            ("namespace", "ml"),
            ("pod", "trainer-0"),
            ("container", "trainer"),
        ],
    );
    assert!(
        named.is_some(),
        "the first export lacks the named series:\n{body}"
    );
    let unnamed = sample(
        &body,
        "shmlink_shm_used_bytes",
        &[("container_id", &id), ("pod", "")],
    );
    assert_eq!(unnamed, None, "{body}");
    assert!(
        !agent.log_text().contains(NOT_SYNCED),
        "{}",
        agent.log_text()
    );
}

/// No API server at all: ready after `--pod-cache-wait`, not before and not much later, with a
/// log line and the metric at 0; names come once the API server does.
#[test]
fn an_absent_api_server_delays_readiness_by_the_bound_only() {
    let mut api = FakeApi::start();
    api.stop();
    let kubeconfig = api.kubeconfig_path();
    let started = Instant::now();
    let agent = serve_auto(&kubeconfig, "3s");
    assert!(common::wait_until(Duration::from_secs(10), || readyz(
        &agent
    )
    .is_some()));
    assert_eq!(readyz(&agent), Some(503));
    agent.wait_ready();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(10),
        "ready after {waited:?}"
    );
    let body = agent.metrics();
    assert_eq!(
        sample(&body, "shmlink_kube_pod_cache_synced", &[]),
        Some(0.0),
        "{body}"
    );
    let log = agent.log_text();
    assert_eq!(log.matches(NOT_SYNCED).count(), 1, "{log}");

    api.resume();
    agent.wait_for_metrics("the pod cache synced once the API server is back", |m| {
        sample(m, "shmlink_kube_pod_cache_synced", &[]) == Some(1.0)
    });
}

/// Without Kubernetes nothing is waited for and the metric is absent.
#[test]
fn without_kubernetes_there_is_no_wait_and_no_metric() {
    let started = Instant::now();
    let agent = Agent::start(&["--no-gpu"], &[]);
    agent.wait_ready();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!agent.metrics().contains("shmlink_kube_pod_cache_synced"));
}

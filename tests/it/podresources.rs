//! The kubelet pod-resources client against a fake kubelet gRPC server on a unix socket.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::pod_resources::{gpu_pod, FakePodResources};
use common::wait_until;
use shmlink::kube::podresources::{gpu_holders, list, PodResourcesError, PodResourcesWatcher};
use shmlink::metrics::Metrics;

const TIMEOUT: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn holder(ns: &str, name: &str) -> Vec<(String, String)> {
    vec![(ns.to_string(), name.to_string())]
}

#[test]
fn list_answers_which_pod_holds_which_gpu() {
    let kubelet = FakePodResources::start();
    kubelet.set(vec![
        gpu_pod("ml", "trainer-0", "train", &["GPU-6", "GPU-7"]),
        gpu_pod("ml", "eval-0", "eval", &["GPU-0"]),
    ]);
    let answer = runtime()
        .block_on(list(&kubelet.socket(), TIMEOUT))
        .expect("List answers");
    assert_eq!(answer.pod_resources.len(), 2);
    let held = gpu_holders(&answer);
    assert_eq!(held["GPU-7"], holder("ml", "trainer-0"));
    assert_eq!(held["GPU-6"], holder("ml", "trainer-0"));
    assert_eq!(held["GPU-0"], holder("ml", "eval-0"));
    assert_eq!(kubelet.calls(), 1);
}

#[test]
fn an_absent_socket_is_no_attribution_and_a_dead_one_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let absent = dir.path().join("kubelet.sock");
    assert!(matches!(
        rt.block_on(list(&absent, TIMEOUT)),
        Err(PodResourcesError::NoSocket(_))
    ));
    // A socket file left behind by a kubelet that is gone: refused at once, not a hang.
    drop(std::os::unix::net::UnixListener::bind(&absent).unwrap());
    let started = std::time::Instant::now();
    let err = rt.block_on(list(&absent, TIMEOUT)).unwrap_err();
    assert!(matches!(err, PodResourcesError::Connect { .. }), "{err}");
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
}

#[test]
fn a_failing_kubelet_is_an_error_carrying_its_status() {
    let kubelet = FakePodResources::start();
    kubelet.fail(tonic::Code::Unavailable);
    let err = runtime()
        .block_on(list(&kubelet.socket(), TIMEOUT))
        .unwrap_err();
    match err {
        PodResourcesError::List { status, .. } => {
            assert_eq!(status.code(), tonic::Code::Unavailable)
        }
        other => panic!("expected a List error, got {other}"),
    }
}

#[test]
fn the_watcher_follows_the_kubelet_keeps_the_last_answer_on_errors_and_counts_them() {
    let kubelet = FakePodResources::start();
    kubelet.set(vec![gpu_pod("ml", "trainer-0", "train", &["GPU-7"])]);
    let rt = runtime();
    let metrics = Arc::new(Metrics::new(Arc::default()));
    let watcher = PodResourcesWatcher::spawn(
        kubelet.socket(),
        Duration::from_millis(100),
        metrics.clone(),
        rt.handle(),
    );
    assert!(wait_until(TIMEOUT, || watcher
        .holders()
        .get("GPU-7")
        .is_some_and(|h| *h == holder("ml", "trainer-0"))));

    // The Pod moved on; another took the GPU.
    kubelet.set(vec![gpu_pod("ml", "trainer-1", "train", &["GPU-7"])]);
    assert!(wait_until(TIMEOUT, || watcher.holders()["GPU-7"]
        == holder("ml", "trainer-1")));

    // The kubelet fails: errors are counted, the last answer stays.
    kubelet.fail(tonic::Code::Internal);
    let errors = || {
        let text = metrics.encode().unwrap();
        common::promtext::value(
            &text,
            "shmlink_scan_errors_total",
            &[("collector", "pod_resources")],
        )
        .unwrap_or(0.0)
    };
    assert!(wait_until(TIMEOUT, || errors() >= 2.0), "{}", errors());
    assert_eq!(watcher.holders()["GPU-7"], holder("ml", "trainer-1"));

    // The socket goes away (the node left Kubernetes): no attribution, not an error.
    let before = errors();
    drop(kubelet);
    assert!(wait_until(TIMEOUT, || watcher.holders().is_empty()));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(errors(), before, "an absent socket is not an error");
}

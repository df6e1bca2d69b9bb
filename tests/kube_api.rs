//! The Kubernetes code against an in-process server that speaks the real API, through the real
//! `kube` client: the pod reflector (list, watch, resume, 410 Gone) and Event publishing
//! (create, series patch, outages, 500s, a full queue).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use common::kube_api::{pod, Behaviour, FakeApi};
use serde_json::Value;
use shmlink::fixtures;
use shmlink::kube::events::{
    spawn_publisher, EventMsg, EventPlanner, EventQueue, GpuHolders, PublishSettings,
};
use shmlink::kube::pods::{PodIndex, PodWatcher};
use shmlink::metrics::Metrics;
use shmlink::model::{Finding, FindingKind, Severity, Subject};
use shmlink::model::{ShmReading, ShmStatus, Snapshot};

const NODE: &str = "node-a";
const UID_1: &str = "11111111-1111-4111-8111-111111111111";
const UID_2: &str = "22222222-2222-4222-8222-222222222222";

fn client(api: &FakeApi) -> kube::Client {
    kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap()
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn has_pod(w: &PodWatcher, uid: &str) -> Option<PodIndex> {
    w.index().filter(|i| i.by_uid(uid).is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_reflector_lists_watches_resumes_and_relists_after_410() {
    let api = FakeApi::start();
    api.apply_pod(pod(NODE, "ml", "trainer-0", UID_1, &[("trainer", "aaaa")]));
    api.apply_pod(pod("node-b", "ml", "elsewhere", UID_2, &[("c", "bbbb")]));
    let (deaths_tx, deaths) = std::sync::mpsc::channel();
    let w = PodWatcher::spawn(
        client(&api),
        NODE,
        &tokio::runtime::Handle::current(),
        Box::new(move |found| {
            let _ = deaths_tx.send(found);
        }),
    );

    let index = eventually("the initial list", || has_pod(&w, UID_1)).await;
    assert_eq!(index.len(), 1, "only this node's pods");
    assert_eq!(index.by_uid(UID_1).unwrap().containers["aaaa"], "trainer");

    // Added, modified, deleted through the watch.
    let uid_3 = "33333333-3333-4333-8333-333333333333";
    api.apply_pod(pod(NODE, "ml", "new", uid_3, &[("c", "cccc")]));
    eventually("an added pod", || has_pod(&w, uid_3)).await;
    api.apply_pod(pod(
        NODE,
        "ml",
        "trainer-0",
        UID_1,
        &[("trainer", "aaaa"), ("side", "dddd")],
    ));
    eventually("a modified pod", || {
        w.index().filter(|i| {
            i.by_uid(UID_1)
                .is_some_and(|p| p.containers.contains_key("dddd"))
        })
    })
    .await;
    api.delete_pod(uid_3);
    eventually("a deleted pod", || {
        w.index().filter(|i| i.by_uid(uid_3).is_none())
    })
    .await;

    // Kubelet records a death: the container was OOM-killed and restarted. The watch delivers
    // it once; the next status updates of the same Pod show it again and are not news.
    let trainer = pod(NODE, "ml", "trainer-0", UID_1, &[("trainer", "aaaa")]);
    let terminated = serde_json::json!({"exitCode": 137, "reason": "OOMKilled",
        "containerID": "containerd://aaaa", "finishedAt": common::kube_api::finished_now()});
    let restarted = common::kube_api::restarted(trainer, "trainer", terminated, "a2a2");
    api.apply_pod(restarted.clone());
    let told = eventually("the death delivered", || deaths.try_recv().ok()).await;
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].kind, FindingKind::WorkloadOomKilled);
    assert_eq!(told[0].source, shmlink::model::FailureSource::PodStatus);
    api.apply_pod(restarted);
    eventually("the same status again in the cache", || {
        w.index().filter(|i| {
            i.by_uid(UID_1)
                .is_some_and(|p| p.containers.contains_key("a2a2"))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(deaths.try_recv().is_err(), "told once");

    // The watch ends (the API server's timeout): the reflector resumes from where it was.
    api.end_watches();
    let uid_4 = "44444444-4444-4444-8444-444444444444";
    api.apply_pod(pod(NODE, "ml", "after-resume", uid_4, &[("c", "eeee")]));
    eventually("a pod added after the watch ended", || has_pod(&w, uid_4)).await;

    // History compacted: the next watch gets 410 Gone and the reflector lists again.
    let lists_before = pod_lists(&api);
    api.expire_history();
    let uid_5 = "55555555-5555-4555-8555-555555555555";
    api.apply_pod(pod(NODE, "ml", "after-410", uid_5, &[("c", "ffff")]));
    let index = eventually("a pod added after 410 Gone", || has_pod(&w, uid_5)).await;
    assert!(pod_lists(&api) > lists_before, "a relist after 410");
    assert_eq!(index.len(), 3, "trainer-0, after-resume, after-410");

    for r in api.requests().iter().filter(|r| r.path == "/api/v1/pods") {
        assert!(
            r.query.contains("fieldSelector=spec.nodeName%3Dnode-a"),
            "every pod request is for this node only: {}",
            r.query
        );
    }
}

fn pod_lists(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
        .count()
}

fn metrics() -> Arc<Metrics> {
    Arc::new(Metrics::new(Arc::new(ArcSwapOption::empty())))
}

fn full_shm() -> ShmReading {
    let r = fixtures::shm_reading("aaaa", 64 << 20, 63 << 20);
    ShmReading {
        status: ShmStatus::Critical,
        ..fixtures::in_pod(r, "ml", "trainer-0", UID_1, "trainer")
    }
}

fn gpu_finding(gpu: u32) -> Finding {
    Finding {
        severity: Severity::Critical,
        kind: FindingKind::GpuPairDegraded,
        subject: Subject::Gpu(gpu),
        message: format!("GPU {gpu} fails with every other GPU"),
    }
}

fn index() -> PodIndex {
    let p: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod(NODE, "ml", "trainer-0", UID_1, &[("trainer", "aaaa")]))
            .unwrap();
    PodIndex::new([&p])
}

fn publisher(api: &FakeApi, settings: PublishSettings) -> (EventQueue, Arc<Metrics>) {
    let m = metrics();
    let q = spawn_publisher(
        client(api),
        NODE.into(),
        m.clone(),
        settings,
        &tokio::runtime::Handle::current(),
    );
    (q, m)
}

fn fast() -> PublishSettings {
    PublishSettings {
        capacity: 64,
        min_gap: Duration::from_millis(1),
        backoff_start: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        request_timeout: Duration::from_secs(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_created_regarding_the_pod_and_the_node_and_repeats_patch_the_series() {
    let api = FakeApi::start();
    let (queue, m) = publisher(&api, fast());
    // A zero heartbeat: every scan repeats every lasting condition.
    let mut planner = EventPlanner::new(NODE, Duration::ZERO);
    let pods = index();
    let mut snapshot = fixtures::scanned(NODE, vec![full_shm()], Some(&pods));
    snapshot.findings.push(gpu_finding(7));
    queue.send(planner.plan(&snapshot, Some(&pods), &GpuHolders::new(), Instant::now()));
    let events = eventually("two events", || {
        let e = api.events();
        (e.len() == 2).then_some(e)
    })
    .await;
    let by_reason = |r: &str| -> Value {
        events
            .iter()
            .find(|e| e["reason"] == r)
            .cloned()
            .unwrap_or_else(|| panic!("no {r} in {events:#?}"))
    };
    let shm = by_reason("ShmExhausted");
    assert_eq!(shm["metadata"]["namespace"], "ml");
    assert_eq!(shm["type"], "Warning");
    assert_eq!(shm["reportingController"], "shmlink");
    assert_eq!(shm["reportingInstance"], NODE);
    assert_eq!(shm["action"], "Scan");
    assert_eq!(shm["regarding"]["kind"], "Pod");
    assert_eq!(shm["regarding"]["name"], "trainer-0");
    assert_eq!(shm["regarding"]["uid"], UID_1);
    assert!(shm["eventTime"].is_string());
    assert!(shm["note"].as_str().unwrap().contains("98% full"), "{shm}");
    let gpu = by_reason("GpuLinkDegraded");
    assert_eq!(
        gpu["metadata"]["namespace"], "default",
        "Node Events live in default"
    );
    assert_eq!(gpu["regarding"]["kind"], "Node");
    assert_eq!(gpu["regarding"]["name"], NODE);
    assert_eq!(gpu["regarding"]["uid"], "node-uid-node-a");

    // The next scan: the same conditions update their series, no new Events.
    queue.send(planner.plan(&snapshot, Some(&pods), &GpuHolders::new(), Instant::now()));
    eventually("series count 2", || {
        let e = api.events();
        e.iter()
            .all(|e| e["series"]["count"] == 2 && e["series"]["lastObservedTime"].is_string())
            .then_some(())
    })
    .await;
    assert_eq!(api.events().len(), 2);
    assert_eq!(api.event_creates().len(), 2);
    let body = m.encode().unwrap();
    assert!(
        body.contains("shmlink_kube_events_total{reason=\"ShmExhausted\"} 2"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_queued_while_the_api_server_is_away_arrive_once_it_is_back() {
    let mut api = FakeApi::start();
    let (queue, m) = publisher(&api, fast());
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    api.stop();
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: (0..3).map(gpu_finding).collect(),
        gpus: Vec::new(),
        ..Snapshot::default()
    };
    queue.send(planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now()));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(m.kube_events_dropped.get(), 0, "queued, not dropped");
    api.resume();
    let events = eventually("three events after the outage", || {
        let e = api.events();
        (e.len() == 3).then_some(e)
    })
    .await;
    let mut notes: Vec<_> = events
        .iter()
        .map(|e| e["note"].as_str().unwrap().to_string())
        .collect();
    notes.sort();
    assert_eq!(
        notes,
        vec![
            "GPU 0 fails with every other GPU",
            "GPU 1 fails with every other GPU",
            "GPU 2 fails with every other GPU"
        ]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.event_creates().len(), 3, "none duplicated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_with_backoff_and_delivered_once() {
    let api = FakeApi::start();
    let (queue, _m) = publisher(&api, fast());
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    api.set_behaviour(Behaviour::Fail500);
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: vec![gpu_finding(7)],
        ..Snapshot::default()
    };
    queue.send(planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now()));
    eventually("retries", || (api.event_creates().len() >= 3).then_some(())).await;
    assert!(api.events().is_empty());
    api.set_behaviour(Behaviour::Normal);
    eventually("the event", || (api.events().len() == 1).then_some(())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.events().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_api_server_holds_an_event_no_longer_than_the_request_timeout() {
    let api = FakeApi::start();
    // request_timeout 1 s; the client's own read timeout would be minutes.
    let (queue, _m) = publisher(&api, fast());
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    api.set_behaviour(Behaviour::Hang);
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: vec![gpu_finding(7)],
        ..Snapshot::default()
    };
    queue.send(planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now()));
    // Abandoned after a second, retried: more than one request reaches the stuck server.
    eventually("a retry after the timeout", || {
        (api.event_creates().len() >= 2).then_some(())
    })
    .await;
    assert!(api.events().is_empty());
    // The server answers again; the held requests stay held.
    api.set_behaviour(Behaviour::Normal);
    let answered = Instant::now();
    eventually("the event", || (api.events().len() == 1).then_some(())).await;
    assert!(
        answered.elapsed() < Duration::from_secs(5),
        "{:?}",
        answered.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.events().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let mut api = FakeApi::start();
    api.stop();
    let (queue, m) = publisher(
        &api,
        PublishSettings {
            capacity: 2,
            ..fast()
        },
    );
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: (0..10).map(gpu_finding).collect(),
        ..Snapshot::default()
    };
    let msgs = planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now());
    assert_eq!(
        msgs.iter()
            .filter(|m| matches!(m, EventMsg::Publish(_)))
            .count(),
        10
    );
    let started = Instant::now();
    queue.send(msgs);
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "send never waits"
    );
    let dropped = m.kube_events_dropped.get();
    // Two fit in the queue and the task may hold one more.
    assert!((7..=8).contains(&dropped), "dropped {dropped}");
}

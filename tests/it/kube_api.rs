//! The Kubernetes code against an in-process server that speaks the real API, through the real
//! `kube` client: the pod reflector (list, watch, resume, 410 Gone) and Event publishing
//! (create, series patch, outages, 500s, a full queue, repeats merged, a flooding Pod among
//! 1,000 others).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use common::kube_api::{pod, Behaviour, FakeApi};
use serde_json::Value;
use shmlink::fixtures;
use shmlink::kube::events::{
    spawn_publisher, EventMsg, EventPlanner, EventQueue, EventSpec, GpuHolders, PublishSettings,
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
        shmlink::kube::exits::Exits::new(std::time::SystemTime::now()),
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
    assert_eq!(told[0].1.kind, FindingKind::WorkloadOomKilled);
    assert_eq!(told[0].1.source, shmlink::model::FailureSource::PodStatus);
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

/// GPU 7's finding planned and sent by a fast publisher, the server set to `behaviour` first;
/// the queue and metrics, to keep the publisher alive.
fn gpu_7_event_sent(api: &FakeApi, behaviour: Behaviour) -> (EventQueue, Arc<Metrics>) {
    let (queue, m) = publisher(api, fast());
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    api.set_behaviour(behaviour);
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: vec![gpu_finding(7)],
        ..Snapshot::default()
    };
    queue.send(planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now()));
    (queue, m)
}

/// `fast`, with a queue of two.
fn two_deep() -> PublishSettings {
    PublishSettings {
        capacity: 2,
        ..fast()
    }
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
    let _publishing = gpu_7_event_sent(&api, Behaviour::Fail500);
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
    let _publishing = gpu_7_event_sent(&api, Behaviour::Hang);
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
    let (queue, m) = publisher(&api, two_deep());
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
    // Two distinct Events are held (the one under way counts), all first Events: every other
    // new one is dropped, whenever the task took its first.
    assert_eq!(m.kube_events_dropped.get(), 8);
    api.resume();
    let events = eventually("the two held", || {
        let e = api.events();
        (e.len() == 2).then_some(e)
    })
    .await;
    let mut notes: Vec<_> = events.iter().map(|e| e["note"].clone()).collect();
    notes.sort_by_key(|n| n.to_string());
    assert_eq!(
        notes,
        vec![
            "GPU 0 fails with every other GPU",
            "GPU 1 fails with every other GPU"
        ]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.events().len(), 2);
    assert_eq!(m.kube_events_dropped.get(), 8);
}

fn publishes(msgs: &[EventMsg]) -> Vec<&EventSpec> {
    msgs.iter()
        .filter_map(|m| match m {
            EventMsg::Publish(spec) => Some(&**spec),
            EventMsg::Ended(_) => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_sent_while_the_api_server_is_away_is_not_dropped_with_the_queue_full() {
    let mut api = FakeApi::start();
    let (queue, m) = publisher(&api, two_deep());
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    let scan = |gpus: std::ops::Range<u32>| Snapshot {
        node: NODE.into(),
        findings: gpus.map(gpu_finding).collect(),
        ..Snapshot::default()
    };
    let first = planner.plan(&scan(0..1), None, &GpuHolders::new(), Instant::now());
    let gpu_0 = publishes(&first)[0].clone();
    queue.send(first);
    eventually("GPU 0's Event", || (queue.remembered() == 1).then_some(())).await;

    api.stop();
    // GPU 0 is not new: three new Events, one more than the queue holds.
    let next = planner.plan(&scan(0..4), None, &GpuHolders::new(), Instant::now());
    let ids: Vec<u64> = publishes(&next).iter().map(|s| s.id).collect();
    assert_eq!(ids.len(), 3);
    queue.send(next);
    assert_eq!(m.kube_events_dropped.get(), 1, "GPU 3's, the newest");

    // Full and the API server away: GPU 0's end is taken and forgotten at once; GPU 1's (under
    // way or waiting) once it is published.
    queue.send(vec![EventMsg::Ended(gpu_0.id), EventMsg::Ended(ids[0])]);
    assert_eq!(m.kube_events_dropped.get(), 1, "no Ended dropped");
    assert_eq!(queue.remembered(), 0, "GPU 0 forgotten without a call");

    api.resume();
    eventually("GPU 1 and 2 published, GPU 1 forgotten", || {
        (api.events().len() == 3 && queue.remembered() == 1).then_some(())
    })
    .await;
    // Forgotten: the same id again is a create (409, the name is taken), not a series patch.
    queue.send(vec![EventMsg::Publish(Box::new(gpu_0.clone()))]);
    let to_gpu_0 = |method: &str| {
        api.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.contains("/events"))
            .filter(|r| r.path.ends_with(&gpu_0.name) || r.body["metadata"]["name"] == gpu_0.name)
            .count()
    };
    eventually("GPU 0 created again", || {
        (to_gpu_0("POST") == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(to_gpu_0("PATCH"), 0);
    assert_eq!(m.kube_events_dropped.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_sent_before_the_first_create_are_created_with_their_series_in_one_call() {
    let mut api = FakeApi::start();
    let (queue, m) = publisher(&api, fast());
    api.stop();
    // A zero heartbeat: every scan repeats the condition.
    let mut planner = EventPlanner::new(NODE, Duration::ZERO);
    let snapshot = Snapshot {
        node: NODE.into(),
        findings: vec![gpu_finding(7)],
        ..Snapshot::default()
    };
    for _ in 0..5 {
        queue.send(planner.plan(&snapshot, None, &GpuHolders::new(), Instant::now()));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.resume();
    let event = eventually("the event", || api.events().pop()).await;
    assert_eq!(event["series"]["count"], 5, "{event}");
    assert!(event["series"]["lastObservedTime"].is_string());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = api.requests();
    let calls: Vec<_> = calls
        .iter()
        .filter(|r| r.path.contains("/events"))
        .collect();
    assert!(calls.iter().all(|r| r.method == "POST"), "no series patch");
    assert_eq!(
        api.event_creates().len(),
        1,
        "one call once the server is back"
    );
    let body = m.encode().unwrap();
    assert!(
        body.contains("shmlink_kube_events_total{reason=\"GpuLinkDegraded\"} 1"),
        "{body}"
    );
}

/// A UID for pod `i`.
fn uid(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_pod_does_not_crowd_out_1000_other_pods_first_events() {
    const PODS: usize = 1000;
    const REPEATS_PER_POD: usize = 20;
    let api = FakeApi::start();
    let (queue, m) = publisher(
        &api,
        PublishSettings {
            capacity: PublishSettings::default().capacity,
            ..fast()
        },
    );
    let mut planner = EventPlanner::new(NODE, Duration::from_secs(300));
    let noisy = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "noisy", &uid(PODS));
    let failure = |i: usize| {
        fixtures::failure(
            FindingKind::GpuJobCrashed,
            "ml",
            &format!("pod-{i}"),
            &uid(i),
        )
    };

    // As the scan thread sends them: the noisy Pod's first failure, then each Pod's one failure
    // amid twenty more of the noisy Pod's. Every tenth Pod's condition ends while its Event
    // still waits.
    let started = Instant::now();
    let mut sent = 1;
    queue.send(planner.plan_failures(std::slice::from_ref(&noisy), Instant::now()));
    let mut ids = Vec::new();
    for i in 0..PODS {
        let mut batch = vec![noisy.clone(); REPEATS_PER_POD / 2];
        batch.push(failure(i));
        batch.extend(vec![noisy.clone(); REPEATS_PER_POD / 2]);
        sent += REPEATS_PER_POD;
        let mut msgs = planner.plan_failures(&batch, Instant::now());
        let id = publishes(&msgs)[REPEATS_PER_POD / 2].id;
        ids.push(id);
        if i % 10 == 0 {
            msgs.push(EventMsg::Ended(id));
        }
        queue.send(msgs);
    }
    let sending = started.elapsed();

    let pod_creates = || {
        api.event_creates()
            .into_iter()
            .filter(|r| r.body["regarding"]["name"] != "noisy")
            .count()
    };
    let deadline = started + Duration::from_secs(120);
    while pod_creates() < PODS {
        assert!(Instant::now() < deadline, "{} of {PODS}", pod_creates());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delivered = started.elapsed();
    let noisy_event = eventually("every occurrence of the noisy Pod counted", || {
        api.events_about("noisy")
            .pop()
            .filter(|e| e["series"]["count"] == sent)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Each Pod's Event created once, the noisy Pod's one Event counting all 20,001.
    let mut per_pod = std::collections::HashMap::new();
    for r in api.event_creates() {
        *per_pod
            .entry(r.body["regarding"]["name"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(per_pod.len(), PODS + 1);
    assert!(per_pod.values().all(|n| *n == 1), "each created once");
    assert_eq!(api.events_about("noisy").len(), 1);
    assert_eq!(noisy_event["series"]["count"], 20_001);
    assert_eq!(m.kube_events_dropped.get(), 0);

    // Calls: one create per Pod, and for the noisy Pod one per round of the Pods waiting ahead
    // of it. While sending is R times faster than calling, each round is about R times the
    // last, so sending saw about log_R(the Pods) rounds; then one last update. R >= 4 (checked
    // below): at most 1 + 5 + 1 calls, 10 allowed.
    let calls: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/events"))
        .collect();
    let noisy_calls = calls
        .iter()
        .filter(|r| r.path.contains("/noisy.") || r.body["regarding"]["name"] == "noisy")
        .count();
    eprintln!(
        "{} API calls ({noisy_calls} for the noisy Pod), sending {sending:?}, all {PODS} first \
         Events in {delivered:?}, {} dropped",
        calls.len(),
        m.kube_events_dropped.get()
    );
    assert!(sending < delivered / 4, "sending {sending:?}");
    assert!(noisy_calls <= 10, "{noisy_calls} calls for the noisy Pod");
    assert_eq!(calls.len(), PODS + noisy_calls);

    // The ended Pods' Events are forgotten once out; ending more forgets them at once.
    assert_eq!(queue.remembered(), PODS + 1 - PODS / 10);
    let more: Vec<EventMsg> = ids
        .iter()
        .skip(1)
        .step_by(10)
        .map(|id| EventMsg::Ended(*id))
        .collect();
    queue.send(more);
    assert_eq!(queue.remembered(), PODS + 1 - 2 * (PODS / 10));
}

/// After a restart, a stored series the API server may lack is sent again: an Event the last
/// run created (its confirmation lost with it) meets 409 and gets its series set to the stored
/// count, one Event; one it never created is created with that count; counts are set, not
/// added, so a second resend changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_failure_series_is_created_whole_or_set_never_added() {
    use shmlink::kube::events::Resend;
    let api = FakeApi::start();
    let spec = |name: &str| EventSpec {
        id: 1,
        name: name.into(),
        regarding: shmlink::kube::events::pod_ref("ml", "trainer-0", UID_1),
        reason: shmlink::model::EventReason::ShmAllocationFailed,
        type_: shmlink::kube::events::EventType::Warning,
        note: "the DataLoader ran out of /dev/shm".into(),
    };
    // The last run created one Event (count 1) and was killed before it knew.
    let (before, _) = publisher(&api, fast());
    before.send(vec![EventMsg::Publish(Box::new(spec(
        "trainer-0.shmlink.a.1",
    )))]);
    eventually("the first run's Event", || {
        (api.events_about("trainer-0").len() == 1).then_some(())
    })
    .await;
    drop(before);

    let resend = || {
        vec![
            Resend {
                spec: spec("trainer-0.shmlink.a.1"),
                assigned: 3,
                confirmed: 0,
            },
            Resend {
                spec: EventSpec {
                    id: 2,
                    ..spec("trainer-0.shmlink.a.2")
                },
                assigned: 2,
                confirmed: 0,
            },
        ]
    };
    let counts = || {
        let mut c: Vec<(String, i64)> = api
            .events_about("trainer-0")
            .iter()
            .map(|e| {
                (
                    e["metadata"]["name"].as_str().unwrap().to_string(),
                    e["series"]["count"].as_i64().unwrap_or(1),
                )
            })
            .collect();
        c.sort();
        c
    };
    let want = vec![
        ("trainer-0.shmlink.a.1".to_string(), 3),
        ("trainer-0.shmlink.a.2".to_string(), 2),
    ];
    for run in 0..2 {
        let (after, _) = publisher(&api, fast());
        after.resend(resend());
        eventually(&format!("resend {run}"), || {
            (counts() == want).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(counts(), want, "resend {run}");
    }
}

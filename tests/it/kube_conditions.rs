//! The Node's GPU conditions through the real `kube` client against the in-process API server:
//! the server's merge semantics for conditions, the writer (only on change or heartbeat, the
//! transition time kept, the latest state after an outage), and the optional taint.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use common::kube_api::{self, FakeApi};
use serde_json::{json, Value};
use shmlink::fixtures;
use shmlink::kube::conditions::{spawn_writer, ConditionFeed, WriterSettings};
use shmlink::kube::NODE_TAINT_KEY as TAINT_KEY;
use shmlink::metrics::Metrics;
use shmlink::model::PairStatus;
use shmlink::model::{Snapshot, XidCount};

const NODE: &str = "gpu-node-7";
const EARLIER: &str = "2026-01-01T00:00:00Z";
const HOLD: Duration = Duration::from_secs(3600);

fn client(api: &FakeApi) -> kube::Client {
    kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap()
}

fn kubelet_node() -> Value {
    kube_api::kubelet_node(NODE)
}

fn condition(api: &FakeApi, type_: &str) -> Option<Value> {
    api.node_conditions(NODE)
        .into_iter()
        .find(|c| c["type"] == type_)
}

async fn eventually<T>(what: &str, api: &FakeApi, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the Node: {:#}",
            api.node(NODE)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_is(api: &FakeApi, type_: &str, status: &str) -> Option<Value> {
    condition(api, type_).filter(|c| c["status"] == status)
}

fn metrics() -> Arc<Metrics> {
    Arc::new(Metrics::new(Arc::new(ArcSwapOption::empty())))
}

fn writer(api: &FakeApi, heartbeat: Duration, taint: bool) -> (ConditionFeed, Arc<Metrics>) {
    let m = metrics();
    let mut settings = WriterSettings::new(heartbeat, taint);
    settings.backoff_start = Duration::from_millis(50);
    settings.backoff_max = Duration::from_millis(400);
    let feed = spawn_writer(
        client(api),
        NODE.into(),
        settings,
        m.clone(),
        &tokio::runtime::Handle::current(),
    );
    (feed, m)
}

/// `s` with its GPU verdicts, as the scan makes them.
fn judged(s: Snapshot) -> Snapshot {
    let mut fatal = shmlink::gpu::xid::FatalXids::new(HOLD);
    fixtures::judged(s, &mut fatal, Instant::now())
}

fn healthy() -> Snapshot {
    fixtures::gpu_board(8)
}

fn link_down() -> Snapshot {
    let mut s = fixtures::gpu_board(8);
    for p in s
        .gpu_pairs
        .iter_mut()
        .filter(|p| (p.gpu, p.peer_gpu) == (0, 1))
    {
        p.status = PairStatus::Down;
        p.links = vec![0, 1, 2, 3];
    }
    s
}

fn xid(gpu: u32, xid: u64, count: u64) -> Snapshot {
    let mut s = fixtures::gpu_board(8);
    s.xids = vec![XidCount::on(gpu, xid, count)];
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_merges_conditions_by_type_as_the_api_server_does() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node());
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client(&api));
    let pp = kube::api::PatchParams::default();
    let ours = json!({"status": {"conditions": [{"type": "GpuFault", "status": "False"}]}});
    nodes
        .patch_status(NODE, &pp, &kube::api::Patch::Strategic(&ours))
        .await
        .unwrap();
    let types: Vec<Value> = api
        .node_conditions(NODE)
        .iter()
        .map(|c| c["type"].clone())
        .collect();
    assert_eq!(
        types,
        [
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "GpuFault"
        ]
    );
    // A field of one element changes, the others stay.
    let ours = json!({"status": {"conditions": [{"type": "GpuFault", "status": "True"}]}});
    nodes
        .patch_status(NODE, &pp, &kube::api::Patch::Strategic(&ours))
        .await
        .unwrap();
    assert_eq!(condition(&api, "GpuFault").unwrap()["status"], "True");
    assert_eq!(api.node_conditions(NODE).len(), 5);
    // A JSON merge patch replaces the list: what an agent must not send.
    nodes
        .patch_status(NODE, &pp, &kube::api::Patch::Merge(&ours))
        .await
        .unwrap();
    assert_eq!(api.node_conditions(NODE).len(), 1);
    // The status subresource leaves the spec alone.
    let spec = json!({"spec": {"taints": []}, "status": {"conditions": []}});
    nodes
        .patch_status(NODE, &pp, &kube::api::Patch::Strategic(&spec))
        .await
        .unwrap();
    assert_eq!(api.node(NODE)["spec"]["taints"][0]["key"], "nvidia.com/gpu");
    // A taint list written under a stale resourceVersion is refused, not merged.
    let stale = json!({"metadata": {"resourceVersion": "1"}, "spec": {"taints": []}});
    match nodes
        .patch(NODE, &pp, &kube::api::Patch::Merge(&stale))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
        other => panic!("a stale write went through: {other:?}"),
    }
    assert_eq!(api.node(NODE)["spec"]["taints"][0]["key"], "nvidia.com/gpu");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_appear_false_flip_true_and_back_with_kubelets_untouched_and_no_storm() {
    let api = FakeApi::start();
    let mut node = kubelet_node();
    // An earlier run of the agent left both False.
    for t in ["GpuLinkDegraded", "GpuFault"] {
        node["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({
            "type": t, "status": "False", "reason": "Earlier", "message": "an earlier run",
            "lastHeartbeatTime": EARLIER, "lastTransitionTime": EARLIER}));
    }
    api.apply_node(node);
    let kubelet_before: Vec<Value> = api.node_conditions(NODE)[..4].to_vec();
    let (mut feed, m) = writer(&api, Duration::from_secs(300), false);

    feed.update(&judged(healthy()));
    let link = eventually("GpuLinkDegraded False", &api, || {
        status_is(&api, "GpuLinkDegraded", "False").filter(|c| c["reason"] == "GpuPairsHealthy")
    })
    .await;
    assert_eq!(link["message"], "All 28 GPU pairs are ok.");
    assert_eq!(
        link["lastTransitionTime"], EARLIER,
        "no flip, the time stays"
    );
    let fault = status_is(&api, "GpuFault", "False").expect("GpuFault False");
    assert_eq!(fault["reason"], "NoGpuFault");
    assert_eq!(
        api.node_conditions(NODE)[..4],
        kubelet_before[..],
        "kubelet's conditions untouched"
    );
    assert_eq!(api.node_status_patches().len(), 1);
    // Ten more scans that find the same: no write.
    for _ in 0..10 {
        feed.update(&judged(healthy()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(api.node_status_patches().len(), 1, "no write storm");
    assert_eq!(m.node_condition_writes.get(), 1);

    // Links down: True, a new transition time, GpuFault's kept.
    for _ in 0..10 {
        feed.update(&judged(link_down()));
    }
    let link = eventually("GpuLinkDegraded True", &api, || {
        status_is(&api, "GpuLinkDegraded", "True")
    })
    .await;
    assert_eq!(link["reason"], "GpuPairsDown");
    assert!(link["message"]
        .as_str()
        .unwrap()
        .starts_with("GPU pairs down: GPU 0 <-> GPU 1 (links 0, 1, 2, 3 of GPU 0)."));
    assert_ne!(
        link["lastTransitionTime"], EARLIER,
        "a flip is a transition"
    );
    assert_eq!(
        condition(&api, "GpuFault").unwrap()["lastTransitionTime"],
        EARLIER,
        "an unchanged status keeps its transition time"
    );
    eprintln!(
        "NODE CONDITIONS (link down), as the API server holds them:\n{:#}",
        Value::Array(api.node_conditions(NODE))
    );

    // Recovered.
    feed.update(&judged(healthy()));
    eventually("GpuLinkDegraded False again", &api, || {
        status_is(&api, "GpuLinkDegraded", "False")
    })
    .await;
    assert_eq!(api.node_conditions(NODE)[..4], kubelet_before[..]);
    assert_eq!(api.node_conditions(NODE).len(), 6);
    assert_eq!(api.node_status_patches().len(), 3, "one write per change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_rewrites_unchanged_conditions_and_a_restart_keeps_transition_times() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node());
    let (mut feed, _m) = writer(&api, Duration::from_millis(100), false);
    feed.update(&judged(link_down()));
    let first = eventually("True", &api, || status_is(&api, "GpuLinkDegraded", "True")).await;
    eventually("two heartbeats", &api, || {
        (api.node_status_patches().len() >= 3).then_some(())
    })
    .await;
    let later = condition(&api, "GpuLinkDegraded").unwrap();
    assert_eq!(later["lastTransitionTime"], first["lastTransitionTime"]);
    drop(feed);

    // A new agent on the same node that finds the same keeps the time the Node holds.
    let (mut feed, _m) = writer(&api, Duration::from_secs(300), false);
    let before = api.node_status_patches().len();
    feed.update(&judged(link_down()));
    eventually("the new agent's write", &api, || {
        (api.node_status_patches().len() > before).then_some(())
    })
    .await;
    assert_eq!(
        condition(&api, "GpuLinkDegraded").unwrap()["lastTransitionTime"],
        first["lastTransitionTime"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_down_during_transitions_gets_the_latest_state_when_back() {
    let mut api = FakeApi::start();
    api.apply_node(kubelet_node());
    let (mut feed, m) = writer(&api, Duration::from_secs(300), false);
    feed.update(&judged(healthy()));
    eventually("False", &api, || status_is(&api, "GpuFault", "False")).await;

    api.stop();
    // Down, then a fatal XID, then links down too: only the last matters.
    feed.update(&judged(link_down()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut both = link_down();
    both.xids = vec![XidCount::on(2, 79, 1)];
    feed.update(&judged(both));
    eventually("failed writes counted", &api, || {
        (m.node_condition_write_errors.get() >= 2).then_some(())
    })
    .await;
    let before = api.node_status_patches().len();
    api.resume();
    let fault = eventually("GpuFault True", &api, || {
        status_is(&api, "GpuFault", "True")
    })
    .await;
    assert_eq!(fault["reason"], "Xid79");
    assert_eq!(
        condition(&api, "GpuLinkDegraded").unwrap()["status"],
        "True"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        api.node_status_patches().len() - before,
        1,
        "one write with the latest state, nothing piled up"
    );
    assert_eq!(api.node_conditions(NODE).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_taint_follows_gpu_fault_and_only_ours_is_touched() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node());
    let (mut feed, _m) = writer(&api, Duration::from_secs(300), true);
    let taints = |api: &FakeApi| api.node(NODE)["spec"]["taints"].clone();

    feed.update(&judged(healthy()));
    eventually("False", &api, || status_is(&api, "GpuFault", "False")).await;
    assert_eq!(
        taints(&api),
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    );

    feed.update(&judged(xid(3, 48, 1)));
    eventually("our taint", &api, || {
        (taints(&api).as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        taints(&api),
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
               {"key": TAINT_KEY, "effect": "NoSchedule"}])
    );

    // History over (driver reloaded): the fault clears and our taint goes, the other stays.
    feed.update(&judged(healthy()));
    eventually("our taint removed", &api, || {
        (taints(&api).as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    assert_eq!(
        taints(&api),
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    );
}

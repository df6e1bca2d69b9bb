//! DeviceTaintRules through the real `kube` client against the in-process API server, which
//! serves `resource.k8s.io` as each release does and holds rules with the API server's semantics
//! (validation, generation, conflicts): the judge's snapshots in (GPU pairs judged by the real
//! pair judge), the rules the server stores out. No root needed.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use common::kube_api::{events::with_reason, Dra, FakeApi};
use serde_json::{json, Value};
use shmlink::fixtures::{self, judged_blame};
use shmlink::kube::device_taint::{
    spawn_device_taints, DeviceTaintFeed, DeviceTaintSettings, Effect,
};
use shmlink::kube::events::{spawn_publisher, PublishSettings};
use shmlink::metrics::Metrics;
use shmlink::model::{PairReason, PairStatus, ReasonKind, Snapshot, Weight};

const NODE: &str = "gpu-node-7";

fn client(api: &FakeApi) -> kube::Client {
    kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap()
}

/// NVIDIA's DRA driver's slice for the 8-GPU node, its UUIDs those of `fixtures::gpu_board`.
fn slice() -> Value {
    let mut slice = crate::common::kube_api::slice_8gpu();
    for (i, d) in slice["spec"]["devices"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        d["attributes"]["uuid"] = json!({"string": format!("GPU-{i}")});
    }
    slice
}

fn api(mode: Dra, with_slice: bool) -> FakeApi {
    let api = FakeApi::start();
    api.set_dra(mode);
    if with_slice {
        api.apply_slice(slice());
    }
    api
}

/// 8 GPUs, those in `bad` failing with every peer, judged by the pair judge.
fn board(bad: &[u32]) -> Snapshot {
    let mut s = fixtures::gpu_board(8);
    for p in &mut s.gpu_pairs {
        if bad.contains(&p.gpu) || bad.contains(&p.peer_gpu) {
            p.status = PairStatus::Down;
            let words = "links inactive".to_string();
            let reason = PairReason::new(ReasonKind::SwitchLinksDown, Weight::Down, words);
            p.reasons = vec![reason];
        }
    }
    s.gpu_blame = judged_blame(&s.gpu_pairs);
    s
}

struct Keeper {
    feed: DeviceTaintFeed,
    metrics: Arc<Metrics>,
}

impl Keeper {
    fn start(api: &FakeApi, effect: Effect, hold: Duration) -> Keeper {
        let mut metrics = Metrics::new(Arc::new(ArcSwapOption::empty()));
        metrics.register_device_taints();
        let metrics = Arc::new(metrics);
        let runtime = tokio::runtime::Handle::current();
        let events = spawn_publisher(
            client(api),
            NODE.into(),
            metrics.clone(),
            PublishSettings::default(),
            &runtime,
        );
        let mut settings = DeviceTaintSettings::new(effect, hold);
        settings.resync = Duration::from_millis(100);
        settings.backoff_start = Duration::from_millis(50);
        let ids = shmlink::kube::events::EventIds::new();
        let handles = (metrics.device_taints.clone(), Some((events, ids)));
        let feed = spawn_device_taints(client(api), NODE.into(), settings, handles, &runtime);
        Keeper { feed, metrics }
    }

    /// One scan of `s`: its GPU verdicts made as the scan makes them, then handed over.
    fn scan(&mut self, s: &Snapshot) {
        let mut fatal = shmlink::gpu::xid::FatalXids::new(Duration::from_secs(3600));
        let judged = shmlink::fixtures::judged(s.clone(), &mut fatal, Instant::now());
        self.feed.update(&judged, Instant::now());
    }

    fn in_force(&self, effect: &str) -> f64 {
        let text = self.metrics.encode().unwrap();
        common::agent::sample(&text, "shmlink_gpu_device_taints", &[("effect", effect)])
            .unwrap_or(-1.0)
    }

    /// Waits for the gauge of rules in force to say `n`: the task sets it once its pass has
    /// written every rule, just after the API holds them.
    async fn wait_in_force(&self, effect: &str, n: f64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.in_force(effect) != n {
            assert!(
                Instant::now() < deadline,
                "{effect} rules in force: {}, not {n}",
                self.in_force(effect)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn eventually(what: &str, api: &FakeApi, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; rules: {:#}; writes: {:?}",
            Value::Array(api.rules()),
            api.rule_writes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Time for a few resyncs: what a churn would have written by then, it has.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

fn names(api: &FakeApi) -> Vec<String> {
    api.rules()
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_7_down_makes_one_rule_selecting_its_device_with_effect_none_and_no_more_writes() {
    let api = api(Dra::RulesV1, true);
    let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
    k.scan(&board(&[7]));
    eventually("one rule", &api, || api.rules().len() == 1).await;
    let rule = api.rule("shmlink-gpu-node-7-gpu-7").expect("GPU 7's rule");
    assert_eq!(rule["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(
        rule["spec"]["deviceSelector"],
        json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-7"})
    );
    assert_eq!(rule["spec"]["taint"]["key"], "shmlink.io/gpu-unhealthy");
    assert_eq!(rule["spec"]["taint"]["value"], "nvlink-down");
    assert_eq!(rule["spec"]["taint"]["effect"], "None");
    assert_eq!(rule["metadata"]["generation"], 1);
    assert_eq!(
        rule["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "shmlink", "shmlink.io/node": NODE})
    );
    assert_eq!(
        rule["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-gpu-node-7"}])
    );
    let description = rule["metadata"]["annotations"]["shmlink.io/description"]
        .as_str()
        .unwrap();
    assert!(
        description.starts_with("GPU 7 fails with every peer GPU: its 7 pairs are down; since "),
        "{description}"
    );
    eventually("the Event", &api, || {
        with_reason(&api.events_about(NODE), "GpuDeviceTainted").len() == 1
    })
    .await;
    // The same snapshot again and again, and resyncs: nothing more is written.
    for _ in 0..5 {
        k.scan(&board(&[7]));
        settle().await;
    }
    assert_eq!(api.rule_writes(), ["POST devicetaintrules"]);
    k.wait_in_force("None", 1.0).await;
    k.wait_in_force("NoSchedule", 0.0).await;
    let events = api.events_about(NODE);
    let made = with_reason(&events, "GpuDeviceTainted");
    assert_eq!(made.len(), 1, "{events:#?}");
    assert_eq!(made[0]["type"], "Warning");
    let note = made[0]["note"].as_str().unwrap();
    assert!(
        note.starts_with("DeviceTaintRule shmlink-gpu-node-7-gpu-7 takes device gpu.nvidia.com/gpu-node-7/gpu-7 out (effect None): GPU 7 fails with every peer GPU"),
        "{note}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_schedule_is_the_effect_asked_and_two_bad_gpus_get_two_rules_the_others_none() {
    let api = api(Dra::RulesV1, true);
    let mut k = Keeper::start(&api, Effect::NoSchedule, Duration::from_secs(3600));
    k.scan(&board(&[3, 7]));
    eventually("two rules", &api, || api.rules().len() == 2).await;
    settle().await;
    assert_eq!(
        names(&api),
        ["shmlink-gpu-node-7-gpu-3", "shmlink-gpu-node-7-gpu-7"]
    );
    for r in api.rules() {
        assert_eq!(r["spec"]["taint"]["effect"], "NoSchedule", "{r:#}");
    }
    let devices: Vec<Value> = api
        .rules()
        .iter()
        .map(|r| r["spec"]["deviceSelector"]["device"].clone())
        .collect();
    assert_eq!(devices, ["gpu-3", "gpu-7"]);
    k.wait_in_force("NoSchedule", 2.0).await;
    assert_eq!(api.rule_writes().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_link_keeps_one_rule_and_it_is_lifted_once_healthy_past_the_hold() {
    let api = api(Dra::RulesV1, true);
    let hold = Duration::from_secs(2);
    let mut k = Keeper::start(&api, Effect::None, hold);
    k.scan(&board(&[7]));
    eventually("the rule", &api, || api.rules().len() == 1).await;
    let made = api.rules()[0].clone();
    // Down, up, down, up within the hold: the rule as it was, no write.
    for bad in [false, true, false, true, false] {
        k.scan(&board(if bad { &[7] } else { &[] }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(api.rules(), std::slice::from_ref(&made));
    assert_eq!(api.rule_writes(), ["POST devicetaintrules"]);
    let healthy_since = Instant::now();
    // Scans go on finding it healthy.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !api.rules().is_empty() && Instant::now() < deadline {
        k.scan(&board(&[]));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually("the rule lifted", &api, || api.rules().is_empty()).await;
    let lifted_after = healthy_since.elapsed();
    assert!(
        lifted_after >= hold - Duration::from_millis(200),
        "{lifted_after:?}"
    );
    assert_eq!(
        api.rule_writes(),
        ["POST devicetaintrules", "DELETE shmlink-gpu-node-7-gpu-7"]
    );
    // The delete carried the rule's UID as a precondition.
    let delete = api
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .unwrap();
    assert_eq!(delete.body["preconditions"]["uid"], made["metadata"]["uid"]);
    eventually("the lifted Event", &api, || {
        with_reason(&api.events_about(NODE), "GpuDeviceTaintLifted").len() == 1
    })
    .await;
    let events = api.events_about(NODE);
    let lifted = with_reason(&events, "GpuDeviceTaintLifted");
    assert_eq!(lifted[0]["type"], "Normal");
    k.wait_in_force("None", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_of_others_are_never_updated_nor_deleted() {
    let api = api(Dra::RulesV1, true);
    // Someone's rule under the agent's name, without its labels; someone's rule for GPU 3;
    // the agent's label on another node's rule.
    let foreign = |name: &str, labels: Value, device: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
               "metadata": {"name": name, "labels": labels},
               "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE,
                                           "device": device},
                        "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}})
    };
    api.create_rule(foreign(
        "shmlink-gpu-node-7-gpu-7",
        json!({"team": "infra"}),
        "gpu-7",
    ))
    .unwrap();
    api.create_rule(foreign("gpu3-by-hand", json!({}), "gpu-3"))
        .unwrap();
    let other = json!({"app.kubernetes.io/managed-by": "shmlink", "shmlink.io/node": "gpu-node-8"});
    api.create_rule(foreign("shmlink-gpu-node-8-gpu-1", other, "gpu-1"))
        .unwrap();
    let before = api.rules();
    let mut k = Keeper::start(&api, Effect::NoExecute, Duration::from_millis(300));
    k.scan(&board(&[7]));
    eventually("the create tried", &api, || !api.rule_writes().is_empty()).await;
    k.scan(&board(&[]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    settle().await;
    assert_eq!(api.rules(), before, "every rule as it was");
    // The 409 was looked into: a rule of that name, not the agent's.
    assert!(
        api.requests().iter().any(|r| r.method == "GET"
            && r.path == "/apis/resource.k8s.io/v1/devicetaintrules/shmlink-gpu-node-7-gpu-7"),
        "whose rule it is, asked"
    );
    let writes = api.rule_writes();
    assert!(
        writes.iter().all(|w| w == "POST devicetaintrules"),
        "{writes:?}"
    );
    k.wait_in_force("NoExecute", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_36_cluster_with_the_gate_gets_v1beta2_rules_and_one_without_it_none() {
    let api = api(Dra::RulesV1beta2, true);
    let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
    k.scan(&board(&[7]));
    eventually("the rule", &api, || api.rules().len() == 1).await;
    assert_eq!(api.rules()[0]["apiVersion"], "resource.k8s.io/v1beta2");
    let posts: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.contains("devicetaintrules"))
        .map(|r| r.path)
        .collect();
    assert_eq!(posts, ["/apis/resource.k8s.io/v1beta2/devicetaintrules"]);

    let api = self::api(Dra::SlicesOnly, true);
    let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
    k.scan(&board(&[7]));
    eventually("discovery", &api, || {
        api.requests()
            .iter()
            .any(|r| r.path == "/apis/resource.k8s.io/v1beta2")
    })
    .await;
    settle().await;
    assert_eq!(api.rule_writes(), Vec::<String>::new());
    k.wait_in_force("None", 0.0).await;
    // Asked once, not on every resync.
    let asked = api
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/resource.k8s.io/v1")
        .count();
    assert_eq!(asked, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_its_rules_without_a_write_and_lifts_a_healed_gpus_after_the_hold()
{
    let api = api(Dra::RulesV1, true);
    // What the last run made: rules for GPUs 3 and 7.
    let hold = Duration::from_secs(2);
    {
        let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
        k.scan(&board(&[3, 7]));
        eventually("two rules", &api, || api.rules().len() == 2).await;
    }
    let writes = api.rule_writes().len();
    // The new run: GPU 7 is still bad, GPU 3 healed while the agent was away.
    let started = Instant::now();
    let mut k = Keeper::start(&api, Effect::None, hold);
    k.scan(&board(&[7]));
    settle().await;
    assert_eq!(api.rules().len(), 2, "GPU 3's rule kept within the hold");
    assert_eq!(api.rule_writes().len(), writes, "GPU 7's rule as it was");
    eventually("GPU 3's rule lifted", &api, || api.rules().len() == 1).await;
    assert!(started.elapsed() >= hold - Duration::from_millis(200));
    assert_eq!(names(&api), ["shmlink-gpu-node-7-gpu-7"]);
    assert_eq!(
        api.rule_writes()[writes..],
        ["DELETE shmlink-gpu-node-7-gpu-3"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_refuses_what_the_api_server_refuses() {
    let api = api(Dra::RulesV1, false);
    let good = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": "r1"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"},
                 "taint": {"key": "example.com/k", "value": "v", "effect": "None"}}});
    let stored = api.create_rule(good.clone()).unwrap();
    assert_eq!(stored["metadata"]["generation"], 1);
    assert!(stored["spec"]["taint"]["timeAdded"].is_string());
    let refused = |mut rule: Value, path: &[&str], v: Value| {
        let mut at = &mut rule;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = v;
        rule["metadata"]["name"] = json!("r2");
        api.create_rule(rule).unwrap_err()["code"].clone()
    };
    assert_eq!(
        refused(
            good.clone(),
            &["spec", "taint", "effect"],
            json!("PreferNoSchedule")
        ),
        422
    );
    assert_eq!(
        refused(
            good.clone(),
            &["spec", "taint", "value"],
            json!("has space")
        ),
        422
    );
    assert_eq!(
        refused(
            good.clone(),
            &["spec", "deviceSelector", "device"],
            json!("GPU_1")
        ),
        422
    );
    assert_eq!(
        refused(good.clone(), &["spec", "taint", "message"], json!("x")),
        422
    );
    assert_eq!(
        api.create_rule(good.clone()).unwrap_err()["reason"],
        "AlreadyExists"
    );

    // Through the client: an update without resourceVersion (v1), a stale one, a new effect.
    let ar = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceTaintRule"),
        "devicetaintrules",
    );
    let rules: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(client(&api), &ar);
    let pp = kube::api::PostParams::default();
    let mut obj: kube::core::DynamicObject = serde_json::from_value(stored.clone()).unwrap();
    obj.metadata.resource_version = None;
    let e = rules.replace("r1", &pp, &obj).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422), "{e}");
    obj.metadata.resource_version = Some("999999".into());
    let e = rules.replace("r1", &pp, &obj).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 409), "{e}");
    let mut changed = stored.clone();
    changed["spec"]["taint"]["effect"] = json!("NoExecute");
    let obj: kube::core::DynamicObject = serde_json::from_value(changed).unwrap();
    let after = rules.replace("r1", &pp, &obj).await.unwrap();
    assert_eq!(after.metadata.generation, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gpu_and_a_held_xid_take_their_gpus_out_too() {
    let api = api(Dra::RulesV1, true);
    let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
    let mut s = board(&[]);
    s.gpus[5].lost = true;
    s.xids = vec![shmlink::model::XidCount::on(2, 48, 1)];
    k.scan(&s);
    eventually("two rules", &api, || api.rules().len() == 2).await;
    let taints: Vec<(Value, Value)> = api
        .rules()
        .iter()
        .map(|r| {
            let t = &r["spec"];
            (
                t["deviceSelector"]["device"].clone(),
                t["taint"]["value"].clone(),
            )
        })
        .collect();
    assert_eq!(
        taints,
        [
            (json!("gpu-2"), json!("xid-48")),
            (json!("gpu-5"), json!("gpu-lost"))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_fails_is_counted_and_the_rule_made_once_it_answers() {
    let api = api(Dra::RulesV1, true);
    api.set_behaviour(common::kube_api::Behaviour::Fail500);
    let mut k = Keeper::start(&api, Effect::None, Duration::from_secs(3600));
    k.scan(&board(&[7]));
    let errors = || {
        let text = k.metrics.encode().unwrap();
        common::agent::sample(&text, "shmlink_gpu_device_taint_errors_total", &[]).unwrap_or(0.0)
    };
    eventually("errors counted", &api, || errors() >= 2.0).await;
    assert!(api.rules().is_empty());
    api.set_behaviour(common::kube_api::Behaviour::Normal);
    eventually("the rule", &api, || api.rules().len() == 1).await;
}

/// MIG on GPU 7: NVIDIA's driver lists its MIG devices (parentUUID = GPU 7's UUID), not the
/// GPU; the blamed GPU's MIG devices each get a rule the server validates, and are lifted with
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blamed_gpu_with_mig_on_takes_each_of_its_mig_devices_out() {
    let api = api(Dra::RulesV1, false);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/dra/resourceslice-8gpu-mig-v1.json"
    );
    let mut slice: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for d in slice["spec"]["devices"].as_array_mut().unwrap() {
        let name = d["name"].as_str().unwrap().to_string();
        if let Some(i) = name.strip_prefix("gpu-").filter(|n| n.len() == 1) {
            d["attributes"]["uuid"] = json!({"string": format!("GPU-{i}")});
        } else {
            d["attributes"]["parentUUID"] = json!({"string": "GPU-7"});
        }
    }
    api.apply_slice(slice);
    let mut k = Keeper::start(&api, Effect::NoSchedule, Duration::from_millis(300));
    k.scan(&board(&[7]));
    eventually("two MIG rules", &api, || api.rules().len() == 2).await;
    let rule = api
        .rule("shmlink-gpu-node-7-gpu-7-mig-1")
        .expect("the second MIG device's rule");
    println!("{}", serde_json::to_string_pretty(&rule).unwrap());
    assert_eq!(
        rule["spec"]["deviceSelector"],
        json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-7-mig-1g10gb-19-1"})
    );
    assert_eq!(rule["spec"]["taint"]["effect"], "NoSchedule");
    assert!(rule["spec"]["taint"]["timeAdded"].is_string());
    assert_eq!(
        names(&api),
        [
            "shmlink-gpu-node-7-gpu-7-mig-0",
            "shmlink-gpu-node-7-gpu-7-mig-1"
        ]
    );
    k.wait_in_force("NoSchedule", 2.0).await;
    // Healthy past the hold: both lifted.
    k.scan(&board(&[]));
    tokio::time::sleep(Duration::from_millis(400)).await;
    k.scan(&board(&[]));
    eventually("both lifted", &api, || api.rules().is_empty()).await;
}

//! The admission webhook's DRA lookup through the real `kube` client against the in-process API
//! server: a Pod whose GPUs come from a ResourceClaimTemplate of NVIDIA's `gpu.nvidia.com`
//! DeviceClass is judged as a GPU Pod (warned on the runtime's 64Mi /dev/shm); a claim of another
//! class is not; a refused or unserved lookup is said to the user, never called fit. No root.

use crate::common;

use common::kube_api::{Dra, FakeApi};
use serde_json::{json, Value};
use shmlink::admit::dra::DraView;
use shmlink::admit::dra_lookup::DraResolver;
use shmlink::admit::review::answer_with;
use shmlink::admit::{Mode, Outcome};
use shmlink::cli::DRA_GPU_DRIVERS as GPU_DRIVERS;

fn client(api: &FakeApi) -> kube::Client {
    kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap()
}

fn resolver(api: &FakeApi) -> DraResolver {
    DraResolver::new(client(api), GPU_DRIVERS.map(String::from).to_vec())
}

/// The pytorch-8gpu fixture's Pod with its GPUs from a DRA claim (template `template`).
fn review(template: &str) -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/admission/pytorch-8gpu.json"
    );
    let mut review: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let pod = &mut review["request"]["object"];
    let trainer = &mut pod["spec"]["containers"][0];
    for which in ["requests", "limits"] {
        trainer["resources"][which]
            .as_object_mut()
            .map(|r| r.remove("nvidia.com/gpu"));
    }
    trainer["resources"]["claims"] = json!([{"name": "gpus"}]);
    pod["spec"]["resourceClaims"] =
        json!([{"name": "gpus", "resourceClaimTemplateName": template}]);
    serde_json::to_vec(&review).unwrap()
}

/// NVIDIA's DRA driver's classes and two templates in namespace `ml` (the fixture's).
fn cluster(mode: Dra) -> FakeApi {
    let api = FakeApi::start();
    api.set_dra(mode);
    let class = |name: &str, expression: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
               "spec": {"selectors": [{"cel": {"expression": expression}}]}})
    };
    api.apply_dra_object("deviceclasses", class("gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"));
    api.apply_dra_object("deviceclasses", class("compute-domain-default-channel.nvidia.com",
        "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel'"));
    let template = |name: &str, class: &str, count: u64| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": name, "namespace": "ml"},
               "spec": {"spec": {"devices": {"requests": [
                   {"name": "gpu", "exactly": {"deviceClassName": class, "count": count}}]}}}})
    };
    api.apply_dra_object(
        "resourceclaimtemplates",
        template("eight-gpus", "gpu.nvidia.com", 8),
    );
    api.apply_dra_object(
        "resourceclaimtemplates",
        template("channel", "compute-domain-default-channel.nvidia.com", 1),
    );
    api
}

fn warnings(body: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(body).unwrap();
    v["response"]["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_claim_gives_gpus_is_warned_and_one_whose_claim_does_not_is_not() {
    let api = cluster(Dra::RulesV1);
    let r = resolver(&api);
    let body = review("eight-gpus");
    let view = r.resolve(&body).await;
    assert_eq!(view.gpus.get("gpus"), Some(&8), "{view:?}");
    let a = answer_with(&body, Mode::Warn, &view);
    assert_eq!(a.outcome, Outcome::Warned);
    let w = warnings(&a.body);
    println!(
        "the DRA Pod {} in warn mode: {w:#?}",
        a.pod.as_deref().unwrap_or("?")
    );
    assert!(
        w[0].starts_with(
            "shmlink: container \"trainer\" uses GPUs and gets the runtime's 64Mi /dev/shm"
        ),
        "{w:?}"
    );
    // Cached: the same Pod again costs no lookup.
    let asked = api.requests().len();
    assert_eq!(r.resolve(&body).await, view);
    assert_eq!(api.requests().len(), asked);
    // A compute domain's channel is no GPU.
    let channel = review("channel");
    let view = r.resolve(&channel).await;
    assert_eq!(view, DraView::default());
    assert_eq!(
        answer_with(&channel, Mode::Warn, &view).outcome,
        Outcome::NoGpu
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_refused_missing_or_not_served_is_said_not_called_fit() {
    let api = cluster(Dra::SlicesOnly);
    api.forbid(
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates",
    );
    let view = resolver(&api).resolve(&review("eight-gpus")).await;
    assert_eq!(view.unknown.len(), 1, "{view:?}");
    assert_eq!(
        view.unknown[0].1,
        "ResourceClaimTemplate ml/eight-gpus: forbidden (RBAC: get resourceclaimtemplates.resource.k8s.io)"
    );
    let a = answer_with(&review("eight-gpus"), Mode::Warn, &view);
    assert!(warnings(&a.body)[0]
        .starts_with("shmlink: could not tell whether the resource claims \"gpus\""));
    let view = resolver(&cluster(Dra::SlicesOnly))
        .resolve(&review("gone"))
        .await;
    assert_eq!(view.unknown[0].1, "ResourceClaimTemplate ml/gone not found");
    let absent = cluster(Dra::Absent);
    let view = resolver(&absent).resolve(&review("eight-gpus")).await;
    assert_eq!(
        view.unknown[0].1,
        "ResourceClaimTemplate ml/eight-gpus: resource.k8s.io is not served"
    );
}

use serde_json::{json, Value};

use super::*;
use crate::admit::review::answer_with;
use crate::admit::{Mode, Outcome};
use crate::cli::DRA_GPU_DRIVERS as GPU_DRIVERS;

/// NVIDIA's DeviceClasses as its DRA driver's chart installs them.
fn class(name: &str, expression: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
           "spec": {"selectors": [{"cel": {"expression": expression}}]}})
}

fn drivers() -> Vec<String> {
    GPU_DRIVERS.iter().map(|d| d.to_string()).collect()
}

#[test]
fn a_device_class_is_a_gpu_class_when_its_selector_names_a_gpu_driver() {
    let gpu = class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    );
    let mig = class(
        "mig.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    );
    let channel = class(
        "compute-domain-default-channel.nvidia.com",
        "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel'",
    );
    let amd = class("gpu.amd.com", "\"gpu.amd.com\" == device.driver");
    assert!(class_is_gpu(&gpu, &drivers()));
    assert!(class_is_gpu(&mig, &drivers()));
    assert!(class_is_gpu(&amd, &drivers()));
    assert!(!class_is_gpu(&channel, &drivers()));
    assert!(!class_is_gpu(&json!({"spec": "odd"}), &drivers()));
}

#[test]
fn a_claims_requests_in_v1_and_v1beta1_shapes() {
    // v1 (NVIDIA's quickstart gpu-test2: one GPU from a template).
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "more", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}},
            {"name": "any", "firstAvailable": [{"name": "a", "deviceClassName": "mig.nvidia.com"}]},
            {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}});
    let r = requests(&template);
    let counts: Vec<(&str, Option<u64>)> = r.iter().map(|r| (r.class.as_str(), r.count)).collect();
    assert_eq!(
        counts,
        [
            ("gpu.nvidia.com", Some(1)),
            ("gpu.nvidia.com", Some(3)),
            ("mig.nvidia.com", Some(1)),
            ("gpu.nvidia.com", None)
        ]
    );
    assert_eq!(
        DraView::count(&r, |c| c == "gpu.nvidia.com"),
        1 + 3 + ALL_GPUS
    );
    // v1beta1: a claim, the class on the request itself.
    let claim = json!({"spec": {"devices": {"requests": [
        {"name": "gpus", "deviceClassName": "gpu.amd.com", "count": 2}]}}});
    assert_eq!(
        requests(&claim),
        [DeviceRequest {
            class: "gpu.amd.com".into(),
            count: Some(2)
        }]
    );
    assert_eq!(requests(&json!({"spec": 7})), []);
}

/// The pytorch-8gpu fixture's Pod getting its 8 GPUs through a DRA claim instead of
/// `nvidia.com/gpu` (NVIDIA's quickstart's shape: a template named in `resourceClaims`, the
/// container listing the claim).
fn dra_review() -> Value {
    let text = include_str!("../../../tests/fixtures/admission/pytorch-8gpu.json");
    let mut review: Value = serde_json::from_str(text).unwrap();
    let pod = &mut review["request"]["object"];
    let trainer = &mut pod["spec"]["containers"][0];
    for which in ["requests", "limits"] {
        if let Some(r) = trainer["resources"][which].as_object_mut() {
            r.remove("nvidia.com/gpu");
        }
    }
    trainer["resources"]["claims"] = json!([{"name": "gpus"}]);
    pod["spec"]["resourceClaims"] =
        json!([{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]);
    review
}

fn warnings(a: &crate::admit::review::Answer) -> Vec<String> {
    let body: Value = serde_json::from_slice(&a.body).unwrap();
    body["response"]["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn a_pod_with_a_gpu_claim_is_judged_as_a_gpu_pod_and_one_without_the_lookup_is_not_called_fit() {
    let review = serde_json::to_vec(&dra_review()).unwrap();
    assert_eq!(
        claims(&dra_review()["request"]["object"]),
        [PodClaim {
            name: "gpus".into(),
            source: ClaimSource::Template("eight-gpus".into()),
        }]
    );
    // Without a lookup: its trainer has no device-plugin GPU.
    let plain = answer_with(&review, Mode::Warn, &DraView::default());
    assert_eq!(plain.outcome, Outcome::NoGpu);
    let view = DraView {
        gpus: [("gpus".to_string(), 8)].into(),
        unknown: Vec::new(),
    };
    let warned = answer_with(&review, Mode::Warn, &view);
    assert_eq!(warned.outcome, Outcome::Warned);
    let w = warnings(&warned);
    assert!(
        w[0].starts_with(
            "shmlink: container \"trainer\" uses GPUs and gets the runtime's 64Mi /dev/shm"
        ),
        "{w:?}"
    );
    println!("DRA Pod, warn mode: {w:?}");
    // Mutate: the patch is for the Pod as it came; the marker never leaves the decision.
    let mutated = answer_with(&review, Mode::Mutate, &view);
    assert_eq!(mutated.outcome, Outcome::Mutated);
    let body: Value = serde_json::from_slice(&mutated.body).unwrap();
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(body["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(!patch.contains(DRA_GPUS_KEY), "{patch}");
    assert!(patch.contains("shmlink-dshm"), "{patch}");
    // A claim the server could not tell about: said, not called fit.
    let unknown = DraView {
        gpus: Default::default(),
        unknown: vec![(
            "gpus".into(),
            "ResourceClaimTemplate ml/eight-gpus: forbidden".into(),
        )],
    };
    let said = answer_with(&review, Mode::Warn, &unknown);
    assert_eq!(said.outcome, Outcome::NoGpu);
    assert_eq!(
        warnings(&said),
        ["shmlink: could not tell whether the resource claims \"gpus\" (ResourceClaimTemplate ml/eight-gpus: forbidden) give GPUs; /dev/shm was not checked for them"]
    );
}

#[test]
fn only_the_containers_that_list_a_gpu_claim_get_its_gpus() {
    let pod = json!({"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "shared"},
                                                  {"name": "nic", "resourceClaimName": "rdma"}],
        "containers": [{"name": "a", "resources": {"claims": [{"name": "gpus"}, {"name": "nic"}]}},
                       {"name": "b", "resources": {"claims": [{"name": "nic"}]}},
                       {"name": "c"}]}});
    let view = DraView {
        gpus: [("gpus".to_string(), 2)].into(),
        unknown: Vec::new(),
    };
    let copy = marked(&pod, &view).unwrap();
    let gpus: Vec<u64> = (0..3)
        .map(|i| crate::admit::pod::gpus(&copy["spec"]["containers"][i]))
        .collect();
    assert_eq!(gpus, [2, 0, 0]);
    assert_eq!(marked(&pod, &DraView::default()), None);
}

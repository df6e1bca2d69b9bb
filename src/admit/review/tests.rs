use super::*;

fn review(request: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "request": request}),
    )
    .unwrap()
}

fn pod_request(object: Value) -> Value {
    json!({"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"},
           "operation": "CREATE", "namespace": "ml", "object": object})
}

fn body(a: &Answer) -> Value {
    serde_json::from_slice(&a.body).unwrap()
}

#[test]
fn what_is_not_an_admission_review_is_a_400_saying_why() {
    for (input, says) in [
        (&b"{not json"[..], "not JSON"),
        (b"{}", "no request"),
        (b"{\"request\": {\"kind\": {}}}", "without a uid"),
        (b"{\"request\": {\"uid\": \"\"}}", "without a uid"),
        (b"[1,2]", "no request"),
    ] {
        let a = answer(input, Mode::Mutate);
        assert_eq!((a.status, a.outcome), (400, Outcome::Error));
        assert!(body(&a)["error"].as_str().unwrap().contains(says), "{a:?}");
    }
}

#[test]
fn an_unreadable_pod_is_let_through_with_a_warning() {
    for object in [
        json!(null),
        json!("pod"),
        json!({"spec": 3}),
        json!({"spec": {}}),
    ] {
        let a = answer(&review(pod_request(object)), Mode::Mutate);
        assert_eq!((a.status, a.outcome), (200, Outcome::Error));
        let r = &body(&a)["response"];
        assert_eq!(r["allowed"], json!(true));
        assert_eq!(r["uid"], json!("u-1"));
        assert!(r.get("patch").is_none());
        assert!(r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("admitted unchanged"));
    }
}

#[test]
fn anything_but_a_pod_create_passes_unchanged() {
    let gpu_pod = json!({"spec": {"containers": [{"name": "t",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let mut status = pod_request(gpu_pod.clone());
    status["subResource"] = json!("status");
    let mut update = pod_request(gpu_pod.clone());
    update["operation"] = json!("UPDATE");
    let mut deploy = pod_request(gpu_pod);
    deploy["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    deploy["resource"] = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    for request in [status, update, deploy] {
        let a = answer(&review(request), Mode::Mutate);
        assert_eq!(a.outcome, Outcome::NotPod, "{}", a.summary);
        assert_eq!(body(&a)["response"], json!({"uid": "u-1", "allowed": true}));
    }
}

#[test]
fn the_answer_speaks_the_requests_version_and_carries_a_base64_patch() {
    let pod = json!({"metadata": {"generateName": "train-"}, "spec": {"containers": [{"name": "t",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let mut raw: Value = serde_json::from_slice(&review(pod_request(pod))).unwrap();
    raw["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let a = answer(&serde_json::to_vec(&raw).unwrap(), Mode::Mutate);
    assert_eq!(a.outcome, Outcome::Mutated);
    assert_eq!(a.pod.as_deref(), Some("ml/train-*"));
    let b = body(&a);
    assert_eq!(b["apiVersion"], json!("admission.k8s.io/v1beta1"));
    assert_eq!(b["response"]["patchType"], json!("JSONPatch"));
    let patch = BASE64
        .decode(b["response"]["patch"].as_str().unwrap())
        .unwrap();
    let ops: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(ops[0]["path"], json!("/spec/volumes"));
}

/// A Pod whose kept part passes `parse::BUDGET` is read again for its names and counts only,
/// and let through unchanged with the one warning that says why; opted out, it is left alone.
#[test]
fn a_pod_too_large_to_read_is_let_through_with_one_warning() {
    let containers: Vec<Value> = (0..20_000)
        .map(|i| json!({"name": format!("c{i}"), "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
        .collect();
    let mut object = json!({"metadata": {"name": "crowd"}, "spec": {"containers": containers}});
    let a = answer(&review(pod_request(object.clone())), Mode::Mutate);
    assert_eq!((a.status, a.outcome), (200, Outcome::Warned));
    assert_eq!(a.pod.as_deref(), Some("ml/crowd"));
    let response = &body(&a)["response"];
    assert_eq!(response["uid"], "u-1");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    assert_eq!(
        response["warnings"],
        json!(["shmlink: this Pod has 20000 containers, more than the 128 the webhook judges: admitted unchanged. Run `shmlink preflight` in its GPU containers to check their /dev/shm"])
    );
    object["metadata"]["annotations"] = json!({"shmlink.io/admission": "off"});
    let a = answer(&review(pod_request(object)), Mode::Mutate);
    assert_eq!(a.outcome, Outcome::OptedOut);
    assert!(body(&a)["response"].get("warnings").is_none());
}

//! `resource.k8s.io`: discovery per version as a cluster of each release serves it, the node's
//! ResourceSlices (list by `spec.nodeName`), and DeviceTaintRules with the API server's
//! semantics: the 1.37 schema (an unknown field is refused, as `fieldValidation=Strict` would)
//! and validation (names, selector, key, value, effect), `uid`, `resourceVersion` and
//! `generation` (1 on create, +1 per spec change), `timeAdded` defaulted (and reset when the
//! effect changes), status cleared on create and kept on update, `resourceVersion` required on
//! a v1 update and a stale one a 409, AlreadyExists, NotFound, and delete preconditions.

use axum::body::Body;
use axum::http::{Method, Response, StatusCode};
use serde_json::{json, Map, Value};

use super::routing::{query_param, respond, status_body};
use super::{FakeApi, State};

/// What the cluster serves of `resource.k8s.io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dra {
    /// No DRA at all (1.33 without the gates): the group is not served.
    #[default]
    Absent,
    /// 1.36 as installed: slices in v1 and v1beta2, no DeviceTaintRule (beta, off by default).
    SlicesOnly,
    /// 1.36 with the gate and runtime-config: rules only in v1beta2.
    RulesV1beta2,
    /// 1.37: rules in v1 (and v1beta2).
    RulesV1,
}

impl Dra {
    fn serves(self, version: &str, resource: &str) -> bool {
        match (self, version, resource) {
            (Dra::Absent, _, _) => false,
            (_, "v1" | "v1beta2", "resourceslices") => true,
            (Dra::RulesV1, "v1" | "v1beta2", "devicetaintrules") => true,
            (Dra::RulesV1beta2, "v1beta2", "devicetaintrules") => true,
            _ => false,
        }
    }
}

#[derive(Default)]
pub(super) struct DraState {
    pub(super) mode: Dra,
    slices: std::collections::BTreeMap<String, Value>,
    rules: std::collections::BTreeMap<String, Value>,
    /// ResourceClaimTemplates, ResourceClaims (by namespace) and DeviceClasses, for GETs.
    objects: std::collections::BTreeMap<(String, String, String), Value>,
    uids: u64,
}

/// The kinds `FakeApi::apply_dra_object` stores: namespaced or not.
const CLAIM_KINDS: [(&str, bool); 3] = [
    ("resourceclaimtemplates", true),
    ("resourceclaims", true),
    ("deviceclasses", false),
];

/// NVIDIA's DRA driver's ResourceSlice of the 8-GPU node `gpu-node-7`, as the fixture has it.
pub fn slice_8gpu() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/dra/resourceslice-8gpu-v1.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

impl FakeApi {
    /// A server with the kubelet's Node `node`, DeviceTaintRules served (v1) and the 8-GPU
    /// node's ResourceSlice.
    pub fn with_dra_rules(node: &str) -> FakeApi {
        let api = FakeApi::start();
        api.apply_node(super::kubelet_node(node));
        api.set_dra(Dra::RulesV1);
        api.apply_slice(slice_8gpu());
        api
    }

    pub fn set_dra(&self, mode: Dra) {
        self.state().dra.mode = mode;
    }

    /// Stores a ResourceSlice as a DRA driver publishes it.
    pub fn apply_slice(&self, slice: Value) {
        let name = slice["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        self.state().dra.slices.insert(name, slice);
    }

    /// Stores a ResourceClaimTemplate, ResourceClaim or DeviceClass (`plural`), served to GETs
    /// at every version the cluster serves slices at.
    pub fn apply_dra_object(&self, plural: &str, object: Value) {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = object["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        self.state()
            .dra
            .objects
            .insert((plural.to_string(), ns, name), object);
    }

    /// Every DeviceTaintRule the server holds, by name.
    pub fn rules(&self) -> Vec<Value> {
        self.state().dra.rules.values().cloned().collect()
    }

    pub fn rule(&self, name: &str) -> Option<Value> {
        self.state().dra.rules.get(name).cloned()
    }

    /// Stores a rule as another client made it (validated as a create).
    pub fn create_rule(&self, rule: Value) -> Result<Value, Value> {
        let mut s = self.state();
        create(&mut s, "v1", rule).map_err(|(_, status)| status)
    }

    /// Writes to DeviceTaintRules the server got (`METHOD name`), answered or not.
    pub fn rule_writes(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET" && r.path.contains("/devicetaintrules"))
            .map(|r| {
                let name = r.path.rsplit('/').next().unwrap_or_default();
                format!("{} {name}", r.method)
            })
            .collect()
    }
}

type Failed = (StatusCode, Value);

fn fail(code: StatusCode, reason: &str, message: &str) -> Failed {
    (code, status_body(code.as_u16(), reason, message))
}

fn answer(result: Result<Value, Failed>) -> Response<Body> {
    match result {
        Ok(v) => respond(StatusCode::OK, &v),
        Err((code, body)) => respond(code, &body),
    }
}

/// Requests under /apis/resource.k8s.io; None for a path it does not serve.
pub(super) fn route(
    s: &mut State,
    method: &Method,
    rest: &[&str],
    query: &str,
    body: Value,
) -> Option<Response<Body>> {
    let mode = s.dra.mode;
    let not_found = || {
        fail(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let served = |v: &str, r: &str| mode.serves(v, r);
    if let Some(answer) = claim_object(s, method, rest) {
        return Some(answer);
    }
    let out = match (method, rest) {
        (&Method::GET, [v]) => {
            if !served(v, "resourceslices") {
                return Some(answer(Err(not_found())));
            }
            Ok(discovery(mode, v))
        }
        (_, [v, r, ..]) if !served(v, r) => Err(not_found()),
        (&Method::GET, [v, "resourceslices"]) => Ok(list_slices(s, v, query)),
        (&Method::GET, [v, "devicetaintrules"]) => Ok(list_rules(s, v, query)),
        (&Method::POST, [v, "devicetaintrules"]) => create(s, v, body),
        (&Method::GET, [_, "devicetaintrules", name]) => {
            s.dra.rules.get(*name).cloned().ok_or_else(not_found)
        }
        (&Method::PUT, [v, "devicetaintrules", name]) => update(s, v, name, body),
        (&Method::DELETE, [_, "devicetaintrules", name]) => delete(s, name, &body),
        _ => return None,
    };
    Some(answer(out))
}

/// GET of a stored ResourceClaimTemplate, ResourceClaim or DeviceClass (v1 and v1beta2 where
/// the cluster serves DRA); the object's own 404 names it, as the API server's does.
fn claim_object(s: &State, method: &Method, rest: &[&str]) -> Option<Response<Body>> {
    let (version, plural, ns, name) = match rest {
        [v, "namespaces", ns, r, name] => (*v, *r, *ns, *name),
        [v, r, name] => (*v, *r, "", *name),
        _ => return None,
    };
    let namespaced = CLAIM_KINDS.iter().find(|(k, _)| *k == plural)?.1;
    if method != Method::GET || namespaced == ns.is_empty() {
        return None;
    }
    if !s.dra.mode.serves(version, "resourceslices") {
        return Some(answer(Err(fail(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ))));
    }
    let key = (plural.to_string(), ns.to_string(), name.to_string());
    Some(answer(match s.dra.objects.get(&key) {
        Some(o) => Ok(as_version(o.clone(), version)),
        None => Err(fail(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{plural}.resource.k8s.io \"{name}\" not found"),
        )),
    }))
}

fn discovery(mode: Dra, version: &str) -> Value {
    let mut resources = vec![
        json!({"name": "resourceslices", "singularName": "resourceslice",
        "namespaced": false, "kind": "ResourceSlice",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}),
    ];
    if mode.serves(version, "devicetaintrules") {
        let verbs = json!(["create", "delete", "get", "list", "patch", "update", "watch"]);
        resources.push(
            json!({"name": "devicetaintrules", "singularName": "devicetaintrule",
            "namespaced": false, "kind": "DeviceTaintRule", "verbs": verbs}),
        );
        resources.push(
            json!({"name": "devicetaintrules/status", "singularName": "",
            "namespaced": false, "kind": "DeviceTaintRule", "verbs": ["get", "patch", "update"]}),
        );
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1",
           "groupVersion": format!("resource.k8s.io/{version}"), "resources": resources})
}

fn as_version(mut o: Value, version: &str) -> Value {
    o["apiVersion"] = json!(format!("resource.k8s.io/{version}"));
    o
}

fn list_slices(s: &State, version: &str, query: &str) -> Value {
    let node = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("spec.nodeName=").map(str::to_string));
    let items: Vec<Value> = s
        .dra
        .slices
        .values()
        .filter(|o| node.as_deref().is_none_or(|n| o["spec"]["nodeName"] == n))
        .map(|o| as_version(o.clone(), version))
        .collect();
    json!({"kind": "ResourceSliceList", "apiVersion": format!("resource.k8s.io/{version}"),
           "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})
}

fn list_rules(s: &State, version: &str, query: &str) -> Value {
    let selector = query_param(query, "labelSelector").unwrap_or_default();
    let wanted: Vec<(&str, &str)> = selector
        .split(',')
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let items: Vec<Value> = s
        .dra
        .rules
        .values()
        .filter(|o| {
            wanted
                .iter()
                .all(|(k, v)| o["metadata"]["labels"][*k].as_str() == Some(*v))
        })
        .map(|o| as_version(o.clone(), version))
        .collect();
    json!({"kind": "DeviceTaintRuleList", "apiVersion": format!("resource.k8s.io/{version}"),
           "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})
}

fn now() -> String {
    super::finished_now()
}

fn create(s: &mut State, version: &str, mut rule: Value) -> Result<Value, Failed> {
    validate(&rule, None)?;
    let name = rule["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if s.dra.rules.contains_key(&name) {
        let message = format!("devicetaintrules.resource.k8s.io \"{name}\" already exists");
        return Err(fail(StatusCode::CONFLICT, "AlreadyExists", &message));
    }
    s.rv += 1;
    s.dra.uids += 1;
    let meta = &mut rule["metadata"];
    meta["uid"] = json!(format!("rule-uid-{}", s.dra.uids));
    meta["resourceVersion"] = json!(s.rv.to_string());
    meta["generation"] = json!(1);
    meta["creationTimestamp"] = json!(now());
    if rule["spec"]["taint"]["timeAdded"].is_null() {
        rule["spec"]["taint"]["timeAdded"] = json!(now());
    }
    if let Some(o) = rule.as_object_mut() {
        o.remove("status");
    }
    let rule = as_version(rule, version);
    s.dra.rules.insert(name, rule.clone());
    Ok(rule)
}

fn update(s: &mut State, version: &str, name: &str, mut rule: Value) -> Result<Value, Failed> {
    let Some(old) = s.dra.rules.get(name).cloned() else {
        let message = format!("devicetaintrules.resource.k8s.io \"{name}\" not found");
        return Err(fail(StatusCode::NOT_FOUND, "NotFound", &message));
    };
    validate(&rule, Some(&old))?;
    let rv = rule["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    // v1 allows no unconditional update (v1beta2 does, as it always did).
    if rv.is_empty() && version == "v1" {
        let message =
            "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update";
        return Err(fail(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message));
    }
    if !rv.is_empty() && rv != old["metadata"]["resourceVersion"] {
        let message = format!(
            "Operation cannot be fulfilled on devicetaintrules.resource.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        );
        return Err(fail(StatusCode::CONFLICT, "Conflict", &message));
    }
    for field in ["uid", "creationTimestamp"] {
        rule["metadata"][field] = old["metadata"][field].clone();
    }
    let old_taint = &old["spec"]["taint"];
    let taint = &mut rule["spec"]["taint"];
    if taint["timeAdded"].is_null()
        || (taint["effect"] != old_taint["effect"] && taint["timeAdded"] == old_taint["timeAdded"])
    {
        taint["timeAdded"] = json!(now());
    }
    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
    let changed = rule["spec"] != old["spec"];
    rule["metadata"]["generation"] = json!(generation + i64::from(changed));
    rule["status"] = old["status"].clone();
    if rule["status"].is_null() {
        rule.as_object_mut().map(|o| o.remove("status"));
    }
    s.rv += 1;
    rule["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    let rule = as_version(rule, version);
    s.dra.rules.insert(name.to_string(), rule.clone());
    Ok(rule)
}

fn delete(s: &mut State, name: &str, options: &Value) -> Result<Value, Failed> {
    let Some(old) = s.dra.rules.get(name) else {
        let message = format!("devicetaintrules.resource.k8s.io \"{name}\" not found");
        return Err(fail(StatusCode::NOT_FOUND, "NotFound", &message));
    };
    let pre = &options["preconditions"];
    for field in ["uid", "resourceVersion"] {
        if !pre[field].is_null() && pre[field] != old["metadata"][field] {
            let message = format!(
                "Operation cannot be fulfilled on devicetaintrules.resource.k8s.io \"{name}\": Precondition failed: {field}"
            );
            return Err(fail(StatusCode::CONFLICT, "Conflict", &message));
        }
    }
    s.rv += 1;
    Ok(s.dra.rules.remove(name).unwrap_or_default())
}

/// The 1.37 DeviceTaintRule's fields, by the path of the object holding them.
fn fields(path: &str) -> &'static [&'static str] {
    match path {
        "" => &["apiVersion", "kind", "metadata", "spec", "status"],
        "metadata" => &[
            "name",
            "generateName",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "managedFields",
            "selfLink",
        ],
        "metadata.ownerReferences[]" => &[
            "apiVersion",
            "kind",
            "name",
            "uid",
            "controller",
            "blockOwnerDeletion",
        ],
        "spec" => &["deviceSelector", "taint"],
        "spec.deviceSelector" => &["driver", "pool", "device"],
        "spec.taint" => &["key", "value", "effect", "timeAdded"],
        "status" => &["conditions"],
        _ => &[],
    }
}

/// Unknown fields anywhere in the parts of the schema above.
fn unknown_fields(v: &Value, path: &str, out: &mut Vec<String>) {
    let Some(o) = v.as_object() else {
        return;
    };
    let known = fields(path);
    for (k, child) in o {
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if !known.contains(&k.as_str()) {
            out.push(here);
            continue;
        }
        if matches!(
            k.as_str(),
            "labels" | "annotations" | "managedFields" | "conditions"
        ) {
            continue;
        }
        match child {
            Value::Array(items) => {
                for item in items {
                    unknown_fields(item, &format!("{here}[]"), out);
                }
            }
            Value::Object(_) => unknown_fields(child, &here, out),
            _ => {}
        }
    }
}

fn invalid(errors: Vec<String>) -> Failed {
    let message = format!(
        "DeviceTaintRule.resource.k8s.io is invalid: {}",
        errors.join(", ")
    );
    let mut body = status_body(422, "Invalid", &message);
    body["details"] = json!({"kind": "devicetaintrules", "group": "resource.k8s.io",
        "causes": errors.iter().map(|e| json!({"message": e})).collect::<Vec<_>>()});
    (StatusCode::UNPROCESSABLE_ENTITY, body)
}

/// The API server's validation of a rule (a create, or an update of `old`).
fn validate(rule: &Value, old: Option<&Value>) -> Result<(), Failed> {
    let mut errors = Vec::new();
    unknown_fields(rule, "", &mut errors);
    let mut errors: Vec<String> = errors
        .into_iter()
        .map(|f| format!("{f}: unknown field"))
        .collect();
    let meta = &rule["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    if !is_subdomain(name) {
        errors.push(format!(
            "metadata.name: Invalid value: {name:?}: a DNS-1123 subdomain"
        ));
    }
    if old.is_some_and(|o| o["metadata"]["uid"] != meta["uid"] && !meta["uid"].is_null()) {
        errors.push("metadata.uid: Invalid value: field is immutable".into());
    }
    for (k, v) in meta["labels"].as_object().unwrap_or(&Map::new()) {
        if !is_qualified(k) || !v.as_str().is_some_and(is_label_value) {
            errors.push(format!("metadata.labels: Invalid value: {k}={v}"));
        }
    }
    let sel = &rule["spec"]["deviceSelector"];
    let check = |field: &str, ok: fn(&str) -> bool, errors: &mut Vec<String>| {
        if let Some(v) = sel.get(field) {
            if !v.as_str().is_some_and(ok) {
                errors.push(format!("spec.deviceSelector.{field}: Invalid value: {v}"));
            }
        }
    };
    check(
        "driver",
        |d| d.len() <= 63 && is_subdomain(&d.to_lowercase()),
        &mut errors,
    );
    check(
        "pool",
        |p| p.len() <= 253 && p.split('/').all(is_subdomain),
        &mut errors,
    );
    check("device", is_dns_label, &mut errors);
    let taint = &rule["spec"]["taint"];
    if !taint["key"].as_str().is_some_and(is_qualified) {
        errors.push(format!("spec.taint.key: Invalid value: {}", taint["key"]));
    }
    if !taint["value"].is_null() && !taint["value"].as_str().is_some_and(is_label_value) {
        errors.push(format!(
            "spec.taint.value: Invalid value: {}",
            taint["value"]
        ));
    }
    let effect_changed = old.is_none_or(|o| o["spec"]["taint"]["effect"] != taint["effect"]);
    let effects = ["None", "NoSchedule", "NoExecute"];
    if effect_changed
        && !taint["effect"]
            .as_str()
            .is_some_and(|e| effects.contains(&e))
    {
        errors.push(format!(
            "spec.taint.effect: Unsupported value: {}: supported values: \"NoExecute\", \"NoSchedule\", \"None\"",
            taint["effect"]
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(invalid(errors))
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends (or empty).
fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// A label key: an optional DNS subdomain prefix and `/`, then a non-empty label value.
fn is_qualified(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_subdomain) && !name.is_empty() && is_label_value(name)
}

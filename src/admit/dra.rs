//! Pure: a Pod that gets GPUs through Dynamic Resource Allocation. Its `spec.resourceClaims`
//! name ResourceClaims or ResourceClaimTemplates; a container uses a claim it lists in
//! `resources.claims`. Whether a claim gives GPUs is in objects the admission request does not
//! carry (the claim or template's requests and their DeviceClasses), so the server looks them
//! up (`dra_lookup`) and hands the answer here as a [`DraView`]: the GPU count of each of the
//! Pod's claims, and the claims it could not tell about.
//!
//! The decision reads a container's GPUs with `pod::gpus`; a GPU claim's count is attached to
//! the containers that use it under [`DRA_GPUS_KEY`], a key no Kubernetes object has, in the
//! copy of the Pod the decision reads (the patch's paths are the same in the Pod as it came).

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// Where the count of GPUs a container gets through its claims is put for `pod::gpus`.
pub const DRA_GPUS_KEY: &str = "shmlink.io/dra-gpus";

/// Where one of the Pod's claims comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimSource {
    /// An existing ResourceClaim (`resourceClaimName`).
    Claim(String),
    /// A claim made per Pod from a ResourceClaimTemplate (`resourceClaimTemplateName`).
    Template(String),
}

/// One entry of the Pod's `spec.resourceClaims`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub name: String,
    pub source: ClaimSource,
}

/// The Pod's claims (entries without a name or a source are left out).
pub fn claims(pod: &Value) -> Vec<PodClaim> {
    let list = pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .filter_map(|c| {
            let name = c.get("name")?.as_str()?.to_string();
            let source = match (
                c.get("resourceClaimName").and_then(Value::as_str),
                c.get("resourceClaimTemplateName").and_then(Value::as_str),
            ) {
                (Some(n), _) => ClaimSource::Claim(n.to_string()),
                (None, Some(t)) => ClaimSource::Template(t.to_string()),
                (None, None) => return None,
            };
            Some(PodClaim { name, source })
        })
        .collect()
}

/// One request of a claim: the DeviceClass it asks from and how many devices (`All`: unknown,
/// None).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    pub class: String,
    pub count: Option<u64>,
}

/// The requests of a ResourceClaim's or a ResourceClaimTemplate's spec, as resource.k8s.io v1
/// (`exactly`, `firstAvailable`) and v1beta1/v1beta2 (the fields on the request) write them.
pub fn requests(object: &Value) -> Vec<DeviceRequest> {
    let spec = match object.pointer("/spec/spec") {
        Some(s) => s,
        None => object.get("spec").unwrap_or(&Value::Null),
    };
    let list = spec.pointer("/devices/requests").and_then(Value::as_array);
    let mut out = Vec::new();
    for r in list.into_iter().flatten() {
        let exact = r.get("exactly").unwrap_or(r);
        if let Some(class) = exact.get("deviceClassName").and_then(Value::as_str) {
            out.push(request(class, exact));
        }
        // Alternatives: whichever the scheduler picks, count each.
        for sub in r
            .get("firstAvailable")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(class) = sub.get("deviceClassName").and_then(Value::as_str) {
                out.push(request(class, sub));
            }
        }
    }
    out
}

fn request(class: &str, r: &Value) -> DeviceRequest {
    let all = r.get("allocationMode").and_then(Value::as_str) == Some("All");
    DeviceRequest {
        class: class.to_string(),
        count: (!all).then(|| r.get("count").and_then(Value::as_u64).unwrap_or(1)),
    }
}

/// Whether a DeviceClass selects a GPU driver's devices: one of its CEL selectors compares
/// `device.driver` with one of `drivers`.
pub fn class_is_gpu(class: &Value, drivers: &[String]) -> bool {
    let selectors = class.pointer("/spec/selectors").and_then(Value::as_array);
    selectors.into_iter().flatten().any(|s| {
        let expr = s
            .pointer("/cel/expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        drivers.iter().any(|d| names_driver(expr, d))
    })
}

/// `device.driver == "<d>"` (either quote, any spacing, either side).
fn names_driver(expr: &str, driver: &str) -> bool {
    let squeezed: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
    ["\"", "'"].iter().any(|q| {
        squeezed.contains(&format!("device.driver=={q}{driver}{q}"))
            || squeezed.contains(&format!("{q}{driver}{q}==device.driver"))
    })
}

/// What the server found out about the Pod's claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraView {
    /// The Pod's claim name -> the GPUs it gives (claims that give none are absent).
    pub gpus: BTreeMap<String, u64>,
    /// Claims it could not tell about, with why (a lookup refused, failed or too slow).
    pub unknown: Vec<(String, String)>,
}

/// GPUs a DRA `All` request is counted as: the largest node's GPUs are not known here; one
/// full node of 8 is what such claims usually get.
pub const ALL_GPUS: u64 = 8;

impl DraView {
    /// The GPUs a claim's requests give, given which classes are GPU classes.
    pub fn count(requests: &[DeviceRequest], is_gpu: impl Fn(&str) -> bool) -> u64 {
        requests
            .iter()
            .filter(|r| is_gpu(&r.class))
            .map(|r| r.count.unwrap_or(ALL_GPUS))
            .sum()
    }
}

/// A copy of the Pod in which each container that lists a GPU claim carries that claim's GPUs
/// under [`DRA_GPUS_KEY`]; None when no container does.
pub fn marked(pod: &Value, view: &DraView) -> Option<Value> {
    if view.gpus.is_empty() {
        return None;
    }
    let mut copy = pod.clone();
    let mut any = false;
    for list in ["initContainers", "containers"] {
        let items = copy
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(Value::as_array_mut);
        for c in items.into_iter().flatten() {
            let used: u64 = c
                .pointer("/resources/claims")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| view.gpus.get(r.get("name")?.as_str()?))
                .sum();
            if used > 0 {
                if let Some(o) = c.as_object_mut() {
                    o.insert(DRA_GPUS_KEY.into(), json!(used));
                    any = true;
                }
            }
        }
    }
    any.then_some(copy)
}

/// The warning for claims whose devices could not be told: the Pod's /dev/shm is not judged
/// as a GPU Pod's, and it says so rather than calling the Pod fit.
pub fn unknown_warning(unknown: &[(String, String)]) -> Option<String> {
    if unknown.is_empty() {
        return None;
    }
    let list: Vec<String> = unknown
        .iter()
        .map(|(claim, why)| format!("{claim:?} ({why})"))
        .collect();
    Some(format!(
        "shmlink: could not tell whether the resource claims {} give GPUs; /dev/shm was not checked for them",
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests;

//! Pure: an AdmissionReview (admission.k8s.io/v1) in, the AdmissionReview answer out.

use serde_json::{json, Value};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use super::decide::{decide, unjudged, Decision};
use super::dra::DraView;
use super::parse::{self, ParseError};
use super::{Mode, Outcome};

/// The answer to one request, with what the server logs and counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// 200 with an AdmissionReview, or 400 when the body is not one (the API server then applies
    /// the webhook's failurePolicy: Ignore).
    pub status: u16,
    /// JSON.
    pub body: Vec<u8>,
    pub mode: Mode,
    pub outcome: Outcome,
    /// `namespace/name` (or `namespace/generateName*`) when the request names a Pod.
    pub pod: Option<String>,
    /// One line for the log: what was done and why.
    pub summary: String,
}

/// Answers one request body in `mode`.
///
/// kube-core's admission types are not used: their response writes `patch` as an array of
/// numbers where the API documents base64, and their request type fails as a whole on an object
/// it cannot read, losing the uid needed to let that Pod through.
pub fn answer(body: &[u8], mode: Mode) -> Answer {
    answer_with(body, mode, &DraView::default())
}

/// [`answer`], with what the server found out about the Pod's DRA claims: their GPUs count as
/// the containers' that use them; a claim it could not tell about is a warning.
pub fn answer_with(body: &[u8], mode: Mode, dra: &DraView) -> Answer {
    // Only what the decision reads is kept (`parse`); a Pod whose kept part is still too large
    // is read again for its names and container counts, and admitted unjudged.
    let (review, too_large) = match parse::review(body) {
        Ok(v) => (v, false),
        Err(ParseError::TooLarge) => match parse::head(body) {
            Ok(v) => (v, true),
            Err(_) => return refuse(mode, "the request's names alone are too large".to_string()),
        },
        Err(ParseError::Json(e)) => return refuse(mode, format!("the body is not JSON: {e}")),
    };
    let Some(request) = review.get("request").filter(|r| r.is_object()) else {
        return refuse(mode, "not an AdmissionReview: no request".to_string());
    };
    let Some(uid) = request
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    else {
        return refuse(mode, "an AdmissionReview request without a uid".to_string());
    };
    let reply = Reply {
        api_version: review
            .get("apiVersion")
            .and_then(Value::as_str)
            .filter(|v| v.starts_with("admission.k8s.io/"))
            .unwrap_or("admission.k8s.io/v1"),
        uid,
        mode,
    };
    if !is_pod_create(request) {
        let what = format!(
            "{} {}{} passed unchanged",
            text_at(request, "/operation"),
            text_at(request, "/resource/resource"),
            request
                .get("subResource")
                .and_then(Value::as_str)
                .map_or(String::new(), |s| format!("/{s}"))
        );
        return reply.allow(
            Outcome::NotPod,
            None,
            Decision::quiet(Outcome::NotPod, what),
        );
    }
    let pod = request.get("object").unwrap_or(&Value::Null);
    let name = pod_name(request, pod);
    if too_large {
        let count = |list: &str| {
            pod.pointer(&format!("/spec/{list}"))
                .and_then(Value::as_u64)
        };
        let containers = count("containers").unwrap_or(0) + count("initContainers").unwrap_or(0);
        let decision = unjudged(pod, mode, containers);
        return reply.allow(decision.outcome, Some(name), decision);
    }
    if let Err(why) = readable(pod) {
        let warning = format!("shmlink: could not read the Pod ({why}); admitted unchanged");
        let decision = Decision {
            warnings: vec![warning],
            ..Decision::quiet(Outcome::Error, format!("unreadable Pod: {why}"))
        };
        return reply.allow(Outcome::Error, Some(name), decision);
    }
    let marked = super::dra::marked(pod, dra);
    let mut decision = decide(marked.as_ref().unwrap_or(pod), mode);
    decision
        .warnings
        .extend(super::dra::unknown_warning(&dra.unknown));
    reply.allow(decision.outcome, Some(name), decision)
}

/// A Pod CREATE: the only request the webhook changes anything for.
fn is_pod_create(request: &Value) -> bool {
    let kind_group = request
        .pointer("/kind/group")
        .and_then(Value::as_str)
        .unwrap_or("");
    let sub = request
        .get("subResource")
        .and_then(Value::as_str)
        .unwrap_or("");
    text_at(request, "/kind/kind") == "Pod"
        && kind_group.is_empty()
        && text_at(request, "/resource/resource") == "pods"
        && sub.is_empty()
        && text_at(request, "/operation") == "CREATE"
}

fn text_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// What the decision needs to hold: an object with a spec whose containers are a list.
fn readable(pod: &Value) -> Result<(), &'static str> {
    let spec = pod.as_object().ok_or("no object")?.get("spec");
    let spec = spec.and_then(Value::as_object).ok_or("no spec")?;
    match spec.get("containers") {
        Some(Value::Array(_)) => Ok(()),
        _ => Err("spec.containers is not a list"),
    }
}

/// `namespace/name`, or `namespace/generateName*` for a controller's Pod not yet named.
fn pod_name(request: &Value, pod: &Value) -> String {
    let namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
        .unwrap_or("");
    let name = match pod.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => format!("{}*", text_at(pod, "/metadata/generateName")),
    };
    format!("{namespace}/{name}")
}

/// The parts of the answer every allowed request shares.
struct Reply<'a> {
    api_version: &'a str,
    uid: &'a str,
    mode: Mode,
}

impl Reply<'_> {
    fn allow(&self, outcome: Outcome, pod: Option<String>, decision: Decision) -> Answer {
        let mut response = json!({"uid": self.uid, "allowed": true});
        if !decision.patch.is_empty() {
            let patch = serde_json::to_vec(&decision.patch).unwrap_or_default();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(BASE64.encode(patch));
        }
        if !decision.warnings.is_empty() {
            response["warnings"] = json!(decision.warnings);
        }
        let body = json!({
            "apiVersion": self.api_version,
            "kind": "AdmissionReview",
            "response": response,
        });
        Answer {
            status: 200,
            body: serde_json::to_vec(&body).unwrap_or_default(),
            mode: self.mode,
            outcome,
            pod,
            summary: decision.summary,
        }
    }
}

fn refuse(mode: Mode, why: String) -> Answer {
    Answer {
        status: 400,
        body: serde_json::to_vec(&json!({ "error": why })).unwrap_or_default(),
        mode,
        outcome: Outcome::Error,
        pod: None,
        summary: why,
    }
}

#[cfg(test)]
mod tests;

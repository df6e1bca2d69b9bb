//! Pure: an AdmissionReview (admission.k8s.io/v1) in, the AdmissionReview answer out.

use serde_json::{json, Value};

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
pub fn answer(body: &[u8], mode: Mode) -> Answer {
    let review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return refuse(mode, format!("the body is not JSON: {e}")),
    };
    let Some(request) = review.get("request") else {
        return refuse(mode, "an AdmissionReview without a request".to_string());
    };
    let Some(uid) = request.get("uid").and_then(Value::as_str) else {
        return refuse(mode, "an AdmissionReview request without a uid".to_string());
    };
    // TODO(issue 39): the Pod decision (decide.rs) goes here.
    allow(uid, mode, Outcome::NotPod, None, "passed unchanged".to_string())
}

fn allow(uid: &str, mode: Mode, outcome: Outcome, pod: Option<String>, summary: String) -> Answer {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true},
    });
    Answer {
        status: 200,
        body: serde_json::to_vec(&body).unwrap_or_default(),
        mode,
        outcome,
        pod,
        summary,
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

//! events.k8s.io/v1 Events: create (409 when the name exists) and merge-patch (404 when it does
//! not), and what a test reads back.

use axum::body::Body;
use axum::http::{Response, StatusCode};
use serde_json::{json, Value};

use super::patch::merge_patch;
use super::routing::{respond, status_body};
use super::{FakeApi, Recorded, State};

impl FakeApi {
    /// The Events the server holds, as stored (create, then merge patches).
    pub fn events(&self) -> Vec<Value> {
        self.state().events.values().cloned().collect()
    }

    /// The Events regarding the object named `name` (a Pod, a Node).
    pub fn events_about(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name)
            .collect()
    }

    /// Waits up to `within` for Events with `reason` regarding `name` (any object when None),
    /// and returns them; else panics with what the server holds.
    pub fn wait_events(
        &self,
        name: Option<&str>,
        reason: &str,
        within: std::time::Duration,
    ) -> Vec<Value> {
        let mut found = Vec::new();
        let ok = super::super::wait_until(within, || {
            found = self
                .events()
                .into_iter()
                .filter(|e| e["reason"] == reason)
                .filter(|e| name.is_none_or(|n| e["regarding"]["name"] == n))
                .collect();
            !found.is_empty()
        });
        assert!(
            ok,
            "no {reason} Event regarding {} within {within:?}; the server holds: {:#?}",
            name.unwrap_or("anything"),
            self.events()
        );
        found
    }

    /// Event create requests the server answered 201 or 409.
    pub fn event_creates(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.contains("/events"))
            .collect()
    }
}

/// Those of `events` with `reason`.
pub fn with_reason<'a>(events: &'a [Value], reason: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["reason"] == reason).collect()
}

/// POST /apis/events.k8s.io/v1/namespaces/<ns>/events.
pub(super) fn create(s: &mut State, ns: &str, body: &Value) -> Response<Body> {
    let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    let key = (ns.to_string(), name.clone());
    if s.events.contains_key(&key) {
        return respond(
            StatusCode::CONFLICT,
            &status_body(
                409,
                "AlreadyExists",
                &format!("events \"{name}\" already exists"),
            ),
        );
    }
    let mut event = body.clone();
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    event["metadata"]["namespace"] = json!(ns);
    s.events.insert(key, event.clone());
    respond(StatusCode::CREATED, &event)
}

/// PATCH /apis/events.k8s.io/v1/namespaces/<ns>/events/<name> (a merge patch).
pub(super) fn patch(s: &mut State, ns: &str, name: &str, body: &Value) -> Response<Body> {
    match s.events.get_mut(&(ns.to_string(), name.to_string())) {
        Some(event) => {
            merge_patch(event, body);
            let event = event.clone();
            respond(StatusCode::OK, &event)
        }
        None => respond(
            StatusCode::NOT_FOUND,
            &status_body(404, "NotFound", &format!("events \"{name}\" not found")),
        ),
    }
}

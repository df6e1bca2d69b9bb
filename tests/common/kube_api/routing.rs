//! A request's way through the server: recorded, then the injected behaviour (500, hang), then
//! the route to the kind of object it names; and the answers' shapes (JSON, a `Status` on
//! failure) and the query string.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::{dra, events, fleet, nodes, pods, Behaviour, Recorded, State};

/// Every request the server gets.
pub(super) async fn handle(state: Arc<Mutex<State>>, req: Request<Body>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    {
        let mut s = lock();
        s.requests.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
        });
        if let Some(refused) = fleet::forbidden(&s, method.as_str(), &path) {
            return refused;
        }
        if s.behaviour == Some(Behaviour::Fail500) {
            return respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                &status_body(500, "InternalError", "injected failure"),
            );
        }
    }
    if lock().behaviour == Some(Behaviour::Hang) {
        let release = lock().release.clone();
        let _ = tokio::time::timeout(Duration::from_secs(60), release.notified()).await;
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &status_body(503, "ServiceUnavailable", "was hung"),
        );
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Some(answer) = fleet::route(&state, &method, &segments, &query).await {
        return answer;
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["version"]) => respond(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "",
                    "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z",
                    "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        ),
        (&Method::GET, ["api", "v1", "pods"]) => pods::get(lock(), &query),
        (&Method::GET, ["api", "v1", "nodes", name]) => nodes::get(&mut lock(), name),
        (&Method::PATCH, ["api", "v1", "nodes", name]) => {
            nodes::patch(&mut lock(), name, &content_type, &body, false)
        }
        (&Method::PATCH, ["api", "v1", "nodes", name, "status"]) => {
            nodes::patch(&mut lock(), name, &content_type, &body, true)
        }
        (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            events::create(&mut lock(), ns, &body)
        }
        (&Method::PATCH, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events", name]) => {
            events::patch(&mut lock(), ns, name, &body)
        }
        (_, ["apis", "resource.k8s.io", rest @ ..]) => {
            dra::route(&mut lock(), &method, rest, &query, body).unwrap_or_else(not_served)
        }
        _ => not_served(),
    }
}

fn not_served() -> Response<Body> {
    respond(
        StatusCode::NOT_FOUND,
        &status_body(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    )
}

pub(super) fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

pub(super) fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

pub(super) fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

//! Pods: what a test does to them (apply, delete, end watches, compact history) and what a
//! client sees: a list, or a watch from a resource version (history replayed, then live changes,
//! filtered by `spec.nodeName`), or 410 Gone from a compacted version.

use std::sync::MutexGuard;

use axum::body::{Body, Bytes};
use axum::http::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::routing::{query_param, respond, status_body};
use super::{FakeApi, State};

impl FakeApi {
    /// Adds or replaces a Pod (by `metadata.uid`) and tells the watches.
    pub fn apply_pod(&self, mut pod: Value) {
        let mut s = self.state();
        s.rv += 1;
        let rv = s.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let uid = pod["metadata"]["uid"]
            .as_str()
            .expect("pod uid")
            .to_string();
        let kind = if s.pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.pods.insert(uid, pod.clone());
        s.history.push((rv, kind, pod.clone()));
        broadcast(&mut s, kind, &pod);
    }

    pub fn delete_pod(&self, uid: &str) {
        let mut s = self.state();
        let Some(mut pod) = s.pods.remove(uid) else {
            return;
        };
        s.rv += 1;
        let rv = s.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.history.push((rv, "DELETED", pod.clone()));
        broadcast(&mut s, "DELETED", &pod);
    }

    /// Ends every open watch, as the API server does at its timeout; clients must resume.
    pub fn end_watches(&self) {
        self.state().watchers.clear();
    }

    /// Compacts history: watches from any version so far get 410 Gone and must relist.
    pub fn expire_history(&self) {
        let mut s = self.state();
        s.expired_below = s.rv + 1;
        s.history.clear();
        s.watchers.clear();
    }
}

/// GET /api/v1/pods: a list, or a watch with `watch=true`; `fieldSelector=spec.nodeName=<node>`
/// is served.
pub(super) fn get(s: MutexGuard<'_, State>, query: &str) -> Response<Body> {
    let selector = query_param(query, "fieldSelector");
    let watch = matches!(query_param(query, "watch").as_deref(), Some("true" | "1"));
    if watch {
        return watch_pods(s, query, selector);
    }
    let items: Vec<Value> = s
        .pods
        .values()
        .filter(|p| node_matches(p, selector.as_deref()))
        .cloned()
        .collect();
    respond(
        StatusCode::OK,
        &json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

fn broadcast(s: &mut State, kind: &str, obj: &Value) {
    let line = watch_line(kind, obj);
    s.watchers.retain(|w| w.send(line.clone()).is_ok());
}

fn watch_line(kind: &str, obj: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

fn node_matches(pod: &Value, selector: Option<&str>) -> bool {
    match selector.and_then(|s| s.strip_prefix("spec.nodeName=")) {
        Some(node) => pod["spec"]["nodeName"] == node,
        None => true,
    }
}

fn watch_pods(
    mut s: MutexGuard<'_, State>,
    query: &str,
    selector: Option<String>,
) -> Response<Body> {
    let from: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(s.rv);
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    if from < s.expired_below {
        let gone = status_body(410, "Expired", &format!("too old resource version: {from}"));
        let _ = tx.send(watch_line("ERROR", &gone));
    } else {
        for (rv, kind, obj) in &s.history {
            if *rv > from && node_matches(obj, selector.as_deref()) {
                let _ = tx.send(watch_line(kind, obj));
            }
        }
        // Changes of other nodes' Pods are filtered as the API server does.
        let (ftx, mut frx) = mpsc::unbounded_channel::<Bytes>();
        s.watchers.push(ftx);
        let tx2 = tx.clone();
        let selector = selector.clone();
        tokio::spawn(async move {
            while let Some(line) = frx.recv().await {
                let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                if node_matches(&v["object"], selector.as_deref()) && tx2.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

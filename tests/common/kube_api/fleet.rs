//! What `shmlink fleet` reads: Node and event lists, a namespace's Pods by label, the API
//! server's proxy to a Pod's port (forwarded to its `status.podIP`), and RBAC refusals a test
//! injects per path.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Response, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::routing::{query_param, respond, status_body};
use super::{FakeApi, State};

impl FakeApi {
    /// Requests with `method` whose path starts with `prefix` get 403, as an API server answers
    /// a user without the RBAC for them.
    pub fn forbid(&self, method: &str, prefix: &str) {
        self.state()
            .forbidden
            .push((method.to_string(), prefix.to_string()));
    }
}

/// The 403 the API server sends for a refused request.
pub(super) fn forbidden(s: &State, method: &str, path: &str) -> Option<Response<Body>> {
    s.forbidden
        .iter()
        .any(|(m, p)| m == method && path.starts_with(p.as_str()))
        .then(|| {
            let message = format!(
                "forbidden: User \"fake\" cannot {} resource at \"{path}\"",
                method.to_lowercase()
            );
            respond(
                StatusCode::FORBIDDEN,
                &status_body(403, "Forbidden", &message),
            )
        })
}

/// The requests `shmlink fleet` makes that the other kinds' files do not serve; None for the
/// rest.
pub(super) async fn route(
    state: &Arc<Mutex<State>>,
    method: &Method,
    segments: &[&str],
    query: &str,
) -> Option<Response<Body>> {
    if method != Method::GET {
        return None;
    }
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    Some(match segments {
        ["api", "v1", "nodes"] => list_nodes(&lock()),
        ["apis", "events.k8s.io", "v1", "events"] => list_events(&lock(), query),
        ["api", "v1", "namespaces", ns, "pods"] => list_pods_in(&lock(), ns, query),
        ["api", "v1", "namespaces", ns, "pods", target, "proxy", rest @ ..] => {
            proxy(state.clone(), ns, target, rest, query).await
        }
        _ => return None,
    })
}

fn labels_match(o: &Value, selector: Option<&str>) -> bool {
    selector
        .unwrap_or("")
        .split(',')
        .filter(|kv| !kv.is_empty())
        .all(|kv| {
            kv.split_once('=')
                .is_some_and(|(k, v)| o["metadata"]["labels"][k].as_str() == Some(v))
        })
}

fn list(kind: &str, api_version: &str, rv: u64, items: Vec<Value>) -> Response<Body> {
    respond(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// GET /api/v1/nodes.
fn list_nodes(s: &State) -> Response<Body> {
    let items = s.nodes.values().cloned().collect();
    list("NodeList", "v1", s.rv, items)
}

/// GET /apis/events.k8s.io/v1/events: `fieldSelector=reportingController=<name>` is served.
fn list_events(s: &State, query: &str) -> Response<Body> {
    let by = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("reportingController=").map(str::to_string));
    let items = s
        .events
        .values()
        .filter(|e| by.as_deref().is_none_or(|c| e["reportingController"] == c))
        .cloned()
        .collect();
    list("EventList", "events.k8s.io/v1", s.rv, items)
}

/// GET /api/v1/namespaces/<ns>/pods: `labelSelector` (`k=v,...`) is served.
fn list_pods_in(s: &State, ns: &str, query: &str) -> Response<Body> {
    let selector = query_param(query, "labelSelector");
    let items = s
        .pods
        .values()
        .filter(|p| p["metadata"]["namespace"] == ns && labels_match(p, selector.as_deref()))
        .cloned()
        .collect();
    list("PodList", "v1", s.rv, items)
}

/// GET /api/v1/namespaces/<ns>/pods/<name>:<port>/proxy/<rest>: forwarded to the Pod's
/// `status.podIP` and port, its status and body returned as they came.
async fn proxy(
    state: Arc<Mutex<State>>,
    ns: &str,
    target: &str,
    rest: &[&str],
    query: &str,
) -> Response<Body> {
    let (name, port) = target.split_once(':').unwrap_or((target, "80"));
    let ip = {
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.pods
            .values()
            .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
            .and_then(|p| p["status"]["podIP"].as_str().map(str::to_string))
    };
    let Some(ip) = ip else {
        let message = format!("pods \"{name}\" not found");
        return respond(
            StatusCode::NOT_FOUND,
            &status_body(404, "NotFound", &message),
        );
    };
    let path = if query.is_empty() {
        format!("/{}", rest.join("/"))
    } else {
        format!("/{}?{query}", rest.join("/"))
    };
    match forward(&format!("{ip}:{port}"), &path).await {
        Ok((code, body)) => Response::builder()
            .status(code)
            .body(Body::from(body))
            .unwrap(),
        Err(e) => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &status_body(
                503,
                "ServiceUnavailable",
                &format!("error trying to reach service: {e}"),
            ),
        ),
    }
}

/// One HTTP/1.0 GET: the status and body.
async fn forward(addr: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    Ok((code, raw[end + 4..].to_vec()))
}

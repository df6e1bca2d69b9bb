//! Nodes: what a test stores and reads back, GET, and PATCH of the object and of its `status`
//! subresource (strategic merge or merge patch, `metadata.resourceVersion` as a precondition).

use axum::body::Body;
use axum::http::{Response, StatusCode};
use serde_json::{json, Value};

use super::patch::{merge_patch, strategic_merge};
use super::routing::{respond, status_body};
use super::{FakeApi, Recorded, State};

impl FakeApi {
    /// Stores a Node as the kubelet would have made it (`metadata.name` required).
    pub fn apply_node(&self, mut node: Value) {
        let mut s = self.state();
        s.rv += 1;
        node["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        let name = node["metadata"]["name"]
            .as_str()
            .expect("node name")
            .to_string();
        s.nodes.insert(name, node);
    }

    /// The Node as the server holds it now.
    pub fn node(&self, name: &str) -> Value {
        let mut s = self.state();
        node_entry(&mut s, name).clone()
    }

    /// The conditions of Node `name` as the server holds them now (none: empty).
    pub fn node_conditions(&self, name: &str) -> Vec<Value> {
        self.node(name)["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Node `name`'s condition `type_` as the server holds it now, or null.
    pub fn node_condition(&self, name: &str, type_: &str) -> Value {
        self.node_conditions(name)
            .into_iter()
            .find(|c| c["type"] == type_)
            .unwrap_or(Value::Null)
    }

    /// Waits up to 30 s until Node `name`'s condition `type_` satisfies `ok` (`what`), and
    /// returns it; else panics with the Node and `log` (the agent's).
    pub fn wait_node_condition(
        &self,
        name: &str,
        type_: &str,
        what: &str,
        log: impl Fn() -> String,
        ok: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut last = Value::Null;
        let done = super::super::wait_until(std::time::Duration::from_secs(30), || {
            last = self.node_condition(name, type_);
            ok(&last)
        });
        assert!(
            done,
            "{type_} never became {what}; the Node: {:#}\nlog:\n{}",
            self.node(name),
            log()
        );
        last
    }

    /// Node writes (status or object patches) the server accepted.
    pub fn node_writes(&self) -> u64 {
        self.state().node_writes
    }

    /// PATCH requests on a Node's status, answered or not.
    pub fn node_status_patches(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r.method == "PATCH"
                    && r.path.starts_with("/api/v1/nodes/")
                    && r.path.ends_with("/status")
            })
            .collect()
    }
}

/// GET /api/v1/nodes/<name>.
pub(super) fn get(s: &mut State, name: &str) -> Response<Body> {
    let node = node_entry(s, name).clone();
    respond(StatusCode::OK, &node)
}

/// A Node by name, made bare on first use (a test that cares stores one with `apply_node`).
fn node_entry<'a>(s: &'a mut State, name: &str) -> &'a mut Value {
    if !s.nodes.contains_key(name) {
        s.rv += 1;
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": format!("node-uid-{name}"),
                         "resourceVersion": s.rv.to_string()},
            "spec": {}, "status": {}});
        s.nodes.insert(name.to_string(), node);
    }
    s.nodes.get_mut(name).expect("just made")
}

/// PATCH of a Node or its status, per the request's content type. The status subresource keeps
/// the object's spec and the object keeps its status, as the API server's node strategies do; a
/// `metadata.resourceVersion` in the patch is a precondition (409 Conflict when stale).
pub(super) fn patch(
    s: &mut State,
    name: &str,
    content_type: &str,
    body: &Value,
    status: bool,
) -> Response<Body> {
    let current = node_entry(s, name).clone();
    if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
        if current["metadata"]["resourceVersion"] != rv {
            return respond(
                StatusCode::CONFLICT,
                &status_body(409, "Conflict", &format!("Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; please apply your changes to the latest version and try again")),
            );
        }
    }
    let mut next = current.clone();
    let applied = match content_type {
        "application/strategic-merge-patch+json" => {
            strategic_merge(&mut next, body, &mut Vec::new())
        }
        "application/merge-patch+json" => {
            merge_patch(&mut next, body);
            Ok(())
        }
        other => {
            return respond(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &status_body(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the fake serves strategic merge and merge patches of nodes, not {other}"
                    ),
                ),
            )
        }
    };
    if let Err(e) = applied {
        return respond(StatusCode::BAD_REQUEST, &status_body(400, "BadRequest", &e));
    }
    if status {
        next["spec"] = current["spec"].clone();
    } else {
        next["status"] = current["status"].clone();
    }
    next["metadata"]["name"] = current["metadata"]["name"].clone();
    next["metadata"]["uid"] = current["metadata"]["uid"].clone();
    s.rv += 1;
    next["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    s.node_writes += 1;
    s.nodes.insert(name.to_string(), next.clone());
    respond(StatusCode::OK, &next)
}

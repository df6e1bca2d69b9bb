//! An in-process HTTP server that speaks the parts of the Kubernetes API shmlink uses, to the
//! real `kube` client: Pod list and watch (with resource versions, watches the test can end, and
//! 410 Gone for expired versions), Node get and patch (the object and its `status` subresource,
//! with the API server's strategic-merge semantics: `status.conditions` merged by `type`),
//! `/version`, events.k8s.io/v1 Event create and merge-patch, and resource.k8s.io's
//! ResourceSlices and DeviceTaintRules (`dra`: discovery per release, the rules' semantics). It records every request. It
//! runs on a thread and runtime of its own, so sync and async tests alike can use it, and it can
//! be stopped and started again on the same port (the API server going away).
//!
//! This file is the public face: `FakeApi` (start, stop, resume, behaviour, recorded requests)
//! and the objects tests store (`pod`, `kubelet_node`). What a test does to one kind of object,
//! and how the server answers about it, sits in that kind's file: `pods` (list, watch, 410),
//! `nodes` (get, patch), `events`; `routing` takes a request to them, `patch` holds the merge
//! semantics; `fleet` what `shmlink fleet` reads (lists, the proxy to a Pod, RBAC refusals).

mod dra;
pub mod events;
mod fleet;
mod nodes;
mod patch;
mod pods;
mod routing;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::Request;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

#[allow(unused_imports)] // not every test binary that shares this module uses it
pub use dra::{slice_8gpu, Dra};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Normal,
    /// Every request gets 500.
    Fail500,
    /// Every request is held without an answer (a stuck API server) until `stop`, or a minute.
    Hang,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Pods by UID.
    pods: BTreeMap<String, Value>,
    /// (resourceVersion, type, object) of every change, for watches that start in the past.
    history: Vec<(u64, &'static str, Value)>,
    /// Watches from below this version get 410 Gone.
    expired_below: u64,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Events by (namespace, name).
    events: BTreeMap<(String, String), Value>,
    requests: Vec<Recorded>,
    /// Nodes by name. Every name exists: one not yet seen is made on first use, bare.
    nodes: BTreeMap<String, Value>,
    /// Node writes the server accepted (status and object patches).
    node_writes: u64,
    behaviour: Option<Behaviour>,
    /// Wakes the requests `Hang` holds.
    release: Arc<tokio::sync::Notify>,
    /// resource.k8s.io: what is served, ResourceSlices, DeviceTaintRules.
    dra: dra::DraState,
    /// (method, path prefix) answered 403 (`FakeApi::forbid`).
    forbidden: Vec<(String, String)>,
}

/// The fake API server.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    running: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
    kubeconfig: tempfile::TempDir,
}

impl FakeApi {
    pub fn start() -> FakeApi {
        let addr = super::free_local_addr();
        let mut api = FakeApi {
            addr,
            state: Arc::new(Mutex::new(State::default())),
            running: None,
            kubeconfig: tempfile::tempdir().unwrap(),
        };
        api.resume();
        std::fs::write(
            api.kubeconfig_path(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n"
            ),
        )
        .unwrap();
        api
    }

    /// A kubeconfig naming this server, for `KUBECONFIG`.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.kubeconfig.path().join("kubeconfig")
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The API server goes away: open watches end, connections are refused.
    pub fn stop(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            let _ = stop.send(());
            // Graceful shutdown waits for every open request, and a client may open a new watch
            // between its old one ending and the server noticing the stop: end them until the
            // server's thread is done.
            while !thread.is_finished() {
                self.end_watches();
                self.state().release.notify_waiters();
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = thread.join();
        }
    }

    /// The API server comes back on the same address.
    pub fn resume(&mut self) {
        if self.running.is_some() {
            return;
        }
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (state, addr) = (self.state.clone(), self.addr);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                // The port was just free, or was ours a moment ago: retry while the kernel lets go.
                let mut listener = None;
                for _ in 0..100 {
                    match tokio::net::TcpListener::bind(addr).await {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                let listener = listener.expect("binding the fake API server's address");
                ready_tx.send(()).unwrap();
                let app = axum::Router::new().fallback(move |req: Request<Body>| {
                    let state = state.clone();
                    async move { routing::handle(state, req).await }
                });
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("fake API server started");
        self.running = Some((stop_tx, thread));
    }

    pub fn set_behaviour(&self, b: Behaviour) {
        self.state().behaviour = Some(b);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Pod on `node` as the API server returns it once its containers run.
pub fn pod(
    node: &str,
    namespace: &str,
    name: &str,
    uid: &str,
    containers: &[(&str, &str)],
) -> Value {
    let specs: Vec<Value> = containers
        .iter()
        .map(|(name, _)| json!({"name": name, "image": "busybox"}))
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, id)| {
            json!({"name": name, "containerID": format!("containerd://{id}"), "image": "busybox",
                   "imageID": "", "ready": true, "restartCount": 0, "started": true,
                   "state": {"running": {"startedAt": "2026-11-22T00:00:00Z"}}})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}]},
        "spec": {"nodeName": node, "containers": specs},
        "status": {"phase": "Running", "containerStatuses": statuses}
    })
}

/// What kubelet writes when a container of `pod` ended as `terminated` says (exitCode, reason,
/// containerID, finishedAt) and was restarted as `new_id`: the restart count up, the old
/// instance in `lastState.terminated`.
pub fn restarted(mut pod: Value, container: &str, terminated: Value, new_id: &str) -> Value {
    let statuses = pod["status"]["containerStatuses"]
        .as_array_mut()
        .expect("a pod with container statuses");
    let status = statuses
        .iter_mut()
        .find(|s| s["name"] == container)
        .expect("the container's status");
    let restarts = status["restartCount"].as_i64().unwrap_or(0) + 1;
    status["restartCount"] = json!(restarts);
    status["containerID"] = json!(format!("containerd://{new_id}"));
    status["lastState"] = json!({ "terminated": terminated });
    status["state"] = json!({"running": {"startedAt": terminated["finishedAt"]}});
    pod
}

/// kubelet's `terminated` record of container `id` that ended now with `exit_code` (`reason`),
/// for [`restarted`].
pub fn terminated_now(id: &str, exit_code: i32, reason: &str) -> Value {
    json!({"exitCode": exit_code, "reason": reason,
           "containerID": format!("containerd://{id}"), "finishedAt": finished_now()})
}

/// `finishedAt` as kubelet writes it (whole seconds): now.
pub fn finished_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    k8s_openapi::jiff::Timestamp::from_second(now as i64)
        .unwrap()
        .to_string()
}

/// A Node as the kubelet keeps it: its own four conditions (since long ago) and a taint of
/// another controller.
pub fn kubelet_node(name: &str) -> Value {
    let cond = |t: &str, s: &str, r: &str| {
        json!({"type": t, "status": s, "reason": r, "message": format!("kubelet says {r}"),
               "lastHeartbeatTime": "2026-11-23T00:00:00Z",
               "lastTransitionTime": "2026-11-01T00:00:00Z"})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("node-uid-{name}")},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            cond("Ready", "True", "KubeletReady"),
        ]}
    })
}

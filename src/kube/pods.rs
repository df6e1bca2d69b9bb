//! This node's Pods: a kube reflector keeps them (managed fields dropped), and a pure
//! [`PodIndex`] built from them names what the cgroup paths only identify by UID and ID.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use super::exits::{DeathKey, Exits};
pub use crate::model::strip_runtime_prefix;
use crate::model::{Detected, ShmReading};

/// What the scans need to know of one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Container ID (runtime prefix stripped) -> container name, over init, app and ephemeral
    /// containers.
    pub containers: HashMap<String, String>,
    /// Whether any container asks for a GPU (`nvidia.com/gpu` or any `*/gpu` resource).
    pub requests_gpu: bool,
    /// Container name -> the image its spec names (init, app and ephemeral containers).
    pub images: HashMap<String, String>,
}

/// Pods by UID and by namespace/name.
#[derive(Debug, Clone, Default)]
pub struct PodIndex {
    by_uid: HashMap<String, PodMeta>,
    uid_by_name: HashMap<(String, String), String>,
}

impl PodIndex {
    pub fn new<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> PodIndex {
        let mut index = PodIndex::default();
        for pod in pods {
            let Some(meta) = pod_meta(pod) else { continue };
            index.uid_by_name.insert(
                (meta.namespace.clone(), meta.name.clone()),
                meta.uid.clone(),
            );
            index.by_uid.insert(meta.uid.clone(), meta);
        }
        index
    }

    pub fn by_uid(&self, uid: &str) -> Option<&PodMeta> {
        self.by_uid.get(uid)
    }

    pub fn by_name(&self, namespace: &str, name: &str) -> Option<&PodMeta> {
        let uid = self
            .uid_by_name
            .get(&(namespace.to_string(), name.to_string()))?;
        self.by_uid.get(uid)
    }

    /// The image the Pod's spec names for a container.
    pub fn image_of(&self, uid: &str, container: &str) -> Option<&str> {
        self.by_uid(uid)?.images.get(container).map(String::as_str)
    }

    /// Whether the Pod with this UID asks for GPUs (unknown Pods do not).
    pub fn requests_gpu(&self, uid: &str) -> bool {
        self.by_uid(uid).is_some_and(|p| p.requests_gpu)
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// Names each reading's pod and container, and drops pod sandboxes (the pause container):
    /// a container of a known Pod whose statuses list containers, but not this one.
    pub fn annotate(&self, readings: &mut Vec<ShmReading>) {
        readings.retain_mut(|r| {
            let Some(meta) = r.pod_uid.as_deref().and_then(|uid| self.by_uid(uid)) else {
                return true;
            };
            r.namespace = Some(meta.namespace.clone());
            r.pod = Some(meta.name.clone());
            match meta.containers.get(&r.container_id) {
                Some(name) => {
                    r.container = Some(name.clone());
                    true
                }
                // A pod whose statuses are not filled yet: keep the container unnamed.
                None => meta.containers.is_empty(),
            }
        });
    }
}

fn is_gpu_resource(name: &str) -> bool {
    name == "nvidia.com/gpu" || name.ends_with("/gpu")
}

fn asks_for_gpu(resources: Option<&std::collections::BTreeMap<String, Quantity>>) -> bool {
    resources.is_some_and(|r| {
        r.iter()
            .any(|(name, q)| is_gpu_resource(name) && q.0.trim() != "0")
    })
}

fn pod_meta(pod: &Pod) -> Option<PodMeta> {
    let uid = pod.metadata.uid.clone()?;
    let spec = pod.spec.as_ref();
    let requests_gpu = spec.is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                let r = c.resources.as_ref();
                asks_for_gpu(r.and_then(|r| r.limits.as_ref()))
                    || asks_for_gpu(r.and_then(|r| r.requests.as_ref()))
            })
    });
    let status = pod.status.as_ref();
    let statuses = status.into_iter().flat_map(|s| {
        let all: [Option<&Vec<ContainerStatus>>; 3] = [
            s.container_statuses.as_ref(),
            s.init_container_statuses.as_ref(),
            s.ephemeral_container_statuses.as_ref(),
        ];
        all.into_iter().flatten().flatten()
    });
    let containers = statuses
        .filter_map(|c| {
            let id = strip_runtime_prefix(c.container_id.as_deref()?);
            (!id.is_empty()).then(|| (id.to_string(), c.name.clone()))
        })
        .collect();
    let images = spec
        .map(|s| {
            let named =
                |name: &str, image: Option<&String>| image.map(|i| (name.to_string(), i.clone()));
            let app = s
                .containers
                .iter()
                .map(|c| named(&c.name, c.image.as_ref()));
            let init = s.init_containers.iter().flatten();
            let init = init.map(|c| named(&c.name, c.image.as_ref()));
            let ephemeral = s.ephemeral_containers.iter().flatten();
            let ephemeral = ephemeral.map(|c| named(&c.name, c.image.as_ref()));
            app.chain(init).chain(ephemeral).flatten().collect()
        })
        .unwrap_or_default();
    Some(PodMeta {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid,
        containers,
        requests_gpu,
        images,
    })
}

/// This node's Pods, listed once (for `check`).
pub async fn list_once(client: Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let api: Api<Pod> = Api::all(client);
    let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(api.list(&params).await?.items)
}

/// Where `serve` hands the deaths the Pods' statuses record (the scan thread's queue).
pub type OnDeaths = Box<dyn Fn(Vec<(DeathKey, Detected)>) + Send + Sync>;

/// A reflector over this node's Pods, driven by a task on the runtime.
pub struct PodWatcher {
    cache: PodCache,
    task: tokio::task::JoinHandle<()>,
}

/// The reflector's store, read from any thread without waiting.
#[derive(Clone)]
pub struct PodCache {
    store: Store<Pod>,
    synced: Arc<AtomicBool>,
}

impl PodCache {
    /// Whether the first list is in.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The index of this node's Pods, once the cache has synced.
    pub fn index(&self) -> Option<PodIndex> {
        self.is_synced()
            .then(|| PodIndex::new(self.store.state().iter().map(|p| p.as_ref())))
    }
}

impl PodWatcher {
    /// Starts watching Pods with `spec.nodeName=<node>`. Never waits for the API server: until
    /// the first list is in, [`PodWatcher::index`] is `None`. Each container death a Pod's
    /// status newly records (`exits.rs`) goes to `on_deaths` as the watch delivers it;
    /// `exits` is `Exits::new(now)`, or resumed from the last checkpoint (deaths while the agent
    /// was down told, those told before not again).
    pub fn spawn(
        client: Client,
        node: &str,
        runtime: &tokio::runtime::Handle,
        mut exits: Exits,
        on_deaths: OnDeaths,
    ) -> PodWatcher {
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let task = runtime.spawn({
            let (store, synced) = (store.clone(), synced.clone());
            async move {
                let ready = async {
                    if store.wait_until_ready().await.is_ok() {
                        synced.store(true, Ordering::Release);
                        tracing::info!(pods = store.len(), "pod cache synced");
                    }
                };
                let mut logged = false;
                let stream = watcher(api, config)
                    .default_backoff()
                    .modify(|pod| pod.managed_fields_mut().clear())
                    .reflect(writer)
                    .for_each(|event| {
                        match event {
                            // The backoff retries; say it once per outage, not per attempt.
                            Err(e) if !logged => {
                                tracing::warn!("watching pods: {e}");
                                logged = true;
                            }
                            Err(_) => {}
                            Ok(event) => {
                                logged = false;
                                match event {
                                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                                        let found = exits.observe(&pod, SystemTime::now());
                                        if !found.is_empty() {
                                            on_deaths(found);
                                        }
                                    }
                                    watcher::Event::Delete(pod) => exits.forget(&pod),
                                    watcher::Event::Init | watcher::Event::InitDone => {}
                                }
                            }
                        }
                        std::future::ready(())
                    });
                tokio::join!(ready, stream);
            }
        });
        PodWatcher {
            cache: PodCache { store, synced },
            task,
        }
    }

    /// A handle on the cache, for another thread.
    pub fn cache(&self) -> PodCache {
        self.cache.clone()
    }

    /// Whether the first list is in.
    pub fn is_synced(&self) -> bool {
        self.cache.is_synced()
    }

    /// The index of this node's Pods, once the cache has synced.
    pub fn index(&self) -> Option<PodIndex> {
        self.cache.index()
    }
}

impl Drop for PodWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn trainer() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80"},
            "spec": {"nodeName": "node-a", "containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"}}},
                {"name": "sidecar"}]},
            "status": {
                "containerStatuses": [
                    {"name": "trainer", "containerID": "containerd://aaaa", "image": "x", "imageID": "", "ready": true, "restartCount": 0},
                    {"name": "sidecar", "containerID": "cri-o://bbbb", "image": "x", "imageID": "", "ready": true, "restartCount": 0}],
                "initContainerStatuses": [
                    {"name": "init", "containerID": "docker://cccc", "image": "x", "imageID": "", "ready": false, "restartCount": 0}]}
        }))
    }

    fn reading(uid: Option<&str>, id: &str) -> ShmReading {
        ShmReading {
            pod_uid: uid.map(str::to_string),
            cgroup: String::new(),
            ..fixtures::shm_reading(id, 64 << 20, 0)
        }
    }

    #[test]
    fn container_ids_lose_any_runtime_prefix() {
        assert_eq!(strip_runtime_prefix("containerd://abc"), "abc");
        assert_eq!(strip_runtime_prefix("cri-o://abc"), "abc");
        assert_eq!(strip_runtime_prefix("docker://abc"), "abc");
        assert_eq!(strip_runtime_prefix("abc"), "abc");
    }

    #[test]
    fn a_pod_is_indexed_by_uid_and_name_with_every_kind_of_container() {
        let p = trainer();
        let index = PodIndex::new([&p]);
        let meta = index
            .by_uid("0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80")
            .unwrap();
        assert_eq!(
            (meta.namespace.as_str(), meta.name.as_str()),
            ("ml", "trainer-0")
        );
        assert_eq!(meta.containers["aaaa"], "trainer");
        assert_eq!(meta.containers["bbbb"], "sidecar");
        assert_eq!(meta.containers["cccc"], "init");
        assert!(meta.requests_gpu);
        assert_eq!(index.by_name("ml", "trainer-0"), Some(meta));
        assert_eq!(index.by_name("ml", "other"), None);
    }

    #[test]
    fn gpu_requests_are_any_slash_gpu_resource_but_not_zero() {
        let with = |res: serde_json::Value| {
            PodIndex::new([&pod(serde_json::json!({
                "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                "spec": {"containers": [{"name": "c", "resources": res}]}
            }))])
            .by_uid("u")
            .unwrap()
            .requests_gpu
        };
        assert!(with(serde_json::json!({"requests": {"amd.com/gpu": "1"}})));
        assert!(with(serde_json::json!({"limits": {"nvidia.com/gpu": "1"}})));
        assert!(!with(
            serde_json::json!({"limits": {"nvidia.com/gpu": "0"}})
        ));
        assert!(!with(
            serde_json::json!({"limits": {"cpu": "1", "example.com/gpus": "1"}})
        ));
        assert!(!with(serde_json::json!({})));
    }

    #[test]
    fn annotate_names_known_containers_drops_sandboxes_and_keeps_the_rest() {
        let p = trainer();
        let index = PodIndex::new([&p]);
        let uid = Some("0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80");
        let mut readings = vec![
            reading(uid, "aaaa"),
            reading(uid, "pause0123"), // the sandbox: not in any status
            reading(Some("11111111-2222-3333-4444-555555555555"), "dddd"), // unknown pod
            reading(None, "plain"),
        ];
        index.annotate(&mut readings);
        assert_eq!(readings.len(), 3);
        assert_eq!(readings[0].namespace.as_deref(), Some("ml"));
        assert_eq!(readings[0].pod.as_deref(), Some("trainer-0"));
        assert_eq!(readings[0].container.as_deref(), Some("trainer"));
        assert_eq!(readings[1].container_id, "dddd");
        assert_eq!(readings[1].pod, None);
        assert_eq!(readings[2].container_id, "plain");
    }

    #[test]
    fn a_pod_without_statuses_yet_keeps_its_containers_unnamed() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "new", "namespace": "n", "uid": "u"},
            "spec": {"containers": [{"name": "c"}]}
        }));
        let index = PodIndex::new([&p]);
        let mut readings = vec![reading(Some("u"), "eeee")];
        index.annotate(&mut readings);
        assert_eq!(readings.len(), 1);
        assert_eq!(readings[0].pod.as_deref(), Some("new"));
        assert_eq!(readings[0].container, None);
    }
}

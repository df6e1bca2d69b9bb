//! Which Pod holds which GPU: the kubelet's pod-resources gRPC API (`v1.PodResourcesLister/List`)
//! on a unix socket, asked off the scan path and kept in a cache the scan thread reads.
//!
//! The messages are written out here with prost's derive rather than generated from the kubelet's
//! `api.proto`: `List` needs five small messages, and generating them would put protoc (or a proto
//! parser) into every build. Field numbers are those of `k8s.io/kubelet/pkg/apis/podresources/v1`;
//! fields this agent does not read (CPU IDs, memory, dynamic resources, topology) are skipped by
//! prost on decoding.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tonic::transport::{Endpoint, Uri};

use crate::metrics::Metrics;

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1` that `List` uses.
pub mod proto {
    /// The gRPC method this agent calls.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
    /// The service's full name, for servers.
    pub const SERVICE: &str = "v1.PodResourcesLister";

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }
}

/// Who holds which GPU: a GPU's UUID (`GPU-...`) or, for a device plugin that names GPUs by
/// index, its index as text -> (namespace, name) of each Pod holding it.
pub type GpuHolders = HashMap<String, Vec<(String, String)>>;

/// Kubelet clients use 16 MiB (gRPC's default of 4 MiB is too small for a node's full list).
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("no pod-resources socket at {0}")]
    NoSocket(PathBuf),
    // The cause in the text, not as a source too (a chain printer would say it twice).
    #[error("connecting to {path}: {error}")]
    Connect {
        path: PathBuf,
        error: tonic::transport::Error,
    },
    #[error("List on {path}: {status}")]
    List {
        path: PathBuf,
        status: Box<tonic::Status>,
    },
}

/// The GPUs each Pod holds, from a `List` answer: devices of any `<vendor>/gpu` resource
/// (`nvidia.com/gpu`, ...). A time-sliced replica (`GPU-<uuid>::<n>`) counts as its GPU; MIG
/// instances (`MIG-...`) name no whole GPU and are left out.
pub fn gpu_holders(list: &proto::ListPodResourcesResponse) -> GpuHolders {
    let mut out = GpuHolders::new();
    for pod in &list.pod_resources {
        for device in pod.containers.iter().flat_map(|c| &c.devices) {
            if !is_gpu_resource(&device.resource_name) {
                continue;
            }
            for id in &device.device_ids {
                let Some(key) = gpu_key(id) else { continue };
                let holders = out.entry(key.to_string()).or_default();
                let holder = (pod.namespace.clone(), pod.name.clone());
                if !holders.contains(&holder) {
                    holders.push(holder);
                }
            }
        }
    }
    out
}

fn is_gpu_resource(name: &str) -> bool {
    name.rsplit_once('/').is_some_and(|(_, r)| r == "gpu")
}

/// The GPU a device ID names: its UUID, or its index for plugins that use indices.
fn gpu_key(id: &str) -> Option<&str> {
    let id = id.trim();
    if let Some(rest) = id.strip_prefix("GPU-") {
        let uuid_len = rest.find("::").unwrap_or(rest.len());
        return (uuid_len > 0).then(|| &id[..4 + uuid_len]);
    }
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

/// One `List` call. The connection is made per call: the kubelet recreates its socket when it
/// restarts, and a unix-socket connect every refresh costs next to nothing.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<proto::ListPodResourcesResponse, PodResourcesError> {
    if !socket.exists() {
        return Err(PodResourcesError::NoSocket(socket.to_path_buf()));
    }
    let path = socket.to_path_buf();
    let connect_to = path.clone();
    // The URI is required by the API and ignored by the connector.
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = connect_to.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|error| PodResourcesError::Connect {
            path: path.clone(),
            error,
        })?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let list_err = |status: tonic::Status| PodResourcesError::List {
        path: path.clone(),
        status: Box::new(status),
    };
    grpc.ready()
        .await
        .map_err(|e| list_err(tonic::Status::unavailable(e.to_string())))?;
    let reply = grpc
        .unary(
            tonic::Request::new(proto::ListPodResourcesRequest {}),
            tonic::codegen::http::uri::PathAndQuery::from_static(proto::LIST_PATH),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map_err(list_err)?;
    Ok(reply.into_inner())
}

/// Asks the kubelet every `refresh` and keeps the last answer; the scan thread reads it without
/// waiting. No socket means no attribution (a node without the kubelet's API, or a run outside
/// Kubernetes), not an error; other failures are logged when they start and counted as
/// `shmlink_scan_errors_total{collector="pod_resources"}`, and the last good answer is kept.
#[derive(Clone)]
pub struct PodResourcesWatcher {
    holders: Arc<ArcSwap<GpuHolders>>,
}

impl PodResourcesWatcher {
    pub fn spawn(
        socket: PathBuf,
        refresh: Duration,
        metrics: Arc<Metrics>,
        runtime: &tokio::runtime::Handle,
    ) -> PodResourcesWatcher {
        let holders = Arc::new(ArcSwap::from_pointee(GpuHolders::new()));
        let cache = holders.clone();
        let timeout = refresh.clamp(Duration::from_secs(1), Duration::from_secs(10));
        runtime.spawn(async move {
            let mut last_state = String::new();
            loop {
                let state = match list(&socket, timeout).await {
                    Ok(answer) => {
                        let found = gpu_holders(&answer);
                        let state = format!("ok:{}", found.len());
                        if state != last_state {
                            tracing::info!(
                                socket = %socket.display(),
                                gpus_held = found.len(),
                                "pod-resources: GPU holders"
                            );
                        }
                        cache.store(Arc::new(found));
                        state
                    }
                    Err(PodResourcesError::NoSocket(_)) => {
                        if !last_state.starts_with("absent") {
                            tracing::info!(
                                socket = %socket.display(),
                                "no kubelet pod-resources socket: GPU Events name the Node only"
                            );
                        }
                        cache.store(Arc::new(GpuHolders::new()));
                        "absent".to_string()
                    }
                    Err(e) => {
                        metrics.count_error("pod_resources");
                        if !last_state.starts_with("error") {
                            tracing::warn!("pod-resources: {e}; keeping the last answer");
                        }
                        "error".to_string()
                    }
                };
                last_state = state;
                tokio::time::sleep(refresh).await;
            }
        });
        PodResourcesWatcher { holders }
    }

    /// The last answer (empty until the first).
    pub fn holders(&self) -> Arc<GpuHolders> {
        self.holders.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
        ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn pod(ns: &str, name: &str, containers: Vec<Vec<ContainerDevices>>) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .into_iter()
                .enumerate()
                .map(|(i, devices)| ContainerResources {
                    name: format!("c{i}"),
                    devices,
                })
                .collect(),
        }
    }

    #[test]
    fn gpus_of_any_vendor_are_attributed_and_other_devices_are_not() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "ml",
                    "trainer-0",
                    vec![
                        vec![devices("nvidia.com/gpu", &["GPU-aaaa", "GPU-bbbb"])],
                        vec![devices("rdma/hca", &["mlx5_0"])],
                    ],
                ),
                pod("ml", "eval", vec![vec![devices("amd.com/gpu", &["3"])]]),
                pod("web", "nginx", vec![vec![]]),
            ],
        };
        let h = gpu_holders(&list);
        let holder = |ns: &str, n: &str| vec![(ns.to_string(), n.to_string())];
        assert_eq!(h.get("GPU-aaaa"), Some(&holder("ml", "trainer-0")));
        assert_eq!(h.get("GPU-bbbb"), Some(&holder("ml", "trainer-0")));
        assert_eq!(h.get("3"), Some(&holder("ml", "eval")));
        assert_eq!(h.len(), 3, "{h:?}");
    }

    #[test]
    fn time_sliced_replicas_count_as_their_gpu_and_mig_is_left_out() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "a",
                    "p1",
                    vec![vec![devices("nvidia.com/gpu", &["GPU-cafe::0"])]],
                ),
                pod(
                    "b",
                    "p2",
                    vec![vec![devices("nvidia.com/gpu", &["GPU-cafe::1"])]],
                ),
                pod(
                    "c",
                    "p3",
                    vec![vec![devices(
                        "nvidia.com/gpu",
                        &["MIG-1234", "GPU-::2", ""],
                    )]],
                ),
            ],
        };
        let h = gpu_holders(&list);
        assert_eq!(
            h.get("GPU-cafe"),
            Some(&vec![
                ("a".to_string(), "p1".to_string()),
                ("b".to_string(), "p2".to_string())
            ])
        );
        assert_eq!(h.len(), 1, "{h:?}");
    }

    #[test]
    fn a_pod_holding_a_gpu_from_two_containers_is_listed_once() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![pod(
                "ml",
                "p",
                vec![
                    vec![devices("nvidia.com/gpu", &["GPU-x"])],
                    vec![devices("nvidia.com/gpu", &["GPU-x"])],
                ],
            )],
        };
        assert_eq!(gpu_holders(&list)["GPU-x"].len(), 1);
    }

    #[test]
    fn resource_names_are_matched_on_the_last_segment() {
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("gpu.intel.com/gpu"));
        assert!(!is_gpu_resource("gpu"));
        assert!(!is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(!is_gpu_resource("example.com/gpus"));
    }

    #[test]
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        use prost::Message;
        // ContainerResources with cpu_ids (3) and an unknown field 9 beside the devices.
        let mut buf = Vec::new();
        prost::encoding::string::encode(1, &"c".to_string(), &mut buf);
        prost::encoding::message::encode(2, &devices("nvidia.com/gpu", &["GPU-1"]), &mut buf);
        prost::encoding::int64::encode_packed(3, &[1, 2, 3], &mut buf);
        prost::encoding::string::encode(9, &"future".to_string(), &mut buf);
        let c = ContainerResources::decode(buf.as_slice()).expect("decodes");
        assert_eq!(c.devices[0].device_ids, ["GPU-1"]);
    }
}

//! A fake kubelet pod-resources gRPC server (`v1.PodResourcesLister/List`) on a unix socket,
//! served by tonic with the agent's own message types, on a thread and runtime of its own.
//! Tests set the answer, make it fail, and count the calls.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use shmlink::kube::podresources::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources, LIST_PATH, SERVICE,
};
use tokio::sync::oneshot;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture};

#[derive(Default)]
struct State {
    answer: ListPodResourcesResponse,
    /// Some: every call fails with this code.
    fail: Option<tonic::Code>,
}

#[derive(Clone)]
struct Lister {
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for Lister {
    const NAME: &'static str = SERVICE;
}

struct ListCall(Lister);

impl tonic::server::UnaryService<ListPodResourcesRequest> for ListCall {
    type Response = ListPodResourcesResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, _request: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        let state = self.0.state.lock().unwrap();
        let reply = match state.fail {
            Some(code) => Err(tonic::Status::new(code, "injected by the test")),
            None => Ok(tonic::Response::new(state.answer.clone())),
        };
        Box::pin(async move { reply })
    }
}

impl tower::Service<http::Request<Body>> for Lister {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != LIST_PATH {
            return Box::pin(async { Ok(tonic::Status::unimplemented("only List").into_http()) });
        }
        let call = ListCall(self.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(call, request).await)
        })
    }
}

/// The fake kubelet API; stops on drop.
pub struct FakePodResources {
    dir: tempfile::TempDir,
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicUsize>,
    stop: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl FakePodResources {
    pub fn start() -> FakePodResources {
        let dir = tempfile::Builder::new()
            .prefix("shmlink-pod-resources-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("kubelet.sock");
        let lister = Lister {
            state: Arc::default(),
            calls: Arc::default(),
        };
        let (state, calls) = (lister.state.clone(), lister.calls.clone());
        let (stop_tx, stop_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&socket).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(lister)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = stop_rx.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        ready_rx
            .recv()
            .expect("the fake pod-resources server started");
        FakePodResources {
            dir,
            state,
            calls,
            stop: Some((stop_tx, thread)),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }

    /// From now on `List` answers this.
    pub fn set(&self, pods: Vec<PodResources>) {
        let mut state = self.state.lock().unwrap();
        state.answer = ListPodResourcesResponse {
            pod_resources: pods,
        };
        state.fail = None;
    }

    /// From now on `List` fails with `code`.
    pub fn fail(&self, code: tonic::Code) {
        self.state.lock().unwrap().fail = Some(code);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.stop.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

/// A Pod whose container `container` holds `nvidia.com/gpu` devices `gpu_ids`.
pub fn gpu_pod(namespace: &str, name: &str, container: &str, gpu_ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: gpu_ids.iter().map(|s| s.to_string()).collect(),
            }],
        }],
    }
}

//! Kubernetes: this node's Pods (names for what cgroup paths identify by UID), Events for what
//! scans find, the Node's GPU conditions, and which Pod holds which GPU (the kubelet's
//! pod-resources API).
//!
//! Nothing here is on the scan path: the pod reflector and the pod-resources refresher keep
//! caches the scan thread reads without waiting, Events go out through a bounded queue, and
//! conditions through a watch channel (the latest state wins).

pub mod conditions;
pub mod device_taint;
pub mod events;
pub mod evicted;
pub mod exits;
pub mod podresources;
pub mod pods;

use kube::Client;

/// The agent's taint keys, in one place: the Node's (`--taint-on-gpu-fault`, while `GpuFault`
/// is True) and each blamed GPU's DRA device taint (`--gpu-device-taint`). Two keys because
/// they are two contracts: one takes the node out, the other one GPU.
pub const NODE_TAINT_KEY: &str = "shmlink.io/gpu-fault";
pub const DEVICE_TAINT_KEY: &str = "shmlink.io/gpu-unhealthy";

use crate::cli::KubeMode;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes configuration (in-cluster, $KUBECONFIG or ~/.kube/config): {0}")]
    Config(kube::config::InferConfigError),
    #[error("building the Kubernetes client: {0}")]
    Client(kube::Error),
    #[error("the Kubernetes API server is unreachable: {0}")]
    Unreachable(kube::Error),
}

/// The client `--kube` asks for: `off` none; `auto` one when a configuration is found (the API
/// server may still be away: the watchers retry); `on` one whose API server answers now.
pub async fn connect(mode: KubeMode) -> Result<Option<Client>, KubeError> {
    if mode == KubeMode::Off {
        return Ok(None);
    }
    let config = match kube::Config::infer().await {
        Ok(config) => config,
        Err(e) if mode == KubeMode::Auto => {
            tracing::info!("no Kubernetes configuration found, running without it: {e}");
            return Ok(None);
        }
        Err(e) => return Err(KubeError::Config(e)),
    };
    let client = Client::try_from(config).map_err(KubeError::Client)?;
    if mode == KubeMode::On {
        client
            .apiserver_version()
            .await
            .map_err(KubeError::Unreachable)?;
    }
    Ok(Some(client))
}

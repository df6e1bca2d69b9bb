//! The reads, each on its own: Nodes, the agent's DeviceTaintRules (v1, else v1beta2), its
//! Events, and each agent's `/api/v1/gpus` and `/api/v1/failures` through the API server's
//! proxy to its Pod. A refusal (RBAC) or a failure is that source's, said with the verb and
//! resource it needs; a call that does not answer within its deadline is one too.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use super::report::{AgentAnswer, NotRead, Sources};
use super::FleetSettings;
use crate::kube::device_taint::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::model::NodeKeys;

/// Each call at most.
const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// Agents asked at once through the proxy.
const AGENTS_AT_ONCE: usize = 32;

pub async fn read(client: &Client, settings: &FleetSettings) -> Sources {
    let (nodes, rules, events, agents) = tokio::join!(
        nodes(client),
        rules(client),
        events(client),
        agents(client, settings)
    );
    Sources {
        nodes,
        rules,
        events,
        agents,
    }
}

/// `what` could not be read: a 403 says the RBAC it takes (`verb resource`, `scope`), in the
/// same words for every agent (so one line says them all).
fn refused(what: &str, needs: &str, e: kube::Error) -> NotRead {
    let why = match &e {
        kube::Error::Api(s) if s.code == 403 => format!("forbidden: it needs RBAC `{needs}`"),
        kube::Error::Api(s) if s.code == 401 => format!("unauthorized: {}", s.message),
        other => other.to_string(),
    };
    NotRead {
        what: what.to_string(),
        why,
    }
}

async fn timed<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, NotRead>>,
) -> Result<T, NotRead> {
    match tokio::time::timeout(CALL_DEADLINE, call).await {
        Ok(r) => r,
        Err(_) => Err(NotRead {
            what: what.to_string(),
            why: format!("no answer within {}s", CALL_DEADLINE.as_secs()),
        }),
    }
}

fn json<T: serde::Serialize>(items: &[T]) -> Vec<Value> {
    items
        .iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect()
}

async fn nodes(client: &Client) -> Result<Vec<Value>, NotRead> {
    let what = "Node conditions";
    timed(what, async {
        let api: Api<Node> = Api::all(client.clone());
        let list = api.list(&ListParams::default()).await;
        list.map(|l| json(&l.items))
            .map_err(|e| refused(what, "list nodes (cluster-wide)", e))
    })
    .await
}

/// The agent's DeviceTaintRules at the newest version served; none when the cluster serves
/// none (a device-plugin cluster: nothing to read, not a refusal).
async fn rules(client: &Client) -> Result<Vec<Value>, NotRead> {
    let what = "DeviceTaintRules";
    timed(what, async {
        for version in ["v1", "v1beta2"] {
            let gvk = GroupVersionKind::gvk("resource.k8s.io", version, "DeviceTaintRule");
            let ar = ApiResource::from_gvk_with_plural(&gvk, "devicetaintrules");
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
            match api.list(&params).await {
                Ok(l) => return Ok(json(&l.items)),
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => {
                    let needs = "list devicetaintrules.resource.k8s.io (cluster-wide)";
                    return Err(refused(what, needs, e));
                }
            }
        }
        Ok(Vec::new())
    })
    .await
}

async fn events(client: &Client) -> Result<Vec<Value>, NotRead> {
    let what = "shmlink's Events";
    timed(what, async {
        let api: Api<Event> = Api::all(client.clone());
        let params = ListParams::default().fields("reportingController=shmlink");
        api.list(&params)
            .await
            .map(|l| json(&l.items))
            .map_err(|e| refused(what, "list events.events.k8s.io (all namespaces)", e))
    })
    .await
}

/// Each agent Pod (the DaemonSet's label in `--namespace`) on a node, asked through the proxy.
async fn agents(client: &Client, settings: &FleetSettings) -> Result<Vec<AgentAnswer>, NotRead> {
    let what = format!("the agents' Pods in namespace {}", settings.namespace);
    let pods = timed(&what, async {
        let api: Api<Pod> = Api::namespaced(client.clone(), &settings.namespace);
        let params = ListParams::default().labels("app.kubernetes.io/name=shmlink");
        api.list(&params).await.map_err(|e| {
            let needs = format!("list pods (namespace {})", settings.namespace);
            refused(&what, &needs, e)
        })
    })
    .await?;
    let targets: Vec<(String, String, u16)> = pods
        .items
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let name = p.metadata.name.clone()?;
            Some((node, name, metrics_port(p)))
        })
        .collect();
    Ok(stream::iter(targets)
        .map(|(node, pod, port)| ask_agent(client, settings, node, pod, port))
        .buffer_unordered(AGENTS_AT_ONCE)
        .collect()
        .await)
}

/// The agent container's port named `metrics`, else 9477.
fn metrics_port(pod: &Pod) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(9477)
}

async fn ask_agent(
    client: &Client,
    settings: &FleetSettings,
    node: String,
    pod: String,
    port: u16,
) -> AgentAnswer {
    let ns = &settings.namespace;
    let base = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy");
    let since = format!("{}s", settings.since.as_secs());
    let keys = proxy(client, &format!("{base}/api/v1/gpus"), &node, "GPUs").await;
    let failures = proxy(
        client,
        &format!("{base}/api/v1/failures?since={since}"),
        &node,
        "deaths",
    )
    .await;
    AgentAnswer {
        keys: keys.and_then(|v| {
            serde_json::from_value::<NodeKeys>(v).map_err(|e| NotRead {
                what: format!("the agent on {node}'s GPUs"),
                why: format!("an answer that is not NodeKeys: {e}"),
            })
        }),
        failures: failures.map(|v| v["failures"].as_array().cloned().unwrap_or_default()),
        node,
    }
}

async fn proxy(client: &Client, path: &str, node: &str, what: &str) -> Result<Value, NotRead> {
    let what = format!("the agent on {node} ({what})");
    timed(&what, async {
        let request = axum::http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| NotRead {
                what: what.clone(),
                why: e.to_string(),
            })?;
        let text = client
            .request_text(request)
            .await
            .map_err(|e| refused(&what, "get pods/proxy (the agents' namespace)", e))?;
        serde_json::from_str(&text).map_err(|e| NotRead {
            what: what.clone(),
            why: format!("not JSON: {e}"),
        })
    })
    .await
}

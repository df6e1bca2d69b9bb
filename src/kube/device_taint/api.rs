//! The API calls: which `resource.k8s.io` version serves DeviceTaintRules and ResourceSlices
//! (asked per version: in 1.36 the group's preferred version serves slices but not rules, which
//! only `v1beta2` has, and only when enabled), the node's slices, the agent's rules, and the
//! writes. Objects go as JSON (`DynamicObject`): the client's typed API is built for an older
//! Kubernetes than the one that has these kinds.

use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::Value;

use super::rules::{own_selector, Stored};

const GROUP: &str = "resource.k8s.io";
/// Newest first.
const VERSIONS: [&str; 2] = ["v1", "v1beta2"];

/// The two kinds, at the versions the cluster serves.
#[derive(Clone)]
pub(super) struct DraApi {
    pub(super) rules: Api<DynamicObject>,
    pub(super) rules_version: String,
    slices: Api<DynamicObject>,
}

/// Whether a call failed because the thing is not there (404) or is not served.
pub(super) fn is_absent(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

pub(super) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The served versions of both kinds; `Ok(None)` when the cluster serves no DeviceTaintRule or
/// no ResourceSlice; `Err` when it could not be asked (to be asked again).
pub(super) async fn discover(client: &Client) -> Result<Option<DraApi>, kube::Error> {
    let Some(rules) = served(client, "DeviceTaintRule").await? else {
        return Ok(None);
    };
    let Some(slices) = served(client, "ResourceSlice").await? else {
        return Ok(None);
    };
    Ok(Some(DraApi {
        rules_version: rules.api_version.clone(),
        rules: Api::all_with(client.clone(), &rules),
        slices: Api::all_with(client.clone(), &slices),
    }))
}

async fn served(client: &Client, kind: &str) -> Result<Option<ApiResource>, kube::Error> {
    for version in VERSIONS {
        let gvk = GroupVersionKind::gvk(GROUP, version, kind);
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok((ar, _)) => return Ok(Some(ar)),
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

impl DraApi {
    /// This node's ResourceSlices, as JSON.
    pub(super) async fn node_slices(&self, node: &str) -> Result<Vec<Value>, kube::Error> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = self.slices.list(&params).await?;
        Ok(list.items.iter().filter_map(to_json).collect())
    }

    /// The agent's rules of this node.
    pub(super) async fn own_rules(&self, node: &str) -> Result<Vec<Stored>, kube::Error> {
        let params = ListParams::default().labels(&own_selector(node));
        let list = self.rules.list(&params).await?;
        Ok(list
            .items
            .iter()
            .filter_map(to_json)
            .filter_map(|o| Stored::parse(&o, node))
            .collect())
    }

    /// Whether the rule named `name` is the agent's for `node`; false when it cannot be read.
    pub(super) async fn is_ours(&self, name: &str, node: &str) -> bool {
        match self.rules.get_opt(name).await {
            Ok(Some(o)) => to_json(&o).is_some_and(|v| Stored::parse(&v, node).is_some()),
            _ => false,
        }
    }

    /// Creates `object` (no apiVersion yet).
    pub(super) async fn create(&self, mut object: Value) -> Result<(), kube::Error> {
        object["apiVersion"] = Value::String(self.rules_version.clone());
        let object = from_json(object)?;
        self.rules.create(&PostParams::default(), &object).await?;
        Ok(())
    }

    /// Replaces the rule with `object` (the stored one changed: its resourceVersion kept, so a
    /// rule changed meanwhile is a 409, never overwritten).
    pub(super) async fn replace(&self, name: &str, object: Value) -> Result<(), kube::Error> {
        let object = from_json(object)?;
        self.rules
            .replace(name, &PostParams::default(), &object)
            .await?;
        Ok(())
    }

    /// Deletes the rule only if it is still the one read (its UID).
    pub(super) async fn delete(&self, stored: &Stored) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(stored.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.rules.delete(&stored.name, &params).await {
            Ok(_) => Ok(()),
            // Gone already: what was wanted.
            Err(e) if is_absent(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn to_json(o: &DynamicObject) -> Option<Value> {
    serde_json::to_value(o).ok()
}

fn from_json(v: Value) -> Result<DynamicObject, kube::Error> {
    serde_json::from_value(v).map_err(kube::Error::SerdeError)
}

//! Pure: the agent's rules, named and built, and the plan that brings what the API server holds
//! to what is wanted. Only rules with both of the agent's labels for this node are ever planned
//! on (the caller lists by them and [`Stored::parse`] checks again); a rule is compared on its
//! selector, key, value and effect only, never on `timeAdded` (the server sets it,
//! and resets it when the effect changes), so an unchanged rule costs no write.

use serde_json::{json, Value};

use super::judge::Wanted;
use super::slices::{DeviceRef, SliceIndex};
use super::{Effect, DESCRIPTION_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, NODE_LABEL};
use crate::kube::DEVICE_TAINT_KEY as TAINT_KEY;

/// A label value's limit, and a name's.
const LABEL_MAX: usize = 63;
const NAME_MAX: usize = 253;

/// The `shmlink.io/node` label's value: the node's name, or for one over 63 characters its
/// first 46, `-` and 16 hex digits of a hash of the whole (a label value must end in an
/// alphanumeric, and a node name is a DNS subdomain, so the rest is already valid).
pub fn node_label(node: &str) -> String {
    if node.len() <= LABEL_MAX {
        return node.to_string();
    }
    let head = node[..46].trim_end_matches(['-', '.']);
    format!("{head}-{:016x}", fnv1a(node.as_bytes()))
}

/// The rule's name: `shmlink-<node>-gpu-<index>`, or with the label's short form of the node
/// when that would pass 253 characters.
pub fn rule_name(node: &str, gpu: u32) -> String {
    let name = format!("shmlink-{node}-gpu-{gpu}");
    if name.len() <= NAME_MAX {
        name
    } else {
        format!("shmlink-{}-gpu-{gpu}", node_label(node))
    }
}

/// The rule of MIG device `n` (0.., in the order of the devices' names) of GPU `gpu`:
/// `shmlink-<node>-gpu-<index>-mig-<n>`.
pub fn mig_rule_name(node: &str, gpu: u32, n: usize) -> String {
    format!("{}-mig-{n}", rule_name(node, gpu))
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The label selector that lists the agent's rules of this node.
pub fn own_selector(node: &str) -> String {
    format!(
        "{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}={}",
        node_label(node)
    )
}

/// A rule of the agent as the API server holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub name: String,
    pub uid: String,
    pub selector: Option<DeviceRef>,
    pub value: String,
    pub effect: String,
    pub description: String,
    /// The object as read, sent back (with its resourceVersion and timeAdded) on an update.
    pub object: Value,
}

impl Stored {
    /// A rule of the agent for `node`; None for anything else (another's, or malformed).
    pub fn parse(object: &Value, node: &str) -> Option<Stored> {
        let meta = &object["metadata"];
        let labels = &meta["labels"];
        if labels[MANAGED_BY_LABEL] != MANAGED_BY || labels[NODE_LABEL] != node_label(node).as_str()
        {
            return None;
        }
        let name = meta["name"].as_str()?;
        if !name.starts_with("shmlink-") {
            return None;
        }
        let sel = &object["spec"]["deviceSelector"];
        let selector = match (
            sel["driver"].as_str(),
            sel["pool"].as_str(),
            sel["device"].as_str(),
        ) {
            (Some(driver), Some(pool), Some(device)) => Some(DeviceRef {
                driver: driver.into(),
                pool: pool.into(),
                device: device.into(),
            }),
            _ => None,
        };
        let taint = &object["spec"]["taint"];
        let selector = selector.filter(|_| taint["key"] == TAINT_KEY);
        Some(Stored {
            name: name.to_string(),
            uid: meta["uid"].as_str().unwrap_or_default().to_string(),
            selector,
            value: taint["value"].as_str().unwrap_or_default().to_string(),
            effect: taint["effect"].as_str().unwrap_or_default().to_string(),
            description: meta["annotations"][DESCRIPTION_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            object: object.clone(),
        })
    }
}

/// A rule as the agent wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub name: String,
    pub gpu: u32,
    pub device: DeviceRef,
    pub value: String,
    pub effect: Effect,
    pub description: String,
}

impl Desired {
    /// The description is not compared: it is refreshed with a change of the rule, so a
    /// restarted agent, whose judge has just begun to count "since", rewrites nothing.
    fn matches(&self, s: &Stored) -> bool {
        s.selector.as_ref() == Some(&self.device)
            && s.value == self.value
            && s.effect == self.effect.as_str()
    }

    /// The object to create (`apiVersion` is the caller's); `owner`: the Node's name and UID.
    pub fn object(&self, node: &str, owner: Option<(&str, &str)>) -> Value {
        let mut meta = json!({
            "name": self.name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: node_label(node)},
            "annotations": {DESCRIPTION_ANNOTATION: self.description},
        });
        if let Some((name, uid)) = owner {
            meta["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]);
        }
        json!({"kind": "DeviceTaintRule", "metadata": meta, "spec": self.spec()})
    }

    /// The stored object changed to this: its metadata (resourceVersion, owner, timeAdded)
    /// kept, its spec and description ours.
    pub fn update_of(&self, stored: &Stored) -> Value {
        let mut object = stored.object.clone();
        let time_added = object["spec"]["taint"]["timeAdded"].clone();
        object["spec"] = self.spec();
        if !time_added.is_null() {
            object["spec"]["taint"]["timeAdded"] = time_added;
        }
        object["metadata"]["annotations"][DESCRIPTION_ANNOTATION] = json!(self.description);
        object
    }

    fn spec(&self) -> Value {
        json!({
            "deviceSelector": {"driver": self.device.driver, "pool": self.device.pool,
                               "device": self.device.device},
            "taint": {"key": TAINT_KEY, "value": self.value, "effect": self.effect.as_str()},
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Create(Desired),
    /// `effect_changed`: a new effect is a new taint (an Event), a new description is not.
    Update {
        desired: Desired,
        stored: Stored,
        effect_changed: bool,
    },
    Delete(Stored),
}

/// What to do, and the wanted GPUs no slice lists (no rule can select them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub unmatched: Vec<(u32, String)>,
}

/// Brings `stored` (the agent's rules of this node) to `wanted`. A stored rule no GPU wants is
/// deleted unless `keep` says to wait (a rule found at start, within its hold).
pub fn plan(
    wanted: &[Wanted],
    index: &SliceIndex,
    stored: &[Stored],
    (node, effect): (&str, Effect),
    keep: impl Fn(&str) -> bool,
) -> Plan {
    let mut out = Plan::default();
    let mut desired_names = Vec::new();
    let mut unlisted: Vec<String> = Vec::new();
    for w in wanted {
        let Some(devices) = devices_of(index, w, node) else {
            // A wanted GPU no slice lists keeps its rules (its own and its MIG devices') as
            // they are: it may be the slice that went.
            unlisted.push(rule_name(node, w.gpu));
            out.unmatched.push((w.gpu, w.uuid.clone()));
            continue;
        };
        for (name, device) in devices {
            desired_names.push(name.clone());
            let desired = Desired {
                name,
                gpu: w.gpu,
                device,
                value: w.value.clone(),
                effect,
                description: w.description.clone(),
            };
            match stored.iter().find(|s| s.name == desired.name) {
                None => out.actions.push(Action::Create(desired)),
                Some(s) if desired.matches(s) => {}
                Some(s) => out.actions.push(Action::Update {
                    effect_changed: s.effect != effect.as_str(),
                    desired,
                    stored: s.clone(),
                }),
            }
        }
    }
    let of_unlisted = |name: &str| {
        unlisted.iter().any(|gpu| {
            name == gpu
                || name
                    .strip_prefix(gpu.as_str())
                    .is_some_and(|r| r.starts_with("-mig-"))
        })
    };
    for s in stored {
        if !desired_names.contains(&s.name) && !of_unlisted(&s.name) && !keep(&s.name) {
            out.actions.push(Action::Delete(s.clone()));
        }
    }
    out
}

/// The GPU's device and, with MIG enabled on it, each of its MIG devices (NVIDIA's driver then
/// lists those instead of the GPU), with their rules' names; None when no slice lists either.
fn devices_of(index: &SliceIndex, w: &Wanted, node: &str) -> Option<Vec<(String, DeviceRef)>> {
    let mut devices: Vec<(String, DeviceRef)> = index
        .device_of(&w.uuid)
        .map(|d| (rule_name(node, w.gpu), d.clone()))
        .into_iter()
        .collect();
    let migs = index.migs_of(&w.uuid);
    devices.extend(
        migs.iter()
            .enumerate()
            .map(|(n, d)| (mig_rule_name(node, w.gpu, n), d.clone())),
    );
    (!devices.is_empty()).then_some(devices)
}

#[cfg(test)]
mod tests;

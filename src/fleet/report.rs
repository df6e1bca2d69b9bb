//! Pure: what the cluster's objects and the agents say, in one report of what is out, since
//! when and why, grouped by NVLink domain. Every reader is total: an object of an odd shape is
//! skipped, never a panic.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::kube::device_taint::{DESCRIPTION_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, NODE_LABEL};
use crate::model::{parse_rfc3339, NodeKeys};

/// The Node conditions shmlink writes: True means out.
pub const CONDITIONS: [&str; 2] = ["GpuLinkDegraded", "GpuFault"];
/// The label NVIDIA's GPU feature discovery puts on a node of an NVLink domain:
/// `<cluster UUID>.<clique ID>`.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// A source the command could not read, and why (an RBAC refusal names what is missing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotRead {
    pub what: String,
    pub why: String,
}

/// One agent's answers through the API server's proxy.
#[derive(Debug, Clone)]
pub struct AgentAnswer {
    pub node: String,
    pub keys: Result<NodeKeys, NotRead>,
    /// `/api/v1/failures`'s `failures`.
    pub failures: Result<Vec<Value>, NotRead>,
}

/// Everything read, each source on its own: one refused is said, the others still count.
#[derive(Debug, Clone)]
pub struct Sources {
    pub nodes: Result<Vec<Value>, NotRead>,
    pub rules: Result<Vec<Value>, NotRead>,
    pub events: Result<Vec<Value>, NotRead>,
    pub agents: Result<Vec<AgentAnswer>, NotRead>,
}

/// Something out: a Node condition True, or a DeviceTaintRule of the agent's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Out {
    pub node: String,
    /// The GPU a rule takes out (NVML's index); none for a Node condition.
    pub gpu: Option<u32>,
    /// `GpuLinkDegraded`, `GpuFault` (a condition), or `DeviceTaintRule`.
    pub what: String,
    /// The rule's name and effect.
    pub rule: Option<String>,
    pub effect: Option<String>,
    /// RFC 3339: the condition's lastTransitionTime, the rule's timeAdded.
    pub since: Option<String>,
    pub reason: String,
    pub message: String,
}

/// What is out in one NVLink domain (`<cluster UUID>.<clique ID>`), or where none is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DomainOut {
    pub domain: Option<String>,
    /// The domain's nodes the command saw, and those with something out.
    pub nodes: Vec<String>,
    pub nodes_out: Vec<String>,
    pub out: Vec<Out>,
}

/// A death an agent told in the window (its `/api/v1/failures`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Death {
    pub node: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub kind: String,
    pub at: String,
}

/// shmlink's Events in the window, one row per object and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventCount {
    /// `Node/<name>` or `Pod/<namespace>/<name>`.
    pub regarding: String,
    pub reason: String,
    pub count: u64,
    pub last: Option<String>,
    pub note: String,
}

/// `shmlink fleet --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetReport {
    /// Domains with something out first (most nodes out first), then the others; the nodes
    /// with no known domain last.
    pub domains: Vec<DomainOut>,
    pub deaths: Vec<Death>,
    pub events: Vec<EventCount>,
    pub not_read: Vec<NotRead>,
}

impl FleetReport {
    pub fn is_out(&self) -> bool {
        self.domains.iter().any(|d| !d.out.is_empty())
    }

    /// 1 something is out, else 2 a source was not read (what was not seen is not called
    /// healthy), else 0.
    pub fn exit_status(&self) -> u8 {
        match (self.is_out(), self.not_read.is_empty()) {
            (true, _) => 1,
            (false, false) => 2,
            (false, true) => 0,
        }
    }
}

/// Builds the report; `since`: how far back Events and deaths count.
pub fn build(sources: Sources, now: SystemTime, since: Duration) -> FleetReport {
    let mut not_read = Vec::new();
    let mut keep = |r: Result<Vec<Value>, NotRead>| {
        r.unwrap_or_else(|e| {
            not_read.push(e);
            Vec::new()
        })
    };
    let nodes = keep(sources.nodes);
    let rules = keep(sources.rules);
    let events = keep(sources.events);
    let agents = sources.agents.unwrap_or_else(|e| {
        not_read.push(e);
        Vec::new()
    });
    let mut keys: BTreeMap<String, NodeKeys> = BTreeMap::new();
    let mut deaths = Vec::new();
    let mut refused: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in agents {
        match a.keys {
            Ok(k) => {
                keys.insert(a.node.clone(), k);
            }
            Err(e) => refused.entry(e.why).or_default().push(e.what),
        }
        match a.failures {
            Ok(f) => deaths.extend(f.iter().filter_map(|v| death(&a.node, v))),
            Err(e) => refused.entry(e.why).or_default().push(e.what),
        }
    }
    // One line per reason: a refusal of the proxy is every agent's.
    for (why, mut what) in refused {
        what.sort();
        let what = match what.len() {
            1 => what.remove(0),
            n => format!("{n} agent answers ({}, ...)", what[0]),
        };
        not_read.push(NotRead { what, why });
    }
    let place = Place::new(&nodes, &keys);
    let mut out: Vec<Out> = nodes.iter().flat_map(conditions_out).collect();
    out.extend(rules.iter().filter_map(rule_out));
    let cutoff = now.checked_sub(since);
    let recent = |at: &str| parse_rfc3339(at).zip(cutoff).is_none_or(|(t, c)| t >= c);
    deaths.retain(|d| recent(&d.at));
    deaths.sort_by(|a, b| b.at.cmp(&a.at));
    FleetReport {
        domains: place.group(out),
        deaths,
        events: event_counts(&events, &recent),
        not_read,
    }
}

/// Which NVLink domain each node and GPU is in: the agent's word (its GPUs' fabric info), else
/// the node's GPU feature discovery label.
struct Place<'a> {
    by_node: BTreeMap<String, Option<String>>,
    keys: &'a BTreeMap<String, NodeKeys>,
}

impl<'a> Place<'a> {
    fn new(nodes: &[Value], keys: &'a BTreeMap<String, NodeKeys>) -> Place<'a> {
        let mut by_node = BTreeMap::new();
        for n in nodes {
            let Some(name) = n["metadata"]["name"].as_str() else {
                continue;
            };
            let label = n["metadata"]["labels"][CLIQUE_LABEL]
                .as_str()
                .filter(|l| !l.is_empty())
                .map(str::to_string);
            let agent = keys
                .get(name)
                .and_then(|k| k.gpus.iter().find_map(|g| g.domain()));
            by_node.insert(name.to_string(), agent.or(label));
        }
        for (name, k) in keys {
            by_node
                .entry(name.clone())
                .or_insert_with(|| k.gpus.iter().find_map(|g| g.domain()));
        }
        Place { by_node, keys }
    }

    fn domain_of(&self, o: &Out) -> Option<String> {
        let gpu = o.gpu.and_then(|i| {
            let k = self.keys.get(&o.node)?;
            k.gpus.iter().find(|g| g.index == i)?.domain()
        });
        gpu.or_else(|| self.by_node.get(&o.node).cloned().flatten())
    }

    fn group(&self, out: Vec<Out>) -> Vec<DomainOut> {
        let mut groups: BTreeMap<Option<String>, DomainOut> = BTreeMap::new();
        for (node, domain) in &self.by_node {
            groups
                .entry(domain.clone())
                .or_insert_with(|| empty(domain.clone()))
                .nodes
                .push(node.clone());
        }
        for o in out {
            let domain = self.domain_of(&o);
            let g = groups
                .entry(domain.clone())
                .or_insert_with(|| empty(domain));
            if !g.nodes_out.contains(&o.node) {
                g.nodes_out.push(o.node.clone());
            }
            g.out.push(o);
        }
        let mut list: Vec<DomainOut> = groups.into_values().collect();
        for g in &mut list {
            g.nodes_out.sort();
            g.out
                .sort_by(|a, b| (&a.node, a.gpu, &a.what).cmp(&(&b.node, b.gpu, &b.what)));
        }
        list.sort_by_key(|g| (g.domain.is_none(), std::cmp::Reverse(g.nodes_out.len())));
        list
    }
}

fn empty(domain: Option<String>) -> DomainOut {
    DomainOut {
        domain,
        nodes: Vec::new(),
        nodes_out: Vec::new(),
        out: Vec::new(),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The node's shmlink conditions that are True.
fn conditions_out(node: &Value) -> Vec<Out> {
    let name = text(&node["metadata"]["name"]);
    let conditions = node["status"]["conditions"].as_array();
    conditions
        .into_iter()
        .flatten()
        .filter(|c| CONDITIONS.contains(&c["type"].as_str().unwrap_or("")) && c["status"] == "True")
        .map(|c| Out {
            node: name.clone(),
            gpu: None,
            what: text(&c["type"]),
            rule: None,
            effect: None,
            since: c["lastTransitionTime"].as_str().map(str::to_string),
            reason: text(&c["reason"]),
            message: text(&c["message"]),
        })
        .collect()
}

/// A DeviceTaintRule of the agent's: its node (its owner, the Node; else the label, which is
/// the name unless that is over 63 characters), GPU (the name's `-gpu-<index>`), effect, since
/// and why (the description).
fn rule_out(rule: &Value) -> Option<Out> {
    let meta = &rule["metadata"];
    if meta["labels"][MANAGED_BY_LABEL] != MANAGED_BY {
        return None;
    }
    let name = meta["name"].as_str()?;
    let owner = meta["ownerReferences"].as_array().and_then(|o| {
        o.iter()
            .find(|r| r["kind"] == "Node")
            .and_then(|r| r["name"].as_str())
    });
    let node = owner.or(meta["labels"][NODE_LABEL].as_str())?;
    let gpu = name
        .rsplit_once("-gpu-")
        .and_then(|(_, rest)| rest.split('-').next()?.parse().ok());
    let taint = &rule["spec"]["taint"];
    Some(Out {
        node: node.to_string(),
        gpu,
        what: "DeviceTaintRule".into(),
        rule: Some(name.to_string()),
        effect: taint["effect"].as_str().map(str::to_string),
        since: taint["timeAdded"].as_str().map(str::to_string),
        reason: text(&taint["value"]),
        message: text(&meta["annotations"][DESCRIPTION_ANNOTATION]),
    })
}

fn death(node: &str, f: &Value) -> Option<Death> {
    let field = |k: &str| f[k].as_str().map(str::to_string);
    Some(Death {
        node: node.to_string(),
        namespace: field("namespace"),
        pod: field("pod"),
        container: field("container"),
        kind: field("kind")?,
        at: field("at")?,
    })
}

/// shmlink's Events (reporting controller `shmlink`) seen within the window, per object and
/// reason, newest first.
fn event_counts(events: &[Value], recent: &dyn Fn(&str) -> bool) -> Vec<EventCount> {
    let mut rows: BTreeMap<(String, String), EventCount> = BTreeMap::new();
    for e in events {
        if e["reportingController"] != "shmlink" {
            continue;
        }
        let last = e["series"]["lastObservedTime"]
            .as_str()
            .or(e["eventTime"].as_str())
            .or(e["metadata"]["creationTimestamp"].as_str())
            .map(str::to_string);
        if !last.as_deref().is_some_and(recent) {
            continue;
        }
        let r = &e["regarding"];
        let regarding = match r["namespace"].as_str().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{}/{ns}/{}", text(&r["kind"]), text(&r["name"])),
            None => format!("{}/{}", text(&r["kind"]), text(&r["name"])),
        };
        let reason = text(&e["reason"]);
        let count = e["series"]["count"].as_u64().unwrap_or(1);
        let row = rows
            .entry((regarding.clone(), reason.clone()))
            .or_insert(EventCount {
                regarding,
                reason,
                count: 0,
                last: None,
                note: String::new(),
            });
        row.count += count;
        if last > row.last {
            row.last = last;
            row.note = text(&e["note"]);
        }
    }
    let mut list: Vec<EventCount> = rows.into_values().collect();
    list.sort_by(|a, b| b.last.cmp(&a.last));
    list
}

#[cfg(test)]
mod tests;

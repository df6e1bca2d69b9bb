use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::*;
use crate::fleet::render;
use crate::model::{GpuKeys, NodeKeys};

const A: &str = "7f3c0d5e-0b1a-4c2d-9e8f-00000000000a";
const B: &str = "7f3c0d5e-0b1a-4c2d-9e8f-00000000000b";

fn now() -> SystemTime {
    parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
}

fn node(name: &str, conditions: Value, clique_label: Option<&str>) -> Value {
    let mut n =
        json!({"metadata": {"name": name, "labels": {}}, "status": {"conditions": conditions}});
    if let Some(l) = clique_label {
        n["metadata"]["labels"][CLIQUE_LABEL] = json!(l);
    }
    n
}

fn degraded(since: &str) -> Value {
    json!([{"type": "Ready", "status": "True"},
           {"type": "GpuLinkDegraded", "status": "True", "reason": "GpuPairsDegraded",
            "message": "GPU 0 fails with all 7 of its peers", "lastTransitionTime": since},
           {"type": "GpuFault", "status": "False", "reason": "GpuHealthy"}])
}

fn keys(node: &str, domain: &str, clique: u32) -> NodeKeys {
    NodeKeys {
        node: node.into(),
        gpus: (0..8)
            .map(|i| GpuKeys {
                index: i,
                cluster_uuid: Some(domain.into()),
                clique_id: Some(clique),
                ..GpuKeys::default()
            })
            .collect(),
        ..NodeKeys::default()
    }
}

fn rule(node: &str, gpu: u32) -> Value {
    json!({"metadata": {"name": format!("shmlink-{node}-gpu-{gpu}"),
            "labels": {"app.kubernetes.io/managed-by": "shmlink", "shmlink.io/node": node},
            "annotations": {"shmlink.io/description": format!("GPU {gpu} has all its NVLinks down")},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "u"}]},
           "spec": {"taint": {"key": "shmlink.io/gpu-unhealthy", "value": "nvlink-down",
                              "effect": "None", "timeAdded": "2026-11-29T11:58:00Z"}}})
}

fn agent(node: &str, domain: &str, clique: u32, failures: Vec<Value>) -> AgentAnswer {
    AgentAnswer {
        node: node.into(),
        keys: Ok(keys(node, domain, clique)),
        failures: Ok(failures),
    }
}

fn forbidden(what: &str) -> NotRead {
    NotRead {
        what: what.into(),
        why: "forbidden: it needs RBAC `list nodes (cluster-wide)`".into(),
    }
}

#[test]
fn what_is_out_is_grouped_by_nvlink_domain_with_since_and_why() {
    let nodes = vec![
        node("a-0", degraded("2026-11-29T11:57:00Z"), None),
        node("a-1", degraded("2026-11-29T11:57:30Z"), None),
        node("a-2", json!([]), None),
        node("b-0", degraded("2026-11-29T11:59:00Z"), None),
        // No agent answer: the GPU feature discovery label places it.
        node("b-1", json!([]), Some(&format!("{B}.2"))),
        node("cpu-0", json!([]), None),
    ];
    let death = json!({"namespace": "ml", "pod": "t", "container": "c",
                       "kind": "shm_allocation_failed", "at": "2026-11-29T11:50:00Z"});
    let old = json!({"namespace": "ml", "pod": "t", "container": "c",
                     "kind": "shm_bus_error", "at": "2026-11-29T10:00:00Z"});
    let sources = Sources {
        nodes: Ok(nodes),
        rules: Ok(vec![
            rule("a-0", 0),
            rule("b-0", 3),
            json!({"metadata": {"name": "other"}}),
        ]),
        events: Ok(vec![]),
        agents: Ok(vec![
            agent("a-0", A, 1, vec![death, old]),
            agent("a-1", A, 1, vec![]),
            agent("a-2", A, 1, vec![]),
            agent("b-0", B, 2, vec![]),
        ]),
    };
    let r = build(sources, now(), Duration::from_secs(3600));
    let keys: Vec<Option<&str>> = r.domains.iter().map(|d| d.domain.as_deref()).collect();
    let a = format!("{A}.1");
    let b = format!("{B}.2");
    assert_eq!(keys, [Some(a.as_str()), Some(b.as_str()), None]);
    let da = &r.domains[0];
    assert_eq!(da.nodes, ["a-0", "a-1", "a-2"]);
    assert_eq!(da.nodes_out, ["a-0", "a-1"]);
    let whats: Vec<(&str, Option<u32>, &str)> = da
        .out
        .iter()
        .map(|o| (o.node.as_str(), o.gpu, o.what.as_str()))
        .collect();
    assert_eq!(
        whats,
        [
            ("a-0", None, "GpuLinkDegraded"),
            ("a-0", Some(0), "DeviceTaintRule"),
            ("a-1", None, "GpuLinkDegraded"),
        ]
    );
    assert_eq!(da.out[1].since.as_deref(), Some("2026-11-29T11:58:00Z"));
    assert_eq!(da.out[1].effect.as_deref(), Some("None"));
    assert_eq!(da.out[1].message, "GPU 0 has all its NVLinks down");
    assert_eq!(r.domains[1].nodes, ["b-0", "b-1"]);
    assert_eq!(r.domains[2].nodes, ["cpu-0"]);
    assert!(r.domains[2].out.is_empty());
    // Deaths within the hour only.
    assert_eq!(r.deaths.len(), 1);
    assert_eq!(r.deaths[0].kind, "shm_allocation_failed");
    assert_eq!(r.exit_status(), 1);
    let text = render::render(&r, now(), "1h");
    assert!(
        text.contains(&format!(
            "NVLink domain {A} clique 1: 2 of its 3 nodes out (a-0, a-1)"
        )),
        "{text}"
    );
    assert!(
        text.contains("a-0  GPU 0 tainted (None, DeviceTaintRule shmlink-a-0-gpu-0)  since 2026-11-29T11:58:00Z (2 min ago)"),
        "{text}"
    );
    assert!(
        text.contains("GpuPairsDegraded: GPU 0 fails with all 7 of its peers"),
        "{text}"
    );
}

#[test]
fn what_could_not_be_read_is_said_and_never_called_healthy() {
    let sources = Sources {
        nodes: Err(forbidden("Node conditions")),
        rules: Ok(vec![]),
        events: Ok(vec![]),
        agents: Ok(vec![AgentAnswer {
            node: "a-0".into(),
            keys: Err(forbidden("the agent on a-0 (GPUs)")),
            failures: Err(forbidden("the agent on a-0 (deaths)")),
        }]),
    };
    let r = build(sources, now(), Duration::from_secs(3600));
    // The agent's two refusals for one reason are one line.
    assert_eq!(r.not_read.len(), 2);
    assert_eq!(
        r.not_read[1].what,
        "2 agent answers (the agent on a-0 (GPUs), ...)"
    );
    assert_eq!(r.exit_status(), 2, "nothing out, but not everything read");
    let text = render::render(&r, now(), "1h");
    assert!(
        text.contains("Not read (nothing is said of it, healthy or not):"),
        "{text}"
    );
    assert!(text.contains("Node conditions: forbidden: it needs RBAC `list nodes (cluster-wide)`"));
    let all_read = Sources {
        nodes: Ok(vec![node("a-0", json!([]), None)]),
        rules: Ok(vec![]),
        events: Ok(vec![]),
        agents: Ok(vec![]),
    };
    let r = build(all_read, now(), Duration::from_secs(3600));
    assert_eq!(r.exit_status(), 0);
    assert!(render::render(&r, now(), "1h").starts_with("Nothing is out on the 1 nodes read."));
}

#[test]
fn shmlinks_events_in_the_window_are_counted_per_object_and_reason() {
    let event = |name: &str, reason: &str, at: &str, count: Option<u64>| {
        let mut e = json!({"reportingController": "shmlink", "reason": reason, "note": format!("{reason} on {name}"),
                           "eventTime": at, "regarding": {"kind": "Node", "name": name}});
        if let Some(c) = count {
            e["series"] = json!({"count": c, "lastObservedTime": at});
        }
        e
    };
    let mut foreign = event("a-0", "GpuLinkDegraded", "2026-11-29T11:59:00Z", None);
    foreign["reportingController"] = json!("kubelet");
    let sources = Sources {
        nodes: Ok(vec![]),
        rules: Ok(vec![]),
        events: Ok(vec![
            event("a-0", "GpuLinkDegraded", "2026-11-29T11:57:00Z", None),
            event("a-0", "GpuLinkDegraded", "2026-11-29T11:58:00Z", Some(3)),
            event("a-1", "GpuXid", "2026-11-29T09:00:00Z", None),
            foreign,
        ]),
        agents: Ok(vec![]),
    };
    let r = build(sources, now(), Duration::from_secs(3600));
    assert_eq!(
        r.events,
        [EventCount {
            regarding: "Node/a-0".into(),
            reason: "GpuLinkDegraded".into(),
            count: 4,
            last: Some("2026-11-29T11:58:00Z".into()),
            note: "GpuLinkDegraded on a-0".into(),
        }]
    );
}

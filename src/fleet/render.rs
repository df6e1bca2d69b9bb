//! Pure: the report as a person reads it, grouped by NVLink domain; times as how long ago.

use std::fmt::Write;
use std::time::SystemTime;

use super::report::{DomainOut, FleetReport, Out};
use crate::model::parse_rfc3339;
use crate::text::ago;

/// Deaths and Events listed at most (the newest); the rest counted.
const LIST_MAX: usize = 20;

pub fn render(r: &FleetReport, now: SystemTime, since: &str) -> String {
    let mut s = String::new();
    let out: Vec<&DomainOut> = r.domains.iter().filter(|d| !d.out.is_empty()).collect();
    if out.is_empty() {
        let nodes: usize = r.domains.iter().map(|d| d.nodes.len()).sum();
        let _ = writeln!(s, "Nothing is out on the {nodes} nodes read.");
    }
    for d in out {
        domain(&mut s, d, now);
    }
    deaths(&mut s, r, now, since);
    events(&mut s, r, now, since);
    if !r.not_read.is_empty() {
        let _ = writeln!(s, "\nNot read (nothing is said of it, healthy or not):");
        for n in &r.not_read {
            let _ = writeln!(s, "  {}: {}", n.what, n.why);
        }
    }
    s
}

fn when(at: Option<&str>, now: SystemTime) -> String {
    match at.and_then(|t| parse_rfc3339(t).map(|p| (t, p))) {
        Some((t, p)) => format!("{t} ({})", ago(p, now)),
        None => "?".into(),
    }
}

fn domain(s: &mut String, d: &DomainOut, now: SystemTime) {
    let title = match &d.domain {
        Some(key) => match key.rsplit_once('.') {
            Some((uuid, clique)) => format!("NVLink domain {uuid} clique {clique}"),
            None => format!("NVLink domain {key}"),
        },
        None => "Nodes in no known NVLink domain".into(),
    };
    let _ = writeln!(
        s,
        "{title}: {} of its {} nodes out ({})",
        d.nodes_out.len(),
        d.nodes.len().max(d.nodes_out.len()),
        d.nodes_out.join(", ")
    );
    for o in &d.out {
        let _ = writeln!(
            s,
            "  {}  {}  since {}\n      {}",
            o.node,
            what(o),
            when(o.since.as_deref(), now),
            why(o)
        );
    }
}

fn what(o: &Out) -> String {
    match (&o.rule, o.gpu) {
        (Some(rule), Some(gpu)) => format!(
            "GPU {gpu} tainted ({}, DeviceTaintRule {rule})",
            o.effect.as_deref().unwrap_or("?")
        ),
        (Some(rule), None) => format!("DeviceTaintRule {rule}"),
        _ => format!("{} True", o.what),
    }
}

fn why(o: &Out) -> String {
    match (o.reason.is_empty(), o.message.is_empty()) {
        (false, false) => format!("{}: {}", o.reason, o.message),
        (false, true) => o.reason.clone(),
        (true, false) => o.message.clone(),
        (true, true) => "(no reason given)".into(),
    }
}

fn deaths(s: &mut String, r: &FleetReport, now: SystemTime, since: &str) {
    if r.deaths.is_empty() {
        return;
    }
    let _ = writeln!(s, "\nDeaths told by the agents in the last {since}:");
    for d in r.deaths.iter().take(LIST_MAX) {
        let who = [&d.namespace, &d.pod, &d.container]
            .iter()
            .map(|p| p.as_deref().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join("/");
        let _ = writeln!(
            s,
            "  {}  {who}  {}  {}",
            d.node,
            d.kind,
            when(Some(&d.at), now)
        );
    }
    if r.deaths.len() > LIST_MAX {
        let _ = writeln!(s, "  ... and {} more", r.deaths.len() - LIST_MAX);
    }
}

fn events(s: &mut String, r: &FleetReport, now: SystemTime, since: &str) {
    if r.events.is_empty() {
        return;
    }
    let _ = writeln!(s, "\nshmlink's Events in the last {since}:");
    for e in r.events.iter().take(LIST_MAX) {
        let _ = writeln!(
            s,
            "  {}  {} x{}  {}",
            e.regarding,
            e.reason,
            e.count,
            when(e.last.as_deref(), now)
        );
    }
    if r.events.len() > LIST_MAX {
        let _ = writeln!(s, "  ... and {} more", r.events.len() - LIST_MAX);
    }
}

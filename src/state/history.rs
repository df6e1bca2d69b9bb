//! History: the failures told and the findings as they began and ended, as rows; how they are
//! written (in the writer's transaction), pruned (oldest first) and read back (filters, bounded:
//! which rows and in what order is `pages.rs`).

use std::time::SystemTime;

use rusqlite::{params, Connection, Transaction};
use serde::Serialize;
use serde_json::Value;

use super::pages::Plan;
pub use super::prune::{prune, Pruned};
pub use super::rows::{scrubbed, Filter, Retention, PER_OWNER};
use crate::model::{printable, unix_ms, Failure, Finding, Subject};

/// One failure row, ready to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureRow {
    pub at_ms: i64,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub kind: String,
    pub found_late: bool,
    pub json: String,
}

impl FailureRow {
    /// The failure as `check --json` writes it, plus `found_late`, kept at its own `at`.
    pub fn new(f: &Failure, found_late: bool) -> FailureRow {
        let mut value = serde_json::to_value(f).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("found_late".into(), Value::Bool(found_late));
        }
        FailureRow {
            at_ms: unix_ms(f.at.time()),
            namespace: f.placed.namespace.clone(),
            pod: f.placed.pod.clone(),
            kind: f.kind.as_str().to_string(),
            found_late,
            json: value.to_string(),
        }
    }
}

/// Whether a finding began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingEvent {
    Began,
    Ended,
}

/// One finding row: the finding as `check --json` writes it, plus `event` and `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct FindingRow {
    pub at_ms: i64,
    pub event: FindingEvent,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub kind: String,
    pub json: String,
}

impl FindingRow {
    pub fn new(f: &Finding, event: FindingEvent, at: SystemTime) -> FindingRow {
        let mut value = serde_json::to_value(f).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert(
                "event".into(),
                serde_json::to_value(event).unwrap_or_default(),
            );
            map.insert("at".into(), Value::String(rfc3339(at)));
        }
        let (namespace, pod) = match &f.subject {
            Subject::Container(c) => (c.namespace.clone(), c.pod.clone()),
            _ => (None, None),
        };
        FindingRow {
            at_ms: unix_ms(at),
            event,
            namespace,
            pod,
            kind: f.kind.as_str().to_string(),
            json: value.to_string(),
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

pub(super) fn insert_failure(tx: &Transaction<'_>, r: &FailureRow) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        r.at_ms,
        r.namespace,
        r.pod,
        r.kind,
        r.found_late,
        r.json
    ])
    .map(drop)
}

pub(super) fn insert_finding(tx: &Transaction<'_>, r: &FindingRow) -> rusqlite::Result<()> {
    let event = match r.event {
        FindingEvent::Began => "began",
        FindingEvent::Ended => "ended",
    };
    tx.prepare_cached(
        "INSERT INTO findings (at_ms, event, namespace, pod, kind, json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![r.at_ms, event, r.namespace, r.pod, r.kind, r.json])
    .map(drop)
}

/// The answer of `history --json` and `/api/v1/failures`, oldest first.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct History {
    pub failures: Vec<Value>,
    pub findings: Vec<Value>,
    /// Set when `limit` cut older rows off.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// What pruning cut in the window, per owner and kind (`prune.rs`), newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pruned: Vec<Pruned>,
}

/// Reads the rows `filter` asks for.
pub fn query(conn: &Connection, filter: &Filter) -> rusqlite::Result<History> {
    let (failures, cut_f) = select(conn, "failures", filter)?;
    let (findings, cut_g) = select(conn, "findings", filter)?;
    Ok(History {
        failures,
        findings,
        truncated: cut_f || cut_g,
        pruned: super::prune::read(conn, filter)?,
    })
}

fn select(
    conn: &Connection,
    table: &'static str,
    filter: &Filter,
) -> rusqlite::Result<(Vec<Value>, bool)> {
    let plan = Plan::new(conn, table, filter)?;
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let page = plan.page(conn, after, 512, usize::MAX)?;
        for (at, id, json) in page.rows {
            after = Some((at, id));
            // A row that no longer parses is left out rather than failing the whole answer.
            if let Ok(v) = serde_json::from_str(&json) {
                rows.push(scrubbed(v));
            }
        }
        if !page.more {
            break;
        }
    }
    Ok((rows, plan.truncated))
}

/// `history`'s table for a person: one line per failure, then one per finding's change.
pub fn render(h: &History) -> String {
    let mut out = String::new();
    if h.failures.is_empty() && h.findings.is_empty() && h.pruned.is_empty() {
        return "nothing stored for this window\n".into();
    }
    // Written out whatever the store holds: a terminal never gets a raw control character.
    let s = |v: &Value, k: &str| printable(v.get(k).and_then(Value::as_str).unwrap_or("-"));
    if !h.failures.is_empty() {
        out.push_str("FAILURES\n");
        for f in &h.failures {
            let late = if f.get("found_late").and_then(Value::as_bool) == Some(true) {
                " (found late)"
            } else {
                ""
            };
            let who = format!(
                "{}/{}/{}",
                s(f, "namespace"),
                s(f, "pod"),
                s(f, "container")
            );
            out.push_str(&format!(
                "{}  {}  {}{}\n",
                s(f, "at"),
                who,
                s(f, "kind"),
                late
            ));
            out.push_str(&format!("    {}\n", s(f, "message")));
        }
    }
    if !h.findings.is_empty() {
        out.push_str("FINDINGS\n");
        for f in &h.findings {
            out.push_str(&format!(
                "{}  {:<5}  {}  {}: {}\n",
                s(f, "at"),
                s(f, "event"),
                s(f, "kind"),
                s(f, "subject"),
                s(f, "message")
            ));
        }
    }
    for p in &h.pruned {
        out.push_str(&format!(
            "(and {} more {} of {} from {} to {}: the newest {} of each kind are kept per Pod)\n",
            p.count,
            printable(&p.kind),
            printable(&p.owner),
            p.first_at,
            p.last_at,
            PER_OWNER
        ));
    }
    if h.truncated {
        out.push_str("(older rows left out: narrow --since, --namespace or --pod)\n");
    }
    out
}

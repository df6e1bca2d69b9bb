//! History: the failures told and the findings as they began and ended, as rows; how they are
//! written (in the writer's transaction), pruned (oldest first) and read back (filters, bounded:
//! which rows and in what order is `pages.rs`).

use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, Transaction};
use serde::Serialize;
use serde_json::Value;

use super::pages::Plan;
pub use super::prune::{prune, Pruned, PER_OWNER};
use crate::model::{printable, redact, unix_ms, Failure, Finding, Subject};

/// How much history is kept: the last `max_age`; at most `per_owner` rows of each kind per
/// owner (a Pod, else a container or a finding's subject), its newest; and at most `max_rows`
/// rows and `max_bytes` of JSON in each of the two tables, cut from the largest groups first
/// (`prune.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_age: Duration,
    pub per_owner: u64,
    pub max_rows: u64,
    pub max_bytes: u64,
}

impl Default for Retention {
    /// A week answers "what happened on this node last weekend"; 100k rows of ~1-2 KiB JSON
    /// fit the 64 MiB, which a node's disk never misses.
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(7 * 24 * 3600),
            per_owner: super::prune::PER_OWNER,
            max_rows: 100_000,
            max_bytes: 64 << 20,
        }
    }
}

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
    /// The failure as `check --json` writes it, plus `found_late`. Its time is its own `at`
    /// (RFC 3339), else `now`.
    pub fn new(f: &Failure, found_late: bool, now: SystemTime) -> FailureRow {
        let mut value = serde_json::to_value(f).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("found_late".into(), Value::Bool(found_late));
        }
        let at = humantime::parse_rfc3339_weak(&f.at)
            .or_else(|_| humantime::parse_rfc3339(&f.at))
            .unwrap_or(now);
        FailureRow {
            at_ms: unix_ms(at),
            namespace: f.namespace.clone(),
            pod: f.pod.clone(),
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

/// What a reader asks of the history.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only rows at or after this time.
    pub since: Option<SystemTime>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    /// At most this many of each (the newest); 0: no bound.
    pub limit: usize,
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

/// A row as it is served: the texts a workload's line reached redacted and written out again,
/// for rows an older shmlink stored before it did so itself (a no-op for the others).
pub fn scrubbed(mut row: Value) -> Value {
    if let Value::Object(map) = &mut row {
        for key in ["evidence", "message", "told_by_workload"] {
            if let Some(Value::String(text)) = map.get_mut(key) {
                *text = printable(&redact(text));
            }
        }
    }
    row
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
            super::prune::PER_OWNER
        ));
    }
    if h.truncated {
        out.push_str("(older rows left out: narrow --since, --namespace or --pod)\n");
    }
    out
}

//! History: the failures told and the findings as they began and ended, as rows; how they are
//! written (in the writer's transaction), pruned (oldest first) and read back (filters, bounded).

use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, Transaction};
use serde::Serialize;
use serde_json::Value;

use crate::model::{unix_ms, Failure, Finding, Subject};

/// How much history is kept: the last `max_age`, and at most `max_rows` rows and `max_bytes`
/// of JSON in each of the two tables; the oldest go first.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_age: Duration,
    pub max_rows: u64,
    pub max_bytes: u64,
}

impl Default for Retention {
    /// A week answers "what happened on this node last weekend"; 100k rows of ~1-2 KiB JSON
    /// fit the 64 MiB, which a node's disk never misses.
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(7 * 24 * 3600),
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

/// Deletes what `keep` no longer keeps, oldest first; the rows deleted.
pub fn prune(conn: &Connection, keep: &Retention, now: SystemTime) -> rusqlite::Result<usize> {
    let oldest = unix_ms(now) - i64::try_from(keep.max_age.as_millis()).unwrap_or(i64::MAX);
    let rows = i64::try_from(keep.max_rows).unwrap_or(i64::MAX);
    let bytes = i64::try_from(keep.max_bytes).unwrap_or(i64::MAX);
    let mut deleted = 0;
    for table in ["failures", "findings"] {
        deleted += conn.execute(&format!("DELETE FROM {table} WHERE at_ms < ?1"), [oldest])?;
        // Rows beyond the newest `max_rows` (by insertion: ids only grow).
        deleted += conn.execute(
            &format!(
                "DELETE FROM {table} WHERE id <= (SELECT id FROM {table}
                 ORDER BY id DESC LIMIT 1 OFFSET ?1)"
            ),
            [rows],
        )?;
        // The oldest beyond `max_bytes` of JSON, counted from the newest.
        deleted += conn.execute(
            &format!(
                "DELETE FROM {table} WHERE id <= (SELECT id FROM (SELECT id,
                 SUM(length(json)) OVER (ORDER BY id DESC) AS acc FROM {table})
                 WHERE acc > ?1 ORDER BY id DESC LIMIT 1)"
            ),
            [bytes],
        )?;
    }
    Ok(deleted)
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
}

/// Reads the rows `filter` asks for.
pub fn query(conn: &Connection, filter: &Filter) -> rusqlite::Result<History> {
    let (failures, cut_f) = select(conn, "failures", filter)?;
    let (findings, cut_g) = select(conn, "findings", filter)?;
    Ok(History {
        failures,
        findings,
        truncated: cut_f || cut_g,
    })
}

fn select(conn: &Connection, table: &str, filter: &Filter) -> rusqlite::Result<(Vec<Value>, bool)> {
    let since = filter.since.map_or(i64::MIN, unix_ms);
    let limit = if filter.limit == 0 {
        i64::MAX
    } else {
        i64::try_from(filter.limit)
            .unwrap_or(i64::MAX)
            .saturating_add(1)
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT json FROM {table} WHERE at_ms >= ?1
           AND (?2 IS NULL OR namespace = ?2) AND (?3 IS NULL OR pod = ?3)
         ORDER BY at_ms DESC, id DESC LIMIT ?4"
    ))?;
    let mut rows: Vec<Value> = stmt
        .query_map(params![since, filter.namespace, filter.pod, limit], |r| {
            r.get::<_, String>(0)
        })?
        // A row that no longer parses is left out rather than failing the whole answer.
        .filter_map(|json| serde_json::from_str(&json.ok()?).ok())
        .collect();
    // A failure stored before `named_from` existed reads with it null: one shape for all.
    if table == "failures" {
        for row in &mut rows {
            if let Value::Object(map) = row {
                map.entry("named_from").or_insert(Value::Null);
            }
        }
    }
    let cut = filter.limit != 0 && rows.len() > filter.limit;
    rows.truncate(if cut { filter.limit } else { rows.len() });
    rows.reverse();
    Ok((rows, cut))
}

/// `history`'s table for a person: one line per failure, then one per finding's change.
pub fn render(h: &History) -> String {
    let mut out = String::new();
    if h.failures.is_empty() && h.findings.is_empty() {
        return "nothing stored for this window\n".into();
    }
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
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
    if h.truncated {
        out.push_str("(older rows left out: narrow --since, --namespace or --pod)\n");
    }
    out
}

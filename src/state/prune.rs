//! Pruning the history, fairly: past its age rows go; then each owner (a Pod, else a container,
//! else a finding's subject) keeps at most [`PER_OWNER`] rows of each kind, its newest; then,
//! over the table's caps, the oldest rows of the largest (owner, kind) groups go first. So a
//! storm of one Pod's deaths keeps only that Pod's newest and never erases another Pod's
//! failures. Every row cut but by age is counted in `pruned` (owner, kind, how many, first and
//! last), which the readers give with the rows: nothing told is lost without a trace.

use std::time::SystemTime;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

pub use super::rows::PER_OWNER;
use super::rows::{Filter, Retention};
use crate::model::{from_unix_ms, unix_ms};

/// Counts kept in `pruned` (the newest by their last row).
const PRUNED_ROWS: i64 = 10_000;

/// The owner of a row: the Pod; a failure without one by its container (a Docker container, a
/// host process); a finding by its subject (a GPU, a pair, the node).
fn owner(table: &str) -> &'static str {
    if table == "failures" {
        "coalesce(namespace, '') || '/' || coalesce(pod, json_extract(json, '$.container_id'), \
         json_extract(json, '$.container'), '')"
    } else {
        "coalesce(namespace, '') || '/' || coalesce(pod, json_extract(json, '$.subject'), '')"
    }
}

/// Each row's rank within its (owner, kind), newest first (ids only grow).
fn ranked(table: &str) -> String {
    format!(
        "SELECT id, length(json) AS len, ROW_NUMBER() OVER (PARTITION BY {}, kind ORDER BY id DESC)
         AS rank FROM {table}",
        owner(table)
    )
}

/// Deletes what `keep` no longer keeps; the rows deleted.
pub fn prune(conn: &Connection, keep: &Retention, now: SystemTime) -> rusqlite::Result<usize> {
    let oldest = unix_ms(now) - i64::try_from(keep.max_age.as_millis()).unwrap_or(i64::MAX);
    let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch("CREATE TEMP TABLE IF NOT EXISTS doomed (id INTEGER PRIMARY KEY)")?;
    let mut deleted = 0;
    for table in ["failures", "findings"] {
        deleted += tx.execute(&format!("DELETE FROM {table} WHERE at_ms < ?1"), [oldest])?;
        let ranked = ranked(table);
        // Beyond each owner's newest `per_owner` of a kind.
        deleted += cut(
            &tx,
            table,
            &format!("SELECT id FROM ({ranked}) WHERE rank > ?1"),
            big(keep.per_owner),
        )?;
        // Over the row cap: the largest groups' oldest first.
        deleted += cut(
            &tx,
            table,
            &format!(
                "SELECT id FROM ({ranked}) ORDER BY rank DESC, id ASC
                 LIMIT max(0, (SELECT count(*) FROM {table}) - ?1)"
            ),
            big(keep.max_rows),
        )?;
        // Over the bytes of JSON: the same order, until what is left fits.
        deleted += cut(
            &tx,
            table,
            &format!(
                "SELECT id FROM (SELECT id, SUM(len) OVER (ORDER BY rank DESC, id ASC
                 ROWS UNBOUNDED PRECEDING) - len AS before FROM ({ranked}))
                 WHERE before < (SELECT coalesce(sum(length(json)), 0) FROM {table}) - ?1"
            ),
            big(keep.max_bytes),
        )?;
    }
    tx.execute("DELETE FROM pruned WHERE last_ms < ?1", [oldest])?;
    tx.execute(
        "DELETE FROM pruned WHERE rowid IN (SELECT rowid FROM pruned ORDER BY last_ms DESC
         LIMIT -1 OFFSET ?1)",
        [PRUNED_ROWS],
    )?;
    tx.commit()?;
    Ok(deleted)
}

/// Deletes the rows of `table` that `select` (one parameter) names, counting them in `pruned`
/// first, in the caller's transaction.
fn cut(conn: &Connection, table: &str, select: &str, bound: i64) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM temp.doomed", [])?;
    let n = conn.execute(&format!("INSERT INTO temp.doomed {select}"), [bound])?;
    if n == 0 {
        return Ok(0);
    }
    conn.execute(
        &format!(
            "INSERT INTO pruned (tbl, owner, namespace, pod, kind, count, first_ms, last_ms)
             SELECT ?1, {owner}, namespace, pod, kind, count(*), min(at_ms), max(at_ms)
             FROM {table} WHERE id IN temp.doomed GROUP BY {owner}, kind
             ON CONFLICT (tbl, owner, kind) DO UPDATE SET count = count + excluded.count,
               first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms)",
            owner = owner(table)
        ),
        [table],
    )?;
    conn.execute(&format!("DELETE FROM {table} WHERE id IN temp.doomed"), [])
}

/// What pruning cut of one owner's kind: `history --json`'s and `/api/v1/failures`'s
/// `pruned[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// `failures` or `findings`.
    pub table: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    /// `<namespace>/<pod>`, else the container or the finding's subject.
    pub owner: String,
    pub kind: String,
    pub count: u64,
    /// The first and last row cut (RFC 3339).
    pub first_at: String,
    pub last_at: String,
}

/// The counts `filter` asks for (any row cut at or after its `since`), newest first.
pub fn read(conn: &Connection, filter: &Filter) -> rusqlite::Result<Vec<Pruned>> {
    // A store that an older shmlink opened last may lack the table.
    let has: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pruned'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if has.is_none() {
        return Ok(Vec::new());
    }
    let since = filter.since.map_or(i64::MIN, unix_ms);
    let mut stmt = conn.prepare_cached(
        "SELECT tbl, namespace, pod, owner, kind, count, first_ms, last_ms FROM pruned
         WHERE last_ms >= ?1 AND (?2 IS NULL OR namespace = ?2) AND (?3 IS NULL OR pod = ?3)
         ORDER BY last_ms DESC LIMIT 1000",
    )?;
    let rows = stmt.query_map(params![since, filter.namespace, filter.pod], |r| {
        let at = |ms: i64| humantime::format_rfc3339_millis(from_unix_ms(ms)).to_string();
        Ok(Pruned {
            table: r.get(0)?,
            namespace: r.get(1)?,
            pod: r.get(2)?,
            owner: r.get(3)?,
            kind: r.get(4)?,
            count: u64::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
            first_at: at(r.get(6)?),
            last_at: at(r.get(7)?),
        })
    })?;
    rows.collect()
}

//! The history read a page at a time: the one place its rows are chosen (time, namespace, Pod,
//! the newest `limit` of each table) and ordered (oldest first). `history` collects the pages
//! (`history::query`); `/api/v1/failures` writes each as it is read ([`Pages`]), so an answer
//! holds one page in memory, never the whole.
//!
//! A reading takes the newest rows as they were when it began: the oldest row it keeps and the
//! highest id are fixed first, then pages follow by (time, id) from that row on. Rows written
//! meanwhile are not in it; rows pruned meanwhile are simply missing.

use rusqlite::{params, Connection};

use super::rows::{scrubbed, Filter};
use crate::model::unix_ms;

/// A stored row longer than this is left out: the agent writes a few KiB at most, so such a row
/// is not its own, and one row must not take an answer's memory.
pub const MAX_ROW_BYTES: i64 = 64 << 10;

/// The two tables, in the order an answer writes them.
pub const TABLES: [&str; 2] = ["failures", "findings"];

/// What one table's reading takes.
#[derive(Debug, Clone)]
pub struct Plan {
    table: &'static str,
    since: i64,
    namespace: Option<String>,
    pod: Option<String>,
    max_id: i64,
    /// The oldest row kept (time, id), when `limit` cuts older ones off.
    from: (i64, i64),
    /// At most this many rows; 0: no bound.
    limit: usize,
    /// Whether `limit` cut older rows off.
    pub truncated: bool,
}

/// One page: its rows (time, id, JSON text) and whether more may follow.
pub struct Page {
    pub rows: Vec<(i64, i64, String)>,
    pub more: bool,
}

const WHERE: &str = "at_ms >= ?1 AND (?2 IS NULL OR namespace = ?2) AND (?3 IS NULL OR pod = ?3)
    AND id <= ?4 AND octet_length(json) <= ?5";

impl Plan {
    pub fn new(conn: &Connection, table: &'static str, filter: &Filter) -> rusqlite::Result<Plan> {
        let max_id: i64 = conn.query_row(
            &format!("SELECT coalesce(max(id), 0) FROM {table}"),
            [],
            |r| r.get(0),
        )?;
        let mut plan = Plan {
            table,
            since: filter.since.map_or(i64::MIN, unix_ms),
            namespace: filter.namespace.clone(),
            pod: filter.pod.clone(),
            max_id,
            from: (i64::MIN, i64::MIN),
            limit: filter.limit,
            truncated: false,
        };
        if plan.limit > 0 {
            // The `limit`-th newest row, and whether one is older still.
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT at_ms, id FROM {table} WHERE {WHERE}
                 ORDER BY at_ms DESC, id DESC LIMIT 2 OFFSET ?6"
            ))?;
            let offset = i64::try_from(plan.limit - 1).unwrap_or(i64::MAX);
            let edge: Vec<(i64, i64)> = stmt
                .query_map(
                    params![
                        plan.since,
                        plan.namespace,
                        plan.pod,
                        plan.max_id,
                        MAX_ROW_BYTES,
                        offset
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?
                .collect::<rusqlite::Result<_>>()?;
            if let Some(&oldest) = edge.first() {
                plan.from = oldest;
                plan.truncated = edge.len() > 1;
            }
        }
        Ok(plan)
    }

    /// The rows after `after` (time, id), oldest first: at most `max_rows`, and no more once
    /// their JSON passes `max_bytes`.
    pub fn page(
        &self,
        conn: &Connection,
        after: Option<(i64, i64)>,
        max_rows: usize,
        max_bytes: usize,
    ) -> rusqlite::Result<Page> {
        let after = after.unwrap_or((i64::MIN, i64::MIN));
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT at_ms, id, json FROM {} WHERE {WHERE}
               AND at_ms >= ?6 AND (at_ms, id) >= (?6, ?7)
               AND at_ms >= ?8 AND (at_ms, id) > (?8, ?9)
             ORDER BY at_ms, id LIMIT ?10",
            self.table
        ))?;
        let mut rows = stmt.query(params![
            self.since,
            self.namespace,
            self.pod,
            self.max_id,
            MAX_ROW_BYTES,
            self.from.0,
            self.from.1,
            after.0,
            after.1,
            i64::try_from(max_rows).unwrap_or(i64::MAX),
        ])?;
        let mut page = Page {
            rows: Vec::new(),
            more: false,
        };
        let mut bytes = 0;
        while let Some(row) = rows.next()? {
            let json: String = row.get(2)?;
            bytes += json.len();
            page.rows.push((row.get(0)?, row.get(1)?, json));
            if bytes >= max_bytes {
                break;
            }
        }
        page.more = page.rows.len() >= max_rows || bytes >= max_bytes;
        Ok(page)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// `history --json`'s answer, `{"failures":[...],"findings":[...]}` (and `"truncated":true`
/// when `limit` cut rows off), written a piece at a time: each piece one page of rows as
/// stored (a row that is not JSON left out).
pub struct Pages {
    conn: Connection,
    plans: Vec<Plan>,
    /// The table being written (an index of `plans`), its rows written and the last row.
    table: usize,
    written: usize,
    after: Option<(i64, i64)>,
    begun: bool,
    ended: bool,
    /// What pruning cut in the window (`prune.rs`), written after the tables.
    pruned: Vec<super::prune::Pruned>,
}

impl Pages {
    /// Fixes what the reading takes (see the module's words); `conn` is read-only.
    pub fn new(conn: Connection, filter: &Filter) -> rusqlite::Result<Pages> {
        // Each reading keeps a small page cache: a few readers at once, each a few hundred KiB.
        conn.pragma_update(None, "cache_size", -256)?;
        let plans = TABLES
            .iter()
            .map(|table| Plan::new(&conn, table, filter))
            .collect::<rusqlite::Result<_>>()?;
        let pruned = super::prune::read(&conn, filter)?;
        Ok(Pages {
            pruned,
            conn,
            plans,
            table: 0,
            written: 0,
            after: None,
            begun: false,
            ended: false,
        })
    }

    /// The next piece of the answer, at most one page of `max_rows` rows (or `max_bytes` of
    /// them); None once it is written whole.
    pub fn next_piece(
        &mut self,
        max_rows: usize,
        max_bytes: usize,
    ) -> rusqlite::Result<Option<String>> {
        if self.ended {
            return Ok(None);
        }
        let mut out = String::new();
        if !self.begun {
            out.push_str("{\"failures\":[");
            self.begun = true;
        }
        let plan = &self.plans[self.table];
        let page = plan.page(&self.conn, self.after, max_rows, max_bytes)?;
        let room = match plan.limit() {
            0 => usize::MAX,
            n => n.saturating_sub(self.written),
        };
        for (at, id, json) in page.rows.into_iter().take(room) {
            self.after = Some((at, id));
            // A row that no longer parses is left out; one an older shmlink stored whole is
            // redacted as it is served (`history::scrubbed`).
            let Ok(row) = serde_json::from_str::<serde_json::Value>(&json) else {
                continue;
            };
            if self.written > 0 {
                out.push(',');
            }
            out.push_str(&scrubbed(row).to_string());
            self.written += 1;
        }
        let full = plan.limit() > 0 && self.written >= plan.limit();
        if !page.more || full {
            self.table += 1;
            self.written = 0;
            self.after = None;
            if self.table < self.plans.len() {
                out.push_str("],\"findings\":[");
            } else {
                out.push(']');
                if self.plans.iter().any(|p| p.truncated) {
                    out.push_str(",\"truncated\":true");
                }
                if !self.pruned.is_empty() {
                    out.push_str(",\"pruned\":");
                    out.push_str(&serde_json::to_string(&self.pruned).unwrap_or("[]".into()));
                }
                out.push('}');
                self.ended = true;
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::schema::{self, Meta};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, SystemTime};

    /// A store file with its tables, and a connection to write it.
    fn store(dir: &Path) -> (PathBuf, Connection) {
        let path = dir.join("s.sqlite3");
        let mut conn = Connection::open(&path).unwrap();
        let meta = Meta {
            schema_version: schema::SCHEMA_VERSION,
            node: "n".into(),
            created_ms: 0,
            boot_id: "b".into(),
        };
        schema::create(&mut conn, &meta).unwrap();
        (path, conn)
    }

    fn failure(conn: &Connection, at_ms: i64, pod: &str, json: &str) {
        conn.execute(
            "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json)
             VALUES (?1, 'ml', ?2, 'k', 0, ?3)",
            params![at_ms, pod, json],
        )
        .unwrap();
    }

    fn whole(pages: &mut Pages, rows: usize) -> String {
        let mut out = String::new();
        while let Some(piece) = pages.next_piece(rows, 1 << 20).unwrap() {
            out.push_str(&piece);
        }
        out
    }

    fn since(ms: i64) -> Filter {
        Filter {
            since: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64)),
            ..Filter::default()
        }
    }

    fn read(path: &Path, filter: &Filter, rows: usize) -> String {
        whole(
            &mut Pages::new(Connection::open(path).unwrap(), filter).unwrap(),
            rows,
        )
    }

    #[test]
    fn the_newest_rows_oldest_first_whatever_the_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = store(dir.path());
        // Written out of time order (a death found late), two at one millisecond.
        for (at, pod) in [(5, "e"), (1, "a"), (3, "c"), (3, "d"), (2, "b")] {
            failure(&conn, at, pod, &format!("{{\"pod\":\"{pod}\"}}"));
        }
        failure(&conn, 4, "x", "{not json");
        let long = format!("\"{}\"", "y".repeat(MAX_ROW_BYTES as usize));
        failure(&conn, 4, "y", &long);
        let filter = Filter {
            limit: 4,
            ..since(0)
        };
        // The newest four rows are e, x (not JSON: left out), d, c; the too long one is none.
        let answers: Vec<String> = [1, 2, 100]
            .iter()
            .map(|&n| read(&path, &filter, n))
            .collect();
        assert_eq!(
            answers[0],
            r#"{"failures":[{"pod":"c"},{"pod":"d"},{"pod":"e"}],"findings":[],"truncated":true}"#
        );
        assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
        // No limit, a time, a Pod: as the filter says, and nothing cut off.
        assert_eq!(
            read(&path, &since(2), 2),
            r#"{"failures":[{"pod":"b"},{"pod":"c"},{"pod":"d"},{"pod":"e"}],"findings":[]}"#
        );
        let pod = Filter {
            pod: Some("d".into()),
            ..since(0)
        };
        assert_eq!(
            read(&path, &pod, 2),
            r#"{"failures":[{"pod":"d"}],"findings":[]}"#
        );
    }

    #[test]
    fn rows_written_during_a_reading_are_not_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = store(dir.path());
        for at in 1..=3 {
            failure(&writer, at, "p", &format!("{{\"at\":{at}}}"));
        }
        let mut pages = Pages::new(Connection::open(&path).unwrap(), &since(0)).unwrap();
        let first = pages.next_piece(1, 1 << 20).unwrap().unwrap();
        failure(&writer, 2, "late", "{\"at\":\"late\"}");
        failure(&writer, 9, "new", "{\"at\":9}");
        let rest = whole(&mut pages, 1);
        assert_eq!(
            first + &rest,
            r#"{"failures":[{"at":1},{"at":2},{"at":3}],"findings":[]}"#
        );
    }
}

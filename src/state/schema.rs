//! The store's tables and its `meta` row: what this binary writes and how it reads another's.

use rusqlite::{Connection, OptionalExtension};

/// The schema this binary reads and writes. A store with a higher number was written by a
/// newer shmlink: never read or written (a rollback must not destroy its state).
pub const SCHEMA_VERSION: i64 = 1;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    node TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    boot_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    namespace TEXT,
    pod TEXT,
    kind TEXT NOT NULL,
    found_late INTEGER NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_at ON failures (at_ms);
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    event TEXT NOT NULL,
    namespace TEXT,
    pod TEXT,
    kind TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_at ON findings (at_ms);
";

/// Tables added since schema 1 without changing [`SCHEMA_VERSION`]: created on every open, of
/// new and existing stores alike. A binary that predates one never reads it and leaves its rows
/// alone, so a rollback and a return keep working on the same file.
///
/// `link_counters`: each NVLink's error counters, one row per link per hour (`links::trend`),
/// by GPU UUID; a count the link does not answer is NULL. `pruned`: how many rows of each
/// owner's kind pruning cut (`prune.rs`).
const ADDED_TABLES: &str = "
CREATE TABLE IF NOT EXISTS link_counters (
    at_ms INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    link INTEGER NOT NULL,
    replay INTEGER,
    recovery INTEGER,
    crc_flit INTEGER,
    crc_data INTEGER,
    ecc_data INTEGER,
    recovery_successful INTEGER,
    recovery_failed INTEGER,
    recovery_events INTEGER,
    symbol INTEGER,
    effective INTEGER,
    PRIMARY KEY (gpu, link, at_ms)
);
CREATE INDEX IF NOT EXISTS link_counters_at ON link_counters (at_ms);
CREATE TABLE IF NOT EXISTS pruned (
    tbl TEXT NOT NULL,
    owner TEXT NOT NULL,
    namespace TEXT,
    pod TEXT,
    kind TEXT NOT NULL,
    count INTEGER NOT NULL,
    first_ms INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    PRIMARY KEY (tbl, owner, kind)
);
";

/// Creates the tables added since schema 1 where they are missing.
pub fn add_tables(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(ADDED_TABLES)
}

/// The `meta` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub schema_version: i64,
    pub node: String,
    pub created_ms: i64,
    pub boot_id: String,
}

/// The meta row, or None in a database that has none yet (new, or never finished creating).
pub fn read_meta(conn: &Connection) -> rusqlite::Result<Option<Meta>> {
    let has_meta: bool = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_meta {
        return Ok(None);
    }
    conn.query_row(
        "SELECT schema_version, node, created_ms, boot_id FROM meta WHERE id = 1",
        [],
        |r| {
            Ok(Meta {
                schema_version: r.get(0)?,
                node: r.get(1)?,
                created_ms: r.get(2)?,
                boot_id: r.get(3)?,
            })
        },
    )
    .optional()
}

/// Creates the tables and the meta row of a fresh store, in one transaction.
pub fn create(conn: &mut Connection, meta: &Meta) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    tx.execute_batch(TABLES)?;
    tx.execute_batch(ADDED_TABLES)?;
    tx.execute(
        "INSERT OR REPLACE INTO meta (id, schema_version, node, created_ms, boot_id)
         VALUES (1, ?1, ?2, ?3, ?4)",
        rusqlite::params![
            meta.schema_version,
            meta.node,
            meta.created_ms,
            meta.boot_id
        ],
    )?;
    tx.commit()
}

pub fn set_boot_id(conn: &Connection, boot_id: &str) -> rusqlite::Result<()> {
    conn.execute("UPDATE meta SET boot_id = ?1 WHERE id = 1", [boot_id])
        .map(drop)
}

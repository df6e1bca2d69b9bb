//! The `link_counters` rows: each NVLink's error counters, one row per link per hour, kept
//! [`LINK_KEEP`] and at most [`LINK_ROWS_MAX`] rows (the oldest go first), read back at start
//! (`serve`) and read-only (`check`).

use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, Transaction};

use crate::model::{unix_ms, LinkSample};

/// How long link rows are kept: 10 days (`links::trend::TrendRules::keep`), so the week judged
/// is whole after a few days of the agent down.
pub const LINK_KEEP: Duration = Duration::from_secs(10 * 24 * 3600);
/// Rows kept at most: 10 days of hourly rows of 400 links (an 8-GPU board has 144), ~7 MB.
pub const LINK_ROWS_MAX: u64 = 100_000;

const COLUMNS: &str = "at_ms, gpu, link, replay, recovery, crc_flit, crc_data, ecc_data, \
                       recovery_successful, recovery_failed, recovery_events, symbol, effective";

/// SQLite's integers are signed: a count past i64::MAX (never met) is stored as the maximum.
fn stored(n: Option<u64>) -> Option<i64> {
    n.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

pub(crate) fn insert(tx: &Transaction<'_>, s: &LinkSample) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO link_counters ({COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
    ))?;
    let c = s.counts.map(stored);
    stmt.execute(params![
        s.at_ms, s.gpu, s.link, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
    ])?;
    Ok(())
}

/// Drops rows older than [`LINK_KEEP`] at `now` and those over a day ahead of it (written
/// while the clock was wrong, they would hold back the hourly rows), then the oldest past
/// [`LINK_ROWS_MAX`].
pub(crate) fn prune(conn: &Connection, now: SystemTime) -> rusqlite::Result<usize> {
    let cutoff = unix_ms(now.checked_sub(LINK_KEEP).unwrap_or(SystemTime::UNIX_EPOCH));
    let ahead = unix_ms(now).saturating_add(24 * 3600 * 1000);
    let old = conn.execute(
        "DELETE FROM link_counters WHERE at_ms < ?1 OR at_ms > ?2",
        [cutoff, ahead],
    )?;
    let excess = conn.execute(
        "DELETE FROM link_counters WHERE rowid IN (
             SELECT rowid FROM link_counters ORDER BY at_ms DESC LIMIT -1 OFFSET ?1)",
        [LINK_ROWS_MAX as i64],
    );
    Ok(old + excess.unwrap_or(0))
}

/// Every kept row (at most [`LINK_ROWS_MAX`], the newest); a store without the table (written
/// before it, read read-only) has none.
pub fn read(conn: &Connection) -> rusqlite::Result<Vec<LinkSample>> {
    let has: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'link_counters'",
        [],
        |r| r.get(0),
    )?;
    if has == 0 {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM link_counters ORDER BY at_ms DESC LIMIT ?1"
    ))?;
    let rows = stmt.query_map([LINK_ROWS_MAX as i64], |r| {
        let mut counts = [None; 10];
        for (i, slot) in counts.iter_mut().enumerate() {
            *slot = r
                .get::<_, Option<i64>>(3 + i)?
                .and_then(|v| u64::try_from(v).ok());
        }
        Ok(LinkSample {
            at_ms: r.get(0)?,
            gpu: r.get(1)?,
            link: r.get(2)?,
            counts,
        })
    })?;
    let mut out: Vec<LinkSample> = rows.filter_map(Result::ok).collect();
    out.reverse();
    Ok(out)
}

//! The store's one writer: a thread that owns the read-write connection and commits what
//! callers send over a bounded channel, in batches, so a log flood or hundreds of containers'
//! positions never become an fsync storm.
//!
//! The bound: at most one commit per [`QUIET_GAP`], or per [`DEATH_GAP`] while the batch holds a
//! failure (so a death reaches the disk within 100 ms but a flood of them still commits at most
//! 10 times a second). A batch holds at most [`MAX_BATCH`] records; past that the writer waits
//! for its gap, the channel fills, and senders drop (counted), never block.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, ErrorCode};
use serde_json::Value;

use super::history::{self, FailureRow, FindingRow, Retention};
use super::StateMetrics;
use crate::links::store as links;
use crate::model::LinkSample;

pub const QUIET_GAP: Duration = Duration::from_secs(1);
pub const DEATH_GAP: Duration = Duration::from_millis(100);
pub const MAX_BATCH: usize = 10_000;
/// Records waiting in the channel before senders drop.
pub const CHANNEL: usize = 16_384;
/// How often history is pruned.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// After a failed write (a full disk), how long batches are dropped before one is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What callers send.
pub enum Record {
    Failure(FailureRow),
    Finding(FindingRow),
    /// A checkpoint: last write wins.
    Put(String, Value),
    /// Failures told and the checkpoints that pass them: added to the batch as one, so one
    /// transaction commits all of them or none.
    Told(Vec<FailureRow>, Vec<(String, Value)>),
    /// Link counter samples (`link_counters`), one per link.
    LinkSamples(Vec<LinkSample>),
    /// Commit what is waiting now, then answer.
    Flush(SyncSender<()>),
    /// Commit what is waiting and end (the store closes; senders may remain elsewhere).
    Stop,
}

/// The clock history is pruned by (a test's own clock moves a week in a moment).
pub type Clock = std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>;

#[derive(Default)]
struct Batch {
    failures: Vec<FailureRow>,
    findings: Vec<FindingRow>,
    puts: BTreeMap<String, Value>,
    links: Vec<LinkSample>,
    records: usize,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.records == 0
    }

    fn gap(&self) -> Duration {
        if self.failures.is_empty() {
            QUIET_GAP
        } else {
            DEATH_GAP
        }
    }
}

pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) metrics: StateMetrics,
    pub(super) retention: Retention,
    pub(super) clock: Clock,
    pub(super) retry_after: Duration,
}

impl Writer {
    /// Runs until told to stop or every sender is gone, committing what is left.
    pub(super) fn run(mut self, rx: Receiver<Record>) {
        let mut batch = Batch::default();
        let mut last_commit = Instant::now() - QUIET_GAP;
        let mut last_prune: Option<Instant> = None;
        let mut broken = Broken {
            since: None,
            retry_after: self.retry_after,
        };
        loop {
            let due = last_commit + batch.gap();
            let got = if batch.is_empty() {
                rx.recv_timeout(PRUNE_EVERY)
            } else if batch.records >= MAX_BATCH {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                Err(RecvTimeoutError::Timeout)
            } else {
                rx.recv_timeout(due.saturating_duration_since(Instant::now()))
            };
            let stop = match got {
                Ok(Record::Failure(r)) => add(&mut batch, |b| b.failures.push(r)),
                Ok(Record::Finding(r)) => add(&mut batch, |b| b.findings.push(r)),
                Ok(Record::Put(k, v)) => add(&mut batch, |b| drop(b.puts.insert(k, v))),
                Ok(Record::Told(failures, puts)) => add(&mut batch, |b| {
                    b.failures.extend(failures);
                    b.puts.extend(puts);
                }),
                Ok(Record::LinkSamples(rows)) => add(&mut batch, |b| b.links.extend(rows)),
                Ok(Record::Flush(ack)) => {
                    self.commit(&mut batch, &mut broken);
                    last_commit = Instant::now();
                    let _ = ack.send(());
                    false
                }
                Ok(Record::Stop) | Err(RecvTimeoutError::Disconnected) => true,
                Err(RecvTimeoutError::Timeout) => false,
            };
            // Due (the gap has passed since the last commit), or stopping.
            if (stop || Instant::now() >= due) && !batch.is_empty() {
                self.commit(&mut batch, &mut broken);
                last_commit = Instant::now();
            }
            if broken.since.is_none() && last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                self.prune(&mut broken);
                last_prune = Some(Instant::now());
            }
            if stop {
                return;
            }
        }
    }

    /// One transaction for the whole batch: rows in the order sent, then the checkpoints, so a
    /// position never lands without the deaths sent before it.
    fn commit(&mut self, batch: &mut Batch, broken: &mut Broken) {
        let b = std::mem::take(batch);
        if b.is_empty() {
            return;
        }
        if broken
            .since
            .is_some_and(|t| t.elapsed() < broken.retry_after)
        {
            self.metrics.dropped.inc_by(b.records as u64);
            return;
        }
        let rows = (b.failures.len() + b.findings.len() + b.puts.len() + b.links.len()) as u64;
        match write(&mut self.conn, &b) {
            Ok(()) => {
                self.metrics.commits.inc();
                self.metrics.rows_written.inc_by(rows);
                if broken.since.take().is_some() {
                    self.metrics.up.set(1);
                    tracing::warn!("the state store is written again (shmlink_state_up 1)");
                }
            }
            Err(e) => {
                self.metrics.dropped.inc_by(b.records as u64);
                self.broke(&e, broken);
            }
        }
    }

    fn prune(&mut self, broken: &mut Broken) {
        let now = (self.clock)();
        let pruned = history::prune(&self.conn, &self.retention, now)
            .and_then(|n| Ok(n + links::prune(&self.conn, now)?));
        match pruned {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "pruned the oldest history"),
            Err(e) => self.broke(&e, broken),
        }
    }

    /// A write failed: a full or read-only disk, or the file went bad. The agent goes on
    /// without the store (said once, `shmlink_state_up 0`), dropping what it is sent (counted)
    /// and trying a batch again every [`RETRY_AFTER`] (a disk freed); a busy database (a reader
    /// holding it past the timeout) only loses that batch.
    fn broke(&mut self, e: &rusqlite::Error, broken: &mut Broken) {
        if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) {
            tracing::warn!(error = %e, "the state store was busy; one batch of history dropped");
            return;
        }
        if broken.since.replace(Instant::now()).is_none() {
            self.metrics.up.set(0);
            tracing::error!(
                error = %e,
                "the state store cannot be written (disk full, read-only or failing?); running \
                 without it, trying again every {}s (shmlink_state_up 0)",
                broken.retry_after.as_secs()
            );
        }
    }
}

/// Since when writes fail, and how long until one is tried again.
pub(super) struct Broken {
    since: Option<Instant>,
    retry_after: Duration,
}

/// Adds a record to the batch; never a reason to stop.
fn add(batch: &mut Batch, f: impl FnOnce(&mut Batch)) -> bool {
    f(batch);
    batch.records += 1;
    false
}

fn write(conn: &mut Connection, b: &Batch) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for r in &b.failures {
        history::insert_failure(&tx, r)?;
    }
    for r in &b.findings {
        history::insert_finding(&tx, r)?;
    }
    for r in &b.links {
        links::insert(&tx, r)?;
    }
    {
        let mut put = tx.prepare_cached(
            "INSERT INTO checkpoints (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &b.puts {
            put.execute(rusqlite::params![k, v.to_string()])?;
        }
    }
    tx.commit()
}

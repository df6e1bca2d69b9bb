//! The agent's state on the node (`--state-dir`): one SQLite file (WAL) with the history of
//! failures and findings and generic checkpoints (JSON under a key) for what a restart must
//! resume from. Below the agent, the server and the commands; it knows only the model.
//!
//! - `open.rs`: opening, and what is done with a corrupt, foreign, newer or unwritable store;
//! - `place.rs`: DIR and the store's names looked at without following a link or blocking;
//! - `schema.rs`: the tables and the meta row;
//! - `writer.rs`: the one writer thread, batched and bounded;
//! - `history.rs`: the history's rows and reading them back;
//! - `pages.rs`: which rows a reading takes, a page at a time (`/api/v1/failures` streams them);
//! - `prune.rs`: pruning by age, per owner and kind, and under the caps, with counts of the cut;
//! - `links::store` (in `links/`): each NVLink's error counters, hourly over days (`links::trend`).

pub mod history;
use crate::links::store as links;
pub mod open;
pub mod pages;
pub mod place;
pub mod prune;
pub mod rows;
pub mod schema;
pub mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;

pub use history::{Filter, FindingEvent, History, Retention};
pub use open::{Reset, Unavailable};
use writer::{Clock, Record, Writer};

use crate::model::{Failure, Finding, LinkSample};

/// How long a [`StoreSender::told`] record waits for room in a full queue: past the writer's
/// longest gap between two commits with a full batch.
pub const TOLD_WAIT: Duration = Duration::from_secs(2);

/// Who the store belongs to: a store of another node is not this one's, and after another
/// boot the kernel log's positions mean nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub node: String,
    pub boot_id: String,
}

/// This boot's ID (`<proc-root>/sys/kernel/random/boot_id`), or "" where it cannot be read (then
/// every start counts as the same boot as the last that could not read it either).
pub fn boot_id(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The store's own series.
#[derive(Debug, Clone, Default)]
pub struct StateMetrics {
    pub up: Gauge,
    pub resets: Family<Vec<(String, String)>, Counter>,
    pub commits: Counter,
    pub rows_written: Counter,
    pub dropped: Counter,
}

impl StateMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "shmlink_state_up",
            "1 while the state store (--state-dir) is being written, 0 when the agent runs without it",
            self.up.clone(),
        );
        registry.register(
            "shmlink_state_resets",
            "State stores moved aside and begun afresh, by reason (corrupt, foreign_node, not_regular, not_shmlink)",
            self.resets.clone(),
        );
        registry.register(
            "shmlink_state_commits",
            "Transactions committed to the state store",
            self.commits.clone(),
        );
        registry.register(
            "shmlink_state_rows_written",
            "History rows, link counter rows and checkpoints written to the state store",
            self.rows_written.clone(),
        );
        registry.register(
            "shmlink_state_dropped",
            "Records not written to the state store (its queue full, or the store unwritable)",
            self.dropped.clone(),
        );
    }
}

/// An open store: its writer thread, and what was found at start.
pub struct Store {
    tx: Option<SyncSender<Record>>,
    thread: Option<thread::JoinHandle<()>>,
    path: PathBuf,
    boot_changed: bool,
    checkpoints: BTreeMap<String, Value>,
    /// The link counter rows as stored when the store was opened.
    link_samples: Vec<LinkSample>,
    metrics: StateMetrics,
}

/// How a store is opened; tests set the clock, retention and retry.
pub struct Options {
    pub retention: Retention,
    pub clock: Clock,
    /// After a failed write, how long until one is tried again ([`writer::RETRY_AFTER`]).
    pub retry_after: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            retention: Retention::default(),
            clock: Arc::new(SystemTime::now),
            retry_after: writer::RETRY_AFTER,
        }
    }
}

impl Store {
    /// Opens `dir`'s store for `identity`, recovering as `open.rs` says; `Err`: the agent runs
    /// without one (said once here, `shmlink_state_up 0`).
    pub fn open(
        dir: &Path,
        identity: &Identity,
        options: Options,
        metrics: &StateMetrics,
    ) -> Result<Store, Unavailable> {
        let opened = match open::open(dir, identity) {
            Ok(o) => o,
            Err(e) => {
                metrics.up.set(0);
                tracing::error!("{e}; running without the state store (shmlink_state_up 0)");
                return Err(e);
            }
        };
        if let Some((why, aside)) = &opened.reset {
            metrics
                .resets
                .get_or_create(&vec![("reason".into(), why.as_str().into())])
                .inc();
            tracing::error!(
                reason = why.as_str(),
                aside = %aside.display(),
                "the state store was {} and was moved aside; starting with an empty one",
                why.said()
            );
        }
        if opened.boot_changed {
            tracing::info!(
                "the node rebooted since the state was stored: kernel log positions are not reused"
            );
        }
        let checkpoints = read_checkpoints(&opened.conn).unwrap_or_default();
        // A store of before the link table gets it now; failing that, the writes fail later
        // (said then) and the rest of the store is still used.
        let link_samples = schema::add_tables(&opened.conn)
            .and_then(|()| links::read(&opened.conn))
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the stored link counters could not be read");
                Vec::new()
            });
        let (tx, rx) = mpsc::sync_channel(writer::CHANNEL);
        let writer = Writer {
            conn: opened.conn,
            metrics: metrics.clone(),
            retention: options.retention,
            clock: options.clock,
            retry_after: options.retry_after,
        };
        let thread = thread::Builder::new()
            .name("state".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| Unavailable::Dir {
                path: dir.into(),
                source: e,
            })?;
        metrics.up.set(1);
        Ok(Store {
            tx: Some(tx),
            thread: Some(thread),
            path: opened.path,
            boot_changed: opened.boot_changed,
            checkpoints,
            link_samples,
            metrics: metrics.clone(),
        })
    }

    /// [`Store::open`] on a thread of its own, waited for at most `wait`: a hung disk (or
    /// anything else that holds an open) must not hold up the agent's start. Past `wait` the
    /// agent goes on without a store (said, `shmlink_state_up 0`); a store that opens later is
    /// closed at once.
    pub fn open_within(
        dir: &Path,
        identity: &Identity,
        options: Options,
        metrics: &StateMetrics,
        wait: Duration,
    ) -> Result<Store, Unavailable> {
        let (tx, rx) = mpsc::sync_channel(1);
        let (dir_, identity, m) = (dir.to_path_buf(), identity.clone(), metrics.clone());
        let spawned = thread::Builder::new()
            .name("state-open".into())
            .spawn(move || {
                let opened = Store::open(&dir_, &identity, options, &m);
                if let Err(mpsc::SendError(Ok(late))) = tx.send(opened) {
                    drop(late);
                    m.up.set(0);
                    tracing::warn!("the state store opened too late and was closed");
                }
            });
        if let Err(source) = spawned {
            return Err(Unavailable::Dir {
                path: dir.into(),
                source,
            });
        }
        rx.recv_timeout(wait).unwrap_or_else(|_| {
            metrics.up.set(0);
            let e = Unavailable::TimedOut {
                path: dir.into(),
                waited: wait,
            };
            tracing::error!("{e}; running without the state store (shmlink_state_up 0)");
            Err(e)
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its directory (`--state-dir`), as [`read_history`] takes it.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(&self.path)
    }

    /// The store was written during another boot: kernel-log positions are not to be trusted.
    pub fn boot_changed(&self) -> bool {
        self.boot_changed
    }

    /// A checkpoint as stored when the store was opened.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.checkpoints.get(key)
    }

    /// The checkpoints under `prefix` as stored when the store was opened.
    pub fn get_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a Value)> {
        self.checkpoints
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v))
    }

    /// The link counter samples as stored when the store was opened, oldest first; taken once
    /// (the trend keeper holds them from then on).
    pub fn take_link_samples(&mut self) -> Vec<LinkSample> {
        std::mem::take(&mut self.link_samples)
    }

    /// A handle to send records with, for another thread.
    pub fn sender(&self) -> StoreSender {
        StoreSender {
            tx: self.tx.clone(),
            dropped: self.metrics.dropped.clone(),
        }
    }

    /// Commits what was sent so far and waits for it (at most `wait`); false if it did not.
    pub fn flush(&self, wait: Duration) -> bool {
        self.sender().flush(wait)
    }
}

impl Drop for Store {
    /// The last batch is committed and the writer ends, even while senders remain (theirs
    /// are then dropped and counted).
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Record::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends records to the writer; never blocks (a full queue drops and counts).
#[derive(Clone)]
pub struct StoreSender {
    tx: Option<SyncSender<Record>>,
    dropped: Counter,
}

impl StoreSender {
    /// False: not sent (no store, or its queue full: counted).
    fn send(&self, r: Record) -> bool {
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(r) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
                false
            }
        }
    }

    /// Failures told (each with its `found_late`) and the checkpoints that pass them (the
    /// follower's positions, the Events planned for them), as one record: committed in one
    /// transaction, all or none. Unlike the other records it waits for room in a full queue,
    /// at most [`TOLD_WAIT`]: dropped, its deaths would have Events but no stored position
    /// past them, and a kill then would tell them again. False: not sent (counted as dropped).
    pub fn told(&self, failures: &[Failure], puts: Vec<(String, Value)>) -> bool {
        let Some(tx) = &self.tx else { return false };
        let rows = failures
            .iter()
            .map(|f| history::FailureRow::new(f, f.found_late))
            .collect();
        let mut record = Record::Told(rows, puts);
        let deadline = Instant::now() + TOLD_WAIT;
        loop {
            match tx.try_send(record) {
                Ok(()) => return true,
                Err(TrySendError::Full(r)) if Instant::now() < deadline => {
                    record = r;
                    thread::sleep(Duration::from_millis(5));
                }
                Err(_) => {
                    self.dropped.inc();
                    return false;
                }
            }
        }
    }

    /// A failure told (`found_late`: it happened while the agent was down).
    pub fn failure(&self, f: &Failure, found_late: bool) {
        self.send(Record::Failure(history::FailureRow::new(f, found_late)));
    }

    /// A finding began or ended at `at`.
    pub fn finding(&self, f: &Finding, event: FindingEvent, at: SystemTime) {
        self.send(Record::Finding(history::FindingRow::new(f, event, at)));
    }

    /// Link counter samples (at most one per link per hour: the trend keeper's choice).
    pub fn link_samples(&self, rows: Vec<LinkSample>) {
        if !rows.is_empty() {
            self.send(Record::LinkSamples(rows));
        }
    }

    /// A checkpoint, committed with (never before) the records sent before it.
    pub fn put(&self, key: &str, value: Value) {
        self.send(Record::Put(key.to_string(), value));
    }

    /// Commits what was sent so far and waits for it (at most `wait`); false if it did not.
    pub fn flush(&self, wait: Duration) -> bool {
        let Some(tx) = &self.tx else { return false };
        let (ack, done) = mpsc::sync_channel(1);
        tx.send(Record::Flush(ack)).is_ok() && done.recv_timeout(wait).is_ok()
    }
}

fn read_checkpoints(conn: &rusqlite::Connection) -> rusqlite::Result<BTreeMap<String, Value>> {
    let mut stmt = conn.prepare("SELECT key, value FROM checkpoints")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    Ok(rows
        .filter_map(|r| {
            let (k, v) = r.ok()?;
            Some((k, serde_json::from_str(&v).ok()?))
        })
        .collect())
}

/// The stored failures `filter` asks for, as failures again (for `check` and a restart); a
/// row that does not read as this agent writes it is left out, said once.
pub fn read_failures(dir: &Path, filter: &Filter) -> Result<Vec<Failure>, Unavailable> {
    let rows = read_history(dir, filter)?.failures;
    let count = rows.len();
    let failures: Vec<Failure> = rows
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    if failures.len() < count {
        tracing::warn!(
            rows = count,
            read = failures.len(),
            "some stored failures do not read as this agent writes them"
        );
    }
    Ok(failures)
}

/// The link counter samples of the store in `dir`, read-only (for `check`), oldest first.
pub fn read_link_samples(dir: &Path) -> Result<Vec<LinkSample>, Unavailable> {
    let conn = open::open_read_only(dir)?;
    links::read(&conn).map_err(|source| Unavailable::Sqlite {
        path: dir.join(open::FILE),
        source,
    })
}

/// Reads the history of the store in `dir`, read-only (for `history` and the HTTP endpoint).
pub fn read_history(dir: &Path, filter: &Filter) -> Result<History, Unavailable> {
    let conn = open::open_read_only(dir)?;
    history::query(&conn, filter).map_err(|source| Unavailable::Sqlite {
        path: dir.join(open::FILE),
        source,
    })
}

/// The history of the store in `dir` as `/api/v1/failures` writes it, a page at a time
/// (read-only; each page read where blocking is fine).
pub fn read_history_pages(dir: &Path, filter: &Filter) -> Result<pages::Pages, Unavailable> {
    let conn = open::open_read_only(dir)?;
    pages::Pages::new(conn, filter).map_err(|source| Unavailable::Sqlite {
        path: dir.join(open::FILE),
        source,
    })
}

/// One checkpoint of the store in `dir`, read-only (`check` takes serve's `job_links`).
pub fn read_checkpoint(dir: &Path, key: &str) -> Result<Option<Value>, Unavailable> {
    let conn = open::open_read_only(dir)?;
    read_checkpoints(&conn)
        .map(|mut all| all.remove(key))
        .map_err(|source| Unavailable::Sqlite {
            path: dir.join(open::FILE),
            source,
        })
}

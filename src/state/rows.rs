//! What the history's readers and its pruning share: what a reader asks ([`Filter`]), how much
//! is kept ([`Retention`]), and a stored row as it is served ([`scrubbed`]). Beneath
//! `history.rs`, `pages.rs` and `prune.rs`, which all read them.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::model::{printable, redact};

/// Rows kept per owner and kind in each of `failures` and `findings` ([`Retention::per_owner`]).
pub const PER_OWNER: u64 = 1_000;

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
            per_owner: PER_OWNER,
            max_rows: 100_000,
            max_bytes: 64 << 20,
        }
    }
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

/// A row as it is served: the texts a workload's line reached redacted and written out again,
/// for rows an older shmlink stored before it did so itself (a no-op for the others).
pub fn scrubbed(mut row: Value) -> Value {
    if let Value::Object(map) = &mut row {
        for key in ["evidence", "message", "told_by_workload"] {
            if let Some(Value::String(text)) = map.get_mut(key) {
                *text = printable(&redact(text));
            }
        }
        // A failure (the rows with evidence) stored before `named_from` existed reads with it
        // null: one shape for all.
        if map.contains_key("evidence") {
            map.entry("named_from").or_insert(Value::Null);
        }
    }
    row
}

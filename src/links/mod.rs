//! NVLink, one feature, read top to bottom:
//!
//! - the counters and a sample: plain types in `model/` (`LinkCounter`, `LinkSample`,
//!   `LinkTrend`; `LinkCounts`, `LinkTable`), since the snapshot, the store and the failures
//!   carry them;
//! - the 60 s windows and the rules over them are the pair judge's
//!   (`gpu::pairs::rules::{window, counters, nvlink5}`): they judge pairs on its board;
//! - `trend/`: each counter kept over days (`TrendKeeper`, one sample per link per hour), the
//!   growth that is steady but slow, and its words (`trend/words.rs`);
//! - `ledger.rs`: the job links ledger (`model::JobLinks`, the data the snapshot carries): fed
//!   each scan, asked a container's deltas, saved as a checkpoint;
//! - `history.rs`: the ledger's history (`model::LinkHistory`): the links and pairs after each
//!   scan that changed them, what a hang's window is asked of;
//! - `jobs.rs`: the ledger fed from a scan, and a failure's `gpu_links` asked of it;
//!   `job_words.rs`: the sentence that says them;
//! - `metrics.rs`: the trends' two gauge families; `store.rs`: the `link_counters` rows.
//!
//! It sits just above `model/` and imports nothing else of the crate: the judges (`gpu/`,
//! `scan.rs`), the outlets (`text/`, `metrics/`, `state/`) and the failures call into it, and
//! it never calls back.

pub mod history;
pub mod job_words;
pub mod jobs;
pub mod ledger;
pub mod metrics;
pub mod store;
pub mod trend;

pub use history::{PairNow, SavedHistory, LINK_HISTORY_KEEP, LINK_MARKS, LINK_RUNS, PAIR_MARKS};
pub use ledger::{
    LinkChange, LinkDeltas, SavedJobLinks, JOB_LINKS_CONTAINERS, JOB_LINKS_KEEP_GONE,
    JOB_LINKS_KEY, JOB_LINKS_SAVE_EVERY,
};

//! NVLink, one feature: the trend of each link's counters over days, the job ledger and its
//! history, their words, metrics and stored rows.

pub mod history;
pub mod job_words;
pub mod jobs;
pub mod ledger;
pub mod metrics;
pub mod store;
pub mod trend;
pub mod words;

pub use history::{
    LinkHistory, LinkKey, Mark, PairKey, PairMark, PairNow, Run, SavedHistory, LINK_HISTORY_KEEP,
    LINK_MARKS, LINK_RUNS, PAIR_MARKS,
};
pub use ledger::{
    GpuLinkDelta, GpuLinks, JobLinks, LinkChange, LinkDeltas, SavedJobLinks, JOB_LINKS_CONTAINERS,
    JOB_LINKS_KEEP_GONE, JOB_LINKS_KEY, JOB_LINKS_SAVE_EVERY,
};

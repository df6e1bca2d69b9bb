//! The types every stage passes on: readings, verdicts, findings, failures and the snapshot
//! that carries them. The bottom layer: nothing here imports any other module of the crate, so
//! a source, a judge and an outlet can all speak in these terms without knowing each other.

mod container_ref;
mod evidence;
mod failure;
mod finding;
mod fleet;
mod gpu;
mod gpu_users;
mod hang;
mod link_counts;
mod link_ledger;
mod link_trend;
mod named_from;
mod pair_reason;
mod shm;
mod sight;
mod snapshot;
mod stamp;
mod stats;
mod traced;
mod verdict;
mod xid;

pub use container_ref::ContainerRef;
pub use evidence::{around, printable, redact, REDACTED};
pub use failure::{
    DeathRules, Detected, Exit, Failure, FailureSource, GpusFrom, MemorySource, MemorySplit,
    PairThen, ShmThen, BUS_ERROR_SHM_RATIO, EVIDENCE_MAX, FATAL_SIGNALS, SHM_OOM_SHARE, SIGBUS,
};
pub use finding::{EventReason, Finding, FindingKind, Severity, Subject};
pub use fleet::{GpuKeys, NodeInfo, NodeKeys, PlatformInfo};
pub use gpu::{
    AcsState, AerTotals, Ber, Blame, FabricInfo, FabricState, GpuProcess, GpuReading, GpuSample,
    LinkErrors, LinkReading, Nvlink5Errors, P2pCaps, P2pStatus, PairProbe, PairSample, PairStatus,
    PairVerdict, PcieHop, PcieLink, Peer, ProbeStatus, RecoveryAction, Suspect, SuspectBy,
    TopologyLevel, Weight,
};
pub use gpu_users::{Crasher, GpuUsers, GPU_USERS_HISTORY, GPU_USERS_KEPT};
pub use hang::{
    Hang, HangFacts, HangLinks, HangSaidBy, HangVerdict, LinkDownAtStart, LinkEvent, LinkWent,
    NotWatched, PairChange, Watched,
};
pub use link_counts::{LinkCounts, LinkLast, LinkTable, LinkTotal};
pub use link_ledger::{
    GpuLinkDelta, GpuLinks, JobLinks, LinkHistory, LinkKey, Mark, PairKey, PairMark, Run, Watch,
};
pub use link_trend::{LinkCounter, LinkSample, LinkTrend, SteadyGrowth};
pub use named_from::{Failed, GpuApi, GpuNamed, NamedFrom};
pub use pair_reason::{PairReason, ReasonKind};
pub use shm::{Leftovers, ShmReading, ShmStatus};
pub use sight::{Blind, NvmlState, Sight};
pub use snapshot::{Snapshot, SxidCount, TrainingCount, XidCount};
pub use stamp::Stamp;
pub use stats::{CollectorName, CollectorRun, LogStats, SourceStats};
pub use traced::{TracedCause, TracedDeath};
pub use verdict::{
    Culprit, GpuVerdict, HeldXid, NvlinkTraining, OutReason, PcieDowntrain, SwitchFatal,
};
pub use xid::{XidAction, XidEntry};

/// The first 12 characters of a container ID, as `docker ps` and `crictl ps` print them.
pub fn short_id(id: &str) -> &str {
    match id.char_indices().nth(12) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

/// `containerd://<id>`, `cri-o://<id>`, `docker://<id>` (a Pod status's spelling): the ID
/// without the runtime prefix.
pub fn strip_runtime_prefix(container_id: &str) -> &str {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn prefix_within(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Unix milliseconds of `t` (0 before 1970): how the state store and the checkpoints keep a
/// moment.
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The moment [`unix_ms`] kept (1970 for a negative one).
pub fn from_unix_ms(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `t` in RFC 3339 (UTC, the digits of the fraction it has), as the JSON and the Events say a
/// moment; "" for a time RFC 3339 cannot hold.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// An RFC 3339 time (a failure's `at`, CRI's and Docker's timestamps, any fraction and offset)
/// as a time; None when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let t: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(std::time::SystemTime::from(t))
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    prefix_within(text, max).to_string()
}

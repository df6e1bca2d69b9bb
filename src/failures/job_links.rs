//! Pure: a failure's `gpu_links`, what the links of the job's GPUs did between its baseline and
//! its end, from the ledger the snapshot carries (`model::JobLinks`, fed by serve's scans).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::{GpuLinkDelta, GpuLinks, JobLinks, Snapshot};

use super::correlate::rfc3339;

/// None when the container or its GPUs are not known, or the ledger has no baseline for it
/// (check without serve's checkpoint; a container gone before serve saw it).
pub fn gpu_links(
    container_id: Option<&str>,
    gpus: &[u32],
    snapshot: Option<&Snapshot>,
) -> Option<GpuLinks> {
    if gpus.is_empty() {
        return None;
    }
    let d = snapshot?.job_links.deltas(container_id?, gpus)?;
    Some(GpuLinks {
        since: rfc3339(d.since),
        since_start: d.since_start,
        until: rfc3339(d.until),
        watched: d.watched,
        unread: d.unread,
        changed: d.changed.iter().map(GpuLinkDelta::from).collect(),
    })
}

/// The containers a scan saw running: those it measured and those NVML listed on a GPU.
pub fn running(snapshot: &Snapshot) -> HashSet<String> {
    let mut out: HashSet<String> = snapshot
        .shm
        .iter()
        .map(|r| r.container_id.clone())
        .collect();
    out.extend(
        snapshot
            .gpu_users
            .containers_now()
            .into_iter()
            .map(|(c, _)| c.container_id.clone()),
    );
    out
}

/// Feeds `ledger` the scan's GPU sample and hands the snapshot a copy (`baselines`: serve).
pub fn feed(ledger: &mut JobLinks, snapshot: &mut Snapshot, now: SystemTime, baselines: bool) {
    ledger.feed(&snapshot.gpus, &running(snapshot), now, baselines);
    snapshot.job_links = Arc::new(ledger.clone());
}

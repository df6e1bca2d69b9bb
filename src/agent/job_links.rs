//! serve's ledger of what each NVLink did while each container ran (`model::JobLinks`): fed
//! after every scan, carried by the snapshot to the failures' correlation, and checkpointed in
//! the state store under `job_links` so a job that started before a restart keeps its baseline.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::links::jobs::feed;
use crate::links::{SavedJobLinks, JOB_LINKS_KEY, JOB_LINKS_SAVE_EVERY};
use crate::model::{JobLinks, LinkTable, Snapshot};
use crate::state::{Store, StoreSender};

/// Each container and whether it is gone: a change is saved at once.
type Shape = Vec<(String, bool)>;

/// The ledger and what was last saved of it.
pub(super) struct Keeper {
    ledger: JobLinks,
    store: Option<StoreSender>,
    /// The containers (and whether each is gone) and the totals last saved, and when.
    saved: Option<(Shape, Arc<LinkTable>, Instant)>,
}

impl Keeper {
    /// The ledger the last run saved, else a new one.
    pub(super) fn resume(store: Option<&Store>) -> Keeper {
        let saved = store.and_then(|s| super::resume::stored::<SavedJobLinks>(s, JOB_LINKS_KEY));
        let ledger = match saved {
            None => JobLinks::default(),
            Some(saved) => JobLinks::restore(saved).unwrap_or_else(|| {
                tracing::warn!(
                    key = JOB_LINKS_KEY,
                    "ignoring a stored value: tables missing"
                );
                JobLinks::default()
            }),
        };
        if !ledger.containers.is_empty() {
            tracing::info!(
                containers = ledger.containers.len(),
                "the NVLink baselines of containers from before the restart go on"
            );
        }
        Keeper {
            ledger,
            store: store.map(Store::sender),
            saved: None,
        }
    }

    /// Feeds the scan's sample, hands the snapshot the ledger, saves it when its containers
    /// changed (at once) or its counts did (at most every [`JOB_LINKS_SAVE_EVERY`]).
    pub(super) fn after_scan(&mut self, snapshot: &mut Snapshot, now: SystemTime) {
        feed(&mut self.ledger, snapshot, now, true);
        let Some(store) = &self.store else { return };
        let mut shape: Shape = self
            .ledger
            .containers
            .iter()
            .map(|(id, w)| (id.clone(), w.gone_at.is_some()))
            .collect();
        shape.sort_unstable();
        let due = match &self.saved {
            None => true,
            Some((s, _, _)) if *s != shape => true,
            Some((_, t, at)) => {
                !Arc::ptr_eq(t, &self.ledger.totals) && at.elapsed() >= JOB_LINKS_SAVE_EVERY
            }
        };
        if !due {
            return;
        }
        match serde_json::to_value(self.ledger.save()) {
            Ok(v) => store.put(JOB_LINKS_KEY, v),
            Err(e) => tracing::warn!(key = JOB_LINKS_KEY, "not saved: {e}"),
        }
        self.saved = Some((shape, Arc::clone(&self.ledger.totals), Instant::now()));
    }
}

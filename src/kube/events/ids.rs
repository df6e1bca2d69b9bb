//! The one owner of Event IDs and names: every source of Events (the planner on the scan thread,
//! the device-taint task on the runtime) takes each occurrence's ID and name from one shared
//! [`EventIds`], so no two Events of this run share an ID (the publisher merges by ID) or a name
//! (a create meeting 409 would be taken for a retry of the other).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::ObjectReference;

use super::{EventMsg, EventSpec, EventType};
use crate::model::EventReason;

/// Hands out IDs counting from 1, and names `<regarding name>.shmlink.<run hex>.<id hex>`.
/// Clones share the count.
#[derive(Debug, Clone)]
pub struct EventIds {
    /// Distinguishes this agent's Event names from an earlier run's on the same node.
    run: u64,
    last: Arc<AtomicU64>,
}

impl EventIds {
    /// A run named by the clock's milliseconds now: a run killed and started again within a
    /// second names anew.
    pub fn new() -> EventIds {
        let run = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        EventIds {
            run,
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    /// An ID for an occurrence whose name is already fixed (a series resumed from the store).
    pub fn id(&self) -> u64 {
        self.last.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A new occurrence about `regarding`: its ID and its name, fixed for it.
    pub fn occurrence(&self, regarding: &ObjectReference) -> (u64, String) {
        let id = self.id();
        let base = regarding.name.as_deref().unwrap_or("shmlink");
        (id, format!("{base}.shmlink.{:x}.{id:x}", self.run))
    }

    /// An Event of its own occurrence, told once and never updated: its create, then its end.
    pub fn once(
        &self,
        regarding: ObjectReference,
        reason: EventReason,
        type_: EventType,
        note: String,
    ) -> Vec<EventMsg> {
        let (id, name) = self.occurrence(&regarding);
        let spec = EventSpec {
            id,
            name,
            regarding,
            reason,
            type_,
            note: super::planner::truncate(note),
        };
        vec![EventMsg::Publish(Box::new(spec)), EventMsg::Ended(id)]
    }
}

impl Default for EventIds {
    fn default() -> EventIds {
        EventIds::new()
    }
}

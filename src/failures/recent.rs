//! The containers seen in the last minute, for the failures told after their container went.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::model::{ShmReading, Snapshot};

/// Containers seen in the last minute: a job that dies takes its container (and its /dev/shm)
/// with it, often before the next scan, and the failure is told just after. What it had then,
/// and which host PIDs were its, come from here.
#[derive(Default)]
pub struct RecentReadings {
    by_id: HashMap<String, (ShmReading, Instant)>,
}

impl RecentReadings {
    const KEEP: Duration = Duration::from_secs(60);

    pub fn remember(&mut self, readings: &[ShmReading], now: Instant) {
        for r in readings {
            self.by_id.insert(r.container_id.clone(), (r.clone(), now));
        }
        self.by_id
            .retain(|_, (_, seen)| now.duration_since(*seen) < Self::KEEP);
    }

    /// The snapshot with the recently gone containers' last readings after its own.
    pub fn added_to(&self, s: &Snapshot) -> Snapshot {
        let mut out = s.clone();
        for (id, (r, _)) in &self.by_id {
            if !s.shm.iter().any(|x| &x.container_id == id) {
                out.shm.push(r.clone());
            }
        }
        out
    }
}

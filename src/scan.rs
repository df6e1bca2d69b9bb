//! One scan of the machine: every collector, then the findings, into one [`Snapshot`].
//! Blocking I/O: callers run it on a thread of its own, never on the async runtime.

use std::time::{Duration, Instant};

use crate::findings::{evaluate_shm, Thresholds};
use crate::host::{HostError, HostPaths};
use crate::shm::ShmScanner;
use crate::snapshot::Snapshot;

/// The collectors named in `shmlink_scan_duration_seconds{collector=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectorName {
    Shm,
    Gpu,
}

impl CollectorName {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectorName::Shm => "shm",
            CollectorName::Gpu => "gpu",
        }
    }
}

/// How one collector fared in one scan.
#[derive(Debug, Clone, Copy)]
pub struct CollectorRun {
    pub collector: CollectorName,
    pub duration: Duration,
    pub errors: u64,
}

pub struct ScanOutput {
    pub snapshot: Snapshot,
    pub runs: Vec<CollectorRun>,
}

pub struct Scanner {
    node: String,
    thresholds: Thresholds,
    shm: ShmScanner,
}

impl Scanner {
    pub fn new(host: &HostPaths, node: String, thresholds: Thresholds) -> Result<Self, HostError> {
        Ok(Scanner {
            node,
            thresholds,
            shm: ShmScanner::new(host)?,
        })
    }

    pub fn scan(&mut self) -> ScanOutput {
        let started = Instant::now();
        let shm = self.shm.scan();
        let shm_run = CollectorRun {
            collector: CollectorName::Shm,
            duration: started.elapsed(),
            errors: shm.errors,
        };
        let mut readings = shm.readings;
        let findings = evaluate_shm(&mut readings, &self.thresholds);
        ScanOutput {
            snapshot: Snapshot {
                node: self.node.clone(),
                shm: readings,
                findings,
                taken_at: Some(std::time::SystemTime::now()),
                ..Snapshot::default()
            },
            runs: vec![shm_run],
        }
    }
}

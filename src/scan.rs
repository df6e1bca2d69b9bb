//! One scan of the machine: every collector, then the findings, into one [`Snapshot`].
//! Blocking I/O: callers run it on a thread of its own, never on the async runtime.

use std::time::{Duration, Instant};

use crate::findings::{shm_findings, Thresholds};
use crate::gpu::collector::GpuCollector;
use crate::host::{HostError, HostPaths};
use crate::kube::pods::PodIndex;
use crate::shm::ShmScanner;
use crate::snapshot::{Snapshot, XidCount};

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
    gpu: GpuCollector,
}

impl Scanner {
    pub fn new(
        host: &HostPaths,
        node: String,
        thresholds: Thresholds,
        gpu: GpuCollector,
    ) -> Result<Self, HostError> {
        Ok(Scanner {
            node,
            thresholds,
            shm: ShmScanner::new(host)?,
            gpu,
        })
    }

    /// Leaves out what only `check --json` reports (`memory_shmem_bytes`, from memory.stat):
    /// `serve`'s metrics and Events do not use it, and it is a tenth of a scan's system calls.
    pub fn without_shmem_stat(mut self) -> Self {
        self.shm.set_read_shmem(false);
        self
    }

    /// One scan without Kubernetes names.
    pub fn scan(&mut self) -> ScanOutput {
        self.scan_with(None)
    }

    /// One scan; `pods` (this node's Pods, once the cache has synced) names the containers,
    /// drops pod sandboxes, and tells which containers belong to GPU workloads.
    pub fn scan_with(&mut self, pods: Option<&PodIndex>) -> ScanOutput {
        let started = Instant::now();
        let shm = self.shm.scan();
        let shm_run = CollectorRun {
            collector: CollectorName::Shm,
            duration: started.elapsed(),
            errors: shm.errors,
        };
        let mut readings = shm.readings;
        if let Some(pods) = pods {
            pods.annotate(&mut readings);
        }
        let mut findings = shm_findings(&mut readings, &self.thresholds, pods);

        let started = Instant::now();
        let gpu = self.gpu.scan();
        let gpu_run = CollectorRun {
            collector: CollectorName::Gpu,
            duration: started.elapsed(),
            errors: gpu.errors,
        };
        findings.extend(gpu.findings);
        // Worst first, so a person (and `check`'s exit status) sees what matters at the top.
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        ScanOutput {
            snapshot: Snapshot {
                node: self.node.clone(),
                shm: readings,
                gpus: gpu.gpus,
                gpu_pairs: gpu.pairs,
                xids: gpu
                    .xids
                    .into_iter()
                    .map(|((gpu, xid), count)| XidCount { gpu, xid, count })
                    .collect(),
                findings,
                failures: Vec::new(),
                failure_counts: Vec::new(),
                nvml_up: gpu.nvml_up,
                taken_at: Some(std::time::SystemTime::now()),
            },
            runs: vec![shm_run, gpu_run],
        }
    }
}

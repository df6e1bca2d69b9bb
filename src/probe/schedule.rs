//! `serve`'s pair probe: every `--p2p-probe-interval`, on the GPUs the last scan saw no process
//! on, on a thread of its own; its verdicts wait in [`ProbeResults`] for the next scans, whose
//! pair judge places them on their pairs (rule 8). The copies run in a worker process with a
//! deadline, so a hung or crashing driver path costs this thread a pair, never the agent.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{assess, pairs_among, run, ProbeOptions};
use crate::metrics::SharedSnapshot;
use crate::model::{GpuSample, PairProbe, PairSample, ProbeStatus, Snapshot};

/// The pair probe's last verdicts (ordered pairs), shared by its thread and the scans.
#[derive(Debug, Clone, Default)]
pub struct ProbeResults(Arc<Mutex<Vec<PairProbe>>>);

impl ProbeResults {
    pub fn set(&self, pairs: Vec<PairProbe>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = pairs;
    }

    pub fn latest(&self) -> Vec<PairProbe> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Starts the probe's thread: a run every `every` until `stop`, each one's verdicts into
/// `results`. `stop` also ends a run's worker.
pub fn spawn(
    mut opts: ProbeOptions,
    every: Duration,
    snapshot: SharedSnapshot,
    results: ProbeResults,
    stop: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    opts.stop = Some(stop.clone());
    tracing::info!(every = ?every, "the GPU pair probe runs on GPUs without processes");
    thread::Builder::new()
        .name("probe".into())
        .spawn(move || probe_loop(&opts, every, &snapshot, &results, &stop))
}

fn probe_loop(
    opts: &ProbeOptions,
    every: Duration,
    snapshot: &SharedSnapshot,
    results: &ProbeResults,
    stop: &AtomicBool,
) {
    let mut next = Instant::now() + every;
    let mut last_error: Option<String> = None;
    loop {
        while Instant::now() < next {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            thread::sleep(Duration::from_millis(100).min(next - Instant::now()));
        }
        next = Instant::now() + every;
        let Some(s) = snapshot.load_full() else {
            continue;
        };
        let idle = idle_gpus(&s);
        if idle.len() < 2 {
            tracing::debug!(idle = idle.len(), "pair probe skipped: GPUs in use");
            continue;
        }
        let sample = sample_of(&s);
        match run(opts, |devices| {
            pairs_among(devices, &sample.gpus, Some(&idle))
        }) {
            Ok(probed) => {
                let report = assess::assess(&probed, &sample);
                let bad = report
                    .pairs
                    .iter()
                    .filter(|p| p.status != ProbeStatus::Ok)
                    .count();
                tracing::info!(
                    pairs = report.pairs.len(),
                    not_ok = bad,
                    took = ?probed.took,
                    "GPU pair probe done"
                );
                last_error = None;
                results.set(report.pairs);
            }
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!("the GPU pair probe could not run: {e}");
                }
                last_error = Some(e);
            }
        }
    }
}

/// The GPUs there with no process on them: a probe's copies would slow a job down.
fn idle_gpus(s: &Snapshot) -> Vec<u32> {
    s.gpus
        .iter()
        .filter(|g| !g.lost && g.processes.is_empty())
        .map(|g| g.index)
        .collect()
}

/// What the probe's verdicts are judged against: the last scan's GPUs and pairs.
fn sample_of(s: &Snapshot) -> GpuSample {
    GpuSample {
        gpus: s.gpus.clone(),
        pairs: s
            .gpu_pairs
            .iter()
            .map(|p| PairSample {
                gpu: p.gpu,
                peer_gpu: p.peer_gpu,
                p2p: p.p2p,
                topology: p.topology,
            })
            .collect(),
        hypervisor: None,
        probes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::gpu_reading;

    #[test]
    fn results_hold_the_last_run_only() {
        let results = ProbeResults::default();
        assert!(results.latest().is_empty());
        let probe = |from_gpu, to_gpu| PairProbe {
            from_gpu,
            to_gpu,
            status: ProbeStatus::Ok,
            peer_access: true,
            verified: true,
            gbps: Some(300.0),
            expected_gbps: None,
            reason: None,
        };
        results.clone().set(vec![probe(0, 1), probe(1, 0)]);
        results.set(vec![probe(2, 3)]);
        assert_eq!(results.latest(), vec![probe(2, 3)]);
    }

    #[test]
    fn only_gpus_without_processes_and_not_lost_are_probed() {
        let mut s = Snapshot {
            gpus: (0..4).map(gpu_reading).collect(),
            ..Snapshot::default()
        };
        s.gpus[1].lost = true;
        s.gpus[2].processes = vec![crate::model::GpuProcess {
            pid: 7,
            used_memory_bytes: None,
        }];
        assert_eq!(idle_gpus(&s), vec![0, 3]);
    }
}

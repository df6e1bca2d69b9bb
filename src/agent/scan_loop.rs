//! `serve`'s scan thread: a scan every `--interval`, and between scans what the failure
//! follower hands over (failures told, the kernel's word on GPUs). It is the only writer of the
//! shared snapshot.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::changes::{Changed, FindingChanges};
use super::cluster::KubeView;
use super::holds::Holds;
use crate::failures::checkpoint::{self, Checkpoint};
use crate::failures::ledger::Ledger;
use crate::failures::sources::Followed;
use crate::gpu::xid::kernel::{KernelGpu, KernelXids};
use crate::metrics::{Metrics, SharedSnapshot};
use crate::model::{Blind, Failure, Snapshot};
use crate::scan::Scanner;
use crate::server::Health;
use crate::state::{FindingEvent, StoreSender};

/// What wakes the scan thread between scans.
pub(super) enum Wake {
    Stop,
    Followed(Followed),
}

/// What the scan thread keeps between scans besides the snapshot.
pub(super) struct Between {
    pub(super) scanner: Scanner,
    pub(super) kube: Option<KubeView>,
    pub(super) ledger: Ledger,
    pub(super) kernel_xids: KernelXids,
    /// Without Kubernetes, the findings said in the log as they begin and end.
    pub(super) findings_told: Option<FindingChanges>,
    /// The blind reasons last logged: said when they begin and end, not every scan.
    pub(super) blind_told: Vec<Blind>,
    /// The state store's history: failures told, findings as they begin and end.
    pub(super) store: Option<(StoreSender, FindingChanges)>,
    /// What a restart takes up again (pairs failing since, held XIDs), saved as it changes.
    pub(super) holds: Option<Holds>,
    /// What each NVLink did while each container ran (a failure's `gpu_links`).
    pub(super) job_links: super::job_links::Keeper,
    /// Failures whose commit was not confirmed in time (said once).
    pub(super) slow_commits: u64,
    /// `death_trace_off`, in every scan while the tracepoints `auto` asked for are refused.
    pub(super) death_trace_off: Option<crate::model::Finding>,
}

/// How long a failure's Event waits for its commit (the writer commits at once when asked).
const TOLD_COMMIT_WAIT: Duration = Duration::from_secs(1);
/// Hand-overs handled between two scans that overran the interval at most (the follower sends
/// one a poll): the scans go on.
const DRAIN_MAX: usize = 16;

impl Between {
    fn on_followed(&mut self, followed: Followed, snapshot: &SharedSnapshot) {
        match followed {
            Followed::Told {
                failures,
                checkpoint,
            } => self.on_told(&failures, checkpoint, snapshot),
            Followed::KernelGpus(gpus) => self.on_kernel_gpus(gpus, snapshot),
        }
    }

    /// The kernel's XIDs, counted with NVML's (seen at the next scan).
    fn on_kernel_gpus(&mut self, gpus: Vec<KernelGpu>, snapshot: &SharedSnapshot) {
        let last = snapshot.load_full();
        let readings = last.as_deref().map_or(&[][..], |s| s.gpus.as_slice());
        let counts = self.scanner.xid_counts();
        self.kernel_xids
            .count(gpus, readings, &counts, Instant::now());
    }

    /// Failures the pipeline told: logged, counted, published, and in the snapshot at once (so
    /// /metrics counts them before the next scan). With a store, the failures, the follower's
    /// checkpoint past them and the Event series they count on are one transaction, committed
    /// before their Events go out: a kill at any moment loses none and tells none twice.
    fn on_told(
        &mut self,
        failures: &[Failure],
        checkpoint: Option<Box<Checkpoint>>,
        snapshot: &SharedSnapshot,
    ) {
        self.ledger.record(failures, Instant::now());
        let msgs = self
            .kube
            .as_mut()
            .map(|k| k.plan_failures(failures))
            .unwrap_or_default();
        if let Some((store, _)) = &self.store {
            let mut puts = Vec::new();
            if let Some(c) = checkpoint {
                puts.push((checkpoint::KEY.to_string(), c.to_stored()));
            }
            if let Some(k) = self.kube.as_ref().filter(|_| !msgs.is_empty()) {
                puts.push(k.series_state());
            }
            let sent = store.told(failures, puts);
            if sent && !msgs.is_empty() && !store.flush(TOLD_COMMIT_WAIT) {
                self.slow_commits += 1;
                if self.slow_commits == 1 {
                    tracing::warn!(
                        "the state store did not commit a failure within {TOLD_COMMIT_WAIT:?}; \
                         its Event goes out anyway (a kill now could tell it twice)"
                    );
                }
            }
        }
        if let Some(k) = self.kube.as_ref() {
            k.publish(msgs);
        }
        if let Some(last) = snapshot.load_full() {
            let mut next = (*last).clone();
            self.ledger.fill(&mut next);
            snapshot.store(Some(Arc::new(next)));
        }
    }

    /// What the follower handed over already (at most [`DRAIN_MAX`]), handled at a deadline: a
    /// scan longer than the interval must not leave failures and their checkpoint waiting for
    /// ever. False: stop.
    fn drain(&mut self, wake: &mpsc::Receiver<Wake>, snapshot: &SharedSnapshot) -> bool {
        for _ in 0..DRAIN_MAX {
            match wake.try_recv() {
                Ok(Wake::Followed(f)) => self.on_followed(f, snapshot),
                Ok(Wake::Stop) | Err(mpsc::TryRecvError::Disconnected) => return false,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        true
    }

    /// Waits until `deadline`, handling what the follower hands over meanwhile; false: stop.
    fn wait(
        &mut self,
        deadline: Instant,
        wake: &mpsc::Receiver<Wake>,
        snapshot: &SharedSnapshot,
    ) -> bool {
        loop {
            let now = Instant::now();
            if deadline <= now {
                return self.drain(wake, snapshot);
            }
            match wake.recv_timeout(deadline - now) {
                Err(RecvTimeoutError::Timeout) => return true,
                Ok(Wake::Followed(f)) => self.on_followed(f, snapshot),
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Series born before the Pod cache syncs carry empty names and are renamed moments later,
    /// which resets every alert's `for:`: the first scan (and so /readyz) waits, boundedly.
    /// False: stop.
    fn wait_for_pod_cache(
        &mut self,
        wake: &mpsc::Receiver<Wake>,
        snapshot: &SharedSnapshot,
    ) -> bool {
        let Some(wait) = self.kube.as_ref().map(|k| k.pod_cache_wait) else {
            return true;
        };
        let started = Instant::now();
        while !self.kube.as_ref().is_some_and(|k| k.pods.is_synced()) {
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                tracing::warn!(
                    waited = ?wait,
                    "the pod cache has not synced; scanning without pod names until it does \
                     (shmlink_kube_pod_cache_synced 0)"
                );
                break;
            }
            let until = Instant::now() + left.min(Duration::from_millis(20));
            if !self.wait(until, wake, snapshot) {
                return false;
            }
        }
        true
    }

    /// One scan, its outlets fed and the snapshot stored.
    fn scan_once(&mut self, snapshot: &SharedSnapshot, metrics: &Metrics, first: bool) {
        let pods = self.kube.as_ref().and_then(|k| k.pods.index());
        if self.kube.is_some() {
            metrics.set_pod_cache_synced(pods.is_some());
        }
        let began = Instant::now();
        let mut out = self.scanner.scan_with(pods.as_ref());
        out.snapshot.findings.extend(self.death_trace_off.clone());
        metrics.record_scan(&out.runs);
        // The kernel log's GPUs fallen off the bus, against what NVML just said of them.
        let counts = self.scanner.xid_counts();
        self.kernel_xids
            .confirm(&out.snapshot.gpus, out.snapshot.nvml_up, began, &counts);
        if let Some(k) = self.kube.as_mut() {
            k.after_scan(&out.snapshot, pods.as_ref());
        }
        if let Some(h) = self.holds.as_mut() {
            let now = Instant::now();
            let held = (self.scanner.held_xids(now), out.snapshot.gpu_fault_hold);
            let windows = self.scanner.carry_link_windows(now);
            h.after_scan(&out.snapshot, held, windows, SystemTime::now());
        }
        if let Some(told) = self.findings_told.as_mut() {
            log_changes(told.update(&out.snapshot.findings));
        }
        self.tell_blind(&out.snapshot);
        if let Some((store, changes)) = self.store.as_mut() {
            store.link_samples(std::mem::take(&mut out.link_samples));
            let changed = changes.update(&out.snapshot.findings);
            let now = SystemTime::now();
            for f in &changed.began {
                store.finding(f, FindingEvent::Began, now);
            }
            for f in &changed.ended {
                store.finding(f, FindingEvent::Ended, now);
            }
        }
        if first {
            tracing::info!(
                containers = out.snapshot.shm.len(),
                findings = out.snapshot.findings.len(),
                "first scan done"
            );
        }
        self.job_links
            .after_scan(&mut out.snapshot, SystemTime::now());
        self.ledger.fill(&mut out.snapshot);
        snapshot.store(Some(Arc::new(out.snapshot)));
    }
}

impl Between {
    /// Logs the scan's blind reasons when they change: each once as it begins, and the end.
    fn tell_blind(&mut self, snapshot: &Snapshot) {
        if snapshot.blind == self.blind_told {
            return;
        }
        for &reason in snapshot
            .blind
            .iter()
            .filter(|b| !self.blind_told.contains(b))
        {
            tracing::warn!(
                reason = reason.as_str(),
                "{} (shmlink_blind{{reason=\"{reason}\"}} 1{})",
                crate::text::blind(reason, &snapshot.sight),
                if reason.is_total() {
                    "; /readyz 503"
                } else {
                    ""
                }
            );
        }
        for reason in self
            .blind_told
            .iter()
            .filter(|b| !snapshot.blind.contains(b))
        {
            tracing::info!(reason = reason.as_str(), "no longer blind: {reason} ended");
        }
        self.blind_told = snapshot.blind.clone();
    }
}

/// Scans every `interval` until told to stop. A slow scan delays the next one rather than
/// piling up; missed periods are skipped, not caught up. What the follower hands over between
/// scans is handled at once.
pub(super) fn scan_loop(
    mut b: Between,
    interval: Duration,
    snapshot: &SharedSnapshot,
    metrics: &Metrics,
    health: &Health,
    wake: &mpsc::Receiver<Wake>,
) {
    if !b.wait_for_pod_cache(wake, snapshot) {
        return;
    }
    let mut next = Instant::now();
    let mut first = true;
    loop {
        b.scan_once(snapshot, metrics, first);
        health.mark_scanned();
        first = false;
        next += interval;
        let now = Instant::now();
        if next <= now {
            next = now + interval;
            // A scan longer than the interval: what the follower told (failures and the
            // checkpoint that passes them) is still handled before the next one.
            if !b.wait(now, wake, snapshot) {
                return;
            }
        } else if !b.wait(next, wake, snapshot) {
            return;
        }
    }
}

/// A finding's beginning and end in the log, with the words its Event would carry.
fn log_changes(changed: Changed) {
    for f in changed.began {
        tracing::warn!(
            kind = f.kind.as_str(),
            subject = %f.subject,
            severity = ?f.severity,
            "finding began: {}",
            f.message
        );
    }
    for f in changed.ended {
        tracing::warn!(
            kind = f.kind.as_str(),
            subject = %f.subject,
            "finding ended: {}",
            f.message
        );
    }
}

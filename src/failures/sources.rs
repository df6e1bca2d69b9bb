//! The sources a [`Pipeline`] is fed from: the container logs, Docker's records of stopped
//! containers and the kernel log, followed on a thread of its own in `serve` ([`follow`], every
//! [`POLL`]) or read back over `--since` in `check` ([`read_back`]). Reading is all that happens
//! here; what a line means, whose it is and how it is told is the pipeline's.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::checkpoint::{Checkpoint, Mark, Positions, Saver};
use super::pipeline::{Mode, Pipeline, Sources};
use crate::docker_records::{exited_since, DockerExit, RecordsSeen};
use crate::gpu::xid::kernel::{kernel_gpu, KernelGpu};
use crate::kernel_log::resume::{at_end_now, boot_id, kmsg_start, KmsgCheckpoint};
use crate::kernel_log::{KernelLog, KmsgStart};
use crate::kube::exits::{DeathKey, FRESH};
use crate::kube::podresources::{GpuHolders, PodResourcesWatcher};
use crate::kube::pods::PodCache;
use crate::logs::{LogSettings, LogTailer};
use crate::metrics::SharedSnapshot;
use crate::model::{Detected, Failure, SourceStats, TracedDeath};

/// How often `serve` reads the sources: a failure reaches its Event well within 2 s (an OOM
/// kill one poll later, with what the logs said of it meanwhile).
pub const POLL: Duration = Duration::from_millis(200);
/// How often `serve` looks at Docker's records for containers that stopped.
const DOCKER_EVERY: Duration = Duration::from_secs(1);
/// Lines per second one container may log before the rest is dropped (and counted): a flood
/// costs its own lines, not the node's CPU.
pub const MAX_LINES_PER_SEC: u32 = 2000;
/// Kernel records read per poll at most.
const KMSG_BATCH: usize = 4096;
/// Records a saved kernel log position stays before an unended OOM report at most (a report
/// lists every task of its cgroup; one cut short must not hold the position for ever).
const KMSG_HELD_MAX: usize = 8192;
/// Docker deaths remembered as told (a record rewritten later is not a second death).
const DOCKER_TOLD_MAX: usize = 4096;

fn log_settings(sources: &Sources) -> LogSettings {
    LogSettings {
        pod_log_root: sources.pod_log_root.clone(),
        docker_root: sources.docker_root.clone(),
        max_lines_per_sec: MAX_LINES_PER_SEC,
    }
}

/// `check`: everything the sources said since `since`, into `pipeline` (made with
/// [`Mode::ReadBack`]).
/// Returns what the kernel log said about GPUs (XIDs, a GPU fallen off the bus) since then, for
/// `check` to count as `serve` does.
pub fn read_back(pipeline: &mut Pipeline, sources: &Sources, since: SystemTime) -> Vec<KernelGpu> {
    let mut gpus = Vec::new();
    let candidates = pipeline.candidates();
    LogTailer::since(log_settings(sources), since).poll_each(
        |text| candidates.is_candidate(text),
        |line| pipeline.log_line(&line),
    );
    // Docker's records of the containers that stopped since: the deaths that print nothing.
    if let Some(root) = &sources.docker_root {
        for exit in exited_since(root, since, None) {
            pipeline.docker_exit(&exit);
        }
    }
    if let Some(path) = &sources.kmsg {
        match KernelLog::open(path, KmsgStart::Since(since)) {
            Ok(mut reader) => loop {
                let batch = reader.read_available(KMSG_BATCH);
                if batch.is_empty() {
                    break;
                }
                for r in &batch {
                    pipeline.kernel_record(r, reader.wall_time(r.usec));
                    gpus.extend(kernel_gpu(r));
                }
            },
            Err(e) => tracing::warn!("not reading the kernel log {}: {e}", path.display()),
        }
    }
    gpus
}

/// What the sources said since `since`, recognised but not yet placed or told: the field
/// corpus measures recognition alone with it.
pub fn recognised_since(sources: &Sources, since: SystemTime) -> Vec<Detected> {
    let mut pipeline = Pipeline::new(sources, Mode::ReadBack { since });
    read_back(&mut pipeline, sources, since);
    pipeline.take_accounts()
}

/// What `serve`'s follower hands the scan thread.
#[derive(Debug)]
pub enum Followed {
    /// Failures told (placed, merged, judged): for the ledger, the log, the store and Events;
    /// with a store, the checkpoint that passes them (or positions alone, with no failures),
    /// to be committed with them in one transaction.
    Told {
        failures: Vec<Failure>,
        checkpoint: Option<Box<Checkpoint>>,
    },
    /// What the kernel said about GPUs (XIDs, a GPU fallen off the bus).
    KernelGpus(Vec<KernelGpu>),
}

/// The cluster's caches the follower reads without waiting, to name a failure's Pod and GPUs.
#[derive(Clone)]
pub struct ClusterCaches {
    pub pods: PodCache,
    pub gpu_holders: PodResourcesWatcher,
    /// How long failures wait at start for the Pod cache to sync (`--pod-cache-wait`): one
    /// told before has no Pod name, so no Event, and is then told (a restart's store holds it).
    pub sync_wait: Duration,
}

/// What `serve`'s follower reads and where it reads what was known.
pub struct Follow {
    pub sources: Sources,
    /// Made with [`Mode::Follow`] (and the OOM counters when the kernel log is off).
    pub pipeline: Pipeline,
    /// The last scan, as the scan thread stores it.
    pub snapshot: SharedSnapshot,
    pub cluster: Option<ClusterCaches>,
    /// The deaths the Pods' statuses record, as the watch delivers them: told at once.
    pub exits: mpsc::Receiver<Vec<(DeathKey, Detected)>>,
    /// The deaths the kernel's tracepoints told, each with its reading at the moment.
    pub traced: Option<mpsc::Receiver<TracedDeath>>,
    pub stop: Arc<AtomicBool>,
    /// The state store's part: None without one (no checkpoints taken).
    pub resume: Option<Resume>,
}

/// Where a follower with a state store starts.
#[derive(Debug, Default)]
pub struct Resume {
    /// The checkpoint stored by the last run, if any.
    pub saved: Option<Checkpoint>,
    /// The store was written during another boot (`state::Store::boot_changed`): the kernel
    /// log is read on from the checkpoint's time, not its sequence number.
    pub boot_changed: bool,
    /// The failures the last runs told lately: the same death heard again from another source
    /// after the restart is not told twice (`Pipeline::resume_told`).
    pub told: Vec<Failure>,
}

/// `serve`: follows the sources from now on, tells what they say through the pipeline and hands
/// it to `deliver` (the scan thread's queue), and the sources' counts to `report`. Stops when
/// `stop` is set or `deliver` says the other side is gone.
pub fn follow<F, R>(f: Follow, deliver: F, report: R) -> std::io::Result<JoinHandle<()>>
where
    F: Fn(Followed) -> bool + Send + 'static,
    R: FnMut(&SourceStats) + Send + 'static,
{
    std::thread::Builder::new()
        .name("failures".into())
        .spawn(move || Follower::new(f).run(deliver, report))
}

struct Follower {
    f: Follow,
    logs: Option<LogTailer>,
    kmsg: Option<KernelLog>,
    docker: Option<DockerFollower>,
    stats: SourceStats,
    /// The snapshot the pipeline last saw (its scan time).
    seen_scan: Option<SystemTime>,
    /// Whether any source is read (else there are no source counts to report).
    any_source: bool,
    /// When checkpoints are taken (with a store), and this boot's ID they are taken in.
    saver: Option<Saver>,
    boot_id: Option<String>,
    /// The kernel log's position past the last record read outside an OOM report.
    kmsg_last: Option<KmsgCheckpoint>,
    /// Records read since, inside a report.
    kmsg_held: usize,
    /// Failures were told since the last checkpoint.
    told: bool,
    /// Failures told, to go with the checkpoint that passes them.
    unsent: Vec<Failure>,
    /// The logs' positions in the last checkpoint (a file whose container has a line pending
    /// stays there).
    logs_saved: Option<crate::logs::resume::LogCheckpoints>,
    /// When it started, until the Pod cache first synced (awaited from then, boundedly).
    started: Option<Instant>,
    /// Pod-status deaths fed to the pipeline, with their finish times (for the checkpoint).
    pod_told: HashMap<DeathKey, SystemTime>,
}

impl Follower {
    /// Resumes from the stored checkpoint, if there is one, and takes checkpoints with a store.
    fn new(mut f: Follow) -> Follower {
        let resume = f.resume.take();
        if let Some(r) = &resume {
            f.pipeline.resume_told(&r.told);
        }
        let saver = resume.as_ref().map(|_| Saver::default());
        let boot_changed = resume.as_ref().is_some_and(|r| r.boot_changed);
        let saved = resume.and_then(|r| r.saved);
        if let Some(c) = &saved {
            tracing::info!(
                "reading on from the stored checkpoint ({}): deaths while the agent was down are \
                 told now, marked found late",
                super::correlate::rfc3339(c.at),
            );
            f.pipeline.resumed(SystemTime::now());
            if let Some(counts) = c.oom_counts.clone() {
                f.pipeline.resume_oom_counts(counts);
            }
        }
        let s = &f.sources;
        let boot_id = boot_id(&s.proc_root);
        let kmsg_saved = saved.as_ref().and_then(|c| c.kmsg.clone());
        // Another boot: the saved sequence number is of another ring (read on by time).
        let this_boot = boot_id.as_deref().filter(|_| !boot_changed);
        let kmsg_from = kmsg_start(kmsg_saved.as_ref(), this_boot);
        let logs_on = s.pod_log_root.is_some() || s.docker_root.is_some();
        let kmsg = s.kmsg.as_ref().and_then(|path| {
            KernelLog::open(path, kmsg_from)
                .map_err(|e| {
                    tracing::warn!(
                        "not reading the kernel log {}: {e} (/dev/kmsg and syslog(2) need \
                         CAP_SYSLOG where kernel.dmesg_restrict=1, and a pod's device cgroup \
                         refuses /dev/kmsg unless privileged: grant CAP_SYSLOG)",
                        path.display()
                    )
                })
                .ok()
        });
        let logs_saved = saved.as_ref().and_then(|c| c.logs.clone());
        // Opened at the end with nothing saved: a restart reads what came after now.
        let kmsg_last = kmsg_saved.or_else(|| kmsg.is_some().then(|| at_end_now(boot_id.clone())));
        let logs = logs_on.then(|| match logs_saved.clone() {
            Some(at) => LogTailer::resume(log_settings(s), at),
            None => LogTailer::from_end(log_settings(s)),
        });
        Follower {
            // Opened at the ends, nothing before them is pending: the first positions to hold.
            logs_saved: logs_saved.or_else(|| logs.as_ref().map(LogTailer::checkpoints)),
            logs,
            stats: SourceStats {
                kmsg_open: s.kmsg.as_ref().map(|_| kmsg.is_some()),
                ..SourceStats::default()
            },
            kmsg,
            docker: s
                .docker_root
                .clone()
                .map(|root| DockerFollower::new(root, saved.as_ref())),
            seen_scan: None,
            any_source: logs_on || s.kmsg.is_some(),
            saver,
            boot_id,
            kmsg_last,
            kmsg_held: 0,
            told: false,
            unsent: Vec::new(),
            started: Some(Instant::now()),
            pod_told: saved
                .as_ref()
                .map(|c| c.pod_exits.iter().cloned().collect())
                .unwrap_or_default(),
            f,
        }
    }

    /// The positions when due, each source's held before its oldest pending death; None
    /// without a store.
    fn checkpoint(&mut self) -> Option<Box<Checkpoint>> {
        let saver = self.saver.as_mut()?;
        let now = Instant::now();
        if !saver.due(self.told, now) {
            return None;
        }
        saver.taken(now);
        self.told = false;
        let at = Positions {
            logs: self.logs.as_ref().map(LogTailer::checkpoints),
            kmsg: self.kmsg_last.clone(),
            docker_read: self
                .docker
                .as_ref()
                .map(|d| d.told.iter().cloned().collect())
                .unwrap_or_default(),
            oom_counts: self.f.pipeline.oom_counts(),
            pod_read: self
                .pod_told
                .iter()
                .map(|(k, at)| (k.clone(), *at))
                .collect(),
        };
        let pending = self.f.pipeline.pending_marks();
        let c = Checkpoint::passing(SystemTime::now(), at, &pending, self.logs_saved.as_ref());
        self.logs_saved.clone_from(&c.logs);
        Some(Box::new(c))
    }

    /// Hands on what was told, with the checkpoint that passes it when one is due (a store
    /// commits both in one transaction); without a store, at once. False: the scan thread is
    /// gone.
    fn hand_on(&mut self, deliver: &impl Fn(Followed) -> bool) -> bool {
        let checkpoint = self.checkpoint();
        if checkpoint.is_none() && (self.unsent.is_empty() || self.saver.is_some()) {
            return true;
        }
        deliver(Followed::Told {
            failures: std::mem::take(&mut self.unsent),
            checkpoint,
        })
    }

    /// Pod-status deaths into the pipeline, their keys kept for the checkpoint (those too old
    /// to be told again are let go).
    fn pod_exits(&mut self, deaths: Vec<(DeathKey, Detected)>) {
        let now = SystemTime::now();
        self.pod_told
            .retain(|_, at| now.duration_since(*at).map_or(true, |age| age <= FRESH * 2));
        for (key, d) in deaths {
            self.pod_told.insert(key.clone(), d.at);
            self.f.pipeline.reading(Some(Mark::Pod(key, d.at)));
            self.f.pipeline.exits([d]);
        }
        self.f.pipeline.reading(None);
    }

    fn run(mut self, deliver: impl Fn(Followed) -> bool, mut report: impl FnMut(&SourceStats)) {
        // The recogniser's question, asked of its own copy while each line goes to it.
        let candidates = self.f.pipeline.candidates();
        while !self.f.stop.load(Ordering::Relaxed) {
            // First: a traced death is the earliest account of its death (`same.rs` keeps it).
            self.read_traced();
            if let Some(logs) = self.logs.as_mut() {
                read_logs(logs, &candidates, &mut self.f.pipeline);
                self.stats.logs = logs.stats();
            }
            let gpus = self.read_kernel_log();
            if let Some(docker) = self.docker.as_mut() {
                docker.poll(&mut self.f.pipeline);
            }
            self.after_scan();
            while let Ok(deaths) = self.f.exits.try_recv() {
                self.pod_exits(deaths);
            }
            if self.any_source {
                report(&self.stats);
            }
            if !gpus.is_empty() && !deliver(Followed::KernelGpus(gpus)) {
                return;
            }
            self.tell();
            if !self.hand_on(&deliver) {
                return;
            }
            self.wait();
        }
    }

    fn read_traced(&mut self) {
        if let Some(traced) = &self.f.traced {
            while let Ok(death) = traced.try_recv() {
                self.f.pipeline.traced(&death);
            }
        }
    }

    fn read_kernel_log(&mut self) -> Vec<KernelGpu> {
        let mut gpus = Vec::new();
        if let Some(reader) = self.kmsg.as_mut() {
            let records = reader.read_available(KMSG_BATCH);
            self.stats.kmsg_records += records.len() as u64;
            for r in records {
                // An account it ends (an OOM report) was read from the position before it.
                self.f
                    .pipeline
                    .reading(self.kmsg_last.clone().map(Mark::Kmsg));
                self.f.pipeline.kernel_record(&r, reader.wall_time(r.usec));
                gpus.extend(kernel_gpu(&r));
                // The position stays before an OOM report until its end (a restart reads it
                // whole), unless the report was cut and records pile up after it.
                if !self.f.pipeline.mid_report() || self.kmsg_held >= KMSG_HELD_MAX {
                    let boot = self.boot_id.clone().unwrap_or_default();
                    self.kmsg_last = Some(reader.checkpoint(&r, boot));
                    self.kmsg_held = 0;
                } else {
                    self.kmsg_held += 1;
                }
            }
            self.stats.kmsg_lost = reader.lost();
            self.f.pipeline.reading(None);
        }
        gpus
    }

    /// A new scan: the pipeline remembers its containers and reads its OOM counters.
    fn after_scan(&mut self) {
        let Some(last) = self.f.snapshot.load_full() else {
            return;
        };
        if last.taken_at.is_some() && last.taken_at == self.seen_scan {
            return;
        }
        self.seen_scan = last.taken_at;
        self.f.pipeline.after_scan(&last, Instant::now());
    }

    /// What the pipeline tells now, kept to be handed on.
    fn tell(&mut self) {
        if !self.f.pipeline.has_pending() {
            return;
        }
        // Deaths read before the Pod cache first synced (a restart reading on from its
        // checkpoint) wait for the Pods' names, boundedly: their Events need them.
        if let (Some(c), Some(started)) = (&self.f.cluster, self.started) {
            if c.pods.is_synced() || started.elapsed() >= c.sync_wait {
                self.started = None;
            } else {
                return;
            }
        }
        let last = self.f.snapshot.load_full();
        let cluster = self.f.cluster.as_ref();
        let pods = cluster.and_then(|c| c.pods.index());
        let holders =
            cluster.map_or_else(|| Arc::new(GpuHolders::new()), |c| c.gpu_holders.holders());
        let failures = self
            .f
            .pipeline
            .tell(last.as_deref(), pods.as_ref(), &holders);
        if failures.is_empty() {
            return;
        }
        self.told = true;
        self.unsent.extend(failures);
    }

    /// One poll's wait; a Pod's death wakes it at once.
    fn wait(&mut self) {
        match self.f.exits.recv_timeout(POLL) {
            Ok(deaths) => self.pod_exits(deaths),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(POLL),
        }
    }
}

/// serve's poll of the container logs: each line's account is marked as its container's.
fn read_logs(logs: &mut LogTailer, candidates: &super::signatures::Signatures, p: &mut Pipeline) {
    logs.poll_each(
        |text| candidates.is_candidate(text),
        |line| {
            p.reading(Some(Mark::Log(line.origin.clone())));
            p.log_line(&line);
        },
    );
    p.reading(None);
}

#[cfg(test)]
#[path = "resume_tests.rs"]
mod resume_tests;

/// Docker's records, looked at every [`DOCKER_EVERY`]: each container that stopped since the
/// agent started, told once.
struct DockerFollower {
    root: std::path::PathBuf,
    since: SystemTime,
    seen: RecordsSeen,
    told: HashSet<(String, SystemTime)>,
    next: Instant,
}

impl DockerFollower {
    /// From now, or from a checkpoint's time with the exits it had told.
    fn new(root: std::path::PathBuf, saved: Option<&Checkpoint>) -> DockerFollower {
        DockerFollower {
            root,
            since: saved.map_or_else(SystemTime::now, |c| c.at),
            seen: RecordsSeen::default(),
            told: saved
                .map(|c| c.docker_told.iter().cloned().collect())
                .unwrap_or_default(),
            next: Instant::now(),
        }
    }

    fn poll(&mut self, pipeline: &mut Pipeline) {
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + DOCKER_EVERY;
        for exit in exited_since(&self.root, self.since, Some(&mut self.seen)) {
            if self.first_time(&exit) {
                pipeline.reading(Some(Mark::Docker(exit.id.clone(), exit.finished_at)));
                pipeline.docker_exit(&exit);
            }
        }
        pipeline.reading(None);
    }

    fn first_time(&mut self, exit: &DockerExit) -> bool {
        if self.told.len() >= DOCKER_TOLD_MAX {
            self.told.clear();
        }
        self.told.insert((exit.id.clone(), exit.finished_at))
    }
}

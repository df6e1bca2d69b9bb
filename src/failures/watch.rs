//! Following the sources: the container logs and the kernel log, read on a thread of its own in
//! `serve` (every [`POLL`]), or back over `--since` in `check` ([`collect`]). What they say is
//! recognised and placed (`detect.rs`), and handed on as [`Detected`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use super::detect::{DeathRules, Recogniser};
use super::docker_deaths;
use crate::gpu::xid::kernel::{kernel_gpu, KernelGpu};
use crate::host::NsId;
use crate::kernel_log::{KernelLog, KmsgStart};
use crate::logs::{LogSettings, LogTailer};
use crate::model::{Detected, SourceStats, Who};

/// How often `serve` reads the sources: a failure reaches its Event well within 2 s (an OOM
/// kill one poll later, with what the logs said of it meanwhile).
pub const POLL: Duration = Duration::from_millis(200);
/// Lines per second one container may log before the rest is dropped (and counted): a flood
/// costs its own lines, not the node's CPU.
pub const MAX_LINES_PER_SEC: u32 = 2000;
/// Kernel records read per poll at most.
const KMSG_BATCH: usize = 4096;

/// Where the failures are told, and how to place a host PID.
#[derive(Debug, Clone)]
pub struct Sources {
    pub pod_log_root: Option<PathBuf>,
    pub docker_root: Option<PathBuf>,
    pub kmsg: Option<PathBuf>,
    pub proc_root: PathBuf,
    /// The host's mount namespace: a process in it is not a container's.
    pub host_mnt: Option<NsId>,
    /// How deaths of memory are judged.
    pub rules: DeathRules,
}

impl Sources {
    fn log_settings(&self) -> LogSettings {
        LogSettings {
            pod_log_root: self.pod_log_root.clone(),
            docker_root: self.docker_root.clone(),
            max_lines_per_sec: MAX_LINES_PER_SEC,
        }
    }
}

/// `check`: what the logs and the kernel said since `since`.
pub fn collect(sources: &Sources, since: SystemTime) -> Vec<Detected> {
    let mut recogniser = Recogniser::new(
        sources.proc_root.clone(),
        sources.host_mnt,
        sources.rules.oom_shm_share,
    );
    let mut out: Vec<Detected> = LogTailer::since(sources.log_settings(), since)
        .poll_matching(|text| recogniser.is_candidate(text))
        .iter()
        .filter_map(|l| recogniser.log_line(l))
        .collect();
    // Docker's records of the containers that stopped since: the deaths that print nothing.
    if let Some(root) = &sources.docker_root {
        out.extend(
            crate::docker::exited_since(root, since)
                .iter()
                .filter_map(docker_deaths::detected),
        );
    }
    if let Some(path) = &sources.kmsg {
        match KernelLog::open(path, KmsgStart::Since(since)) {
            Ok(mut reader) => loop {
                let batch = reader.read_available(KMSG_BATCH);
                if batch.is_empty() {
                    break;
                }
                for r in &batch {
                    let at = reader.wall_time(r.usec);
                    // Every record is read, in order: an OOM report spans many.
                    let told = recogniser.kernel(r, at);
                    if at >= since {
                        out.extend(told);
                    }
                }
            },
            Err(e) => tracing::warn!("not reading the kernel log {}: {e}", path.display()),
        }
    }
    // A container gone since has no reading to name it: Docker's record still does.
    if let Some(root) = &sources.docker_root {
        let mut names = crate::docker::DockerNames::new(Some(root.clone()));
        for d in &mut out {
            if let Who::Container {
                pod_uid: None,
                container_id,
            } = &d.who
            {
                if let Some(c) = names.lookup(container_id) {
                    d.who = Who::Docker {
                        container_id: container_id.clone(),
                        name: c.name,
                    };
                }
            }
        }
    }
    out.sort_by_key(|d| d.at);
    out
}

/// What one poll found: workloads' failures, and what the kernel said about GPUs.
#[derive(Debug, Default)]
pub struct Told {
    pub failures: Vec<Detected>,
    pub gpus: Vec<KernelGpu>,
}

/// `serve`: follows the sources from now on and hands each poll's failures to `deliver`
/// (the scan thread's queue) and its counts to `report`. Stops when `stop` is set. None when
/// every source is off.
pub fn spawn<F, R>(
    sources: Sources,
    deliver: F,
    mut report: R,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>>
where
    F: Fn(Told) -> bool + Send + 'static,
    R: FnMut(&SourceStats) + Send + 'static,
{
    if sources.pod_log_root.is_none() && sources.docker_root.is_none() && sources.kmsg.is_none() {
        return None;
    }
    let spawned = std::thread::Builder::new()
        .name("failures".into())
        .spawn(move || {
            let mut recogniser = Recogniser::new(
                sources.proc_root.clone(),
                sources.host_mnt,
                sources.rules.oom_shm_share,
            );
            let mut logs = LogTailer::from_end(sources.log_settings());
            let mut kmsg = sources.kmsg.as_ref().and_then(|path| {
                KernelLog::open(path, KmsgStart::End)
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
            let mut stats = SourceStats {
                kmsg_open: sources.kmsg.as_ref().map(|_| kmsg.is_some()),
                ..SourceStats::default()
            };
            let logs_on = sources.pod_log_root.is_some() || sources.docker_root.is_some();
            // The kernel's OOM kills of the last poll: told with this poll's lines, so that
            // PyTorch's word of the kill (written a moment after it) goes with it.
            let mut kills: Vec<Detected> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let mut told = Told {
                    failures: std::mem::take(&mut kills),
                    gpus: Vec::new(),
                };
                told.failures.extend(
                    logs.poll_matching(|text| recogniser.is_candidate(text))
                        .iter()
                        .filter_map(|l| recogniser.log_line(l)),
                );
                if let Some(reader) = kmsg.as_mut() {
                    let records = reader.read_available(KMSG_BATCH);
                    stats.kmsg_records += records.len() as u64;
                    for r in records {
                        let at = reader.wall_time(r.usec);
                        match recogniser.kernel(&r, at) {
                            Some(d) if logs_on && d.kind.is_oom_kill() => kills.push(d),
                            d => told.failures.extend(d),
                        }
                        told.gpus.extend(kernel_gpu(&r));
                    }
                    stats.kmsg_lost = reader.lost();
                }
                stats.logs = logs.stats();
                report(&stats);
                let quiet = told.failures.is_empty() && told.gpus.is_empty();
                if !quiet && !deliver(told) {
                    return;
                }
                std::thread::sleep(POLL);
            }
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("cannot start the failure watcher: {e}");
            None
        }
    }
}

/// The scan thread's side: a channel the watcher delivers into.
pub fn channel<T: Send + 'static>(
    tx: mpsc::Sender<T>,
    wrap: fn(Told) -> T,
) -> impl Fn(Told) -> bool + Send + 'static {
    move |batch| tx.send(wrap(batch)).is_ok()
}

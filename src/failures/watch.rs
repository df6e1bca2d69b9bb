//! Following the sources: the container logs and the kernel log, read on a thread of its own in
//! `serve` (every [`POLL`]), or back over `--since` in `check` ([`collect`]). What they say is
//! recognised and placed (`detect.rs`), and handed on as [`Detected`].

use std::collections::{HashMap, VecDeque};
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
use crate::model::{Detected, FindingKind, SourceStats, Who};

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
    let mut kept = Bounded::default();
    let candidates = recogniser.candidates();
    LogTailer::since(sources.log_settings(), since).poll_each(
        |text| candidates.is_candidate(text),
        |line| kept.extend(recogniser.log_line(&line)),
    );
    let mut out = kept.into_vec();
    // Docker's records of the containers that stopped since: the deaths that print nothing.
    if let Some(root) = &sources.docker_root {
        out.extend(
            crate::docker_records::exited_since(root, since)
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
        let mut names = crate::docker_records::DockerNames::new(Some(root.clone()));
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

/// A container's failures of one kind that `check` lists at most: the first and the newest
/// (a container printing the same failure for an hour would otherwise hold millions).
const KEPT_PER_KIND: usize = 64;

/// `check`'s failures from the logs, at most [`KEPT_PER_KIND`] per container and kind: the
/// first half and the newest half of them, the rest counted and said once.
#[derive(Default)]
struct Bounded {
    by_key: HashMap<(Who, FindingKind), Kept>,
}

/// One container's failures of one kind: the first, the newest, and how many were left out.
type Kept = (Vec<Detected>, VecDeque<Detected>, u64);

impl Bounded {
    fn extend(&mut self, d: Option<Detected>) {
        let Some(d) = d else { return };
        let (first, newest, left_out) = self.by_key.entry((d.who.clone(), d.kind)).or_default();
        if first.len() < KEPT_PER_KIND / 2 {
            first.push(d);
            return;
        }
        newest.push_back(d);
        if newest.len() > KEPT_PER_KIND / 2 {
            newest.pop_front();
            *left_out += 1;
        }
    }

    fn into_vec(self) -> Vec<Detected> {
        let mut out = Vec::new();
        for ((who, kind), (first, newest, left_out)) in self.by_key {
            if left_out > 0 {
                let whose = match &who {
                    Who::Pod {
                        namespace,
                        pod,
                        container,
                        ..
                    } => format!("{namespace}/{pod}/{container}"),
                    Who::Container { container_id, .. } | Who::Docker { container_id, .. } => {
                        crate::model::short_id(container_id).to_string()
                    }
                    Who::Process => "a process".into(),
                };
                tracing::warn!(
                    "container {whose}: {left_out} more {} failures in its log are not listed \
                     (the first {half} and the newest {half} are)",
                    kind.as_str(),
                    half = KEPT_PER_KIND / 2
                );
            }
            out.extend(first);
            out.extend(newest);
        }
        out
    }
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
            // The recogniser's question, asked of its own copy while each line goes to it.
            let candidates = recogniser.candidates();
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
                logs.poll_each(
                    |text| candidates.is_candidate(text),
                    |line| told.failures.extend(recogniser.log_line(&line)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FailureSource;

    #[test]
    fn check_keeps_the_first_and_the_newest_failures_of_a_flooding_container() {
        let who = |c: &str| Who::Container {
            pod_uid: None,
            container_id: c.into(),
        };
        let at = |i: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(i);
        let mut kept = Bounded::default();
        for i in 0..10_000 {
            let kind = FindingKind::ShmAllocationFailed;
            kept.extend(Some(Detected::new(
                who("flood"),
                kind,
                at(i),
                FailureSource::Log,
                "x",
            )));
        }
        kept.extend(Some(Detected::new(
            who("quiet"),
            FindingKind::ShmAllocationFailed,
            at(5),
            FailureSource::Log,
            "y",
        )));
        let mut out = kept.into_vec();
        out.sort_by_key(|d| d.at);
        let flood: Vec<u64> = out
            .iter()
            .filter(|d| d.who == who("flood"))
            .map(|d| {
                d.at.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        let want: Vec<u64> = (0..32).chain(10_000 - 32..10_000).collect();
        assert_eq!(flood, want);
        assert_eq!(out.iter().filter(|d| d.who == who("quiet")).count(), 1);
    }
}

//! Following the sources: the container logs and the kernel log, read on a thread of its own in
//! `serve` (every [`POLL`]), or back over `--since` in `check` ([`collect`]). What they say is
//! recognised (`failures::`), placed (`attribute`), and handed on as [`Detected`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use super::attribute::who_is_pid;
use crate::failures::kmsg::{kernel_event, KernelEvent, KmsgRecord};
use crate::failures::reader::{KernelLog, KmsgStart};
use crate::failures::signatures::{LogFailure, Signatures};
use crate::gpu::xid::kernel::KernelGpu;
use crate::host::NsId;
use crate::logs::{LogLine, LogOrigin, LogSettings, LogTailer};
use crate::model::FindingKind;
use crate::model::{cut, Detected, FailureSource, SourceStats, Who, EVIDENCE_MAX};

/// How often `serve` reads the sources: a failure reaches its Event well within 2 s.
pub const POLL: Duration = Duration::from_millis(200);
/// Lines per second one container may log before the rest is dropped (and counted): a flood
/// costs its own lines, not the node's CPU.
pub const MAX_LINES_PER_SEC: u32 = 2000;
/// Kernel records read per poll at most.
const KMSG_BATCH: usize = 4096;

/// Where the failures are told, and how to place a host PID.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub pod_log_root: Option<PathBuf>,
    pub docker_root: Option<PathBuf>,
    pub kmsg: Option<PathBuf>,
    pub proc_root: PathBuf,
    /// The host's mount namespace: a process in it is not a container's.
    pub host_mnt: Option<NsId>,
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

/// Lines and kernel records in, failures out.
pub struct Recogniser {
    signatures: Signatures,
    proc_root: PathBuf,
    host_mnt: Option<NsId>,
}

impl Recogniser {
    pub fn new(sources: &Sources) -> Recogniser {
        Recogniser {
            signatures: Signatures::new(),
            proc_root: sources.proc_root.clone(),
            host_mnt: sources.host_mnt,
        }
    }

    /// A container's line: only ever about that container.
    pub fn log_line(&self, line: &LogLine) -> Option<Detected> {
        let m = self.signatures.match_line(&line.text)?;
        let who = match &line.origin {
            LogOrigin::Pod {
                namespace,
                pod,
                uid,
                container,
            } => Who::Pod {
                namespace: namespace.clone(),
                pod: pod.clone(),
                uid: uid.clone(),
                container: container.clone(),
            },
            LogOrigin::Docker { id } => Who::Container {
                pod_uid: None,
                container_id: id.clone(),
            },
        };
        Some(Detected {
            who,
            kind: match m.kind {
                LogFailure::ShmAllocationFailed => FindingKind::ShmAllocationFailed,
                LogFailure::NcclP2pDisabled => FindingKind::NcclP2pDisabled,
            },
            at: line.at,
            source: FailureSource::Log,
            evidence: cut(line.text.trim(), EVIDENCE_MAX),
            pid: None,
            comm: None,
            library: None,
            nccl_gpus: m.gpus,
        })
    }

    /// A kernel record about a GPU (an XID, a GPU fallen off the bus), for the XID count it
    /// shares with NVML (`gpu::xid::kernel`).
    pub fn kernel_gpu(&self, record: &KmsgRecord) -> Option<KernelGpu> {
        match kernel_event(record)? {
            KernelEvent::Xid { pci, xid, .. } => Some(KernelGpu::Xid { pci, xid }),
            KernelEvent::FellOffBus { pci } => Some(KernelGpu::FellOffBus { pci }),
            KernelEvent::GpuLibCrash { .. } => None,
        }
    }

    /// A kernel record: a crash in a GPU library, placed through the crashing PID at once.
    pub fn kernel(&self, record: &KmsgRecord, at: SystemTime) -> Option<Detected> {
        let KernelEvent::GpuLibCrash { comm, pid, library } = kernel_event(record)? else {
            return None;
        };
        Some(Detected {
            who: who_is_pid(&self.proc_root, pid, self.host_mnt),
            kind: FindingKind::GpuJobCrashed,
            at,
            source: FailureSource::Kernel,
            evidence: cut(record.message.trim(), EVIDENCE_MAX),
            pid: Some(pid),
            comm: Some(comm),
            library: Some(library),
            nccl_gpus: None,
        })
    }
}

/// `check`: what the logs and the kernel said since `since`.
pub fn collect(sources: &Sources, since: SystemTime) -> Vec<Detected> {
    let recogniser = Recogniser::new(sources);
    let mut out: Vec<Detected> = LogTailer::since(sources.log_settings(), since)
        .poll_matching(|text| recogniser.signatures.is_candidate(text))
        .iter()
        .filter_map(|l| recogniser.log_line(l))
        .collect();
    if let Some(path) = &sources.kmsg {
        match KernelLog::open(path, KmsgStart::Since(since)) {
            Ok(mut reader) => loop {
                let batch = reader.read_available(KMSG_BATCH);
                if batch.is_empty() {
                    break;
                }
                for r in &batch {
                    let at = reader.wall_time(r.usec);
                    if at >= since {
                        out.extend(recogniser.kernel(r, at));
                    }
                }
            },
            Err(e) => tracing::warn!("not reading the kernel log {}: {e}", path.display()),
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
            let recogniser = Recogniser::new(&sources);
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
            while !stop.load(Ordering::Relaxed) {
                let mut told = Told {
                    failures: logs
                        .poll_matching(|text| recogniser.signatures.is_candidate(text))
                        .iter()
                        .filter_map(|l| recogniser.log_line(l))
                        .collect(),
                    gpus: Vec::new(),
                };
                if let Some(reader) = kmsg.as_mut() {
                    let records = reader.read_available(KMSG_BATCH);
                    stats.kmsg_records += records.len() as u64;
                    for r in records {
                        let at = reader.wall_time(r.usec);
                        told.failures.extend(recogniser.kernel(&r, at));
                        told.gpus.extend(recogniser.kernel_gpu(&r));
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

//! `serve --death-trace`: starts the kernel's tracepoints of deaths (`crate::death_trace`) and
//! hands what they tell to the failure follower; where the kernel or the capabilities refuse,
//! says so once, exports `shmlink_death_trace_up 0` and goes on with the scans' readings.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use super::AgentError;
use crate::cli::DeathTraceMode;
use crate::death_trace::{self, TraceSettings};
use crate::failures::Sources;
use crate::host::HostPaths;
use crate::metrics::Metrics;
use crate::model::{TracedCause, TracedDeath};

#[derive(Debug, Clone)]
pub struct DeathTraceSettings {
    pub mode: DeathTraceMode,
    pub sys_root: PathBuf,
    pub tracefs: Option<PathBuf>,
}

type Started = (Option<JoinHandle<()>>, Option<mpsc::Receiver<TracedDeath>>);

pub(super) fn start(
    s: &DeathTraceSettings,
    host: &HostPaths,
    sources: &Sources,
    stop: &Arc<AtomicBool>,
    metrics: &Metrics,
) -> Result<Started, AgentError> {
    metrics.set_death_trace_up(false);
    if s.mode == DeathTraceMode::Off {
        return Ok((None, None));
    }
    let settings = TraceSettings {
        sys_root: s.sys_root.clone(),
        tracefs: s.tracefs.clone(),
        proc_root: sources.proc_root.clone(),
        hierarchy: host.memory_hierarchy().ok(),
        host_mnt: sources.host_mnt,
    };
    let (tx, rx) = mpsc::channel();
    let deliver = move |d: TracedDeath| {
        log_moment(&d);
        tx.send(d).is_ok()
    };
    match death_trace::start(&settings, deliver, stop.clone()) {
        Ok(tracer) => {
            metrics.set_death_trace_up(true);
            tracing::info!(
                "death trace on: SIGBUS faults and OOM victims from the kernel's tracepoints, \
                 each container's /dev/shm read the moment it dies"
            );
            Ok((Some(tracer.handle), Some(rx)))
        }
        Err(e) if s.mode == DeathTraceMode::On => Err(AgentError::DeathTrace(e)),
        Err(e) => {
            tracing::warn!(
                "death trace off: {e}; a SIGBUS death is judged by the last scan's reading of \
                 its /dev/shm (and the peak sampler's), which a death between two scans misses"
            );
            Ok((None, None))
        }
    }
}

/// One line per traced death at debug level: when its reading was taken (bench/death_trace).
fn log_moment(d: &TracedDeath) {
    let cause = match d.cause {
        TracedCause::BusFault { .. } => "sigbus",
        TracedCause::OomVictim { .. } => "oom_victim",
    };
    tracing::debug!(
        pid = d.pid,
        cause,
        read_after_us = d.read_after.as_micros() as u64,
        shm_used = d.reading.as_ref().and_then(|r| r.used_bytes),
        shm_size = d.reading.as_ref().and_then(|r| r.size_bytes),
        cgroup = d
            .cgroup_file
            .as_deref()
            .map(|c| c.lines().find(|l| l.contains("memory")).unwrap_or(c)),
        "traced death"
    );
}

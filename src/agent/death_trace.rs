//! `serve --death-trace`: starts the kernel's tracepoints of deaths (`crate::death_trace`) and
//! hands what they tell to the failure follower; where the kernel or the capabilities refuse,
//! says so once, exports `shmlink_death_trace_up 0`, keeps the finding `death_trace_off` in
//! every scan (and so `/readyz`'s body) and goes on with the scans' readings.

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
use crate::model::{Finding, FindingKind, Subject, TracedCause, TracedDeath};

#[derive(Debug, Clone)]
pub struct DeathTraceSettings {
    pub mode: DeathTraceMode,
    pub sys_root: PathBuf,
    pub tracefs: Option<PathBuf>,
}

/// The reader, its channel, and the finding every scan carries while `auto` found it refused.
pub(super) struct Started {
    pub handle: Option<JoinHandle<()>>,
    pub deaths: Option<mpsc::Receiver<TracedDeath>>,
    pub off: Option<Finding>,
}

impl Started {
    fn none(off: Option<Finding>) -> Started {
        Started {
            handle: None,
            deaths: None,
            off,
        }
    }
}

pub(super) fn start(
    s: &DeathTraceSettings,
    host: &HostPaths,
    sources: &Sources,
    stop: &Arc<AtomicBool>,
    metrics: &Metrics,
) -> Result<Started, AgentError> {
    metrics.set_death_trace_up(false);
    if s.mode == DeathTraceMode::Off {
        return Ok(Started::none(None));
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
                "death trace on ({}): SIGBUS faults and OOM victims from the kernel's \
                 tracepoints, each container's /dev/shm read the moment it dies",
                tracer.source
            );
            Ok(Started {
                handle: Some(tracer.handle),
                deaths: Some(rx),
                off: None,
            })
        }
        Err(e) if s.mode == DeathTraceMode::On => Err(AgentError::DeathTrace(e)),
        Err(e) => {
            let said = crate::text::death_trace_off(&e.to_string());
            tracing::warn!("{said}");
            let finding = Finding::new(FindingKind::DeathTraceOff, Subject::Node, said);
            Ok(Started::none(Some(finding)))
        }
    }
}

/// One line per traced death at debug level: when its reading was taken (bench/death_trace).
fn log_moment(d: &TracedDeath) {
    let cause = match d.cause {
        TracedCause::BusFault { .. } => "sigbus",
        TracedCause::OomVictim { .. } => "oom_victim",
        TracedCause::Fatal { .. } => "fatal_signal",
    };
    tracing::debug!(
        pid = d.pid,
        cause,
        read_after_us = d.read_after.as_micros() as u64,
        in_time = d.read_in_time,
        shm_used = d.reading.as_ref().and_then(|r| r.used_bytes),
        shm_size = d.reading.as_ref().and_then(|r| r.size_bytes),
        cgroup = d
            .cgroup_file
            .as_deref()
            .map(|c| c.lines().find(|l| l.contains("memory")).unwrap_or(c)),
        "traced death"
    );
}

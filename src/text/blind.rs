//! What a blind scan tells a person: why it saw nothing (or not all), and what to do.

use crate::model::{Blind, NvmlState, Sight};

/// What gives the agent sight into other users' processes.
const PRIVILEGE: &str = "run as root, or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the \
                         DaemonSet's capabilities)";

/// `death_trace_off`: why the moment of death is not read, what follows and what to do.
pub fn death_trace_off(why: &str) -> String {
    format!(
        "death trace off: {why}. Fast deaths are judged by the scans: a SIGBUS death between two \
         scans is told bus_error_unmeasured unless a scan saw its /dev/shm full, and a crash \
         whose PID cannot be placed for certain is told unplaced (on the node). Fix: give the \
         agent CAP_PERFMON and a tracefs (mounted on the host at /sys/kernel/tracing, or \
         CAP_SYS_ADMIN to mount its own)"
    )
}

/// One line per reason: what was not seen, why, and what to do.
pub fn blind(reason: Blind, sight: &Sight) -> String {
    match reason {
        Blind::NoProcesses => format!(
            "blind (no_processes): {} lists no process, so no container can be seen: check \
             --proc-root (the host's /proc; in a pod, the host's /proc mounted, e.g. /host/proc)",
            sight.proc_root
        ),
        Blind::NoCgroups => format!(
            "blind (no_cgroups): no memory cgroup hierarchy under {} (cgroup v2 \
             cgroup.controllers, v1 memory/, unified/), so no container can be found: check \
             --cgroup-root (the host's /sys/fs/cgroup)",
            sight.cgroup_root
        ),
        Blind::ContainersUnreadable => format!(
            "blind (containers_unreadable): the processes of {} cgroup{} could not be looked \
             into (permission denied), so no container's /dev/shm was measured: {PRIVILEGE}",
            sight.unreadable,
            plural(sight.unreadable)
        ),
        Blind::SomeContainersUnreadable => format!(
            "partly blind (some_containers_unreadable): {} container{} measured, but the \
             processes of {} cgroup{} could not be looked into (permission denied) and are not \
             in this report: {PRIVILEGE}",
            sight.measured,
            plural(sight.measured),
            sight.unreadable,
            plural(sight.unreadable)
        ),
    }
}

/// Why `check` lists no GPU.
pub fn no_gpus_because(nvml: &NvmlState) -> String {
    let library = nvml.library.as_deref().unwrap_or("libnvidia-ml.so.1");
    match (&nvml.error, nvml.loaded) {
        _ if nvml.disabled => "GPUs: none (--no-gpu: NVML not loaded)".to_string(),
        (Some(error), _) => format!("GPUs: none (NVML did not load from {library}: {error})"),
        (None, true) => format!("GPUs: none (NVML loaded from {library} lists no GPU)"),
        (None, false) => format!("GPUs: none (NVML not loaded from {library})"),
    }
}

/// The closing line of a scan without findings that was blind: never "all healthy".
pub fn no_findings_but_blind(total: bool) -> &'static str {
    if total {
        "No findings, but the scan was blind (see above): nothing here is known to be healthy."
    } else {
        "No findings among the containers measured; the others were not read (see above)."
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_says_what_to_do() {
        let sight = Sight {
            proc_root: "/host/prc".into(),
            cgroup_root: "/tmp/empty".into(),
            processes: true,
            cgroup_hierarchy: true,
            measured: 2,
            unreadable: 10,
        };
        let line = blind(Blind::NoProcesses, &sight);
        assert!(line.starts_with("blind (no_processes): /host/prc lists no process"));
        assert!(line.contains("check --proc-root"));
        let line = blind(Blind::NoCgroups, &sight);
        assert!(line.contains("under /tmp/empty") && line.contains("check --cgroup-root"));
        let line = blind(Blind::ContainersUnreadable, &sight);
        assert!(line.contains("of 10 cgroups could not be looked into"));
        assert!(line.contains("CAP_SYS_PTRACE"));
        let line = blind(Blind::SomeContainersUnreadable, &sight);
        assert!(line.starts_with("partly blind"));
        assert!(line.contains("2 containers measured") && line.contains("of 10 cgroups"));
        assert!(!line.contains('\n'));
    }

    #[test]
    fn no_gpus_says_why() {
        let failed = NvmlState {
            loaded: false,
            library: Some("/nonexistent/x.so".into()),
            error: Some("libloading error".into()),
            disabled: false,
        };
        assert_eq!(
            no_gpus_because(&failed),
            "GPUs: none (NVML did not load from /nonexistent/x.so: libloading error)"
        );
        assert_eq!(
            no_gpus_because(&NvmlState::disabled()),
            "GPUs: none (--no-gpu: NVML not loaded)"
        );
        let loaded = NvmlState {
            loaded: true,
            error: None,
            ..failed
        };
        assert!(no_gpus_because(&loaded).contains("lists no GPU"));
    }
}

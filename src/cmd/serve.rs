//! `shmlink serve`: the DaemonSet agent, until SIGTERM.

use std::process::ExitCode;

use anyhow::Context;

use shmlink::agent::{self, DeathTraceSettings, KubeSettings, ServeSettings};
use shmlink::cli::ServeArgs;

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(args.log_format, args.common.log_level, "info")?;
    let sources = super::sources(&args.common, &args.sources);
    let mut scan = super::scan_settings(&args.common, sources.docker_root.clone())?;
    scan.gpu_fault_hold = args.gpu_fault_hold;
    let settings = ServeSettings {
        scan,
        listen: args.listen,
        interval: args.interval,
        kube: KubeSettings {
            mode: args.kube,
            node: args.common.node_name(),
            event_heartbeat: args.event_heartbeat,
            pod_resources_socket: args.pod_resources_socket.clone(),
            gpu_fault_hold: args.gpu_fault_hold,
            condition_heartbeat: args.condition_heartbeat,
            taint_on_gpu_fault: args.taint_on_gpu_fault,
            gpu_device_taint: agent::device_taint_effect(args.gpu_device_taint),
            pod_cache_wait: args.pod_cache_wait,
        },
        death_trace: DeathTraceSettings {
            mode: args.death_trace,
            sys_root: args.common.host.sys_root.clone(),
            tracefs: args.tracefs.clone(),
        },
        state_dir: args.state.dir(),
        sources,
        probe: match args.p2p_probe_interval {
            Some(every) => Some((super::probe_options(&args.cuda)?, every)),
            None => None,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(agent::serve(settings))?;
    Ok(ExitCode::SUCCESS)
}

//! One file per command: each turns its arguments into one settings value and makes one call
//! into the library. What several commands share (the host's roots, the scan, the failure
//! sources, the probe's options, logging) is turned here.

pub mod admit;
pub mod check;
pub mod fleet;
pub mod history;
pub mod preflight;
pub mod probe;
pub mod serve;

use std::io::IsTerminal;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use shmlink::cli::{CommonArgs, CudaArgs, FailureSourceArgs, LogFormat, LogLevel};
use shmlink::failures::Sources;
use shmlink::gpu::pairs::PairRules;
use shmlink::host::HostPaths;
use shmlink::model::DeathRules;
use shmlink::probe::ProbeOptions;
use shmlink::scan::ScanSettings;
use shmlink::shm::status::Thresholds;

fn host_paths(common: &CommonArgs) -> HostPaths {
    HostPaths {
        proc_root: common.host.proc_root.clone(),
        cgroup_root: common.host.cgroup_root.clone(),
    }
}

fn pair_rules(common: &CommonArgs) -> PairRules {
    PairRules {
        window: common.gpu.nvlink_error_window,
        ..PairRules::default()
    }
}

/// What a scan looks at; `docker_root` (the failure sources' own) names plain Docker containers.
fn scan_settings(
    common: &CommonArgs,
    docker_root: Option<std::path::PathBuf>,
) -> anyhow::Result<ScanSettings> {
    Ok(ScanSettings {
        host: host_paths(common),
        sys_root: common.host.sys_root.clone(),
        node: common.node_name(),
        thresholds: Thresholds::new(
            common.thresholds.shm_warn_ratio,
            common.thresholds.shm_critical_ratio,
        )?,
        no_gpu: common.gpu.no_gpu,
        nvml_lib: common.gpu.nvml_lib.clone(),
        pair_rules: pair_rules(common),
        docker_root,
        gpu_fault_hold: shmlink::gpu::collector::DEFAULT_FAULT_HOLD,
    })
}

/// The failure sources as the options name them (`off` turns one off).
fn sources(common: &CommonArgs, args: &FailureSourceArgs) -> Sources {
    let host = host_paths(common);
    Sources {
        pod_log_root: FailureSourceArgs::on(&args.pod_log_root),
        docker_root: FailureSourceArgs::on(&args.docker_root),
        kmsg: FailureSourceArgs::on(&args.kmsg),
        host_mnt: host.host_namespaces().ok().map(|ns| ns.mnt),
        proc_root: host.proc_root,
        rules: DeathRules {
            oom_shm_share: args.oom_shm_share,
            bus_error_shm_ratio: args.bus_error_shm_ratio,
        },
    }
}

/// How the probe runs from `shmlink probe`, `preflight --p2p` and `serve`: this binary as its
/// worker.
fn probe_options(cuda: &CudaArgs) -> anyhow::Result<ProbeOptions> {
    Ok(ProbeOptions {
        cuda_lib: cuda.cuda_lib.clone(),
        bytes: cuda.bytes,
        timeout: cuda.probe_timeout,
        init_timeout: std::time::Duration::from_secs(60),
        worker: std::env::current_exe().context("finding this program for the probe's worker")?,
        stop: None,
    })
}

/// Logs go to stderr at `--log-level` (else the command's default); `SHMLINK_LOG` (or
/// `RUST_LOG`), when set, is a full filter instead. A filter that does not parse is an error:
/// silently logging at another level than asked hides what the operator is looking for.
fn init_logging(
    format: LogFormat,
    level: Option<LogLevel>,
    default_level: &'static str,
) -> anyhow::Result<()> {
    let expert = ["SHMLINK_LOG", "RUST_LOG"]
        .into_iter()
        .find_map(|name| Some((name, std::env::var(name).ok().filter(|f| !f.is_empty())?)));
    let filter = match expert {
        Some((name, f)) => {
            EnvFilter::try_new(&f).with_context(|| format!("{name}={f:?} is not a valid filter"))?
        }
        None => EnvFilter::new(level.map_or(default_level, LogLevel::as_str)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

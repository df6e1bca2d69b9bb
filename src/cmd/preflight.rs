//! `shmlink preflight`: inside a workload's container, its /dev/shm, memory limit and GPU pairs
//! against what the workload needs, with the fix.

use std::io::Write;
use std::process::ExitCode;

use shmlink::cli::{LogFormat, PreflightArgs};
use shmlink::preflight::need;
use shmlink::preflight::{self, render};

/// `shmlink preflight`: bad sizes are a one-line error (exit 2, through `main`).
pub fn run(args: PreflightArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.common.log_level, "error")?;
    let need = need::spec_of(
        args.min_shm.as_deref(),
        args.dataloader_workers,
        args.batch_bytes.as_deref(),
        args.prefetch_factor,
    )?;
    let roots = preflight::Roots {
        proc_root: args.common.host.proc_root.clone(),
        cgroup_root: args.common.host.cgroup_root.clone(),
        shm_dir: args.shm_dir.clone(),
    };
    let options = preflight::Options {
        need,
        no_gpu: args.common.gpu.no_gpu,
        nvml_lib: args.common.gpu.nvml_lib.clone(),
        rules: super::pair_rules(&args.common),
        host_ipc_ns: args.host_ipc_ns,
        p2p: if args.p2p {
            Some(super::probe_options(&args.cuda)?)
        } else {
            None
        },
    };
    let report = preflight::run(&roots, &preflight::Env::from_process(), &options);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", render::render_text(&report))?;
    }
    stdout.flush()?;
    Ok(ExitCode::from(report.exit_code))
}

//! `shmlink admit`: the admission webhook, until SIGTERM.

use std::process::ExitCode;

use anyhow::Context;

use shmlink::admit::server::{self, AdmitSettings, Limits};
use shmlink::admit::Mode;
use shmlink::cli::{AdmitArgs, AdmitMode};

pub fn run(args: AdmitArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(args.log_format, args.log_level, "info")?;
    let settings = AdmitSettings {
        listen: args.listen,
        cert_file: args.tls_cert_file,
        key_file: args.tls_key_file,
        mode: match args.mode {
            AdmitMode::Warn => Mode::Warn,
            AdmitMode::Mutate => Mode::Mutate,
        },
        metrics_listen: args.metrics_listen.0,
        reload_interval: args.tls_reload_interval,
        limits: Limits::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(server::serve(settings, shmlink::server::shutdown_signal()))?;
    Ok(ExitCode::SUCCESS)
}

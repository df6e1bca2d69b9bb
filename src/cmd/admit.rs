//! `shmlink admit`: the admission webhook, until SIGTERM.

use std::process::ExitCode;

use anyhow::Context;

use std::sync::Arc;

use shmlink::admit::dra_lookup::DraResolver;
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
        dra: None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut settings = settings;
        let client = shmlink::kube::connect(args.kube).await?;
        settings.dra = client.map(|c| Arc::new(DraResolver::new(c, args.dra_gpu_drivers)));
        if settings.dra.is_none() {
            tracing::info!("no Kubernetes client: DRA claims are not looked up");
        }
        server::serve(settings, shmlink::server::shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

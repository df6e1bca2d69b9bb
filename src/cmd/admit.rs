//! `shmlink admit`: the admission webhook, until SIGTERM.

use std::process::ExitCode;

use anyhow::Context;

use std::sync::Arc;

use shmlink::admit::dra_lookup::DraResolver;
use shmlink::admit::server::{self, AdmitSettings, Limits};
use shmlink::admit::Mode;
use shmlink::cli::{AdmitArgs, AdmitMode, KubeMode};

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
        let client = kube_client(args.kube).await?;
        settings.dra = client.map(|c| Arc::new(DraResolver::new(c, args.dra_gpu_drivers)));
        server::serve(settings, shmlink::server::shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The client the DRA lookup uses: `auto` takes one where a configuration is found (said at
/// debug only: without one the webhook works as before, DRA Pods counted by their
/// device-plugin GPUs), `on` must find one.
async fn kube_client(mode: KubeMode) -> anyhow::Result<Option<kube::Client>> {
    if mode != KubeMode::Auto {
        return Ok(shmlink::kube::connect(mode).await?);
    }
    match kube::Config::infer().await {
        Ok(config) => Ok(kube::Client::try_from(config).ok()),
        Err(e) => {
            tracing::debug!("no Kubernetes configuration: DRA claims are not looked up: {e}");
            Ok(None)
        }
    }
}

//! `shmlink fleet`: the cluster read through its API, printed (or JSON).

use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;

use shmlink::cli::{FleetArgs, LogFormat};
use shmlink::fleet::{self, render::render, FleetSettings};

pub fn run(args: FleetArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.log_level, "warn")?;
    let settings = FleetSettings {
        namespace: args.namespace,
        since: args.since,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let client = client(args.kubeconfig.as_deref()).await?;
        anyhow::Ok(fleet::run(&client, &settings).await)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let since = humantime::format_duration(settings.since).to_string();
        print!("{}", render(&report, SystemTime::now(), &since));
    }
    Ok(ExitCode::from(report.exit_status()))
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration ($KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use k8s_openapi::api::core::v1::Pod;
use shmlink::cli::{Cli, Command, CommonArgs, FailureSourceArgs, KubeMode, LogFormat, LogLevel};
use shmlink::failures::correlate::{correlate, finding, Known};
use shmlink::failures::detect::DeathRules;
use shmlink::failures::memcg::OomCounters;
use shmlink::failures::same::SameDeath;
use shmlink::failures::watch::{collect, Sources};
use shmlink::findings::Thresholds;
use shmlink::gpu::collector::GpuCollector;
use shmlink::gpu::pairs::PairRules;
use shmlink::host::HostPaths;
use shmlink::kube::events::GpuHolders;
use shmlink::kube::exits::deaths;
use shmlink::kube::pods::{list_once, PodIndex};
use shmlink::model::Severity;
use shmlink::model::Snapshot;
use shmlink::model::{Detected, FailureSource};
use shmlink::scan::Scanner;
use shmlink::{agent, report};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shmlink: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check(args) => {
            init_logging(LogFormat::Text, args.common.log_level, "warn")?;
            let listed = pods_once(args.kube, &args.common.node_name())?;
            let pods = listed.as_deref().map(|p| PodIndex::new(p.iter()));
            let sources = sources(&args.common, &args.sources);
            let mut scanner =
                scanner(&args.common, false)?.with_docker_root(sources.docker_root.clone());
            let mut snapshot = scanner.scan_with(pods.as_ref()).snapshot;
            let since = std::time::SystemTime::now() - args.since;
            let mut found = collect(&sources, since);
            // The deaths the Pods' statuses record, as serve tells them from the watch.
            found.extend(
                listed
                    .iter()
                    .flatten()
                    .flat_map(deaths)
                    .map(|(_, d)| d)
                    .filter(|d| d.at >= since),
            );
            // A runtime's record after the accounts with numbers: of two that tell one death
            // (the kernel's kill, kubelet's OOMKilled stamped in whole seconds), the first stays.
            found.sort_by_key(|d| {
                let record = matches!(d.source, FailureSource::PodStatus | FailureSource::Docker);
                (record, d.at)
            });
            add_failures(&mut snapshot, &found, pods.as_ref(), sources.rules);
            let mut stdout = std::io::stdout().lock();
            if args.json {
                report::write_json(&mut stdout, &snapshot)?;
            } else {
                let colour =
                    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                report::write_tables(&mut stdout, &snapshot, colour)?;
            }
            Ok(match snapshot.worst_severity() {
                Some(Severity::Warning | Severity::Critical) => ExitCode::from(1),
                _ => ExitCode::SUCCESS,
            })
        }
        Command::Serve(args) => {
            init_logging(args.log_format, args.common.log_level, "info")?;
            let sources = sources(&args.common, &args.sources);
            let mut scanner = scanner(&args.common, true)?
                .without_shmem_stat()
                .with_docker_root(sources.docker_root.clone())
                .with_peak_sampling(args.common.host.proc_root.clone(), PEAK_PERIOD);
            // Without the kernel log, OOM kills are told from the memory cgroups' counters.
            let oom_counters = match (&sources.kmsg, host_paths(&args.common).memory_hierarchy()) {
                (None, Ok((hierarchy, version))) => {
                    scanner = scanner.with_oom_kills();
                    Some(OomCounters::new(
                        hierarchy,
                        version,
                        sources.rules.oom_shm_share,
                    ))
                }
                _ => None,
            };
            let kube = agent::KubeSettings {
                mode: args.kube,
                node: args.common.node_name(),
                event_heartbeat: args.event_heartbeat,
                pod_resources_socket: args.pod_resources_socket.clone(),
                gpu_fault_hold: args.gpu_fault_hold,
                condition_heartbeat: args.condition_heartbeat,
                taint_on_gpu_fault: args.taint_on_gpu_fault,
                pod_cache_wait: args.pod_cache_wait,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(agent::serve(
                scanner,
                args.listen,
                args.interval,
                kube,
                sources,
                oom_counters,
                match args.p2p_probe_interval {
                    Some(every) => Some((probe_options(&args.cuda)?, every)),
                    None => None,
                },
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Preflight(args) => {
            init_logging(LogFormat::Text, args.common.log_level, "error")?;
            preflight(args)
        }
        Command::Probe(args) => {
            init_logging(LogFormat::Text, args.common.log_level, "warn")?;
            probe(args)
        }
        Command::ProbeWorker(args) => {
            let pairs = match args.pairs.as_str() {
                shmlink::probe::ASK => None,
                list => Some(shmlink::probe::parse_pairs(list).map_err(anyhow::Error::msg)?),
            };
            let bytes = usize::try_from(args.bytes).context("--bytes")?;
            Ok(ExitCode::from(shmlink::probe::worker::run(
                args.cuda_lib.as_deref(),
                bytes,
                pairs,
            )))
        }
    }
}

/// How the probe runs from `shmlink probe` and `serve`: this binary as its worker.
fn probe_options(cuda: &shmlink::cli::CudaArgs) -> anyhow::Result<shmlink::probe::ProbeOptions> {
    Ok(shmlink::probe::ProbeOptions {
        cuda_lib: cuda.cuda_lib.clone(),
        bytes: shmlink::units::parse_size("--bytes", &cuda.bytes)?,
        timeout: cuda.probe_timeout,
        init_timeout: std::time::Duration::from_secs(60),
        worker: std::env::current_exe().context("finding this program for the probe's worker")?,
        stop: None,
    })
}

/// `shmlink probe`: every ordered pair, judged with NVML's view of the board.
fn probe(args: shmlink::cli::ProbeArgs) -> anyhow::Result<ExitCode> {
    use shmlink::probe::{self, judge};
    let opts = probe_options(&args.cuda)?;
    let nvml = shmlink::gpu::nvml::NvmlGpus::open(args.common.gpu.nvml_lib.as_deref())
        .map_err(|e| anyhow::anyhow!("NVML did not load ({e}): the probe judges pairs by it"))?;
    let (sample, _) = nvml.sample();
    let only = args.gpus.as_deref();
    let probed = probe::run(&opts, |devices| {
        probe::pairs_among(devices, &sample.gpus, only)
    })
    .map_err(|e| anyhow::anyhow!("the probe could not run: {e}"))?;
    let report = judge::judge(&probed, &sample);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let json = serde_json::json!({
            "pairs": report.pairs,
            "culprits": report.culprits,
            "unmatched_cuda_devices": report.unmatched,
            "seconds": probed.took.as_secs_f64(),
        });
        serde_json::to_writer_pretty(&mut stdout, &json)?;
        writeln!(stdout)?;
    } else {
        write!(
            stdout,
            "{}",
            shmlink::findings::text::probe_table(&report.pairs, &report.culprits, probed.took)
        )?;
    }
    stdout.flush()?;
    Ok(if report.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `shmlink preflight`: bad sizes are a one-line error (exit 2, through `main`).
fn preflight(args: shmlink::cli::PreflightArgs) -> anyhow::Result<ExitCode> {
    use shmlink::preflight::need::NeedSpec;
    use shmlink::preflight::{self, render};
    use shmlink::units::parse_size;
    let need = match (&args.min_shm, args.dataloader_workers, &args.batch_bytes) {
        (Some(min), _, _) => NeedSpec::MinShm(parse_size("--min-shm", min)?),
        (None, Some(workers), Some(batch)) => NeedSpec::Sizing {
            workers,
            prefetch_factor: args.prefetch_factor,
            batch_bytes: parse_size("--batch-bytes", batch)?,
        },
        _ => NeedSpec::Unspecified,
    };
    let roots = preflight::Roots {
        proc_root: args.common.host.proc_root.clone(),
        cgroup_root: args.common.host.cgroup_root.clone(),
        shm_dir: args.shm_dir.clone(),
    };
    let options = preflight::Options {
        need,
        no_gpu: args.common.gpu.no_gpu,
        nvml_lib: args.common.gpu.nvml_lib.clone(),
        rules: PairRules {
            window: args.common.gpu.nvlink_error_window,
            ..PairRules::default()
        },
        host_ipc_ns: args.host_ipc_ns,
        p2p: if args.p2p {
            Some(probe_options(&args.cuda)?)
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

/// `with_xid_thread`: serve waits for XID events; a one-shot check could not see one in time.
fn scanner(common: &CommonArgs, with_xid_thread: bool) -> anyhow::Result<Scanner> {
    let thresholds = Thresholds::new(
        common.thresholds.shm_warn_ratio,
        common.thresholds.shm_critical_ratio,
    )?;
    let host = host_paths(common);
    let gpu = GpuCollector::new(
        common.gpu.no_gpu,
        common.gpu.nvml_lib.as_deref(),
        &host.proc_root,
        with_xid_thread,
        PairRules {
            window: common.gpu.nvlink_error_window,
            ..PairRules::default()
        },
    )
    .with_sys_root(&common.host.sys_root);
    Ok(Scanner::new(&host, common.node_name(), thresholds, gpu)?)
}

fn host_paths(common: &CommonArgs) -> HostPaths {
    HostPaths {
        proc_root: common.host.proc_root.clone(),
        cgroup_root: common.host.cgroup_root.clone(),
    }
}

/// How often a container's /dev/shm is sampled between scans while it is half full or growing.
const PEAK_PERIOD: std::time::Duration = std::time::Duration::from_millis(200);

/// The failure sources as the options name them (`off` turns one off).
fn sources(common: &CommonArgs, args: &FailureSourceArgs) -> Sources {
    let host = host_paths(common);
    Sources {
        pod_log_root: FailureSourceArgs::on(&args.pod_log_root),
        docker_root: FailureSourceArgs::on(&args.docker_root),
        kmsg: FailureSourceArgs::on(&args.kmsg),
        proc_root: host.proc_root.clone(),
        host_mnt: host.host_namespaces().ok().map(|ns| ns.mnt),
        rules: DeathRules {
            oom_shm_share: args.oom_shm_share,
            bus_error_shm_ratio: args.bus_error_shm_ratio,
        },
    }
}

/// `check`: the failures told since `--since`, with what this scan knows, as findings too.
fn add_failures(
    snapshot: &mut Snapshot,
    found: &[Detected],
    pods: Option<&PodIndex>,
    rules: DeathRules,
) {
    let holders = GpuHolders::new();
    let known = Known {
        snapshot: Some(snapshot),
        pods,
        holders: &holders,
        rules,
    };
    let failures =
        SameDeath::default().keep_new(found.iter().filter_map(|d| correlate(d, known)).collect());
    snapshot.findings.extend(failures.iter().map(finding));
    snapshot
        .findings
        .sort_by_key(|f| std::cmp::Reverse(f.severity));
    snapshot.failures = failures;
}

/// This node's Pods for a one-shot `check`: `auto` goes on without them when the API server
/// cannot be had, `on` fails.
fn pods_once(mode: KubeMode, node: &str) -> anyhow::Result<Option<Vec<Pod>>> {
    if mode == KubeMode::Off {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let listed = runtime.block_on(async {
        let Some(client) = shmlink::kube::connect(mode).await? else {
            return Ok(None);
        };
        anyhow::Ok(Some(list_once(client, node).await?))
    });
    match listed {
        Err(e) if mode == KubeMode::Auto => {
            tracing::warn!("listing this node's pods: {e:#}; going on without pod names");
            Ok(None)
        }
        other => other.context("listing this node's pods"),
    }
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

//! `shmlink probe`: copies between every ordered GPU pair, judged with NVML's view of the
//! board; and the hidden `probe-worker` it runs them in.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use shmlink::cli::{LogFormat, ProbeArgs, ProbeWorkerArgs};
use shmlink::probe::{self, assess};

/// `shmlink probe`: every ordered pair, judged with NVML's view of the board.
pub fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.common.log_level, "warn")?;
    let opts = super::probe_options(&args.cuda)?;
    let nvml = shmlink::gpu::nvml::NvmlGpus::open(args.common.gpu.nvml_lib.as_deref())
        .map_err(|e| anyhow::anyhow!("NVML did not load ({e}): the probe judges pairs by it"))?;
    let (sample, _) = nvml.sample();
    let only = args.gpus.as_deref();
    let probed = probe::run(&opts, |devices| {
        probe::pairs_among(devices, &sample.gpus, only)
    })
    .map_err(|e| anyhow::anyhow!("the probe could not run: {e}"))?;
    let report = assess::assess(&probed, &sample);
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
            shmlink::text::probe_table(&report.pairs, &report.culprits, probed.took)
        )?;
    }
    stdout.flush()?;
    Ok(if report.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `shmlink probe-worker`: the process the probe's copies run in (this binary).
pub fn worker(args: ProbeWorkerArgs) -> anyhow::Result<ExitCode> {
    let pairs = match args.pairs.as_str() {
        probe::ASK => None,
        list => Some(probe::parse_pairs(list).map_err(anyhow::Error::msg)?),
    };
    let bytes = usize::try_from(args.bytes).context("--bytes")?;
    Ok(ExitCode::from(probe::worker::run(
        args.cuda_lib.as_deref(),
        bytes,
        pairs,
    )))
}

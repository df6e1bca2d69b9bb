//! `shmlink probe`: copies between every ordered GPU pair, judged with NVML's view of the
//! board; and the hidden `probe-worker` it runs them in.
//!
//! What it is asked is checked against NVML before the worker starts (`probe::input`): a GPU
//! that is not there, one GPU, a copy no GPU has room for are exit 2 with the reason. While it
//! runs, a line per pair goes to stderr (`--progress`; by default when stderr is a terminal),
//! never to stdout, which holds the table or the JSON alone.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use shmlink::cli::{LogFormat, ProbeArgs, ProbeWorkerArgs, When};
use shmlink::gpu::nvml::NvmlGpus;
use shmlink::model::{GpuSample, PairProbe};
use shmlink::probe::assess::{self, CopyFacts};
use shmlink::probe::input::{self, GpuMemory};
use shmlink::probe::{self, render, Event, Progress};

/// `shmlink probe`: every ordered pair, judged with NVML's view of the board.
pub fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.common.log_level, "warn")?;
    let opts = super::probe_options(&args.cuda)?;
    let nvml = NvmlGpus::open(args.common.gpu.nvml_lib.as_deref())
        .map_err(|e| anyhow::anyhow!("NVML did not load ({e}): the probe judges pairs by it"))?;
    let (sample, _) = nvml.sample();
    let mut listed: Vec<u32> = sample.gpus.iter().map(|g| g.index).collect();
    listed.sort_unstable();
    let chosen = input::choose_gpus(&listed, args.gpus.as_deref())?;
    input::fits(opts.bytes, &memory_of(&nvml, &chosen))?;

    let colour_out = wanted(args.color, || colours(&std::io::stdout()));
    let colour_err = wanted(args.color, || colours(&std::io::stderr()));
    let progress = wanted(args.progress, || std::io::stderr().is_terminal());
    let mut tell = |p: &Progress<'_>| {
        if progress {
            say_progress(p, &sample, colour_err);
        }
    };
    let probed = probe::run_with(
        &opts,
        |devices| probe::pairs_among(devices, &sample.gpus, Some(chosen.as_slice())),
        &mut tell,
    )
    .map_err(|e| anyhow::anyhow!("the probe could not run: {e}"))?;
    let report = assess::assess(&probed, &sample);
    if report.pairs.is_empty() {
        anyhow::bail!(
            "no pair to probe: CUDA lists {} device(s) ({}), and fewer than two of them are \
             GPUs {} as NVML lists them",
            probed.devices.len(),
            probed.devices.join(", "),
            chosen
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let pairs: Vec<Row<'_>> = report
            .pairs
            .iter()
            .zip(&report.facts)
            .map(|(verdict, facts)| Row { verdict, facts })
            .collect();
        let json = serde_json::json!({
            "pairs": pairs,
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
            render::table(&report, probed.took, colour_out)
        )?;
    }
    stdout.flush()?;
    Ok(if report.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--json`'s pair: the shared contract's keys, then `peer`, `path`, `compared`.
#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    verdict: &'a PairProbe,
    #[serde(flatten)]
    facts: &'a CopyFacts,
}

/// `--color`/`--progress`: `auto` asks `auto_says`.
fn wanted(when: When, auto_says: impl FnOnce() -> bool) -> bool {
    match when {
        When::Always => true,
        When::Never => false,
        When::Auto => auto_says(),
    }
}

/// anstream's answer for a stream: a terminal that takes colour, and neither NO_COLOR (set,
/// not empty) nor CLICOLOR=0 against it. `--color always` overrides NO_COLOR, as no-color.org
/// has a command line option do.
fn colours<S: anstream::stream::RawStream>(stream: &S) -> bool {
    anstream::AutoStream::choice(stream) != anstream::ColorChoice::Never
}

/// Free and total memory of the chosen GPUs, where NVML reports it.
fn memory_of(nvml: &NvmlGpus, chosen: &[u32]) -> Vec<GpuMemory> {
    nvml.memory()
        .into_iter()
        .filter(|(gpu, _, _)| chosen.contains(gpu))
        .map(|(gpu, free, total)| GpuMemory { gpu, free, total })
        .collect()
}

/// One progress line on stderr; a pair NVML does not list (not probed here) says nothing.
fn say_progress(p: &Progress<'_>, sample: &GpuSample, colour: bool) {
    let index = |c| assess::index_of(p.devices, sample, c);
    let line = match p.event {
        Event::Waiting {
            pair: (a, b),
            copying,
            waited,
            deadline,
        } => match (index(a), index(b)) {
            (Some(from), Some(to)) => render::waiting_line((from, to), copying, waited, deadline),
            _ => return,
        },
        Event::Ended {
            pair,
            outcome,
            took,
        } => match assess::one(p.devices, sample, pair, outcome) {
            Some((verdict, facts)) => {
                render::progress_line((p.done, p.total), &verdict, &facts, took, colour)
            }
            None => return,
        },
    };
    // Progress that cannot be written (a closed stderr) is not worth stopping the probe for.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
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

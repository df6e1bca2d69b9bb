//! How fast the failure watcher gets through container logs: bytes scanned per CPU-second.
//!
//! ```text
//! cargo run --release --example log_bench -- [MiB=256] [--containers 20] [--reps 5]
//!                                            [--failures-per-container 5] [--dir D] [--json]
//! ```
//!
//! Writes a kubelet pod log tree (`<dir>/<ns>_<pod>_<uid>/<container>/0.log`, CRI lines) of
//! MiB in all, spread over the containers, into a temporary directory: training progress
//! (logger lines, tqdm bars, NCCL INFO, JSON metrics, warnings), Python tracebacks (a real
//! PyTorch one), lines that look like failures and are not (`tests/fixtures/logs/
//! lookalikes.log`), now and then a config dump of a few KiB and a 40 KiB line that the runtime
//! split into `P` records, and a known number of real failure lines (every row of
//! `SIGNATURES`, in turn). Lines are 10 ms apart per container (100 lines/s), so serve's rate
//! limit (`MAX_LINES_PER_SEC`, applied here too) drops none.
//!
//! Then, R times, interleaved, each on this thread:
//! - *full*: `LogTailer::since(..)`, one `poll_each` handing on the lines the recogniser's
//!   filter wants (a needle, PyTorch's worker line, a context hint), `Signatures::match_line` on
//!   each as it is read (what `check` does, and `serve` per poll);
//! - *tailer*: the same, keeping no line (`poll_matching(|_| false)`): reading, splitting and
//!   parsing alone;
//! - *signatures*: `match_line` over an in-memory `Vec<String>` of the same lines' texts (the
//!   exact rows, then the fact tier for a line no row matched whose pass found a fact needle);
//! - *exact*: the same with `Signatures::exact_only()`: the rows alone, their needles alone in
//!   the one pass, as before the fact tier (the baseline its cost per line is read against).
//!
//! CPU time by `CLOCK_THREAD_CPUTIME_ID` (user + system: the reads are in it), wall time by
//! `Instant`. The files were just written, so they are read from the page cache, as a node's
//! recent logs are. Throughput is log bytes (the files' bytes, CRI prefixes included) per
//! CPU-second; for *signatures* also the text bytes it actually looked at.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rng::Rng;
use serde_json::{json, Value};
use timing::timed;
use training_log::{write_container, Filler, Written};

#[path = "../common/rng.rs"]
mod rng;
#[path = "../common/timing.rs"]
mod timing;
mod training_log;

use shmlink::failures::detect::Recogniser;
use shmlink::failures::sources::MAX_LINES_PER_SEC;
use shmlink::failures::Signatures;
use shmlink::logs::{LogSettings, LogTailer};
use shmlink::model::SHM_OOM_SHARE;

type Error = Box<dyn std::error::Error>;

struct Args {
    mib: u64,
    containers: usize,
    reps: usize,
    failures_per_container: usize,
    dir: Option<PathBuf>,
    json: bool,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        mib: 256,
        containers: 20,
        reps: 5,
        failures_per_container: 5,
        dir: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--containers" => args.containers = value()?.parse()?,
            "--reps" => args.reps = value()?.parse()?,
            "--failures-per-container" => args.failures_per_container = value()?.parse()?,
            "--dir" => args.dir = Some(value()?.into()),
            "--json" => args.json = true,
            "-h" | "--help" => {
                return Err("usage: log_bench [MiB=256] [--containers 20] [--reps 5] \
                            [--failures-per-container 5] [--dir D] [--json]"
                    .into())
            }
            n if !n.starts_with('-') => args.mib = n.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if args.reps == 0 || args.containers == 0 || args.mib == 0 {
        return Err("MiB, --containers and --reps must be at least 1".into());
    }
    Ok(args)
}

fn main() {
    match parse_args().and_then(|args| run(&args).map(|v| (args.json, v))) {
        Ok((true, v)) => println!("{v}"),
        Ok((false, v)) => print_text(&v),
        Err(e) => {
            eprintln!("log_bench: {e}");
            std::process::exit(2);
        }
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Median, min and max of the seconds, and the throughput of the median CPU time.
fn summary(wall: &[f64], cpu: &[f64], bytes: u64) -> Value {
    let (mw, mc) = (median(wall), median(cpu));
    let min = |s: &[f64]| s.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |s: &[f64]| s.iter().copied().fold(0.0, f64::max);
    json!({
        "wall_s": {"median": mw, "min": min(wall), "max": max(wall), "samples": wall},
        "cpu_s": {"median": mc, "min": min(cpu), "max": max(cpu), "samples": cpu},
        "gb_per_cpu_s": bytes as f64 / mc / 1e9,
        "gb_per_wall_s": bytes as f64 / mw / 1e9,
    })
}

fn run(args: &Args) -> Result<Value, Error> {
    let sigs = Signatures::new();
    let filler = Filler::new(&sigs)?;
    let mut builder = tempfile::Builder::new();
    builder.prefix("shmlink-log-bench-");
    let tmp = match &args.dir {
        Some(d) => builder.tempdir_in(d)?,
        None => builder.tempdir()?,
    };
    let root = tmp.path();
    let now = SystemTime::now();
    // A day back: the lines of a container at 100 lines/s fit before now, whatever MiB.
    let start = now - Duration::from_secs(24 * 3600);
    let since = start - Duration::from_secs(1);

    let gen0 = Instant::now();
    let written = write_tree(args, root, &filler, start)?;
    let gen_s = gen0.elapsed().as_secs_f64();

    let settings = LogSettings {
        pod_log_root: Some(root.to_path_buf()),
        docker_root: None,
        max_lines_per_sec: MAX_LINES_PER_SEC,
    };
    let texts = read_texts(&settings, since, &written)?;
    let passes = Passes::measure(args.reps, &settings, since, &sigs, &texts, written.lines)?;
    let out = results(args, &written, &texts, gen_s, &passes);
    let (found_full, found_sigs, planted) = (passes.found_full, passes.found_sigs, written.planted);
    let found_exact = passes.found_exact;
    if [found_full, found_sigs, found_exact]
        .iter()
        .any(|&f| f as u64 != planted)
    {
        print_text(&out);
        return Err(format!(
            "found {found_full} (signatures alone {found_sigs}, the rows alone {found_exact}) \
             failures, {planted} were planted"
        )
        .into());
    }
    Ok(out)
}

/// The kubelet pod log tree under `root`: `args.containers` logs of `args.mib` MiB in all,
/// their lines from `start` on. What was written, in all.
fn write_tree(
    args: &Args,
    root: &Path,
    filler: &Filler,
    start: SystemTime,
) -> Result<Written, Error> {
    let per_container = args.mib * (1 << 20) / args.containers as u64;
    let mut rng = Rng(0x5eed_1095_2026_0001);
    let mut all = Written {
        bytes: 0,
        lines: 0,
        planted: 0,
    };
    for i in 0..args.containers {
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            rng.next() as u32,
            rng.next() as u16,
            rng.below(0x1000),
            rng.below(0x1000),
            rng.next() & 0xffff_ffff_ffff
        );
        let dir = root.join(format!("ml_llama-ft-worker-{i}_{uid}/trainer"));
        std::fs::create_dir_all(&dir)?;
        let w = write_container(
            &dir.join("0.log"),
            per_container,
            args.failures_per_container,
            filler,
            &mut rng,
            start,
        )?;
        all.bytes += w.bytes;
        all.lines += w.lines;
        all.planted += w.planted;
    }
    Ok(all)
}

/// Untimed: the texts of every line, for the signatures-only pass, and the check that the
/// tailer reads all that was `written`, dropping none.
fn read_texts(
    settings: &LogSettings,
    since: SystemTime,
    written: &Written,
) -> Result<Vec<String>, Error> {
    let (bytes, lines) = (written.bytes, written.lines);
    let mut tailer = LogTailer::since(settings.clone(), since);
    let got = tailer.poll();
    let texts: Vec<String> = got.into_iter().map(|l| l.text).collect();
    let stats = tailer.stats();
    if stats.bytes != bytes {
        return Err(format!("the tailer read {} of {bytes} bytes", stats.bytes).into());
    }
    if texts.len() as u64 != lines || stats.dropped_lines != 0 {
        return Err(format!(
            "the tailer returned {} lines ({} dropped), {lines} were written",
            texts.len(),
            stats.dropped_lines
        )
        .into());
    }
    Ok(texts)
}

/// The wall and CPU seconds of one pass, a sample per repetition.
#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Samples {
    fn push(&mut self, wall: f64, cpu: f64) {
        self.wall.push(wall);
        self.cpu.push(cpu);
    }
}

/// The passes' samples, and the failures the last repetition of each found.
struct Passes {
    full: Samples,
    tailer: Samples,
    signatures: Samples,
    exact: Samples,
    found_full: usize,
    found_sigs: usize,
    found_exact: usize,
}

impl Passes {
    /// The measured loop: `reps` times, interleaved, the full pass, the tailer alone and the
    /// signatures alone, each checked to have seen all the `lines`.
    fn measure(
        reps: usize,
        settings: &LogSettings,
        since: SystemTime,
        sigs: &Signatures,
        texts: &[String],
        lines: u64,
    ) -> Result<Passes, Error> {
        let mut p = Passes {
            full: Samples::default(),
            tailer: Samples::default(),
            signatures: Samples::default(),
            exact: Samples::default(),
            found_full: 0,
            found_sigs: 0,
            found_exact: 0,
        };
        let exact = Signatures::exact_only();
        // The filter serve and check put before the tailer's lines: the signatures' automaton
        // and the looks for PyTorch's worker lines and the context hints.
        let recogniser = Recogniser::new("/nonexistent".into(), None, SHM_OOM_SHARE);
        for _ in 0..reps {
            let ((n, found), wall, cpu) = timed(|| {
                // As serve and check read: only lines holding a needle become LogLines.
                // Each line matched as it is read, as they do: none is kept.
                let mut tailer = LogTailer::since(settings.clone(), since);
                let mut found = 0;
                tailer.poll_each(
                    |t| recogniser.is_candidate(t),
                    |l| found += usize::from(sigs.match_line(&l.text).is_some()),
                );
                (tailer.stats().lines as usize, found)
            });
            check_lines("full", n as u64, lines)?;
            p.found_full = found;
            p.full.push(wall, cpu);

            let (n, wall, cpu) = timed(|| {
                let mut tailer = LogTailer::since(settings.clone(), since);
                let got = tailer.poll_matching(|t| {
                    std::hint::black_box(t);
                    false
                });
                assert!(got.is_empty());
                tailer.stats().lines as usize
            });
            check_lines("tailer", n as u64, lines)?;
            p.tailer.push(wall, cpu);

            let (found, wall, cpu) = timed(|| {
                texts
                    .iter()
                    .filter(|t| sigs.match_line(std::hint::black_box(t)).is_some())
                    .count()
            });
            p.found_sigs = found;
            p.signatures.push(wall, cpu);

            let (found, wall, cpu) = timed(|| {
                texts
                    .iter()
                    .filter(|t| exact.match_line(std::hint::black_box(t)).is_some())
                    .count()
            });
            p.found_exact = found;
            p.exact.push(wall, cpu);
        }
        Ok(p)
    }
}

/// The results as `--json` prints them.
fn results(args: &Args, written: &Written, texts: &[String], gen_s: f64, p: &Passes) -> Value {
    let bytes = written.bytes;
    let text_bytes: u64 = texts.iter().map(|t| t.len() as u64).sum();
    json!({
        "mode": "logs",
        "containers": args.containers,
        "reps": args.reps,
        "bytes": bytes,
        "text_bytes": text_bytes,
        "lines": written.lines,
        "planted": written.planted,
        "found": p.found_full,
        "found_signatures_only": p.found_sigs,
        "generate_s": gen_s,
        "full": summary(&p.full.wall, &p.full.cpu, bytes),
        "tailer": summary(&p.tailer.wall, &p.tailer.cpu, bytes),
        "signatures": summary(&p.signatures.wall, &p.signatures.cpu, bytes),
        "exact": summary(&p.exact.wall, &p.exact.cpu, bytes),
        "found_exact_only": p.found_exact,
        "signatures_text_gb_per_cpu_s": text_bytes as f64 / median(&p.signatures.cpu) / 1e9,
        "signatures_ns_per_line": 1e9 * median(&p.signatures.cpu) / written.lines as f64,
        "exact_ns_per_line": 1e9 * median(&p.exact.cpu) / written.lines as f64,
    })
}

fn check_lines(what: &str, n: u64, lines: u64) -> Result<(), Error> {
    if n != lines {
        return Err(format!("{what}: {n} lines returned, {lines} written").into());
    }
    Ok(())
}

fn print_text(v: &Value) {
    let f = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN);
    println!(
        "{:.1} MiB in {} containers: {} lines ({:.1} MiB of text), written in {:.1} s",
        f("/bytes") / (1 << 20) as f64,
        v["containers"],
        v["lines"],
        f("/text_bytes") / (1 << 20) as f64,
        f("/generate_s"),
    );
    println!(
        "failures planted {}, found {} (signatures alone {})",
        v["planted"], v["found"], v["found_signatures_only"]
    );
    println!(
        "median of {} repetitions (min-max), this thread:",
        v["reps"]
    );
    for part in ["full", "tailer", "signatures", "exact"] {
        println!(
            "  {part:<10} {:>7.1} ms CPU ({:.1}-{:.1}), {:>7.1} ms wall: {:.2} GB/s per CPU-second \
             of log ({:.2} GB/s wall)",
            f(&format!("/{part}/cpu_s/median")) * 1e3,
            f(&format!("/{part}/cpu_s/min")) * 1e3,
            f(&format!("/{part}/cpu_s/max")) * 1e3,
            f(&format!("/{part}/wall_s/median")) * 1e3,
            f(&format!("/{part}/gb_per_cpu_s")),
            f(&format!("/{part}/gb_per_wall_s")),
        );
    }
    println!(
        "  signatures over the text bytes they look at: {:.2} GB/s per CPU-second",
        f("/signatures_text_gb_per_cpu_s")
    );
    println!(
        "  per line: {:.1} ns CPU with the fact tier, {:.1} ns the rows alone ({:.2}x)",
        f("/signatures_ns_per_line"),
        f("/exact_ns_per_line"),
        f("/signatures_ns_per_line") / f("/exact_ns_per_line")
    );
}

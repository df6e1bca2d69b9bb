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
//! - *signatures*: `match_line` over an in-memory `Vec<String>` of the same lines' texts.
//!
//! CPU time by `CLOCK_THREAD_CPUTIME_ID` (user + system: the reads are in it), wall time by
//! `Instant`. The files were just written, so they are read from the page cache, as a node's
//! recent logs are. Throughput is log bytes (the files' bytes, CRI prefixes included) per
//! CPU-second; for *signatures* also the text bytes it actually looked at.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use timing::timed;

#[path = "../common/timing.rs"]
mod timing;

mod log_gen;
use log_gen::{write_pods, Filler, Written};

use shmlink::failures::detect::{Recogniser, SHM_OOM_SHARE};
use shmlink::failures::watch::MAX_LINES_PER_SEC;
use shmlink::failures::Signatures;
use shmlink::logs::{LogSettings, LogTailer};

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
    let Written {
        bytes,
        lines,
        planted,
    } = write_pods(root, args, &filler, start)?;
    let gen_s = gen0.elapsed().as_secs_f64();

    let settings = LogSettings {
        pod_log_root: Some(root.to_path_buf()),
        docker_root: None,
        max_lines_per_sec: MAX_LINES_PER_SEC,
    };
    let texts = read_back(&settings, since, bytes, lines)?;
    let text_bytes: u64 = texts.iter().map(|t| t.len() as u64).sum();
    let t = time_passes(args.reps, &settings, since, &sigs, &texts, lines)?;
    let (found_full, found_sigs) = (t.found_full, t.found_sigs);
    let found_ok = found_full as u64 == planted && found_sigs as u64 == planted;
    let out = json!({
        "mode": "logs",
        "containers": args.containers,
        "reps": args.reps,
        "bytes": bytes,
        "text_bytes": text_bytes,
        "lines": lines,
        "planted": planted,
        "found": found_full,
        "found_signatures_only": found_sigs,
        "generate_s": gen_s,
        "full": summary(&t.full_wall, &t.full_cpu, bytes),
        "tailer": summary(&t.tail_wall, &t.tail_cpu, bytes),
        "signatures": summary(&t.sig_wall, &t.sig_cpu, bytes),
        "signatures_text_gb_per_cpu_s": text_bytes as f64 / median(&t.sig_cpu) / 1e9,
    });
    if !found_ok {
        print_text(&out);
        return Err(format!(
            "found {found_full} (signatures alone {found_sigs}) failures, {planted} were planted"
        )
        .into());
    }
    Ok(out)
}

/// Untimed: every line's text (for the signatures-only pass), checked to be all that was
/// written.
fn read_back(
    settings: &LogSettings,
    since: SystemTime,
    bytes: u64,
    lines: u64,
) -> Result<Vec<String>, Error> {
    let mut tailer = LogTailer::since(settings.clone(), since);
    let texts: Vec<String> = tailer.poll().into_iter().map(|l| l.text).collect();
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

/// The wall and CPU seconds of each rep of each pass, and what the last rep found.
struct Passes {
    full_wall: Vec<f64>,
    full_cpu: Vec<f64>,
    tail_wall: Vec<f64>,
    tail_cpu: Vec<f64>,
    sig_wall: Vec<f64>,
    sig_cpu: Vec<f64>,
    found_full: usize,
    found_sigs: usize,
}

/// The timed passes, `reps` times each: the full pass as serve and check read, the tailer
/// alone, the signatures alone over the texts.
fn time_passes(
    reps: usize,
    settings: &LogSettings,
    since: SystemTime,
    sigs: &Signatures,
    texts: &[String],
    lines: u64,
) -> Result<Passes, Error> {
    let mut t = Passes {
        full_wall: Vec::new(),
        full_cpu: Vec::new(),
        tail_wall: Vec::new(),
        tail_cpu: Vec::new(),
        sig_wall: Vec::new(),
        sig_cpu: Vec::new(),
        found_full: 0,
        found_sigs: 0,
    };
    // The filter serve and check put before the tailer's lines: the signatures' automaton and
    // the looks for PyTorch's worker lines and the context hints.
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
        t.found_full = found;
        t.full_wall.push(wall);
        t.full_cpu.push(cpu);

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
        t.tail_wall.push(wall);
        t.tail_cpu.push(cpu);

        let (found, wall, cpu) = timed(|| {
            texts
                .iter()
                .filter(|t| sigs.match_line(std::hint::black_box(t)).is_some())
                .count()
        });
        t.found_sigs = found;
        t.sig_wall.push(wall);
        t.sig_cpu.push(cpu);
    }
    Ok(t)
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
    for part in ["full", "tailer", "signatures"] {
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
}

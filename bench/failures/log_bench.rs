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

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use timing::timed;

#[path = "../common/timing.rs"]
mod timing;

use shmlink::failures::detect::{Recogniser, SHM_OOM_SHARE};
use shmlink::failures::watch::MAX_LINES_PER_SEC;
use shmlink::failures::{Signatures, SIGNATURES};
use shmlink::logs::{LogSettings, LogTailer};

type Error = Box<dyn std::error::Error>;

/// Lines that look like failures and are not, verbatim from the signature tests' fixture.
const LOOKALIKES: &str = include_str!("../../tests/fixtures/logs/lookalikes.log");
/// What PyTorch 2.15 printed when its DataLoader outgrew /dev/shm: its traceback lines are the
/// filler's tracebacks (the failure line itself is taken out and planted separately).
const TORCH_TRACE: &str =
    include_str!("../../tests/fixtures/logs/torch-2.15.0-dataloader-64mib-shm.txt");

const LINE_STEP: Duration = Duration::from_millis(10);

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

/// xorshift64*: reproducible filler, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The filler's line sources, none of which matches a signature (checked).
struct Filler {
    lookalikes: Vec<&'static str>,
    trace: Vec<&'static str>,
}

impl Filler {
    fn new(sigs: &Signatures) -> Result<Filler, Error> {
        let lookalikes: Vec<&str> = LOOKALIKES
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .collect();
        let trace: Vec<&str> = TORCH_TRACE
            .lines()
            .filter(|l| sigs.match_line(l).is_none())
            .collect();
        if let Some(l) = lookalikes.iter().find(|l| sigs.match_line(l).is_some()) {
            return Err(format!("a lookalike matches a signature: {l}").into());
        }
        Ok(Filler { lookalikes, trace })
    }

    /// One logical line (or a block of them: a traceback) of a training job's output.
    fn block(&self, rng: &mut Rng, step: u64, out: &mut Vec<String>) {
        let r = rng.below(1000);
        match r {
            0..=399 => out.push(training_step(rng, step)),
            400..=599 => out.push(progress_bar(rng, step)),
            600..=749 => out.push(nccl_channel(rng)),
            750..=869 => out.push(metrics_json(rng, step)),
            870..=939 => out.push(
                "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:617: \
                 UserWarning: This DataLoader will create 16 worker processes in total. Our \
                 suggested max number of worker in current system is 8, which is smaller than \
                 what this DataLoader is going to create."
                    .to_string(),
            ),
            940..=974 => out.push(rng.pick(&self.lookalikes).to_string()),
            975..=994 => {
                // A traceback: a contiguous run of the real one.
                let len = 8 + rng.below(16) as usize;
                let start = rng.below((self.trace.len() - len.min(self.trace.len())) as u64);
                let start = start as usize;
                out.extend(
                    self.trace[start..(start + len).min(self.trace.len())]
                        .iter()
                        .map(|l| l.to_string()),
                );
            }
            _ => out.push(config_dump(rng)),
        }
    }
}

/// A training step's log line, as a rank prints it.
fn training_step(rng: &mut Rng, step: u64) -> String {
    format!(
        "[rank{}]:[2026-11-23 10:{:02}:{:02},{:03}] INFO trainer.py:412 epoch={} \
         step={}/50000 loss={:.4} grad_norm={:.3} lr={:.2e} tokens/s={} mem={:.1}GiB",
        rng.below(8),
        rng.below(60),
        rng.below(60),
        rng.below(1000),
        step / 5000,
        step,
        1.5 + rng.below(20000) as f64 / 10000.0,
        0.2 + rng.below(2000) as f64 / 1000.0,
        3e-4 * (1.0 - step as f64 / 60000.0),
        40_000 + rng.below(20_000),
        20.0 + rng.below(150) as f64 / 10.0,
    )
}

/// A progress bar's line (PyTorch Lightning's).
fn progress_bar(rng: &mut Rng, step: u64) -> String {
    let pct = rng.below(101);
    let filled = (pct / 10) as usize;
    format!(
        "Epoch {}: {:3}%|{}{}| {}/5000 [{:02}:{:02}<{:02}:{:02}, {}.{:02}it/s, \
         loss={:.3}, v_num=7]",
        step / 5000,
        pct,
        "█".repeat(filled),
        " ".repeat(10 - filled),
        pct * 50,
        rng.below(60),
        rng.below(60),
        rng.below(60),
        rng.below(60),
        1 + rng.below(4),
        rng.below(100),
        1.5 + rng.below(2000) as f64 / 1000.0,
    )
}

/// NCCL's channel setup line.
fn nccl_channel(rng: &mut Rng) -> String {
    format!(
        "gpu-node-7:{}:{} [{}] NCCL INFO Channel {:02}/24 : {}[{}] -> {}[{}] via \
         P2P/CUMEM/read",
        1000 + rng.below(9000),
        1000 + rng.below(9000),
        rng.below(8),
        rng.below(24),
        rng.below(8),
        rng.below(8),
        rng.below(8),
        rng.below(8),
    )
}

/// A metrics line in JSON.
fn metrics_json(rng: &mut Rng, step: u64) -> String {
    format!(
        "{{\"step\": {step}, \"loss\": {:.4}, \"lr\": {:.6}, \"throughput\": {:.1}, \"time\": \
         1763892902.{:03}}}",
        1.5 + rng.below(20000) as f64 / 10000.0,
        3e-4,
        400.0 + rng.below(2000) as f64 / 10.0,
        rng.below(1000),
    )
}

/// A config dump of a few KiB on one line.
fn config_dump(rng: &mut Rng) -> String {
    let n = 40 + rng.below(80);
    let mut s = String::from("config: {");
    for i in 0..n {
        s.push_str(&format!(
            "\"model.layers.{i}.attention.dropout\": {:.3}, ",
            rng.below(1000) as f64 / 1000.0
        ));
    }
    s.push('}');
    s
}

/// `2026-11-23T10:15:02.123456789Z`, the prefix cached per second.
struct Clock {
    second: u64,
    prefix: String,
}

impl Clock {
    fn format(&mut self, at: SystemTime) -> String {
        let d = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        if d.as_secs() != self.second || self.prefix.is_empty() {
            self.second = d.as_secs();
            let ts = k8s_openapi::jiff::Timestamp::from_second(d.as_secs() as i64)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            self.prefix = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
        }
        format!("{}.{:09}Z", self.prefix, d.subsec_nanos())
    }
}

/// What was written.
struct Written {
    bytes: u64,
    /// Logical lines (a line split into `P` records counts once).
    lines: u64,
    planted: u64,
}

/// One container's `0.log` of about `target` bytes.
fn write_container(
    path: &Path,
    target: u64,
    failures: usize,
    filler: &Filler,
    rng: &mut Rng,
    start: SystemTime,
) -> Result<Written, Error> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut clock = Clock {
        second: 0,
        prefix: String::new(),
    };
    let mut w = Written {
        bytes: 0,
        lines: 0,
        planted: 0,
    };
    // The failures go at random byte offsets of the file, in order.
    let mut plant_at: Vec<u64> = (0..failures).map(|_| rng.below(target)).collect();
    plant_at.sort_unstable();
    let mut plant_at = plant_at.into_iter().peekable();
    let mut at = start;
    let mut step = 0;
    let mut block = Vec::new();
    while w.bytes < target {
        block.clear();
        if plant_at.next_if(|&b| b <= w.bytes).is_some() {
            let sig = &SIGNATURES[(rng.below(SIGNATURES.len() as u64)) as usize];
            block.push(sig.fixture.to_string());
            w.planted += 1;
        } else if rng.below(20_000) == 0 {
            // A 40 KiB line: containerd writes it as 16 KiB `P` records and an `F`.
            let long: String = "0123456789abcdef".repeat(40 * 64);
            let time = clock.format(at);
            let chunks: Vec<&str> = long
                .as_bytes()
                .chunks(16 * 1024)
                .map(|c| std::str::from_utf8(c).unwrap_or(""))
                .collect();
            for (i, chunk) in chunks.iter().enumerate() {
                let tag = if i + 1 == chunks.len() { 'F' } else { 'P' };
                let rec = format!("{time} stdout {tag} {chunk}\n");
                out.write_all(rec.as_bytes())?;
                w.bytes += rec.len() as u64;
            }
            w.lines += 1;
            at += LINE_STEP;
            continue;
        } else {
            step += 1;
            filler.block(rng, step, &mut block);
        }
        for text in &block {
            let stream = if text.starts_with('[') || text.starts_with('{') {
                "stdout"
            } else {
                "stderr"
            };
            let rec = format!("{} {stream} F {text}\n", clock.format(at));
            out.write_all(rec.as_bytes())?;
            w.bytes += rec.len() as u64;
            w.lines += 1;
            at += LINE_STEP;
        }
    }
    // Planted lines whose offset fell past the end go last.
    for _ in plant_at {
        let sig = &SIGNATURES[(rng.below(SIGNATURES.len() as u64)) as usize];
        let rec = format!("{} stderr F {}\n", clock.format(at), sig.fixture);
        out.write_all(rec.as_bytes())?;
        w.bytes += rec.len() as u64;
        w.lines += 1;
        w.planted += 1;
        at += LINE_STEP;
    }
    out.flush()?;
    Ok(w)
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
    let per_container = args.mib * (1 << 20) / args.containers as u64;
    let mut rng = Rng(0x5eed_1095_2026_0001);

    let gen0 = Instant::now();
    let (mut bytes, mut lines, mut planted) = (0, 0, 0);
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
            &filler,
            &mut rng,
            start,
        )?;
        bytes += w.bytes;
        lines += w.lines;
        planted += w.planted;
    }
    let gen_s = gen0.elapsed().as_secs_f64();

    let settings = LogSettings {
        pod_log_root: Some(root.to_path_buf()),
        docker_root: None,
        max_lines_per_sec: MAX_LINES_PER_SEC,
    };
    // Untimed: the texts for the signatures-only pass, and the checks.
    let (texts, stats) = {
        let mut tailer = LogTailer::since(settings.clone(), since);
        let got = tailer.poll();
        let texts: Vec<String> = got.into_iter().map(|l| l.text).collect();
        (texts, tailer.stats())
    };
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
    let text_bytes: u64 = texts.iter().map(|t| t.len() as u64).sum();

    let (mut full_wall, mut full_cpu) = (Vec::new(), Vec::new());
    let (mut tail_wall, mut tail_cpu) = (Vec::new(), Vec::new());
    let (mut sig_wall, mut sig_cpu) = (Vec::new(), Vec::new());
    let mut found_full = 0;
    let mut found_sigs = 0;
    // The filter serve and check put before the tailer's lines: the signatures' automaton and
    // the looks for PyTorch's worker lines and the context hints.
    let recogniser = Recogniser::new("/nonexistent".into(), None, SHM_OOM_SHARE);
    for _ in 0..args.reps {
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
        found_full = found;
        full_wall.push(wall);
        full_cpu.push(cpu);

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
        tail_wall.push(wall);
        tail_cpu.push(cpu);

        let (found, wall, cpu) = timed(|| {
            texts
                .iter()
                .filter(|t| sigs.match_line(std::hint::black_box(t)).is_some())
                .count()
        });
        found_sigs = found;
        sig_wall.push(wall);
        sig_cpu.push(cpu);
    }
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
        "full": summary(&full_wall, &full_cpu, bytes),
        "tailer": summary(&tail_wall, &tail_cpu, bytes),
        "signatures": summary(&sig_wall, &sig_cpu, bytes),
        "signatures_text_gb_per_cpu_s": text_bytes as f64 / median(&sig_cpu) / 1e9,
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

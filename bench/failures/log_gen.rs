//! log_bench's log tree: a kubelet pod log tree of training output with a known number of real
//! failure lines planted, written reproducibly (a seeded xorshift).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

use shmlink::failures::{Signatures, SIGNATURES};

use super::{Args, Error};

/// Lines that look like failures and are not, verbatim from the signature tests' fixture.
const LOOKALIKES: &str = include_str!("../../tests/fixtures/logs/lookalikes.log");
/// What PyTorch 2.15 printed when its DataLoader outgrew /dev/shm: its traceback lines are the
/// filler's tracebacks (the failure line itself is taken out and planted separately).
const TORCH_TRACE: &str =
    include_str!("../../tests/fixtures/logs/torch-2.15.0-dataloader-64mib-shm.txt");

const LINE_STEP: Duration = Duration::from_millis(10);

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
pub(crate) struct Filler {
    lookalikes: Vec<&'static str>,
    trace: Vec<&'static str>,
}

impl Filler {
    pub(crate) fn new(sigs: &Signatures) -> Result<Filler, Error> {
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
pub(crate) struct Written {
    pub(crate) bytes: u64,
    /// Logical lines (a line split into `P` records counts once).
    pub(crate) lines: u64,
    pub(crate) planted: u64,
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

/// Each container's log under `root` as kubelet lays them out, `args.mib` MiB in all.
pub(crate) fn write_pods(
    root: &Path,
    args: &Args,
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

//! The pair probe: for every ordered pair of GPUs, through the CUDA driver API, whether peer
//! access can be enabled, an 8-byte copy, then a sized copy of a known pattern, read back and
//! compared, and its bandwidth; judged against what NVML says the pair's path carries
//! (`assess.rs`, pure).
//!
//! The copies run in a worker process (`worker.rs`, the binary run as `probe-worker`): a hung
//! peer copy cannot be cancelled and a broken driver path can crash the process. The parent
//! gives each pair a deadline; a pair that outlives it, or takes the worker down, is that
//! pair's answer ("did not finish within 10 s", "crashed the probe"), and a new worker goes on
//! with the pairs left. CUDA numbers devices its own way: the worker reports each device's PCI
//! bus id and the parent maps them to NVML's indices.
//!
//! `shmlink probe` and `preflight` run it once; `serve` on a schedule (`schedule.rs`: the
//! thread, and the store its verdicts wait in for the scans).

pub mod assess;
pub mod cuda;
pub mod schedule;
pub mod worker;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The hidden subcommand the parent runs the worker as.
pub const WORKER_COMMAND: &str = "probe-worker";

/// One line from the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// PCI bus ids in CUDA's order: the first line.
    Devices(Vec<String>),
    Start {
        from: i32,
        to: i32,
    },
    Pair(PairLine),
    /// The worker could not start (no libcuda, a missing symbol, cuInit failed).
    Error(String),
}

/// What one ordered pair's copies did, by CUDA ordinal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairLine {
    pub from: i32,
    pub to: i32,
    pub peer_access: bool,
    pub peer_error: Option<String>,
    pub copy_error: Option<String>,
    pub copy_code: Option<i32>,
    pub bad_offset: Option<u64>,
    pub seconds: Option<f64>,
    pub bytes: u64,
}

/// How one ordered pair ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ran(PairLine),
    /// No answer within the deadline: the worker was killed.
    Hung(Duration),
    /// The worker died during the pair (how, as its exit status says).
    Crashed(String),
}

/// What the probe is asked.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// libcuda to load; None: the system's `libcuda.so.1`.
    pub cuda_lib: Option<PathBuf>,
    pub bytes: u64,
    /// Per pair, at least; a large copy gets more (`cuda::copy_deadline`).
    pub timeout: Duration,
    /// How long the driver may take to start (cuInit on a big board takes seconds).
    pub init_timeout: Duration,
    /// The program to run as the worker (this binary).
    pub worker: PathBuf,
    /// Set when the agent stops: the worker is ended and the run given up.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl ProbeOptions {
    fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The devices CUDA sees and each ordered pair's outcome, by CUDA ordinal.
#[derive(Debug, Clone, PartialEq)]
pub struct Probed {
    pub devices: Vec<String>,
    pub outcomes: Vec<((i32, i32), Outcome)>,
    pub took: Duration,
}

/// Runs the probe over the ordered pairs `choose` picks from CUDA's device list.
pub fn run(
    opts: &ProbeOptions,
    choose: impl FnOnce(&[String]) -> Vec<(i32, i32)>,
) -> Result<Probed, String> {
    let started = Instant::now();
    // The first worker says its devices, then is told the pairs: the driver starts once unless
    // a pair hangs or crashes it.
    let mut first = Worker::spawn(opts, None)?;
    let devices = first.devices(opts.init_timeout)?;
    let mut left = choose(&devices);
    first.tell(&left)?;
    let mut next = Some(first);
    let mut outcomes = Vec::new();
    while !left.is_empty() {
        let mut w = match next.take() {
            Some(w) => w,
            None => {
                let mut w = Worker::spawn(opts, Some(&left))?;
                w.devices(opts.init_timeout)?;
                w
            }
        };
        follow(&mut w, opts, &mut left, &mut outcomes)?;
    }
    Ok(Probed {
        devices,
        outcomes,
        took: started.elapsed(),
    })
}

/// Follows one worker until it ends, hangs or crashes: each pair it finished, hung on or
/// crashed in goes from `left` to `outcomes`.
fn follow(
    w: &mut Worker,
    opts: &ProbeOptions,
    left: &mut Vec<(i32, i32)>,
    outcomes: &mut Vec<((i32, i32), Outcome)>,
) -> Result<(), String> {
    let deadline_for = cuda::copy_deadline(opts.bytes, opts.timeout);
    let mut current: Option<(i32, i32)> = None;
    let mut deadline = Instant::now() + deadline_for;
    loop {
        if opts.stopped() {
            w.kill();
            return Err("stopped".into());
        }
        // Short waits, so that a stop is seen; the deadline is the pair's.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wait = remaining.min(Duration::from_millis(100));
        match w.lines.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Timeout) if !remaining.is_zero() => continue,
            Ok(Line::Start { from, to }) => {
                current = Some((from, to));
                deadline = Instant::now() + deadline_for;
            }
            Ok(Line::Pair(line)) => {
                let key = (line.from, line.to);
                left.retain(|p| *p != key);
                outcomes.push((key, Outcome::Ran(line)));
                current = None;
                deadline = Instant::now() + deadline_for;
            }
            Ok(Line::Devices(_)) => {}
            Ok(Line::Error(e)) => return Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                w.kill();
                let Some(key) = current else {
                    return Err(format!(
                        "the probe's worker went quiet between pairs for {deadline_for:?}"
                    ));
                };
                left.retain(|p| *p != key);
                outcomes.push((key, Outcome::Hung(deadline_for)));
                return Ok(());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let how = w.exit();
                match current {
                    Some(key) => {
                        left.retain(|p| *p != key);
                        outcomes.push((key, Outcome::Crashed(how)));
                    }
                    None if left.is_empty() => {}
                    None => return Err(format!("the probe's worker ended early ({how})")),
                }
                return Ok(());
            }
        }
    }
}

/// A running worker and the lines it has said.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<Line>,
}

impl Worker {
    /// Runs `pairs`; None: the pairs are told after the devices ([`Worker::tell`]).
    fn spawn(opts: &ProbeOptions, pairs: Option<&[(i32, i32)]>) -> Result<Worker, String> {
        let mut cmd = Command::new(&opts.worker);
        cmd.arg(WORKER_COMMAND)
            .arg("--bytes")
            .arg(opts.bytes.to_string())
            .arg("--pairs")
            .arg(pairs.map_or_else(|| ASK.to_string(), pairs_arg))
            .stdin(if pairs.is_some() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(lib) = &opts.cuda_lib {
            cmd.arg("--cuda-lib").arg(lib);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the probe's worker {}: {e}", opts.worker.display()))?;
        let stdout = child.stdout.take().ok_or("the worker has no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line that does not parse is the worker's garbage, not an answer.
                if let Ok(l) = serde_json::from_str::<Line>(&line) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Worker { child, lines })
    }

    /// Its first line: the devices, or why it could not start.
    fn devices(&mut self, within: Duration) -> Result<Vec<String>, String> {
        match self.lines.recv_timeout(within) {
            Ok(Line::Devices(d)) => Ok(d),
            Ok(Line::Error(e)) => Err(e),
            Ok(other) => Err(format!("the probe's worker began with {other:?}")),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.kill();
                Err(format!("the CUDA driver did not start within {within:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!(
                "the probe's worker ended at start ({})",
                self.exit()
            )),
        }
    }

    /// Tells a worker spawned without pairs which to run (one line on its stdin, then EOF).
    fn tell(&mut self, pairs: &[(i32, i32)]) -> Result<(), String> {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().ok_or("the worker has no stdin")?;
        writeln!(stdin, "{}", pairs_arg(pairs))
            .map_err(|e| format!("telling the probe's worker its pairs: {e}"))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to end; how it ended, for a person.
    fn exit(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.child.wait() {
            Ok(s) => match (s.code(), s.signal()) {
                (_, Some(sig)) => format!("killed by signal {sig}"),
                (Some(c), _) => format!("exit status {c}"),
                _ => "ended".into(),
            },
            Err(e) => format!("could not be waited for: {e}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// `--pairs` for a worker that reads its pairs from stdin after saying its devices.
pub const ASK: &str = "ask";

/// `none`, or `a:b,c:d`.
fn pairs_arg(pairs: &[(i32, i32)]) -> String {
    if pairs.is_empty() {
        return "none".into();
    }
    let each: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}:{b}")).collect();
    each.join(",")
}

/// `--pairs`: `none`, or `a:b,c:d`.
pub fn parse_pairs(text: &str) -> Result<Vec<(i32, i32)>, String> {
    if text == "none" {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|p| {
            let (a, b) = p.split_once(':').ok_or_else(|| format!("bad pair {p:?}"))?;
            Ok((
                a.parse().map_err(|_| format!("bad pair {p:?}"))?,
                b.parse().map_err(|_| format!("bad pair {p:?}"))?,
            ))
        })
        .collect()
}

/// Every ordered pair of CUDA devices whose NVML index (matched by PCI bus id) is in `only`
/// (all when None); devices NVML does not list are left out.
pub fn pairs_among(
    devices: &[String],
    gpus: &[crate::model::GpuReading],
    only: Option<&[u32]>,
) -> Vec<(i32, i32)> {
    let chosen: Vec<i32> = devices
        .iter()
        .enumerate()
        .filter_map(|(ordinal, bus)| {
            let g = gpus
                .iter()
                .find(|g| crate::gpu::pci::same_pci_device(&g.pci_bus_id, bus))?;
            only.is_none_or(|o| o.contains(&g.index))
                .then_some(ordinal as i32)
        })
        .collect();
    let mut out = Vec::new();
    for &a in &chosen {
        for &b in &chosen {
            if a != b {
                out.push((a, b));
            }
        }
    }
    out
}

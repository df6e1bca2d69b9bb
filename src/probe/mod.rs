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
//! thread, and the store its verdicts wait in for the scans). [`run_with`] tells its caller
//! each pair as it ends, and a pair still waiting on its deadline ([`Progress`]): `shmlink
//! probe` prints them as they come.

pub mod assess;
pub mod cuda;
pub mod input;
mod process;
pub mod render;
pub mod schedule;
pub mod worker;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use process::Worker;

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
    /// What CUDA answered to peer access, before the copies: a pair that then hangs or
    /// crashes is still told with it.
    Peer(PeerLine),
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

/// Peer access from one device to another (CUDA ordinals): granted, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerLine {
    pub from: i32,
    pub to: i32,
    pub peer_access: bool,
    pub peer_error: Option<String>,
}

/// How one ordered pair ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ran(PairLine),
    /// No answer within the deadline: the worker was killed. `peer`: what peer access had
    /// answered before, if the worker got that far.
    Hung {
        after: Duration,
        peer: Option<PeerLine>,
    },
    /// The worker died during the pair (how, as its exit status says).
    Crashed {
        how: String,
        peer: Option<PeerLine>,
    },
}

/// What a run tells its caller as it goes, by CUDA ordinal (`devices` maps them).
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    pub devices: &'a [String],
    /// Pairs ended so far (this one included), of `total`.
    pub done: usize,
    pub total: usize,
    pub event: Event<'a>,
}

#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A pair has not answered for `waited`; it is ended at `deadline`. `copying`: peer access
    /// was answered and the copies are under way (else the contexts or peer access are).
    Waiting {
        pair: (i32, i32),
        copying: bool,
        waited: Duration,
        deadline: Duration,
    },
    /// A pair ended, `took` after it started.
    Ended {
        pair: (i32, i32),
        outcome: &'a Outcome,
        took: Duration,
    },
}

/// When a pair that has not answered is first said to be waiting: at 5 s, or half its
/// deadline when that is shorter; then every 10 s.
fn first_note(deadline: Duration) -> Duration {
    (deadline / 2).min(Duration::from_secs(5))
}
const NOTE_EVERY: Duration = Duration::from_secs(10);

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
    run_with(opts, choose, &mut |_| {})
}

/// [`run`], telling `tell` each pair as it ends and each pair still waiting on its deadline.
pub fn run_with(
    opts: &ProbeOptions,
    choose: impl FnOnce(&[String]) -> Vec<(i32, i32)>,
    tell: &mut dyn FnMut(&Progress<'_>),
) -> Result<Probed, String> {
    let started = Instant::now();
    // The first worker says its devices, then is told the pairs: the driver starts once unless
    // a pair hangs or crashes it.
    let mut first = Worker::spawn(opts, None)?;
    let devices = first.devices(opts.init_timeout)?;
    let left = choose(&devices);
    first.tell(&left)?;
    let mut r = Following {
        opts,
        devices: &devices,
        total: left.len(),
        left,
        outcomes: Vec::new(),
        tell,
    };
    let mut next = Some(first);
    while !r.left.is_empty() {
        let mut w = match next.take() {
            Some(w) => w,
            None => {
                let mut w = Worker::spawn(opts, Some(&r.left))?;
                w.devices(opts.init_timeout)?;
                w
            }
        };
        r.follow(&mut w)?;
    }
    let outcomes = r.outcomes;
    Ok(Probed {
        devices,
        outcomes,
        took: started.elapsed(),
    })
}

/// A run's state while its workers are followed.
struct Following<'a, 'b> {
    opts: &'a ProbeOptions,
    devices: &'a [String],
    total: usize,
    left: Vec<(i32, i32)>,
    outcomes: Vec<((i32, i32), Outcome)>,
    tell: &'b mut dyn FnMut(&Progress<'_>),
}

/// The pair a worker is on: since when, what peer access answered, when it is next noted.
struct Current {
    pair: (i32, i32),
    since: Instant,
    peer: Option<PeerLine>,
    note_at: Instant,
}

impl Following<'_, '_> {
    /// Follows one worker until it ends, hangs or crashes: each pair it finished, hung on or
    /// crashed in goes from `left` to `outcomes`, and is told.
    fn follow(&mut self, w: &mut Worker) -> Result<(), String> {
        let deadline_for = cuda::copy_deadline(self.opts.bytes, self.opts.timeout);
        let mut current: Option<Current> = None;
        let mut deadline = Instant::now() + deadline_for;
        loop {
            if self.opts.stopped() {
                w.kill();
                return Err("stopped".into());
            }
            // Short waits, so that a stop is seen and a waiting pair noted; the deadline is
            // the pair's.
            let remaining = deadline.saturating_duration_since(Instant::now());
            let wait = remaining.min(Duration::from_millis(100));
            match w.lines.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) if !remaining.is_zero() => {
                    if let Some(c) = current.as_mut() {
                        self.note_waiting(c, deadline_for);
                    }
                }
                Ok(Line::Start { from, to }) => {
                    let now = Instant::now();
                    current = Some(Current {
                        pair: (from, to),
                        since: now,
                        peer: None,
                        note_at: now + first_note(deadline_for),
                    });
                    deadline = now + deadline_for;
                }
                Ok(Line::Peer(p)) => {
                    if let Some(c) = current.as_mut().filter(|c| c.pair == (p.from, p.to)) {
                        c.peer = Some(p);
                    }
                }
                Ok(Line::Pair(line)) => {
                    let since = current.take().map_or_else(Instant::now, |c| c.since);
                    self.ended((line.from, line.to), Outcome::Ran(line), since);
                    deadline = Instant::now() + deadline_for;
                }
                Ok(Line::Devices(_)) => {}
                Ok(Line::Error(e)) => return Err(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    w.kill();
                    let Some(c) = current else {
                        return Err(format!(
                            "the probe's worker went quiet between pairs for {deadline_for:?}"
                        ));
                    };
                    let hung = Outcome::Hung {
                        after: deadline_for,
                        peer: c.peer,
                    };
                    self.ended(c.pair, hung, c.since);
                    return Ok(());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let how = w.exit();
                    match current {
                        Some(c) => {
                            let crashed = Outcome::Crashed { how, peer: c.peer };
                            self.ended(c.pair, crashed, c.since);
                        }
                        None if self.left.is_empty() => {}
                        None => return Err(format!("the probe's worker ended early ({how})")),
                    }
                    return Ok(());
                }
            }
        }
    }

    fn ended(&mut self, pair: (i32, i32), outcome: Outcome, since: Instant) {
        self.left.retain(|p| *p != pair);
        self.outcomes.push((pair, outcome));
        let (_, outcome) = self.outcomes.last().expect("just pushed");
        (self.tell)(&Progress {
            devices: self.devices,
            done: self.outcomes.len(),
            total: self.total,
            event: Event::Ended {
                pair,
                outcome,
                took: since.elapsed(),
            },
        });
    }

    fn note_waiting(&mut self, c: &mut Current, deadline: Duration) {
        let now = Instant::now();
        if now < c.note_at {
            return;
        }
        c.note_at = now + NOTE_EVERY;
        (self.tell)(&Progress {
            devices: self.devices,
            done: self.outcomes.len(),
            total: self.total,
            event: Event::Waiting {
                pair: c.pair,
                copying: c.peer.is_some(),
                waited: now - c.since,
                deadline,
            },
        });
    }
}

/// `--pairs` for a worker that reads its pairs from stdin after saying its devices.
pub const ASK: &str = "ask";

/// `none`, or `a:b,c:d`.
pub(crate) fn pairs_arg(pairs: &[(i32, i32)]) -> String {
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

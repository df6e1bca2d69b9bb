//! Chaos (issue 38): real runc containers die at random moments, each in a Pod of its own (a
//! DataLoader's bus-error line in its CRI log, a kernel OOM kill of its main process, a real
//! SIGBUS), while `serve --state-dir` is killed with SIGKILL at random moments and started again
//! on the same store; then the same with SIGTERM rollouts. The test plays kubelet (each death in
//! the Pod's status, as kubelet writes it) and counts, on the in-process API server, the Events
//! each death's Pod got: told once, lost (none), doubled (more than one occurrence); then the
//! same in `shmlink history --json`.
//!
//! Some kills aim at the store being written: right after the store's WAL file changes, a few ms
//! after a death is there to be read, or while serve is still starting (resuming). The schedule
//! comes from a seed; `SHMLINK_CHAOS_SEED`, `_DEATHS`, `_KILLS`, `_ROLLOUTS` make a longer run.
//! Run with --nocapture to read the figures.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use common::agent::Agent;
use common::kube_api::{pod, restarted, terminated_now, FakeApi};
use common::rng::SplitMix;
use common::{Container, ContainerSpec};
use serde_json::Value;

const NODE: &str = "chaos-node";
const NS: &str = "chaos";
const BUS_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be caused \
                        by insufficient shared memory (shm).";

/// The run's size; the defaults keep it within CI's budget.
struct Plan {
    seed: u64,
    deaths: usize,
    kills: usize,
    rollouts: usize,
}

impl Plan {
    fn from_env() -> Plan {
        let get = |name: &str, default: u64| {
            std::env::var(format!("SHMLINK_CHAOS_{name}"))
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Plan {
            seed: get("SEED", 38),
            deaths: get("DEATHS", 60) as usize,
            kills: get("KILLS", 50) as usize,
            rollouts: get("ROLLOUTS", 10) as usize,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// PyTorch's DataLoader line in the CRI log, then exit 1.
    LogLine,
    /// The kernel OOM-kills the main process: kubelet's OOMKilled, 137.
    OomKill,
    /// A real SIGBUS: exit status 135, reason Error.
    SigBus,
}

const KINDS: [Kind; 3] = [Kind::LogLine, Kind::OomKill, Kind::SigBus];

/// One death: its Pod, and when serve could first have known of it.
struct Death {
    kind: Kind,
    pod: String,
    uid: String,
    known_at: Instant,
    _container: Container,
}

/// How a stop was aimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Aim {
    /// At a random moment after serve is ready.
    Random,
    /// 0-300 ms after a death became readable (a log line, a Pod status).
    AfterDeath,
    /// The moment the store's WAL file changed (a commit under way or just done).
    StoreWrite,
    /// 0-300 ms after the start, before ready: while it opens the store and resumes.
    Starting,
}

struct Stop {
    at: Instant,
    aim: Aim,
    graceful: bool,
    /// The log of the serve stopped.
    log: PathBuf,
}

/// What the test shares across its threads.
struct World {
    api: FakeApi,
    logs: tempfile::TempDir,
    state: PathBuf,
    python: PathBuf,
    t0: Instant,
}

impl World {
    fn serve(&self) -> Agent {
        Agent::start_kube(
            &self.api.kubeconfig_path(),
            NODE,
            &[
                "--state-dir",
                self.state.to_str().unwrap(),
                "--pod-log-root",
                self.logs.path().to_str().unwrap(),
                "--kmsg",
                "/dev/kmsg",
            ],
        )
    }

    fn secs(&self, at: Instant) -> f64 {
        at.duration_since(self.t0).as_secs_f64()
    }
}

/// Starts a container that dies as `kind` in a Pod of its own, waits for the death, and writes
/// what kubelet would; `known` hears when serve could first know it.
fn die(w: &World, kind: Kind, i: usize, known: &Sender<Instant>) -> Death {
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    let name = format!("{kind:?}-{i}").to_lowercase();
    let container_name = "worker";
    let live = pod(NODE, NS, &name, &uid, &[(container_name, &id)]);
    w.api.apply_pod(live.clone());
    let (container, exit_code, reason) = match kind {
        Kind::LogLine => {
            let dir = w
                .logs
                .path()
                .join(format!("{NS}_{name}_{uid}/{container_name}"));
            std::fs::create_dir_all(&dir).unwrap();
            let script = format!("echo 'epoch 1: loss 0.42'; sleep 0.2; echo '{BUS_LINE}'; exit 1");
            let c = Container::start(ContainerSpec {
                pod_uid: Some(uid.clone()),
                id: Some(id.clone()),
                args: vec!["sh".into(), "-c".into(), script],
                cri_log: Some(dir.join("0.log")),
                ..ContainerSpec::default()
            });
            (c, 1, "Error")
        }
        Kind::OomKill => (
            common::oom::main_process_past_the_limit(&uid, &id),
            137,
            "OOMKilled",
        ),
        Kind::SigBus => (
            common::crash::sigbus_container(&uid, &id, &w.python),
            135,
            "Error",
        ),
    };
    assert!(
        container.wait_exited(Duration::from_secs(60)),
        "{name} never died: {}",
        container.console()
    );
    // A line is in the log the moment the container is gone (the shim writes as it reads).
    let line_at = Instant::now();
    if kind == Kind::LogLine {
        let _ = known.send(line_at);
    }
    // Kubelet notices the exit at its next relist, then writes the status.
    std::thread::sleep(Duration::from_millis(500));
    let dead = terminated_now(&id, exit_code, reason);
    w.api.apply_pod(restarted(
        live,
        container_name,
        dead,
        &common::random_container_id(),
    ));
    let status_at = Instant::now();
    if kind != Kind::LogLine {
        let _ = known.send(status_at);
    }
    Death {
        kind,
        pod: name,
        uid,
        known_at: if kind == Kind::LogLine {
            line_at
        } else {
            status_at
        },
        _container: container,
    }
}

/// `n` deaths numbered from `first`, started at random moments `mean_gap` apart on average,
/// each on a thread of its own (a slow death does not hold the schedule back).
fn deaths(
    w: &World,
    rng: &mut SplitMix,
    first: usize,
    n: usize,
    mean_gap: Duration,
    known: Sender<Instant>,
) -> Vec<Death> {
    let gap = mean_gap.as_millis() as u64;
    std::thread::scope(|s| {
        let mut running = Vec::new();
        for i in first..first + n {
            std::thread::sleep(rng.millis(0, 2 * gap));
            let kind = KINDS[rng.below(3) as usize];
            let known = known.clone();
            running.push(s.spawn(move || die(w, kind, i, &known)));
        }
        running.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// The store's WAL file as last written: its length and time.
fn wal_mark(state: &Path) -> Option<(u64, SystemTime)> {
    let wal = state.join(format!("{}-wal", shmlink::state::open::FILE));
    let m = std::fs::metadata(wal).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// Waits (up to 3 s) for what `aim` aims at; serve is running.
fn take_aim(w: &World, aim: Aim, rng: &mut SplitMix, known: &Receiver<Instant>) {
    match aim {
        Aim::Random => std::thread::sleep(rng.millis(100, 2500)),
        Aim::Starting => std::thread::sleep(rng.millis(0, 300)),
        Aim::AfterDeath => {
            while known.try_recv().is_ok() {}
            if known.recv_timeout(Duration::from_secs(3)).is_ok() {
                std::thread::sleep(rng.millis(0, 300));
            }
        }
        Aim::StoreWrite => {
            let before = wal_mark(&w.state);
            let deadline = Instant::now() + Duration::from_secs(3);
            while wal_mark(&w.state) == before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Stops serve (SIGKILL, or SIGTERM for a rollout) and starts it again on the same store, over
/// and over, until `want` stops are done and `done()` says the deaths are over.
#[allow(clippy::too_many_arguments)]
fn stop_and_start(
    w: &World,
    mut agent: Agent,
    rng: &mut SplitMix,
    known: &Receiver<Instant>,
    graceful: bool,
    want: usize,
    done: impl Fn() -> bool,
    stops: &mut Vec<Stop>,
) -> Agent {
    let aims: &[Aim] = if graceful {
        &[Aim::Random, Aim::AfterDeath, Aim::StoreWrite]
    } else {
        &[Aim::Random, Aim::AfterDeath, Aim::StoreWrite, Aim::Starting]
    };
    if want == 0 {
        // The control run: the same deaths, serve left alone.
        while !done() {
            std::thread::sleep(Duration::from_millis(100));
        }
        return agent;
    }
    let mut n = 0;
    while n < want || !done() {
        let aim = aims[rng.below(aims.len() as u64) as usize];
        if aim != Aim::Starting {
            agent.wait_ready();
        }
        take_aim(w, aim, rng, known);
        assert!(
            agent.is_running(),
            "serve stopped by itself: {}",
            agent.log_text()
        );
        let (at, log) = (Instant::now(), agent.log.clone());
        if graceful {
            let status = agent.terminate();
            assert!(status.success(), "serve on SIGTERM: {status}");
        } else {
            drop(agent); // SIGKILL
        }
        stops.push(Stop {
            at,
            aim,
            graceful,
            log,
        });
        n += 1;
        agent = w.serve();
    }
    agent
}

/// Runs `want` stops of serve while `n` deaths happen, numbered from `first`.
#[allow(clippy::too_many_arguments)]
fn phase(
    w: &World,
    agent: Agent,
    rng: &mut SplitMix,
    seed: u64,
    first: usize,
    n: usize,
    want: usize,
    graceful: bool,
    stops: &mut Vec<Stop>,
) -> (Agent, Vec<Death>) {
    // About 1.5 s a stop: the deaths spread over the phase (at least 0.5 s apart on average).
    let mean_gap =
        Duration::from_millis((1500 * want as u64).max(500 * n as u64) / n.max(1) as u64);
    // The deaths' own stream, from the seed alone: the same deaths at the same moments in
    // every run of a seed, however the stops (timed by serve) fell.
    let mut death_rng = SplitMix::new(seed);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let dying = s.spawn(move || deaths(w, &mut death_rng, first, n, mean_gap, tx));
        let agent = stop_and_start(
            w,
            agent,
            rng,
            &rx,
            graceful,
            want,
            || dying.is_finished(),
            stops,
        );
        (agent, dying.join().unwrap())
    })
}

/// How many times the Events about `pod` say something happened (a series counts each).
fn occurrences(api: &FakeApi, pod: &str) -> u64 {
    api.events_about(pod)
        .iter()
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum()
}

/// Lets serve run until every death is told (or 60 s) and nothing new comes for 5 s.
fn until_quiet(w: &World, deaths: &[Death]) {
    common::wait_until(Duration::from_secs(60), || {
        deaths.iter().all(|d| occurrences(&w.api, &d.pod) >= 1)
    });
    let mut last = w.api.events();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let now = w.api.events();
        if now == last || Instant::now() > deadline {
            return;
        }
        last = now;
    }
}

/// Per kind: (deaths, told once, lost, doubled), by `count` of each death.
type Tally = BTreeMap<Kind, [usize; 4]>;

fn tally(deaths: &[Death], count: impl Fn(&Death) -> u64) -> (Tally, Vec<&Death>) {
    let mut t = Tally::new();
    let mut wrong = Vec::new();
    for d in deaths {
        let n = count(d);
        let row = t.entry(d.kind).or_default();
        row[0] += 1;
        row[match n {
            1 => 1,
            0 => 2,
            _ => 3,
        }] += 1;
        if n != 1 {
            wrong.push(d);
        }
    }
    (t, wrong)
}

fn totals(t: &Tally) -> [usize; 4] {
    t.values().fold([0; 4], |mut sum, row| {
        for (s, r) in sum.iter_mut().zip(row) {
            *s += r;
        }
        sum
    })
}

fn print_tally(what: &str, t: &Tally) {
    for (kind, [n, once, lost, doubled]) in t {
        println!(
            "CHAOS {what} {kind:?}: deaths {n}, told once {once}, lost {lost}, doubled {doubled}"
        );
    }
    let [n, once, lost, doubled] = totals(t);
    println!("CHAOS {what} all: deaths {n}, told once {once}, lost {lost}, doubled {doubled}");
}

/// A stop as said in the figures: how, aimed at what, when (ms from `at`).
fn said(w: &World, s: &Stop, at: Instant) -> String {
    let ms = (w.secs(s.at) - w.secs(at)) * 1000.0;
    let how = if s.graceful { "SIGTERM" } else { "SIGKILL" };
    format!("{how} {:?} at {ms:+.0} ms", s.aim)
}

/// What went wrong with one death: the stops either side of it, which serve told it (each
/// serve's log names the container in a line per telling) and the Events.
fn explain(w: &World, d: &Death, stops: &[Stop], last_log: &Path) {
    let before = stops.iter().rfind(|s| s.at < d.known_at);
    let after = stops.iter().find(|s| s.at >= d.known_at);
    let show = |s: Option<&Stop>| s.map_or("none".into(), |s| said(w, s, d.known_at));
    println!(
        "CHAOS wrong: {} ({:?}) known at {:.1} s; stop before: {}; after: {}",
        d.pod,
        d.kind,
        w.secs(d.known_at),
        show(before),
        show(after)
    );
    let container = format!("container {NS}/{}/", d.pod);
    let logs = stops.iter().map(|s| (s.log.as_path(), Some(s)));
    for (i, (log, stopped)) in logs.chain([(last_log, None)]).enumerate() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains(&container)) {
            let late = line.contains("Found when the agent started again");
            println!(
                "CHAOS   told by serve #{i} (then {}){}: {}",
                show(stopped),
                if late { ", found late" } else { "" },
                line.chars().take(110).collect::<String>()
            );
        }
    }
    for e in w.api.events_about(&d.pod) {
        println!(
            "CHAOS   Event {} x{} {}: {}",
            e["reason"].as_str().unwrap_or(""),
            e["series"]["count"].as_u64().unwrap_or(1),
            e["metadata"]["name"].as_str().unwrap_or(""),
            e["note"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(100)
                .collect::<String>()
        );
    }
}

/// `shmlink history --json` of the store: failures per Pod UID.
fn history(state: &Path) -> BTreeMap<String, u64> {
    let out = std::process::Command::new(common::shmlink_bin())
        .args(["history", "--json", "--since", "1h", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "history: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("history's JSON");
    let mut per_pod = BTreeMap::new();
    for f in json["failures"].as_array().expect("failures") {
        *per_pod
            .entry(f["pod_uid"].as_str().unwrap_or("").to_string())
            .or_default() += 1;
    }
    per_pod
}

#[test]
fn deaths_are_told_once_while_serve_is_killed_and_rolled() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let Some(python) = common::crash::host_python() else {
        return;
    };
    let plan = Plan::from_env();
    let tmp = tempfile::tempdir().unwrap();
    let w = World {
        api: FakeApi::start(),
        logs: tempfile::tempdir().unwrap(),
        state: tmp.path().join("state"),
        python,
        t0: Instant::now(),
    };
    let mut rng = SplitMix::new(plan.seed);
    let mut stops = Vec::new();
    // Two thirds of the deaths among the kills, the rest among the rollouts.
    let (n1, n2) = (plan.deaths * 2 / 3, plan.deaths - plan.deaths * 2 / 3);
    // Its first look at the logs reads from their end (nothing before the agent is news): the
    // deaths begin once it has looked.
    let first = w.serve();
    first.wait_ready();
    let (agent, mut all) = phase(
        &w,
        first,
        &mut rng,
        plan.seed ^ 1,
        0,
        n1,
        plan.kills,
        false,
        &mut stops,
    );
    let killed_for = w.t0.elapsed();
    let (agent, more) = phase(
        &w,
        agent,
        &mut rng,
        plan.seed ^ 2,
        n1,
        n2,
        plan.rollouts,
        true,
        &mut stops,
    );
    all.extend(more);
    agent.wait_ready();
    until_quiet(&w, &all);
    let last_log = agent.log.clone();
    assert!(agent.terminate().success());
    let took = w.t0.elapsed();

    let (events, wrong) = tally(&all, |d| occurrences(&w.api, &d.pod));
    let stored = history(&w.state);
    let (kept, wrong_kept) = tally(&all, |d| stored.get(&d.uid).copied().unwrap_or(0));
    let count = |aim: Aim, graceful: bool| {
        let n = stops
            .iter()
            .filter(|s| s.aim == aim && s.graceful == graceful);
        n.count()
    };
    println!(
        "CHAOS seed {}: {} SIGKILLs in {:.0} s (random {}, after a death {}, on a store write \
         {}, while starting {}), {} SIGTERM rollouts (random {}, after a death {}, on a store \
         write {}), {:.0} s in all",
        plan.seed,
        stops.iter().filter(|s| !s.graceful).count(),
        killed_for.as_secs_f64(),
        count(Aim::Random, false),
        count(Aim::AfterDeath, false),
        count(Aim::StoreWrite, false),
        count(Aim::Starting, false),
        stops.iter().filter(|s| s.graceful).count(),
        count(Aim::Random, true),
        count(Aim::AfterDeath, true),
        count(Aim::StoreWrite, true),
        took.as_secs_f64()
    );
    print_tally("Events", &events);
    print_tally("history", &kept);
    let mut seen = std::collections::HashSet::new();
    for d in wrong.iter().chain(&wrong_kept) {
        if seen.insert(&d.pod) {
            explain(&w, d, &stops, &last_log);
        }
    }
    assert_eq!(all.len(), plan.deaths);
    assert!(stops.iter().filter(|s| !s.graceful).count() >= plan.kills);
    assert!(stops.iter().filter(|s| s.graceful).count() >= plan.rollouts);
    let [_, _, lost, doubled] = totals(&events);
    assert_eq!((lost, doubled), (0, 0), "Events: lost, doubled");
    let [_, _, lost, doubled] = totals(&kept);
    assert_eq!((lost, doubled), (0, 0), "history: lost, doubled");
}

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
use common::dying::{self, InPod, Kind, KINDS};
use common::kube_api::{pod, restarted, terminated_now, FakeApi};
use common::rng::SplitMix;
use common::Container;
use serde_json::Value;

const NODE: &str = "chaos-node";
const NS: &str = "chaos";

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
    /// The log of the serve stopped, read at once (the file is named by the port, which a
    /// later serve may get again).
    log: String,
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
    let live = pod(NODE, NS, &name, &uid, &[("worker", &id)]);
    w.api.apply_pod(live.clone());
    let at = InPod {
        namespace: NS,
        pod: &name,
        uid: &uid,
        container: "worker",
        id: &id,
    };
    let container = dying::start(kind, &at, w.logs.path(), &w.python);
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
    let (exit_code, reason) = kind.kubelet_exit();
    let dead = terminated_now(&id, exit_code, reason);
    let next = restarted(live, "worker", dead, &common::random_container_id());
    w.api.apply_pod(next);
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

/// Waits (up to 3 s) for what `aim` aims at; serve is running. Returns the aim taken (Random
/// when what it waited for did not come).
fn take_aim(w: &World, aim: Aim, rng: &mut SplitMix, known: &Receiver<Instant>) -> Aim {
    match aim {
        Aim::Random => std::thread::sleep(rng.millis(100, 2500)),
        Aim::Starting => std::thread::sleep(rng.millis(0, 300)),
        Aim::AfterDeath => {
            while known.try_recv().is_ok() {}
            if known.recv_timeout(Duration::from_secs(3)).is_err() {
                return Aim::Random; // no death came: counted as what it was
            }
            std::thread::sleep(rng.millis(0, 300));
        }
        Aim::StoreWrite => {
            let before = wal_mark(&w.state);
            let deadline = Instant::now() + Duration::from_secs(3);
            while wal_mark(&w.state) == before {
                if Instant::now() >= deadline {
                    return Aim::Random;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    aim
}

/// One phase: `deaths` deaths numbered from `first`, from `seed`, while serve is stopped at
/// least `stops` times, by SIGTERM if `graceful`, else SIGKILL.
struct Phase {
    seed: u64,
    first: usize,
    deaths: usize,
    stops: usize,
    graceful: bool,
}

/// Stops serve and starts it again on the same store, over and over, until the phase's stops
/// are done and `done()` says its deaths are over.
fn stop_and_start(
    w: &World,
    p: &Phase,
    mut agent: Agent,
    rng: &mut SplitMix,
    known: &Receiver<Instant>,
    done: impl Fn() -> bool,
    stops: &mut Vec<Stop>,
) -> Agent {
    let aims: &[Aim] = if p.graceful {
        &[Aim::Random, Aim::AfterDeath, Aim::StoreWrite]
    } else {
        &[Aim::Random, Aim::AfterDeath, Aim::StoreWrite, Aim::Starting]
    };
    if p.stops == 0 {
        // The control run: the same deaths, serve left alone.
        while !done() {
            std::thread::sleep(Duration::from_millis(100));
        }
        return agent;
    }
    let mut n = 0;
    while n < p.stops || !done() {
        let aim = aims[rng.below(aims.len() as u64) as usize];
        if aim != Aim::Starting {
            agent.wait_ready();
        }
        let aim = take_aim(w, aim, rng, known);
        assert!(
            agent.is_running(),
            "serve stopped by itself: {}",
            agent.log_text()
        );
        let (at, path) = (Instant::now(), agent.log.clone());
        if p.graceful {
            let status = agent.terminate();
            assert!(status.success(), "serve on SIGTERM: {status}");
        } else {
            drop(agent); // SIGKILL
        }
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(path); // a run leaves no hundreds of them behind
        let graceful = p.graceful;
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

/// Runs a phase: its deaths on a thread of their own, the stops on this one.
fn phase(
    w: &World,
    p: Phase,
    agent: Agent,
    rng: &mut SplitMix,
    stops: &mut Vec<Stop>,
) -> (Agent, Vec<Death>) {
    // About 1.5 s a stop: the deaths spread over the phase (at least 0.5 s apart on average).
    let n = p.deaths.max(1) as u64;
    let mean_gap = Duration::from_millis((1500 * p.stops as u64).max(500 * n) / n);
    // The deaths' own stream, from the seed alone: the same deaths at the same moments in
    // every run of a seed, however the stops (timed by serve) fell.
    let mut death_rng = SplitMix::new(p.seed);
    let (tx, rx) = mpsc::channel();
    let (first, count) = (p.first, p.deaths);
    std::thread::scope(|s| {
        let dying = s.spawn(move || deaths(w, &mut death_rng, first, count, mean_gap, tx));
        let agent = stop_and_start(w, &p, agent, rng, &rx, || dying.is_finished(), stops);
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
fn explain(w: &World, d: &Death, stops: &[Stop], last_log: &str) {
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
    let logs = stops.iter().map(|s| (s.log.as_str(), Some(s)));
    for (i, (log, stopped)) in logs.chain([(last_log, None)]).enumerate() {
        for line in log.lines().filter(|l| l.contains(&container)) {
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
        let note = e["note"].as_str().unwrap_or("").chars().take(100);
        println!(
            "CHAOS   Event {} x{}: {}",
            e["reason"].as_str().unwrap_or(""),
            e["series"]["count"].as_u64().unwrap_or(1),
            note.collect::<String>()
        );
    }
}

/// How many serves told `d` in their log (each names the container in a line per telling).
fn tellers(d: &Death, stops: &[Stop], last_log: &str) -> usize {
    let container = format!("container {NS}/{}/", d.pod);
    let logs = stops.iter().map(|s| s.log.as_str()).chain([last_log]);
    logs.filter(|log| log.contains(&container)).count()
}

/// The window a death told `events` times (`stored` in history) fell in, as the serves' logs
/// show it.
fn window(events: u64, stored: u64, tellers: usize) -> &'static str {
    match (events, stored, tellers) {
        (0, 1.., _) => "lost: stored in history, its Event never went out",
        (0, 0, 0) => "lost: read by no serve (it happened while serve was down or starting)",
        (0, 0, _) => "lost: told in a serve's log, stopped before it was stored",
        (_, _, 0 | 1) => "doubled: by one serve",
        _ => "doubled: told again by the next serve",
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

/// What a run did.
struct Run {
    deaths: Vec<Death>,
    stops: Vec<Stop>,
    /// The last serve's log.
    last_log: String,
    killed_for: Duration,
    took: Duration,
}

/// The two phases, then the last serve until quiet, stopped by SIGTERM.
fn run(w: &World, plan: &Plan) -> Run {
    let mut rng = SplitMix::new(plan.seed);
    let mut stops = Vec::new();
    // Two thirds of the deaths among the kills, the rest among the rollouts.
    let n1 = plan.deaths * 2 / 3;
    let kills = Phase {
        seed: plan.seed ^ 1,
        first: 0,
        deaths: n1,
        stops: plan.kills,
        graceful: false,
    };
    let rollouts = Phase {
        seed: plan.seed ^ 2,
        first: n1,
        deaths: plan.deaths - n1,
        stops: plan.rollouts,
        graceful: true,
    };
    // Its first look at the logs reads from their end (nothing before the agent is news): the
    // deaths begin once it has looked.
    let first = w.serve();
    first.wait_ready();
    let (agent, mut deaths) = phase(w, kills, first, &mut rng, &mut stops);
    let killed_for = w.t0.elapsed();
    let (agent, more) = phase(w, rollouts, agent, &mut rng, &mut stops);
    deaths.extend(more);
    agent.wait_ready();
    until_quiet(w, &deaths);
    let path = agent.log.clone();
    assert!(agent.terminate().success());
    let last_log = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    Run {
        deaths,
        stops,
        last_log,
        killed_for,
        took: w.t0.elapsed(),
    }
}

fn print_stops(plan: &Plan, r: &Run) {
    let by_aim = |graceful: bool| {
        let aims = [Aim::Random, Aim::AfterDeath, Aim::StoreWrite, Aim::Starting];
        let of = |aim: Aim| {
            r.stops
                .iter()
                .filter(move |s| (s.aim, s.graceful) == (aim, graceful))
        };
        let counts = aims.map(|a| format!("{a:?} {}", of(a).count()));
        let n = r.stops.iter().filter(|s| s.graceful == graceful).count();
        format!("{n} ({})", counts.join(", "))
    };
    println!(
        "CHAOS seed {}: SIGKILLs {} in {:.0} s; SIGTERM rollouts {}; {:.0} s in all",
        plan.seed,
        by_aim(false),
        r.killed_for.as_secs_f64(),
        by_aim(true),
        r.took.as_secs_f64()
    );
}

/// The windows the deaths whose Events are wrong fell in, by kind.
fn print_windows(w: &World, r: &Run, wrong: &[&Death], stored: &BTreeMap<String, u64>) {
    let mut windows = BTreeMap::<(Kind, &str), usize>::new();
    for d in wrong {
        let told = tellers(d, &r.stops, &r.last_log);
        let kept = stored.get(&d.uid).copied().unwrap_or(0);
        let at = window(occurrences(&w.api, &d.pod), kept, told);
        *windows.entry((d.kind, at)).or_default() += 1;
    }
    for ((kind, window), n) in &windows {
        println!("CHAOS window {kind:?} {window}: {n}");
    }
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
    let r = run(&w, &plan);

    let (events, wrong) = tally(&r.deaths, |d| occurrences(&w.api, &d.pod));
    let stored = history(&w.state);
    let (kept, wrong_kept) = tally(&r.deaths, |d| stored.get(&d.uid).copied().unwrap_or(0));
    print_stops(&plan, &r);
    print_tally("Events", &events);
    print_tally("history", &kept);
    print_windows(&w, &r, &wrong, &stored);
    let mut seen = std::collections::HashSet::new();
    for d in wrong.iter().chain(&wrong_kept) {
        if seen.insert(&d.pod) {
            explain(&w, d, &r.stops, &r.last_log);
        }
    }
    assert_eq!(r.deaths.len(), plan.deaths);
    assert!(r.stops.iter().filter(|s| !s.graceful).count() >= plan.kills);
    assert!(r.stops.iter().filter(|s| s.graceful).count() >= plan.rollouts);
    let [_, _, lost, doubled] = totals(&events);
    assert_eq!((lost, doubled), (0, 0), "Events: lost, doubled");
    let [_, _, lost, doubled] = totals(&kept);
    assert_eq!((lost, doubled), (0, 0), "history: lost, doubled");
}

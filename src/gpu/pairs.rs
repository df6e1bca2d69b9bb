//! Pure: GPU samples over time -> a verdict per GPU pair, with reasons.
//!
//! No I/O and no NVML: [`PairJudge::judge`] takes one [`GpuSample`] and the instant it was taken,
//! and keeps only what later verdicts need (error-counter histories and which P2P capabilities
//! were ever ok), keyed by GPU UUID so that a change of NVML indices is not mistaken for growth.
//!
//! The rules, in the order they add reasons to a pair:
//!
//! 1. A lost GPU (NVML's GPU_IS_LOST) makes every pair it is in `down`.
//! 2. An inactive NVLink whose far end is another of this machine's GPUs makes that pair `down`,
//!    at first sight too. On an NVSwitch board a GPU's traffic to every peer crosses its switch
//!    links: all of them inactive makes all its pairs `down`, some of them `degraded`. Links whose
//!    far end is unknown or some other PCI device say nothing about a pair.
//! 3. NVLink error counters, per (GPU UUID, link), over a sliding window (60 s): replay,
//!    recovery or ECC-data growth at or above a threshold (1), or a CRC (flit + data) rate between
//!    two consecutive samples at or above 100/s, makes the pairs the link serves `degraded` until
//!    the growth has left the window. A direct link serves its one pair; a switch link serves all
//!    pairs of its GPU. A counter that goes down (driver reload, GPU reset) starts a new baseline.
//!    Any CRC growth (and any growth below the thresholds) that did not already make the pairs
//!    fail is a warning finding of its own. These are DCGM's NVLink health-watch defaults.
//! 4. A P2P capability (read, write, nvlink, atomics) that was ever ok for a pair and now is not
//!    makes the pair `degraded`.
//! 5. The outlier test, which needs no history: among pairs at the same PCIe topology level, if
//!    any pair has P2P read and write ok, a pair whose read or write is not ok is `degraded`. A
//!    board where no pair at that level can is fine (the platform, not a GPU). On an NVSwitch
//!    board, where every pair should reach every other over NVLink, the same goes for the nvlink
//!    capability across all pairs.
//!
//! Findings are one per problem a person acts on: a lost GPU; a GPU all of whose pairs fail (the
//! broken-GPU case, named once rather than once per pair); every pair failing (a node-wide cause);
//! else each failing pair; and link errors that did not make any pair fail.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::{
    GpuReading, GpuSample, LinkErrors, P2pStatus, PairStatus, PairVerdict, Peer, TopologyLevel,
};
use crate::snapshot::{Finding, Severity};

/// An inactive link to another GPU, or all of a GPU's NVSwitch links inactive.
pub const KIND_LINK_DOWN: &str = "gpu_link_down";
/// NVLink error counters growing where no pair was made to fail by them.
pub const KIND_LINK_ERRORS: &str = "gpu_link_errors";
/// A pair (or a GPU's every pair) degraded: P2P lost or failing where its neighbours work,
/// error counters over threshold, some NVSwitch links inactive.
pub const KIND_PAIR_DEGRADED: &str = "gpu_pair_degraded";
/// NVML reports the GPU lost (fell off the bus). Not in CONTRACT.md's list yet: proposed.
pub const KIND_GPU_LOST: &str = "gpu_lost";

/// Thresholds of the pair verdicts. The defaults follow DCGM's NVLink health watch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairRules {
    /// How long counter growth keeps the pairs it affects degraded after it was seen.
    pub window: Duration,
    /// Replay, recovery or ECC-data growth within `window` at or above which the pairs the link
    /// serves are degraded. 0 is taken as 1 (no growth never degrades).
    pub replay_recovery_degraded: u64,
    /// CRC (flit + data) errors per second between two consecutive samples at or above which the
    /// pairs the link serves are degraded. Growth below it is still a warning finding.
    pub crc_degraded_per_sec: f64,
}

impl Default for PairRules {
    fn default() -> Self {
        PairRules {
            window: Duration::from_secs(60),
            replay_recovery_degraded: 1,
            crc_degraded_per_sec: 100.0,
        }
    }
}

/// The outcome of one [`PairJudge::judge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    /// Every unordered pair of the sample's GPUs, `gpu < peer_gpu`, sorted.
    pub pairs: Vec<PairVerdict>,
    pub findings: Vec<Finding>,
}

/// Judges GPU pairs scan after scan; keeps the baselines that rules 3 and 4 need.
#[derive(Debug, Default)]
pub struct PairJudge {
    rules: PairRules,
    /// Per (GPU key, link): the samples that cover the window, oldest first, plus the newest one
    /// just outside it (the baseline growth is measured from).
    counters: HashMap<(String, u32), VecDeque<(Instant, LinkErrors)>>,
    /// Per (GPU key of `gpu`, GPU key of `peer_gpu`): whether read, write, nvlink, atomics were
    /// ever ok. Directional, so a reorder that flips a pair forgets rather than misjudges.
    p2p_ever_ok: HashMap<(String, String), [bool; 4]>,
}

impl PairJudge {
    pub fn new(rules: PairRules) -> Self {
        PairJudge {
            rules,
            counters: HashMap::new(),
            p2p_ever_ok: HashMap::new(),
        }
    }

    pub fn rules(&self) -> &PairRules {
        &self.rules
    }

    /// Judges one sample. `now` is when the sample was taken (tests pass synthetic instants).
    pub fn judge(&mut self, sample: &GpuSample, now: Instant) -> Judgement {
        let board = Board::new(sample);
        let mut pairs = board.pair_states(sample);
        lost_rule(&board, &mut pairs);
        link_state_rule(&board, &mut pairs);
        let notices = self.counter_rule(&board, now, &mut pairs);
        self.p2p_regression_rule(&board, &mut pairs);
        outlier_rule(&board, &mut pairs);

        let judged: Vec<Judged> = pairs
            .into_iter()
            .map(|((gpu, peer_gpu), st)| {
                let weight = st.reasons.iter().map(|r| r.weight).max();
                let mut links = st.links;
                links.sort_unstable();
                links.dedup();
                Judged {
                    weight,
                    verdict: PairVerdict {
                        gpu,
                        peer_gpu,
                        status: weight.map_or(PairStatus::Ok, Weight::status),
                        p2p: st.p2p,
                        topology: st.topology,
                        links,
                        reasons: st.reasons.into_iter().map(|r| r.text).collect(),
                    },
                }
            })
            .collect();
        let findings = findings(&board, &judged, notices, &self.rules);
        Judgement {
            pairs: judged.into_iter().map(|j| j.verdict).collect(),
            findings,
        }
    }

    /// Rule 3: error counters. Returns the growth that did not degrade anything (for warnings).
    fn counter_rule(
        &mut self,
        board: &Board<'_>,
        now: Instant,
        pairs: &mut BTreeMap<(u32, u32), PairState>,
    ) -> Vec<Notice> {
        let cutoff = now.checked_sub(self.rules.window);
        let threshold = self.rules.replay_recovery_degraded.max(1);
        let mut seen = HashSet::new();
        // pair -> (GPU, counter) -> what degrades it
        let mut degrading: BTreeMap<(u32, u32), BTreeMap<(u32, Counter), Agg>> = BTreeMap::new();
        let mut notices = Vec::new();

        for (&a, gpu) in &board.gpus {
            for link in &gpu.links {
                let key = (board.key(a), link.link);
                seen.insert(key.clone());
                // A lost GPU's pairs are down already; its counters (if any) wait for its return.
                if gpu.lost || (link.errors.is_none() && !self.counters.contains_key(&key)) {
                    continue;
                }
                let history = self.counters.entry(key).or_default();
                match link.errors {
                    Some(errors) => push_sample(history, now, errors),
                    None => {
                        if history.back().is_some_and(|(t, _)| *t > now) {
                            history.clear();
                        }
                    }
                }
                prune(history, cutoff);
                let growth = Growth::of(history);
                if growth.is_zero() {
                    continue;
                }

                let affected = affected_pairs(a, &link.peer, pairs);
                let mut hits = Vec::new();
                let mut below = Vec::new();
                for (counter, amount) in [
                    (Counter::Replay, growth.replay),
                    (Counter::Recovery, growth.recovery),
                    (Counter::EccData, growth.ecc_data),
                ] {
                    if amount >= threshold && !affected.is_empty() {
                        hits.push((counter, amount, 0.0));
                    } else if amount > 0 {
                        below.push(format!("{} +{amount}", counter.long()));
                    }
                }
                if growth.crc > 0 {
                    // NaN never degrades; growth > 0 guarantees a positive rate.
                    if growth.crc_rate >= self.rules.crc_degraded_per_sec && !affected.is_empty() {
                        hits.push((Counter::Crc, growth.crc, growth.crc_rate));
                    }
                    // Any CRC growth is worth a warning, unless the pairs fail anyway (see
                    // `findings`, which drops notices whose pairs are all not ok).
                    below.push(format!(
                        "{} +{} (up to {}/s)",
                        Counter::Crc.long(),
                        growth.crc,
                        rate(growth.crc_rate)
                    ));
                }
                for &pair in &affected {
                    let per_pair = degrading.entry(pair).or_default();
                    for &(counter, amount, rate) in &hits {
                        let agg = per_pair.entry((a, counter)).or_default();
                        agg.links.push(link.link);
                        agg.total = agg.total.saturating_add(amount);
                        agg.rate = agg.rate.max(rate);
                    }
                }
                if !below.is_empty() {
                    notices.push(Notice {
                        gpu: a,
                        link: link.link,
                        parts: below,
                        affected,
                    });
                }
            }
        }
        // Rule 7: baselines of GPUs (and links) no longer present are dropped.
        self.counters.retain(|key, _| seen.contains(key));

        let window = secs(self.rules.window);
        for (pair, per_pair) in degrading {
            let Some(st) = pairs.get_mut(&pair) else {
                continue;
            };
            for ((gpu, counter), agg) in per_pair {
                let links = link_list(&agg.links);
                let text = match counter {
                    Counter::Crc => format!(
                        "NVLink CRC errors on GPU {gpu} {links}: +{} in the last {window} s, \
                         up to {}/s (degraded at {}/s)",
                        agg.total,
                        rate(agg.rate),
                        self.rules.crc_degraded_per_sec
                    ),
                    _ => format!(
                        "NVLink {} errors on GPU {gpu} {links}: +{} in the last {window} s",
                        counter.long(),
                        agg.total
                    ),
                };
                st.push(Weight::Errors, text);
            }
        }
        notices
    }

    /// Rule 4: a P2P capability that was ever ok for the pair and now is not.
    fn p2p_regression_rule(
        &mut self,
        board: &Board<'_>,
        pairs: &mut BTreeMap<(u32, u32), PairState>,
    ) {
        let present: HashSet<String> = board.indices.iter().map(|&i| board.key(i)).collect();
        self.p2p_ever_ok
            .retain(|(x, y), _| present.contains(x) && present.contains(y));
        for (&(a, b), st) in pairs.iter_mut() {
            let Some(caps) = st.p2p else {
                continue;
            };
            let ever_ok = self
                .p2p_ever_ok
                .entry((board.key(a), board.key(b)))
                .or_default();
            for (was_ok, (name, status)) in ever_ok.iter_mut().zip(caps.iter()) {
                if status == P2pStatus::Ok {
                    *was_ok = true;
                } else if *was_ok {
                    st.push(
                        Weight::Broken,
                        format!("P2P {name} was ok and is now {}", p2p_name(status)),
                    );
                }
            }
        }
    }
}

/// How bad one reason is. The pair's status is the worst of its reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Weight {
    /// Error counters over threshold: the link still carries traffic (NVLink retries replays
    /// and CRC failures in hardware), so jobs slow down rather than crash; DCGM's health watch
    /// calls this a warning. Degraded, Warning.
    Errors,
    /// P2P lost or failing where its neighbours work, some NVSwitch links inactive: transfers
    /// between the pair fail or fall back, which is what crashed the all-reduce. Degraded,
    /// Critical.
    Broken,
    /// An inactive direct link, all switch links inactive, a lost GPU. Down, Critical.
    Down,
}

impl Weight {
    fn status(self) -> PairStatus {
        match self {
            Weight::Errors | Weight::Broken => PairStatus::Degraded,
            Weight::Down => PairStatus::Down,
        }
    }

    fn severity(self) -> Severity {
        match self {
            Weight::Errors => Severity::Warning,
            Weight::Broken | Weight::Down => Severity::Critical,
        }
    }
}

#[derive(Debug)]
struct Reason {
    weight: Weight,
    text: String,
}

#[derive(Debug, Default)]
struct PairState {
    /// Whether the sample had a `PairSample` for this pair (the first one counts).
    sampled: bool,
    p2p: Option<super::P2pCaps>,
    topology: Option<TopologyLevel>,
    links: Vec<u32>,
    reasons: Vec<Reason>,
}

impl PairState {
    fn push(&mut self, weight: Weight, text: String) {
        if !self.reasons.iter().any(|r| r.text == text) {
            self.reasons.push(Reason { weight, text });
        }
    }
}

struct Judged {
    verdict: PairVerdict,
    weight: Option<Weight>,
}

impl Judged {
    fn key(&self) -> (u32, u32) {
        (self.verdict.gpu, self.verdict.peer_gpu)
    }

    fn has(&self, gpu: u32) -> bool {
        self.verdict.gpu == gpu || self.verdict.peer_gpu == gpu
    }

    fn other(&self, gpu: u32) -> u32 {
        if self.verdict.gpu == gpu {
            self.verdict.peer_gpu
        } else {
            self.verdict.gpu
        }
    }
}

/// Counter growth on one link that degraded nothing, for a `gpu_link_errors` warning.
struct Notice {
    gpu: u32,
    link: u32,
    parts: Vec<String>,
    /// The pairs the link serves; empty for a link to an unknown or non-GPU device.
    affected: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Counter {
    Replay,
    Recovery,
    EccData,
    Crc,
}

impl Counter {
    fn long(self) -> &'static str {
        match self {
            Counter::Replay => "replay",
            Counter::Recovery => "recovery",
            Counter::EccData => "ECC data",
            Counter::Crc => "CRC",
        }
    }
}

#[derive(Debug, Default)]
struct Agg {
    links: Vec<u32>,
    total: u64,
    rate: f64,
}

/// Growth of one link's counters across its history.
#[derive(Debug, Default, PartialEq)]
struct Growth {
    replay: u64,
    recovery: u64,
    ecc_data: u64,
    crc: u64,
    /// The highest CRC rate (per second) between two consecutive samples.
    crc_rate: f64,
}

impl Growth {
    fn of(history: &VecDeque<(Instant, LinkErrors)>) -> Growth {
        let (Some((_, first)), Some((_, last))) = (history.front(), history.back()) else {
            return Growth::default();
        };
        let mut crc_rate: f64 = 0.0;
        for ((t0, e0), (t1, e1)) in history.iter().zip(history.iter().skip(1)) {
            let dt = t1.saturating_duration_since(*t0).as_secs_f64();
            let grown = crc(e1).saturating_sub(crc(e0));
            if dt > 0.0 && grown > 0 {
                crc_rate = crc_rate.max(grown as f64 / dt);
            }
        }
        Growth {
            replay: last.replay.saturating_sub(first.replay),
            recovery: last.recovery.saturating_sub(first.recovery),
            ecc_data: last.ecc_data.saturating_sub(first.ecc_data),
            crc: crc(last).saturating_sub(crc(first)),
            crc_rate,
        }
    }

    fn is_zero(&self) -> bool {
        self.replay == 0 && self.recovery == 0 && self.ecc_data == 0 && self.crc == 0
    }
}

fn crc(e: &LinkErrors) -> u64 {
    e.crc_flit.saturating_add(e.crc_data)
}

fn went_down(old: &LinkErrors, new: &LinkErrors) -> bool {
    new.replay < old.replay
        || new.recovery < old.recovery
        || new.crc_flit < old.crc_flit
        || new.crc_data < old.crc_data
        || new.ecc_data < old.ecc_data
}

/// Appends a sample. A counter that went down, or time that went back, starts a new baseline;
/// a second sample at the same instant replaces the first.
fn push_sample(history: &mut VecDeque<(Instant, LinkErrors)>, now: Instant, errors: LinkErrors) {
    if let Some(&(t, last)) = history.back() {
        if now < t || went_down(&last, &errors) {
            history.clear();
        } else if now == t {
            history.pop_back();
        }
    }
    history.push_back((now, errors));
}

/// Keeps the samples newer than `cutoff` and the newest one at or before it (the baseline).
fn prune(history: &mut VecDeque<(Instant, LinkErrors)>, cutoff: Option<Instant>) {
    let Some(cutoff) = cutoff else {
        return;
    };
    while history.len() >= 2 && history.get(1).is_some_and(|(t, _)| *t <= cutoff) {
        history.pop_front();
    }
}

/// The pairs whose traffic crosses a link of GPU `a`.
fn affected_pairs(a: u32, peer: &Peer, pairs: &BTreeMap<(u32, u32), PairState>) -> Vec<(u32, u32)> {
    match peer {
        Peer::Gpu(b) if *b != a => {
            let key = ordered(a, *b);
            if pairs.contains_key(&key) {
                vec![key]
            } else {
                Vec::new()
            }
        }
        Peer::Switch => pairs
            .keys()
            .filter(|(x, y)| *x == a || *y == a)
            .copied()
            .collect(),
        _ => Vec::new(),
    }
}

fn ordered(a: u32, b: u32) -> (u32, u32) {
    (a.min(b), a.max(b))
}

/// The sample, indexed.
struct Board<'a> {
    /// By NVML index; the first reading of a duplicated index wins.
    gpus: BTreeMap<u32, &'a GpuReading>,
    /// Every GPU index in the sample, from readings and pairs.
    indices: BTreeSet<u32>,
    lost: BTreeSet<u32>,
    /// Some GPU has a link to an NVSwitch: every pair should then reach every other over NVLink.
    nvswitch: bool,
}

impl<'a> Board<'a> {
    fn new(sample: &'a GpuSample) -> Self {
        let mut gpus = BTreeMap::new();
        for g in &sample.gpus {
            gpus.entry(g.index).or_insert(g);
        }
        let mut indices: BTreeSet<u32> = gpus.keys().copied().collect();
        for p in &sample.pairs {
            if p.gpu != p.peer_gpu {
                indices.insert(p.gpu);
                indices.insert(p.peer_gpu);
            }
        }
        let lost = gpus.values().filter(|g| g.lost).map(|g| g.index).collect();
        let nvswitch = gpus
            .values()
            .any(|g| !g.lost && g.links.iter().any(|l| l.peer == Peer::Switch));
        Board {
            gpus,
            indices,
            lost,
            nvswitch,
        }
    }

    /// What baselines are keyed by: the UUID, or the index when NVML gave no UUID.
    fn key(&self, index: u32) -> String {
        match self.gpus.get(&index) {
            Some(g) if !g.uuid.is_empty() => g.uuid.clone(),
            _ => format!("#{index}"),
        }
    }

    fn is_lost(&self, pair: (u32, u32)) -> bool {
        self.lost.contains(&pair.0) || self.lost.contains(&pair.1)
    }

    /// ` (GPU-…, NVIDIA H100, PCI 0000:…)`, with what is known.
    fn describe(&self, index: u32) -> String {
        let Some(g) = self.gpus.get(&index) else {
            return String::new();
        };
        let mut parts = Vec::new();
        for (prefix, value) in [("", &g.uuid), ("", &g.name), ("PCI ", &g.pci_bus_id)] {
            if !value.is_empty() {
                parts.push(format!("{prefix}{value}"));
            }
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    }

    /// Every unordered pair of indices, with the sample's P2P status and topology.
    fn pair_states(&self, sample: &GpuSample) -> BTreeMap<(u32, u32), PairState> {
        let indices: Vec<u32> = self.indices.iter().copied().collect();
        let mut pairs = BTreeMap::new();
        for (i, &a) in indices.iter().enumerate() {
            for &b in indices.iter().skip(i + 1) {
                pairs.insert((a, b), PairState::default());
            }
        }
        for p in &sample.pairs {
            if p.gpu == p.peer_gpu {
                continue;
            }
            if let Some(st) = pairs.get_mut(&ordered(p.gpu, p.peer_gpu)) {
                if !st.sampled {
                    st.sampled = true;
                    st.p2p = p.p2p;
                    st.topology = p.topology;
                }
            }
        }
        pairs
    }
}

/// Rule 1: a lost GPU's pairs are down.
fn lost_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    for (&(a, b), st) in pairs.iter_mut() {
        for g in [a, b] {
            if board.lost.contains(&g) {
                st.push(Weight::Down, format!("GPU {g} is lost (fell off the bus)"));
            }
        }
    }
}

/// Rule 2: inactive links to GPUs and to NVSwitches; `links` of each pair.
fn link_state_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    for (&a, gpu) in &board.gpus {
        if gpu.lost {
            continue;
        }
        let mut switch_links = 0usize;
        let mut switch_down = Vec::new();
        for link in &gpu.links {
            match &link.peer {
                Peer::Gpu(b) if *b != a => {
                    let key = ordered(a, *b);
                    let Some(st) = pairs.get_mut(&key) else {
                        continue;
                    };
                    if key.0 == a {
                        st.links.push(link.link);
                    }
                    if !link.active {
                        st.push(
                            Weight::Down,
                            format!("link {} of GPU {a} to GPU {b} is inactive", link.link),
                        );
                    }
                }
                Peer::Switch => {
                    switch_links += 1;
                    if !link.active {
                        switch_down.push(link.link);
                    }
                }
                _ => {}
            }
        }
        if switch_down.is_empty() {
            continue;
        }
        let (weight, text) = if switch_down.len() == switch_links {
            let text = if switch_links == 1 {
                format!("the only NVSwitch link of GPU {a} is inactive")
            } else {
                format!("all {switch_links} NVSwitch links of GPU {a} are inactive")
            };
            (Weight::Down, text)
        } else {
            (
                Weight::Broken,
                format!(
                    "{} of {switch_links} NVSwitch links of GPU {a} are inactive ({})",
                    switch_down.len(),
                    link_list(&switch_down)
                ),
            )
        };
        for (_, st) in pairs.iter_mut().filter(|((x, y), _)| *x == a || *y == a) {
            st.push(weight, text.clone());
        }
    }
}

/// Rule 5: P2P failing where pairs like it work. Pairs are alike when they sit at the same
/// topology level and join the same two GPU models: on a node that mixes models, P2P between
/// two different models is legitimately `gpu_not_supported` and says nothing about either GPU.
fn outlier_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    let models = |(a, b): (u32, u32)| {
        let name = |i: u32| board.gpus.get(&i).map_or("", |g| g.name.as_str());
        let (x, y) = (name(a), name(b));
        if x <= y {
            (x, y)
        } else {
            (y, x)
        }
    };
    let mut read_write_ok: HashMap<(Option<TopologyLevel>, (&str, &str)), usize> = HashMap::new();
    let mut nvlink_ok: HashMap<(&str, &str), usize> = HashMap::new();
    for (&key, st) in pairs.iter() {
        let Some(caps) = st.p2p.filter(|_| !board.is_lost(key)) else {
            continue;
        };
        if caps.read == P2pStatus::Ok && caps.write == P2pStatus::Ok {
            *read_write_ok.entry((st.topology, models(key))).or_default() += 1;
        }
        if caps.nvlink == P2pStatus::Ok {
            *nvlink_ok.entry(models(key)).or_default() += 1;
        }
    }
    for (&key, st) in pairs.iter_mut() {
        let Some(caps) = st.p2p.filter(|_| !board.is_lost(key)) else {
            continue;
        };
        let can = read_write_ok
            .get(&(st.topology, models(key)))
            .copied()
            .unwrap_or(0);
        let failing = match (caps.read, caps.write) {
            (P2pStatus::Ok, P2pStatus::Ok) => None,
            (read, P2pStatus::Ok) => Some(format!("read {}", p2p_name(read))),
            (P2pStatus::Ok, write) => Some(format!("write {}", p2p_name(write))),
            (read, write) if read == write => Some(format!("read and write {}", p2p_name(read))),
            (read, write) => Some(format!(
                "read {} and write {}",
                p2p_name(read),
                p2p_name(write)
            )),
        };
        if let Some(failing) = failing.filter(|_| can > 0) {
            let level = match st.topology {
                Some(level) => format!("at topology level {}", level_name(level)),
                None => "of unknown topology".to_string(),
            };
            st.push(
                Weight::Broken,
                format!("P2P {failing} while {} {level} can", other_pairs(can)),
            );
        }
        let nvlink_can = nvlink_ok.get(&models(key)).copied().unwrap_or(0);
        if board.nvswitch && caps.nvlink != P2pStatus::Ok && nvlink_can > 0 {
            st.push(
                Weight::Broken,
                format!(
                    "P2P over NVLink {} while {} on this NVSwitch fabric can",
                    p2p_name(caps.nvlink),
                    other_pairs(nvlink_can)
                ),
            );
        }
    }
}

fn other_pairs(n: usize) -> String {
    if n == 1 {
        "1 other pair".to_string()
    } else {
        format!("{n} other pairs")
    }
}

/// Rule 6: one finding per problem a person acts on.
fn findings(
    board: &Board<'_>,
    judged: &[Judged],
    notices: Vec<Notice>,
    rules: &PairRules,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let not_ok: HashSet<(u32, u32)> = judged
        .iter()
        .filter(|j| j.weight.is_some())
        .map(Judged::key)
        .collect();

    // A lost GPU is one problem, whatever else is wrong.
    for &g in &board.lost {
        let down: Vec<u32> = judged
            .iter()
            .filter(|j| j.has(g))
            .map(|j| j.other(g))
            .collect();
        out.push(Finding {
            severity: Severity::Critical,
            kind: KIND_GPU_LOST,
            subject: format!("GPU {g}"),
            message: format!(
                "GPU {g}{} is lost: NVML reports it fell off the bus, so every job using it \
                 fails{}. Drain the node, check `dmesg` for Xid 79, then reset the GPU \
                 (`nvidia-smi -r -i {g}`) or reboot; replace it if it falls off again.",
                board.describe(g),
                if down.is_empty() {
                    String::new()
                } else {
                    format!(" and its {} are down", pairs_with(&down))
                },
            ),
        });
    }

    // The rest, among GPUs that are still there.
    let live: Vec<u32> = board
        .indices
        .iter()
        .copied()
        .filter(|i| !board.lost.contains(i))
        .collect();
    let failing: Vec<&Judged> = judged
        .iter()
        .filter(|j| j.weight.is_some() && !board.is_lost(j.key()))
        .collect();
    let mine = |g: u32| -> Vec<&Judged> {
        judged
            .iter()
            .filter(|j| j.has(g) && !board.lost.contains(&j.other(g)))
            .collect()
    };
    // GPUs all of whose pairs fail: with three or more GPUs that is the GPU's fault (the
    // broken-GPU case), unless every GPU is in that state, which points at the node.
    let mut culprits = BTreeSet::new();
    if live.len() >= 3 && !failing.is_empty() {
        for &g in &live {
            let own = mine(g);
            if !own.is_empty() && own.iter().all(|j| j.weight.is_some()) {
                culprits.insert(g);
            }
        }
    }
    let node_wide = !culprits.is_empty() && culprits.len() == live.len();
    if node_wide {
        out.push(node_finding(&failing, live.len()));
    } else {
        for &g in &culprits {
            out.push(gpu_finding(board, g, &mine(g)));
        }
        for j in failing.iter().filter(|j| {
            !culprits.contains(&j.verdict.gpu) && !culprits.contains(&j.verdict.peer_gpu)
        }) {
            out.push(pair_finding(j));
        }
    }

    // Counter growth that made no pair fail: one warning per GPU.
    let mut per_gpu: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for n in notices {
        let covered = node_wide
            || board.lost.contains(&n.gpu)
            || culprits.contains(&n.gpu)
            || (!n.affected.is_empty() && n.affected.iter().all(|p| not_ok.contains(p)));
        if !covered {
            per_gpu.entry(n.gpu).or_default().push(format!(
                "link {} {}",
                n.link,
                n.parts.join(", ")
            ));
        }
    }
    for (g, parts) in per_gpu {
        out.push(Finding {
            severity: Severity::Warning,
            kind: KIND_LINK_ERRORS,
            subject: format!("GPU {g}"),
            message: format!(
                "NVLink errors on GPU {g}{} in the last {} s: {}. No GPU pair fails because of \
                 them yet, but a link that keeps counting errors is marginal: watch \
                 `nvidia-smi nvlink -e -i {g}` and reseat or replace the GPU or its NVLink \
                 bridge if they keep growing.",
                board.describe(g),
                secs(rules.window),
                parts.join("; "),
            ),
        });
    }
    out
}

fn worst(pairs: &[&Judged]) -> Option<Weight> {
    pairs.iter().filter_map(|j| j.weight).max()
}

fn state_of(pairs: &[&Judged]) -> &'static str {
    let down = pairs.iter().any(|j| j.weight == Some(Weight::Down));
    let degraded = pairs
        .iter()
        .any(|j| matches!(j.weight, Some(Weight::Errors | Weight::Broken)));
    match (down, degraded) {
        (true, true) => "down or degraded",
        (true, false) => "down",
        _ => "degraded",
    }
}

fn kind_of(weight: Option<Weight>) -> &'static str {
    if weight == Some(Weight::Down) {
        KIND_LINK_DOWN
    } else {
        KIND_PAIR_DEGRADED
    }
}

/// Distinct reasons of some pairs, at most `max` of them, as one sentence.
fn brief_reasons(pairs: &[&Judged], max: usize) -> String {
    let mut distinct: Vec<&str> = Vec::new();
    for r in pairs.iter().flat_map(|j| &j.verdict.reasons) {
        if !distinct.contains(&r.as_str()) {
            distinct.push(r);
        }
    }
    let shown = distinct.len().min(max);
    let mut text = distinct.get(..shown).unwrap_or_default().join("; ");
    if distinct.len() > shown {
        text.push_str(&format!(" (and {} more)", distinct.len() - shown));
    }
    text
}

/// The broken-GPU case: GPU `g` fails with every other GPU. Always critical: whatever the
/// cause, every multi-GPU job placed on it is affected.
fn gpu_finding(board: &Board<'_>, g: u32, pairs: &[&Judged]) -> Finding {
    let peers: Vec<u32> = pairs.iter().map(|j| j.other(g)).collect();
    Finding {
        severity: Severity::Critical,
        kind: kind_of(worst(pairs)),
        subject: format!("GPU {g}"),
        message: format!(
            "GPU {g}{} fails with every other GPU: all {} of its pairs ({}) are {}, so any job \
             that uses GPU {g} together with another GPU can crash or hang in collectives such \
             as all-reduce. Reasons: {}. Drain the node (or keep jobs off GPU {g}) and reset or \
             replace GPU {g}; confirm with `nvidia-smi nvlink -s -i {g}`, `nvidia-smi nvlink -e \
             -i {g}` and `nvidia-smi topo -p2p rw`.",
            board.describe(g),
            pairs.len(),
            pairs_with(&peers),
            state_of(pairs),
            brief_reasons(pairs, 8),
        ),
    }
}

/// Every pair of every live GPU fails: a node-wide cause (fabric manager, platform, driver).
fn node_finding(pairs: &[&Judged], gpus: usize) -> Finding {
    let weight = worst(pairs);
    Finding {
        severity: weight.map_or(Severity::Warning, Weight::severity),
        kind: kind_of(weight),
        subject: "all GPUs".to_string(),
        message: format!(
            "Every one of the {} pairs of the {gpus} GPUs is {}, which points at the node rather \
             than one GPU. Reasons: {}. Drain the node; on an NVSwitch system check the fabric \
             manager (`systemctl status nvidia-fabricmanager`), and check `nvidia-smi nvlink -s` \
             and `nvidia-smi topo -p2p rw`.",
            pairs.len(),
            state_of(pairs),
            brief_reasons(pairs, 8),
        ),
    }
}

fn pair_finding(j: &Judged) -> Finding {
    let (a, b) = j.key();
    let advice = match j.weight {
        Some(Weight::Down) => {
            "Jobs using these two GPUs together crash or hang at their first collective: drain \
             the node, check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p rw`, then reseat \
             or replace the GPU or its NVLink bridge."
        }
        Some(Weight::Broken) => {
            "Peer-to-peer transfers between them fail or fall back: drain the node, check \
             `nvidia-smi topo -p2p rw` and `nvidia-smi nvlink -s`, then reset or replace the GPU."
        }
        _ => {
            "The link still carries traffic but retries transfers, so jobs slow down: watch \
             `nvidia-smi nvlink -e`, and drain the node to reseat or replace the GPU if the \
             counters keep growing."
        }
    };
    let status = match j.verdict.status {
        PairStatus::Down => "down",
        _ => "degraded",
    };
    Finding {
        severity: j.weight.map_or(Severity::Warning, Weight::severity),
        kind: kind_of(j.weight),
        subject: format!("GPU {a} <-> GPU {b}"),
        message: format!(
            "GPU {a} <-> GPU {b} is {status}: {}. {advice}",
            j.verdict.reasons.join("; ")
        ),
    }
}

/// `pairs with GPUs 0-6` / `pair with GPU 3`.
fn pairs_with(peers: &[u32]) -> String {
    match peers {
        [one] => format!("pair with GPU {one}"),
        _ => format!("pairs with GPUs {}", ranges(peers)),
    }
}

/// `link 3` / `links 0, 2, 5-17`.
fn link_list(links: &[u32]) -> String {
    let mut sorted = links.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    match sorted.as_slice() {
        [one] => format!("link {one}"),
        _ => format!("links {}", ranges(&sorted)),
    }
}

/// Sorted, deduplicated numbers with runs of three or more as `a-b`.
fn ranges(numbers: &[u32]) -> String {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while let Some(&next) = iter.peek() {
            if end.checked_add(1) == Some(next) {
                end = next;
                iter.next();
            } else {
                break;
            }
        }
        match end - start {
            0 => parts.push(start.to_string()),
            1 => parts.push(format!("{start}, {end}")),
            _ => parts.push(format!("{start}-{end}")),
        }
    }
    parts.join(", ")
}

/// `250`, `1`, `0.4`: a rate per second, whole above 10.
fn rate(per_sec: f64) -> String {
    if per_sec >= 10.0 || per_sec.fract() == 0.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.1}")
    }
}

/// `60`, `0.5`: a duration in seconds as a person writes it.
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

/// The contract's snake-case name of a P2P status.
fn p2p_name(status: P2pStatus) -> &'static str {
    match status {
        P2pStatus::Ok => "ok",
        P2pStatus::ChipsetNotSupported => "chipset_not_supported",
        P2pStatus::GpuNotSupported => "gpu_not_supported",
        P2pStatus::IohTopologyNotSupported => "ioh_topology_not_supported",
        P2pStatus::DisabledByRegkey => "disabled_by_regkey",
        P2pStatus::NotSupported => "not_supported",
        P2pStatus::Unknown => "unknown",
    }
}

fn level_name(level: TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "internal",
        TopologyLevel::Single => "single",
        TopologyLevel::Multiple => "multiple",
        TopologyLevel::Hostbridge => "hostbridge",
        TopologyLevel::Node => "node",
        TopologyLevel::System => "system",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{LinkReading, P2pCaps, PairSample};

    const OK: P2pStatus = P2pStatus::Ok;
    const NS: P2pStatus = P2pStatus::NotSupported;

    // ---- builders -------------------------------------------------------------------------

    fn uuid(i: u32) -> String {
        format!("GPU-{i:08x}-aaaa-bbbb-cccc-000000000000")
    }

    fn gpu(index: u32, links: Vec<LinkReading>) -> GpuReading {
        GpuReading {
            index,
            uuid: uuid(index),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            pcie_replays: Some(0),
            lost: false,
            links,
        }
    }

    fn link(l: u32, peer: Peer) -> LinkReading {
        LinkReading {
            link: l,
            active: true,
            peer,
            errors: Some(LinkErrors::default()),
        }
    }

    fn errs(replay: u64, recovery: u64, crc_flit: u64, crc_data: u64, ecc: u64) -> LinkErrors {
        LinkErrors {
            replay,
            recovery,
            crc_flit,
            crc_data,
            ecc_data: ecc,
        }
    }

    fn caps(read: P2pStatus, write: P2pStatus, nvlink: P2pStatus) -> P2pCaps {
        P2pCaps {
            read,
            write,
            nvlink,
            atomics: read,
        }
    }

    fn pair(a: u32, b: u32, p2p: Option<P2pCaps>, topology: Option<TopologyLevel>) -> PairSample {
        PairSample {
            gpu: a,
            peer_gpu: b,
            p2p,
            topology,
        }
    }

    /// Every unordered pair of `0..n`, described by `f`.
    fn all_pairs(
        n: u32,
        f: impl Fn(u32, u32) -> (Option<P2pCaps>, Option<TopologyLevel>),
    ) -> Vec<PairSample> {
        let mut out = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                let (p2p, topology) = f(a, b);
                out.push(pair(a, b, p2p, topology));
            }
        }
        out
    }

    /// Two sockets: GPUs of the same half share a NUMA node, the others meet at the system.
    fn socket_level(n: u32, a: u32, b: u32) -> TopologyLevel {
        if (a < n / 2) == (b < n / 2) {
            TopologyLevel::Node
        } else {
            TopologyLevel::System
        }
    }

    /// 8 PCIe GPUs, no NVLink; P2P read/write ok everywhere except pairs with `broken`.
    fn pcie8(broken: Option<u32>) -> GpuSample {
        GpuSample {
            gpus: (0..8).map(|i| gpu(i, Vec::new())).collect(),
            pairs: all_pairs(8, |a, b| {
                let bad = Some(a) == broken || Some(b) == broken;
                let st = if bad { NS } else { OK };
                (Some(caps(st, st, NS)), Some(socket_level(8, a, b)))
            }),
        }
    }

    /// `n` GPUs, each with one direct NVLink to every other: GPU a's links are numbered in the
    /// order of its peers, so GPU 0's link 2 leads to GPU 3 and GPU 3's link 0 to GPU 0.
    fn mesh(n: u32) -> GpuSample {
        GpuSample {
            gpus: (0..n)
                .map(|a| {
                    let peers = (0..n).filter(|&b| b != a);
                    gpu(
                        a,
                        peers
                            .enumerate()
                            .map(|(l, b)| link(l as u32, Peer::Gpu(b)))
                            .collect(),
                    )
                })
                .collect(),
            pairs: all_pairs(n, |a, b| {
                (Some(caps(OK, OK, OK)), Some(socket_level(n, a, b)))
            }),
        }
    }

    fn mesh_link(a: u32, b: u32) -> u32 {
        if b < a {
            b
        } else {
            b - 1
        }
    }

    /// `n` GPUs on NVSwitches, `links` switch links each; P2P ok everywhere, NVLink included.
    fn nvswitch(n: u32, links: u32) -> GpuSample {
        GpuSample {
            gpus: (0..n)
                .map(|a| gpu(a, (0..links).map(|l| link(l, Peer::Switch)).collect()))
                .collect(),
            pairs: all_pairs(n, |a, b| {
                (Some(caps(OK, OK, OK)), Some(socket_level(n, a, b)))
            }),
        }
    }

    fn gpu_mut(s: &mut GpuSample, index: u32) -> &mut GpuReading {
        s.gpus.iter_mut().find(|g| g.index == index).expect("gpu")
    }

    fn link_mut(s: &mut GpuSample, index: u32, l: u32) -> &mut LinkReading {
        gpu_mut(s, index)
            .links
            .iter_mut()
            .find(|x| x.link == l)
            .expect("link")
    }

    fn set_p2p(s: &mut GpuSample, a: u32, b: u32, p2p: Option<P2pCaps>) {
        s.pairs
            .iter_mut()
            .find(|p| p.gpu == a && p.peer_gpu == b)
            .expect("pair")
            .p2p = p2p;
    }

    fn verdict(j: &Judgement, a: u32, b: u32) -> &PairVerdict {
        j.pairs
            .iter()
            .find(|p| p.gpu == a && p.peer_gpu == b)
            .expect("verdict")
    }

    /// Every pair with `g` has `status`, every other pair is ok.
    fn assert_only_pairs_of(j: &Judgement, g: u32, status: PairStatus) {
        for p in &j.pairs {
            if p.gpu == g || p.peer_gpu == g {
                assert_eq!(
                    p.status, status,
                    "{}-{}: {:?}",
                    p.gpu, p.peer_gpu, p.reasons
                );
            } else {
                assert_eq!(
                    p.status,
                    PairStatus::Ok,
                    "{}-{}: {:?}",
                    p.gpu,
                    p.peer_gpu,
                    p.reasons
                );
                assert!(p.reasons.is_empty());
            }
        }
    }

    fn all_ok(j: &Judgement) -> bool {
        j.pairs
            .iter()
            .all(|p| p.status == PairStatus::Ok && p.reasons.is_empty())
    }

    fn secs_after(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn judge_once(sample: &GpuSample) -> Judgement {
        PairJudge::new(PairRules::default()).judge(sample, Instant::now())
    }

    // ---- rules and shape ------------------------------------------------------------------

    #[test]
    fn defaults_follow_dcgm() {
        let r = PairRules::default();
        assert_eq!(r.window, Duration::from_secs(60));
        assert_eq!(r.replay_recovery_degraded, 1);
        assert_eq!(r.crc_degraded_per_sec, 100.0);
        assert_eq!(PairJudge::default().rules(), &r);
    }

    #[test]
    fn every_unordered_pair_once_sorted() {
        let j = judge_once(&pcie8(None));
        let keys: Vec<(u32, u32)> = j.pairs.iter().map(|p| (p.gpu, p.peer_gpu)).collect();
        let mut expected = Vec::new();
        for a in 0..8 {
            for b in a + 1..8 {
                expected.push((a, b));
            }
        }
        assert_eq!(keys, expected);
        assert_eq!(keys.len(), 28);
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
        let p = verdict(&j, 0, 7);
        assert_eq!(p.p2p, Some(caps(OK, OK, NS)));
        assert_eq!(p.topology, Some(TopologyLevel::System));
        assert!(p.links.is_empty());
    }

    // ---- the broken GPU 7 -----------------------------------------------------------------

    #[test]
    fn pcie_board_gpu7_without_p2p_is_caught_at_first_sight() {
        let j = judge_once(&pcie8(Some(7)));
        assert_only_pairs_of(&j, 7, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 0, 7).reasons,
            vec![
                "P2P read and write not_supported while 12 other pairs at topology level \
                 system can"
                    .to_string()
            ]
        );
        assert_eq!(
            verdict(&j, 4, 7).reasons,
            vec![
                "P2P read and write not_supported while 9 other pairs at topology level node can"
                    .to_string()
            ]
        );
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.kind, "gpu_pair_degraded");
        assert_eq!(f.subject, "GPU 7");
        assert!(f.message.contains(&uuid(7)), "{}", f.message);
        assert!(f
            .message
            .contains("all 7 of its pairs (pairs with GPUs 0-6) are degraded"));
        assert!(f.message.contains("at topology level node can"));
        assert!(f.message.contains("Drain the node"));
        assert!(f.message.contains("nvidia-smi topo -p2p rw"));
        assert!(f.message.contains("nvidia-smi nvlink -s -i 7"));
    }

    #[test]
    fn board_without_p2p_anywhere_is_fine() {
        let mut s = pcie8(None);
        for p in &mut s.pairs {
            p.p2p = Some(caps(NS, NS, NS));
        }
        let j = judge_once(&s);
        assert_eq!(j.pairs.len(), 28);
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
    }

    #[test]
    fn p2p_only_within_a_socket_is_fine() {
        let mut s = pcie8(None);
        for p in &mut s.pairs {
            if p.topology == Some(TopologyLevel::System) {
                p.p2p = Some(caps(P2pStatus::ChipsetNotSupported, NS, NS));
            }
        }
        let j = judge_once(&s);
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
        assert_eq!(
            verdict(&j, 0, 4).p2p.map(|c| c.read),
            Some(P2pStatus::ChipsetNotSupported)
        );
    }

    #[test]
    fn mesh_gpu3_links_inactive_makes_its_pairs_down() {
        let mut s = mesh(4);
        for other in 0..3 {
            link_mut(&mut s, 3, mesh_link(3, other)).active = false;
            link_mut(&mut s, other, mesh_link(other, 3)).active = false;
        }
        let j = judge_once(&s);
        assert_only_pairs_of(&j, 3, PairStatus::Down);
        let p = verdict(&j, 0, 3);
        assert_eq!(p.links, vec![2]);
        assert_eq!(
            p.reasons,
            vec![
                "link 2 of GPU 0 to GPU 3 is inactive".to_string(),
                "link 0 of GPU 3 to GPU 0 is inactive".to_string(),
            ]
        );
        assert_eq!(verdict(&j, 1, 2).links, vec![1]);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_link_down", "GPU 3")
        );
        assert!(f
            .message
            .contains("all 3 of its pairs (pairs with GPUs 0-2) are down"));
        assert!(f.message.contains("link 2 of GPU 1 to GPU 3 is inactive"));
    }

    #[test]
    fn healthy_mesh_lists_direct_links() {
        let j = judge_once(&mesh(4));
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
        assert_eq!(verdict(&j, 0, 1).links, vec![0]);
        assert_eq!(verdict(&j, 0, 3).links, vec![2]);
        assert_eq!(verdict(&j, 2, 3).links, vec![2]);
    }

    #[test]
    fn several_links_between_two_gpus_are_all_listed() {
        let mut s = GpuSample {
            gpus: vec![
                gpu(
                    0,
                    vec![
                        link(5, Peer::Gpu(1)),
                        link(1, Peer::Gpu(1)),
                        link(3, Peer::Gpu(1)),
                    ],
                ),
                gpu(1, vec![link(0, Peer::Gpu(0))]),
            ],
            pairs: vec![pair(
                0,
                1,
                Some(caps(OK, OK, OK)),
                Some(TopologyLevel::Node),
            )],
        };
        let j = judge_once(&s);
        assert_eq!(verdict(&j, 0, 1).links, vec![1, 3, 5]);
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
        // one of three links inactive is still down, per the contract
        link_mut(&mut s, 0, 3).active = false;
        let j = judge_once(&s);
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Down);
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["link 3 of GPU 0 to GPU 1 is inactive".to_string()]
        );
        // two GPUs: always a pair finding
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].subject, "GPU 0 <-> GPU 1");
        assert_eq!(j.findings[0].kind, "gpu_link_down");
    }

    #[test]
    fn nvswitch_gpu7_links_inactive_is_one_finding() {
        let mut s = nvswitch(8, 18);
        for l in &mut gpu_mut(&mut s, 7).links {
            l.active = false;
        }
        let j = judge_once(&s);
        assert_eq!(j.pairs.len(), 28);
        assert_only_pairs_of(&j, 7, PairStatus::Down);
        assert_eq!(
            verdict(&j, 3, 7).reasons,
            vec!["all 18 NVSwitch links of GPU 7 are inactive".to_string()]
        );
        assert!(j.pairs.iter().all(|p| p.links.is_empty()));
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_link_down", "GPU 7")
        );
        assert!(f.message.contains(&uuid(7)));
        assert!(f.message.contains("pairs with GPUs 0-6"));
        assert_eq!(
            j.findings
                .iter()
                .filter(|f| f.message.contains("GPU 7"))
                .count(),
            1
        );
    }

    #[test]
    fn nvswitch_gpu7_replay_errors_degrade_all_its_pairs() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = nvswitch(8, 18);
        let j = judge.judge(&s, t0);
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());

        link_mut(&mut s, 7, 2).errors = Some(errs(3, 0, 0, 0, 0));
        link_mut(&mut s, 7, 5).errors = Some(errs(1, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert_only_pairs_of(&j, 7, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 0, 7).reasons,
            vec!["NVLink replay errors on GPU 7 links 2, 5: +4 in the last 60 s".to_string()]
        );
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_pair_degraded", "GPU 7")
        );
        assert!(f
            .message
            .contains("NVLink replay errors on GPU 7 links 2, 5"));
    }

    #[test]
    fn nvswitch_gpu7_unresolved_links_caught_by_nvlink_p2p() {
        // The collector could not resolve GPU 7's dead links (peer unknown), but NVML's P2P
        // status says NVLink no longer reaches GPU 7 while it reaches the other 21 pairs.
        let mut s = nvswitch(8, 18);
        for l in &mut gpu_mut(&mut s, 7).links {
            l.active = false;
            l.peer = Peer::Unknown;
        }
        for a in 0..7 {
            set_p2p(&mut s, a, 7, Some(caps(OK, OK, NS)));
        }
        let j = judge_once(&s);
        assert_only_pairs_of(&j, 7, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 2, 7).reasons,
            vec![
                "P2P over NVLink not_supported while 21 other pairs on this NVSwitch fabric can"
                    .to_string()
            ]
        );
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].subject, "GPU 7");
        assert_eq!(j.findings[0].severity, Severity::Critical);
    }

    #[test]
    fn nvlink_capability_is_not_compared_without_nvswitch() {
        // PCIe GPUs with NVLink bridges in pairs (0-1, 2-3): NVLink P2P only within a bridge.
        let s = GpuSample {
            gpus: vec![
                gpu(0, vec![link(0, Peer::Gpu(1))]),
                gpu(1, vec![link(0, Peer::Gpu(0))]),
                gpu(2, vec![link(0, Peer::Gpu(3))]),
                gpu(3, vec![link(0, Peer::Gpu(2))]),
            ],
            pairs: all_pairs(4, |a, b| {
                let bridged = (a, b) == (0, 1) || (a, b) == (2, 3);
                let nv = if bridged { OK } else { NS };
                (Some(caps(OK, OK, nv)), Some(TopologyLevel::Node))
            }),
        };
        let j = judge_once(&s);
        assert!(all_ok(&j), "{:#?}", j.pairs);
        assert!(j.findings.is_empty());
    }

    #[test]
    fn mixed_models_are_compared_with_their_like() {
        // three T4s and an A100 under one NUMA node: P2P between different models is not
        // supported, which is the platform, not a broken GPU
        let mut s = GpuSample {
            gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
            pairs: all_pairs(4, |_, b| {
                let st = if b == 3 {
                    P2pStatus::GpuNotSupported
                } else {
                    OK
                };
                (Some(caps(st, st, NS)), Some(TopologyLevel::Node))
            }),
        };
        for g in &mut s.gpus {
            g.name = if g.index == 3 {
                "NVIDIA A100-PCIE-40GB".into()
            } else {
                "Tesla T4".into()
            };
        }
        let j = judge_once(&s);
        assert!(all_ok(&j), "{:#?}", j.pairs);
        assert!(j.findings.is_empty());
        // a T4 pair failing where the other T4 pairs work is still caught
        set_p2p(&mut s, 1, 2, Some(caps(NS, NS, NS)));
        let j = judge_once(&s);
        assert_eq!(
            verdict(&j, 1, 2).reasons,
            vec![
                "P2P read and write not_supported while 2 other pairs at topology level node can"
                    .to_string()
            ]
        );
        assert_eq!(
            j.pairs
                .iter()
                .filter(|p| p.status != PairStatus::Ok)
                .count(),
            1
        );
    }

    #[test]
    fn some_nvswitch_links_inactive_degrade() {
        let mut s = nvswitch(8, 18);
        link_mut(&mut s, 7, 3).active = false;
        link_mut(&mut s, 7, 4).active = false;
        let j = judge_once(&s);
        assert_only_pairs_of(&j, 7, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 6, 7).reasons,
            vec!["2 of 18 NVSwitch links of GPU 7 are inactive (links 3, 4)".to_string()]
        );
        assert_eq!(j.findings.len(), 1);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_pair_degraded", "GPU 7")
        );
    }

    #[test]
    fn every_pair_down_is_one_node_finding() {
        let mut s = nvswitch(8, 12);
        for g in &mut s.gpus {
            for l in &mut g.links {
                l.active = false;
            }
        }
        let j = judge_once(&s);
        assert!(j.pairs.iter().all(|p| p.status == PairStatus::Down));
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec![
                "all 12 NVSwitch links of GPU 0 are inactive".to_string(),
                "all 12 NVSwitch links of GPU 1 are inactive".to_string(),
            ]
        );
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_link_down", "all GPUs")
        );
        assert!(f
            .message
            .contains("Every one of the 28 pairs of the 8 GPUs is down"));
        assert!(f.message.contains("nvidia-fabricmanager"));
        assert!(f
            .message
            .contains("all 12 NVSwitch links of GPU 7 are inactive"));
        assert!(!f.message.contains("more)"), "{}", f.message);
    }

    #[test]
    fn two_broken_gpus_are_two_findings() {
        let mut s = nvswitch(8, 18);
        for g in [6, 7] {
            for l in &mut gpu_mut(&mut s, g).links {
                l.active = false;
            }
        }
        let j = judge_once(&s);
        let down = j
            .pairs
            .iter()
            .filter(|p| p.status == PairStatus::Down)
            .count();
        assert_eq!(down, 13);
        let subjects: Vec<&str> = j.findings.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(subjects, vec!["GPU 6", "GPU 7"]);
        assert!(j.findings.iter().all(|f| f.kind == "gpu_link_down"));
    }

    #[test]
    fn broken_gpu_and_an_unrelated_pair_are_two_findings() {
        let mut s = pcie8(Some(7));
        set_p2p(&mut s, 2, 3, Some(caps(OK, NS, NS)));
        let j = judge_once(&s);
        assert_eq!(verdict(&j, 2, 3).status, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 2, 3).reasons,
            vec![
                "P2P write not_supported while 8 other pairs at topology level node can"
                    .to_string()
            ]
        );
        let subjects: Vec<&str> = j.findings.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(subjects, vec!["GPU 7", "GPU 2 <-> GPU 3"]);
        assert_eq!(j.findings[1].kind, "gpu_pair_degraded");
        assert_eq!(j.findings[1].severity, Severity::Critical);
    }

    #[test]
    fn separate_failing_pairs_are_a_finding_each() {
        let mut s = pcie8(None);
        set_p2p(&mut s, 0, 1, Some(caps(NS, OK, NS)));
        set_p2p(
            &mut s,
            5,
            6,
            Some(caps(P2pStatus::Unknown, P2pStatus::GpuNotSupported, NS)),
        );
        let j = judge_once(&s);
        assert_eq!(
            verdict(&j, 5, 6).reasons,
            vec![
                "P2P read unknown and write gpu_not_supported while 10 other pairs at topology \
                 level node can"
                    .to_string()
            ]
        );
        let subjects: Vec<&str> = j.findings.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(subjects, vec!["GPU 0 <-> GPU 1", "GPU 5 <-> GPU 6"]);
        assert!(j.findings[0]
            .message
            .starts_with("GPU 0 <-> GPU 1 is degraded: P2P read"));
    }

    // ---- error counters over time ---------------------------------------------------------

    #[test]
    fn replay_growth_degrades_then_leaves_the_window() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        let j = judge.judge(&s, t0);
        assert!(all_ok(&j));

        link_mut(&mut s, 0, 0).errors = Some(errs(3, 0, 0, 0, 0));
        for t in (5..=60).step_by(5) {
            let j = judge.judge(&s, secs_after(t0, t));
            assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded, "at {t} s");
            assert_eq!(
                verdict(&j, 0, 1).reasons,
                vec!["NVLink replay errors on GPU 0 link 0: +3 in the last 60 s".to_string()]
            );
            assert_eq!(
                j.pairs
                    .iter()
                    .filter(|p| p.status != PairStatus::Ok)
                    .count(),
                1
            );
            assert_eq!(j.findings.len(), 1);
            let f = &j.findings[0];
            assert_eq!(
                (f.severity, f.kind, f.subject.as_str()),
                (Severity::Warning, "gpu_pair_degraded", "GPU 0 <-> GPU 1")
            );
            assert!(f.message.contains("nvidia-smi nvlink -e"));
        }
        // seen at 5 s; at 65 s that is more than 60 s ago
        let j = judge.judge(&s, secs_after(t0, 65));
        assert!(all_ok(&j), "{:#?}", j.pairs);
        assert!(j.findings.is_empty());
        // the history covers the window and one baseline, no more: samples 5..=65
        assert_eq!(judge.counters[&(uuid(0), 0)].len(), 13);
    }

    #[test]
    fn growth_counts_from_the_newest_sample_outside_the_window() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        judge.judge(&s, t0);
        link_mut(&mut s, 0, 0).errors = Some(errs(2, 0, 0, 0, 0));
        assert_eq!(
            verdict(&judge.judge(&s, secs_after(t0, 30)), 0, 1).status,
            PairStatus::Degraded
        );
        link_mut(&mut s, 0, 0).errors = Some(errs(5, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 80));
        // baseline is the sample at 0 s (newest at or before 20 s): +5
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["NVLink replay errors on GPU 0 link 0: +5 in the last 60 s".to_string()]
        );
        let j = judge.judge(&s, secs_after(t0, 95));
        // baseline now the sample at 30 s: +3
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["NVLink replay errors on GPU 0 link 0: +3 in the last 60 s".to_string()]
        );
        let j = judge.judge(&s, secs_after(t0, 140));
        assert!(all_ok(&j));
    }

    #[test]
    fn recovery_and_ecc_growth_are_reasons() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        judge.judge(&s, t0);
        link_mut(&mut s, 1, 0).errors = Some(errs(0, 2, 0, 0, 1));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec![
                "NVLink recovery errors on GPU 1 link 0: +2 in the last 60 s".to_string(),
                "NVLink ECC data errors on GPU 1 link 0: +1 in the last 60 s".to_string(),
            ]
        );
        assert_eq!(verdict(&j, 1, 2).status, PairStatus::Ok);
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].severity, Severity::Warning);
    }

    #[test]
    fn slow_crc_growth_warns_but_the_pair_stays_ok() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        judge.judge(&s, t0);
        link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 3, 2, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert!(all_ok(&j));
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Warning, "gpu_link_errors", "GPU 0")
        );
        assert!(
            f.message.contains("link 0 CRC +5 (up to 1/s)"),
            "{}",
            f.message
        );
        assert!(f.message.contains(&uuid(0)));
        // the warning lasts while the growth is in the window
        let j = judge.judge(&s, secs_after(t0, 60));
        assert_eq!(j.findings.len(), 1);
        let j = judge.judge(&s, secs_after(t0, 66));
        assert!(j.findings.is_empty());
    }

    #[test]
    fn fast_crc_growth_degrades_without_a_second_finding() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        judge.judge(&s, t0);
        link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 800, 200, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec![
                "NVLink CRC errors on GPU 0 link 0: +1000 in the last 60 s, up to 200/s \
                 (degraded at 100/s)"
                    .to_string()
            ]
        );
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        assert_eq!(j.findings[0].kind, "gpu_pair_degraded");
        assert_eq!(j.findings[0].subject, "GPU 0 <-> GPU 1");
    }

    #[test]
    fn crc_rate_is_between_consecutive_samples() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        judge.judge(&s, t0);
        // 90 over 1 s: below 100/s
        link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 90, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 1));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
        // another 150 over the next second: 150/s, though 240 over 2 s would average 120/s
        link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 240, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 2));
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec![
                "NVLink CRC errors on GPU 0 link 0: +240 in the last 60 s, up to 150/s \
                 (degraded at 100/s)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn counter_reset_is_a_new_baseline() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        link_mut(&mut s, 2, 1).errors = Some(errs(100, 7, 50, 50, 4));
        assert!(all_ok(&judge.judge(&s, t0)));
        // driver reload: every counter back near zero
        link_mut(&mut s, 2, 1).errors = Some(errs(3, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert!(all_ok(&j), "{:#?}", j.pairs);
        assert!(j.findings.is_empty());
        let j = judge.judge(&s, secs_after(t0, 10));
        assert!(all_ok(&j));
        link_mut(&mut s, 2, 1).errors = Some(errs(5, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 15));
        // GPU 2's link 1 leads to GPU 1
        assert_eq!(
            verdict(&j, 1, 2).reasons,
            vec!["NVLink replay errors on GPU 2 link 1: +2 in the last 60 s".to_string()]
        );
    }

    #[test]
    fn unreadable_counters_keep_the_history_and_still_expire() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        judge.judge(&s, t0);
        link_mut(&mut s, 0, 0).errors = Some(errs(4, 0, 0, 0, 0));
        judge.judge(&s, secs_after(t0, 5));
        link_mut(&mut s, 0, 0).errors = None;
        let j = judge.judge(&s, secs_after(t0, 30));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
        let j = judge.judge(&s, secs_after(t0, 70));
        assert!(all_ok(&j));
        link_mut(&mut s, 0, 0).errors = Some(errs(4, 0, 0, 0, 0));
        assert!(all_ok(&judge.judge(&s, secs_after(t0, 75))));
    }

    #[test]
    fn growth_below_a_raised_threshold_is_a_warning() {
        let t0 = Instant::now();
        let mut judge = PairJudge::new(PairRules {
            replay_recovery_degraded: 5,
            ..PairRules::default()
        });
        let mut s = mesh(4);
        judge.judge(&s, t0);
        link_mut(&mut s, 3, 2).errors = Some(errs(2, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert!(all_ok(&j));
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].kind, "gpu_link_errors");
        assert_eq!(j.findings[0].subject, "GPU 3");
        assert!(j.findings[0].message.contains("link 2 replay +2"));
        link_mut(&mut s, 3, 2).errors = Some(errs(7, 0, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 10));
        assert_eq!(verdict(&j, 2, 3).status, PairStatus::Degraded);
    }

    #[test]
    fn errors_on_a_link_to_no_gpu_are_a_warning_only() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        gpu_mut(&mut s, 1)
            .links
            .push(link(4, Peer::Pci("00000000:05:00.0".into())));
        judge.judge(&s, t0);
        link_mut(&mut s, 1, 4).errors = Some(errs(6, 1, 0, 0, 0));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert!(all_ok(&j));
        assert_eq!(j.findings.len(), 1);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Warning, "gpu_link_errors", "GPU 1")
        );
        assert!(
            f.message.contains("link 4 replay +6, recovery +1"),
            "{}",
            f.message
        );
    }

    // ---- P2P regressions, lost GPUs, flapping links -----------------------------------------

    #[test]
    fn p2p_capability_that_was_ok_and_is_not() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        assert!(all_ok(&judge.judge(&s, t0)));
        set_p2p(&mut s, 0, 1, Some(caps(NS, OK, OK)));
        let j = judge.judge(&s, secs_after(t0, 5));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
        // read and atomics (built alike) regressed; no other pair to compare with
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec![
                "P2P read was ok and is now not_supported".to_string(),
                "P2P atomics was ok and is now not_supported".to_string(),
            ]
        );
        assert_eq!(j.findings.len(), 1);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_pair_degraded", "GPU 0 <-> GPU 1")
        );
        // a failed query is no verdict, and does not forget
        set_p2p(&mut s, 0, 1, None);
        assert!(all_ok(&judge.judge(&s, secs_after(t0, 10))));
        set_p2p(&mut s, 0, 1, Some(caps(NS, OK, OK)));
        assert_eq!(
            verdict(&judge.judge(&s, secs_after(t0, 15)), 0, 1).status,
            PairStatus::Degraded
        );
        set_p2p(&mut s, 0, 1, Some(caps(OK, OK, OK)));
        assert!(all_ok(&judge.judge(&s, secs_after(t0, 20))));
    }

    #[test]
    fn p2p_never_ok_is_not_a_regression() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        set_p2p(&mut s, 0, 1, Some(caps(NS, NS, NS)));
        assert!(all_ok(&judge.judge(&s, t0)));
        assert!(all_ok(&judge.judge(&s, secs_after(t0, 5))));
    }

    #[test]
    fn link_going_down_and_coming_back() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(4);
        link_mut(&mut s, 1, mesh_link(1, 2)).active = false;
        let j = judge.judge(&s, t0);
        assert_eq!(verdict(&j, 1, 2).status, PairStatus::Down);
        assert_eq!(
            verdict(&j, 1, 2).reasons,
            vec!["link 1 of GPU 1 to GPU 2 is inactive".to_string()]
        );
        assert_eq!(
            j.pairs
                .iter()
                .filter(|p| p.status != PairStatus::Ok)
                .count(),
            1
        );
        assert_eq!(j.findings.len(), 1);
        assert_eq!(
            (
                j.findings[0].severity,
                j.findings[0].kind,
                j.findings[0].subject.as_str()
            ),
            (Severity::Critical, "gpu_link_down", "GPU 1 <-> GPU 2")
        );
        link_mut(&mut s, 1, mesh_link(1, 2)).active = true;
        let j = judge.judge(&s, secs_after(t0, 5));
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
    }

    #[test]
    fn inactive_links_to_unknown_or_pci_peers_are_ignored() {
        let mut s = mesh(2);
        let g = gpu_mut(&mut s, 0);
        g.links.push(LinkReading {
            link: 7,
            active: false,
            peer: Peer::Unknown,
            errors: None,
        });
        g.links.push(LinkReading {
            link: 8,
            active: false,
            peer: Peer::Pci("00000000:05:00.0".into()),
            errors: None,
        });
        let j = judge_once(&s);
        assert!(all_ok(&j));
        assert!(j.findings.is_empty());
        assert_eq!(verdict(&j, 0, 1).links, vec![0]);
    }

    #[test]
    fn lost_gpu_is_one_finding_and_its_pairs_are_down() {
        let mut s = GpuSample {
            gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
            pairs: all_pairs(4, |_, _| {
                (Some(caps(OK, OK, NS)), Some(TopologyLevel::Node))
            }),
        };
        gpu_mut(&mut s, 2).lost = true;
        for (a, b) in [(0, 2), (1, 2), (2, 3)] {
            set_p2p(&mut s, a, b, None);
        }
        let j = judge_once(&s);
        assert_only_pairs_of(&j, 2, PairStatus::Down);
        assert_eq!(
            verdict(&j, 2, 3).reasons,
            vec!["GPU 2 is lost (fell off the bus)".to_string()]
        );
        assert_eq!(verdict(&j, 2, 3).p2p, None);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind, f.subject.as_str()),
            (Severity::Critical, "gpu_lost", "GPU 2")
        );
        assert!(f.message.contains(&uuid(2)));
        assert!(
            f.message.contains("pairs with GPUs 0, 1, 3 are down"),
            "{}",
            f.message
        );
        assert!(f.message.contains("nvidia-smi -r -i 2"));
    }

    #[test]
    fn lone_lost_gpu_has_no_pairs_but_a_finding() {
        let mut g = gpu(0, Vec::new());
        g.lost = true;
        let j = judge_once(&GpuSample {
            gpus: vec![g],
            pairs: Vec::new(),
        });
        assert!(j.pairs.is_empty());
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].kind, "gpu_lost");
        assert!(j.findings[0]
            .message
            .contains("so every job using it fails. Drain the node"));
    }

    #[test]
    fn lost_gpu_and_an_unrelated_down_link() {
        let mut s = mesh(4);
        let g3 = gpu_mut(&mut s, 3);
        g3.lost = true;
        g3.links.clear();
        link_mut(&mut s, 0, mesh_link(0, 1)).active = false;
        let j = judge_once(&s);
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Down);
        assert_eq!(verdict(&j, 0, 3).status, PairStatus::Down);
        assert_eq!(verdict(&j, 1, 2).status, PairStatus::Ok);
        let found: Vec<(&str, &str)> = j
            .findings
            .iter()
            .map(|f| (f.kind, f.subject.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![("gpu_lost", "GPU 3"), ("gpu_link_down", "GPU 0 <-> GPU 1")]
        );
    }

    #[test]
    fn missing_p2p_is_not_a_verdict() {
        let s = GpuSample {
            gpus: (0..3).map(|i| gpu(i, Vec::new())).collect(),
            pairs: Vec::new(),
        };
        let j = judge_once(&s);
        assert_eq!(j.pairs.len(), 3);
        assert!(all_ok(&j));
        assert!(j
            .pairs
            .iter()
            .all(|p| p.p2p.is_none() && p.topology.is_none()));
        assert!(j.findings.is_empty());
    }

    #[test]
    fn unknown_topology_is_its_own_level() {
        let mut s = GpuSample {
            gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
            pairs: all_pairs(4, |_, _| (Some(caps(OK, OK, NS)), None)),
        };
        set_p2p(&mut s, 0, 1, Some(caps(NS, OK, NS)));
        // the only pair at level node: nothing to compare with
        let p23 = s
            .pairs
            .iter_mut()
            .find(|p| (p.gpu, p.peer_gpu) == (2, 3))
            .expect("pair");
        p23.topology = Some(TopologyLevel::Node);
        p23.p2p = Some(caps(NS, NS, NS));
        let j = judge_once(&s);
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["P2P read not_supported while 4 other pairs of unknown topology can".to_string()]
        );
        assert_eq!(verdict(&j, 2, 3).status, PairStatus::Ok);
        assert_eq!(
            j.pairs
                .iter()
                .filter(|p| p.status != PairStatus::Ok)
                .count(),
            1
        );
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].subject, "GPU 0 <-> GPU 1");
    }

    // ---- identity across scans ------------------------------------------------------------

    #[test]
    fn reordered_gpus_are_matched_by_uuid() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let mut s = mesh(2);
        link_mut(&mut s, 0, 0).errors = Some(errs(10, 0, 0, 0, 0));
        assert!(all_ok(&judge.judge(&s, t0)));

        // NVML now enumerates them the other way round: index 1 is the GPU that was index 0
        let mut swapped = s.clone();
        swapped.gpus[0].index = 1;
        swapped.gpus[0].links[0].peer = Peer::Gpu(0);
        swapped.gpus[1].index = 0;
        swapped.gpus[1].links[0].peer = Peer::Gpu(1);
        let j = judge.judge(&swapped, secs_after(t0, 5));
        assert!(all_ok(&j), "{:#?}", j.pairs);
        assert!(j.findings.is_empty());

        // real growth on that GPU, under its new index
        swapped.gpus[0].links[0].errors = Some(errs(12, 0, 0, 0, 0));
        let j = judge.judge(&swapped, secs_after(t0, 10));
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["NVLink replay errors on GPU 1 link 0: +2 in the last 60 s".to_string()]
        );
    }

    #[test]
    fn baselines_of_vanished_gpus_are_dropped() {
        let t0 = Instant::now();
        let mut judge = PairJudge::default();
        let full = mesh(3);
        judge.judge(&full, t0);
        assert!(judge.counters.keys().any(|(u, _)| *u == uuid(2)));
        assert!(judge.p2p_ever_ok.keys().any(|(_, b)| *b == uuid(2)));

        let mut without = full.clone();
        without.gpus.retain(|g| g.index != 2);
        without.pairs.retain(|p| p.peer_gpu != 2);
        for g in &mut without.gpus {
            g.links.retain(|l| l.peer != Peer::Gpu(2));
        }
        let j = judge.judge(&without, secs_after(t0, 5));
        assert_eq!(j.pairs.len(), 1);
        assert!(all_ok(&j));
        assert!(!judge.counters.keys().any(|(u, _)| *u == uuid(2)));
        assert!(!judge
            .p2p_ever_ok
            .keys()
            .any(|(a, b)| *a == uuid(2) || *b == uuid(2)));

        // it comes back with higher counters and no P2P: neither is news about a baseline
        let mut back = full.clone();
        for l in &mut gpu_mut(&mut back, 2).links {
            l.errors = Some(errs(50, 0, 0, 0, 0));
        }
        let j = judge.judge(&back, secs_after(t0, 10));
        assert!(all_ok(&j), "{:#?}", j.pairs);
    }

    // ---- hostile input --------------------------------------------------------------------

    #[test]
    fn odd_input_does_not_panic() {
        let mut a = gpu(0, Vec::new());
        a.links = vec![
            LinkReading {
                link: 0,
                active: false,
                peer: Peer::Gpu(0),
                errors: Some(errs(u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX)),
            },
            LinkReading {
                link: 1,
                active: false,
                peer: Peer::Gpu(99),
                errors: None,
            },
            LinkReading {
                link: u32::MAX,
                active: true,
                peer: Peer::Gpu(1),
                errors: Some(LinkErrors::default()),
            },
        ];
        let mut b = gpu(1, vec![link(0, Peer::Switch)]);
        b.uuid.clear();
        let duplicate = gpu(1, vec![link(0, Peer::Gpu(0))]);
        let s = GpuSample {
            gpus: vec![a, b, duplicate],
            pairs: vec![
                pair(3, 3, Some(caps(NS, NS, NS)), None),
                pair(1, 0, Some(caps(OK, OK, OK)), Some(TopologyLevel::Single)),
                pair(0, 1, Some(caps(NS, NS, NS)), None),
            ],
        };
        let mut judge = PairJudge::new(PairRules {
            window: Duration::ZERO,
            replay_recovery_degraded: 0,
            crc_degraded_per_sec: f64::NAN,
        });
        let t0 = Instant::now();
        let j = judge.judge(&s, t0);
        assert_eq!(j.pairs.len(), 1);
        let p = verdict(&j, 0, 1);
        assert_eq!(p.status, PairStatus::Ok, "{:?}", p.reasons);
        // the first of two samples of a pair counts
        assert_eq!(p.p2p, Some(caps(OK, OK, OK)));
        assert_eq!(p.topology, Some(TopologyLevel::Single));
        assert_eq!(p.links, vec![u32::MAX]);
        assert!(j.findings.is_empty());

        // time running backwards, same instant twice, counters at the top of their range
        let mut s2 = s.clone();
        s2.gpus[0].links[2].errors = Some(errs(5, 5, 5, 5, 5));
        let j = judge.judge(&s2, secs_after(t0, 10));
        // a zero window holds nothing recent enough to count
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
        assert!(j.findings.is_empty());
        let j = judge.judge(&s2, t0);
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
        let j = judge.judge(&s2, t0);
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
        let j = judge.judge(&GpuSample::default(), t0);
        assert_eq!(j, Judgement::default());
        assert!(judge.counters.is_empty());
        assert!(judge.p2p_ever_ok.is_empty());
    }

    #[test]
    fn helpers_format_as_a_person_writes() {
        assert_eq!(link_list(&[3]), "link 3");
        assert_eq!(link_list(&[5, 0, 1, 2, 7, 8, 2]), "links 0-2, 5, 7, 8");
        assert_eq!(
            ranges(&[u32::MAX - 1, u32::MAX]),
            format!("{}, {}", u32::MAX - 1, u32::MAX)
        );
        assert_eq!(ranges(&[]), "");
        assert_eq!(secs(Duration::from_secs(60)), "60");
        assert_eq!(rate(250.4), "250");
        assert_eq!(rate(1.0), "1");
        assert_eq!(rate(0.4), "0.4");
        assert_eq!(secs(Duration::from_millis(500)), "0.5");
        assert_eq!(pairs_with(&[3]), "pair with GPU 3");
        assert_eq!(
            p2p_name(P2pStatus::IohTopologyNotSupported),
            "ioh_topology_not_supported"
        );
        for status in [
            P2pStatus::Ok,
            P2pStatus::ChipsetNotSupported,
            P2pStatus::GpuNotSupported,
            P2pStatus::IohTopologyNotSupported,
            P2pStatus::DisabledByRegkey,
            P2pStatus::NotSupported,
            P2pStatus::Unknown,
        ] {
            let json = serde_json::to_string(&status).expect("json");
            assert_eq!(json, format!("\"{}\"", p2p_name(status)));
        }
        for level in [
            TopologyLevel::Internal,
            TopologyLevel::Single,
            TopologyLevel::Multiple,
            TopologyLevel::Hostbridge,
            TopologyLevel::Node,
            TopologyLevel::System,
        ] {
            let json = serde_json::to_string(&level).expect("json");
            assert_eq!(json, format!("\"{}\"", level_name(level)));
        }
    }
}

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
//!    3b. The NVLink5 counters of Blackwell GPUs (`nvlink5.rs`): failed link recoveries as
//!    replay errors; successful recoveries, symbol and effective error rates and BERs over
//!    their thresholds as degrading reasons (warnings), never down.
//!    3c. NVML's word on a whole GPU (`gpu_state.rs`): a recovery action that drains P2P, or
//!    an unhealthy fabric registration on an NVSwitch board, degrades all of the GPU's pairs.
//! 4. A P2P capability (read, write, nvlink, atomics) that was ever ok for a pair and now is not
//!    makes the pair `degraded`.
//! 5. The outlier test, which needs no history: among pairs at the same PCIe topology level, if
//!    any pair has P2P read and write ok, a pair whose read or write is not ok is `degraded`. A
//!    board where no pair at that level can is fine (the platform, not a GPU). On an NVSwitch
//!    board, where every pair should reach every other over NVLink, the same goes for the nvlink
//!    capability across all pairs.
//!
//! 6. Findings, one per problem a person acts on (`findings.rs`), and which GPUs they blame
//!    (`blame.rs`).
//! 7. The PCIe path under the GPUs (`pcie.rs`): a busy GPU's link trained down, AER errors on
//!    it or a bridge above it, ACS redirecting P2P on a bridge between two GPUs; the pairs whose
//!    P2P crosses PCIe get a reason for each.
//!
//! 8. The pair probe's verdicts, where `serve` runs it (`probe_results.rs`): a direction that
//!    failed makes the pair `degraded` (`Broken`), one that ran slow `degraded` (`Errors`).
//!
//! Files: `board.rs` indexes the sample, `reasons.rs` weighs reasons into a status, `rules/`
//! holds rules 1-5, 7 and 8 (one file per family, named above), `findings.rs` and `blame.rs`
//! rule 6.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

mod board;
mod findings;
mod reasons;
mod rules;

pub use crate::model::Weight;
pub use rules::window::CarriedWindow;

/// Since when each failing pair (by its GPUs' keys: UUID, or `#index`) has failed.
pub type FailingSince = HashMap<(String, String), SystemTime>;

use board::Board;
use reasons::Judged;
use rules::counters::CounterHistory;
use rules::nvlink5::Nvlink5History;
use rules::p2p::P2pMemory;
use rules::{counters, gpu_state, links, nvlink5, p2p, pcie, probe_results};

use crate::model::{Blame, Finding, PcieDowntrain};
use crate::model::{GpuSample, LinkErrors, PairStatus, PairVerdict};

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
    /// NVLink5 symbol or effective errors per second between two consecutive samples at or
    /// above which the pairs the link serves are degraded (a warning). 0.4/s is `ber_degraded`
    /// at an NVLink5 link's line rate: 2 lanes x 200 Gb/s = 4e11 bit/s per direction.
    pub nvlink5_errors_degraded_per_sec: f64,
    /// An NVLink5 effective or symbol BER at or above which the pairs the link serves are
    /// degraded (a warning): 1e-12, the link bit error rate objective of InfiniBand, whose
    /// 200 Gb/s-per-lane SerDes generation NVLink5 shares.
    pub ber_degraded: f64,
}

impl Default for PairRules {
    fn default() -> Self {
        PairRules {
            window: Duration::from_secs(60),
            replay_recovery_degraded: 1,
            crc_degraded_per_sec: 100.0,
            nvlink5_errors_degraded_per_sec: 0.4,
            ber_degraded: 1e-12,
        }
    }
}

/// The outcome of one [`PairJudge::judge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    /// Every unordered pair of the sample's GPUs, `gpu < peer_gpu`, sorted.
    pub pairs: Vec<PairVerdict>,
    pub findings: Vec<Finding>,
    /// Which GPUs the failing pairs point at.
    pub blame: Blame,
    /// The GPUs whose PCIe link trained down, by index (rule 7): the GPU verdicts carry them.
    pub pcie: BTreeMap<u32, PcieDowntrain>,
}

/// Judges GPU pairs scan after scan; keeps the baselines that rules 3 and 4 need.
#[derive(Debug, Default)]
pub struct PairJudge {
    rules: PairRules,
    counters: CounterHistory,
    nvlink5: Nvlink5History,
    p2p_ever_ok: P2pMemory,
    /// AER totals of the devices on the GPUs' PCIe paths (rule 7).
    aer: pcie::AerHistory,
    /// Since when each failing pair (by its GPUs' UUIDs) has failed.
    failing_since: FailingSince,
}

impl PairJudge {
    pub fn new(rules: PairRules) -> Self {
        PairJudge {
            rules,
            counters: CounterHistory::default(),
            nvlink5: Nvlink5History::default(),
            p2p_ever_ok: HashMap::new(),
            aer: HashMap::new(),
            failing_since: HashMap::new(),
        }
    }

    /// Since when each pair (by its GPUs' UUIDs, or `#index`) failed before a restart: a
    /// pair still failing at the next judgement keeps that time; one that is not starts over.
    pub fn resume_failing_since(&mut self, since: FailingSince) {
        self.failing_since = since;
    }

    /// The NVLink (DL) counter windows that hold growth, for a restart to carry: what keeps
    /// pairs degraded for `window` after errors goes on, not over.
    pub fn carry_windows(&self, now: Instant) -> Vec<CarriedWindow<LinkErrors>> {
        self.counters.carry(now)
    }

    /// Takes up windows carried `since_save` ago.
    pub fn resume_windows(
        &mut self,
        carried: Vec<CarriedWindow<LinkErrors>>,
        since_save: Duration,
        now: Instant,
    ) {
        self.counters.resume(carried, since_save, now);
    }

    /// Judges one sample. `now` is when the sample was taken (tests pass synthetic instants).
    pub fn judge(&mut self, sample: &GpuSample, now: Instant) -> Judgement {
        self.judge_at(sample, now, SystemTime::now())
    }

    /// [`PairJudge::judge`], with the clock time of `now` for the pairs' `since`.
    pub fn judge_at(&mut self, sample: &GpuSample, now: Instant, clock: SystemTime) -> Judgement {
        let board = Board::new(sample);
        let mut pairs = board.pair_states(sample);
        links::lost_rule(&board, &mut pairs);
        links::link_state_rule(&board, &mut pairs);
        let mut notices =
            counters::counter_rule(&mut self.counters, &self.rules, &board, now, &mut pairs);
        notices.extend(nvlink5::nvlink5_rule(
            &mut self.nvlink5,
            &self.rules,
            &board,
            now,
            &mut pairs,
        ));
        let gpu_findings = gpu_state::gpu_state_rule(&board, &mut pairs);
        p2p::p2p_regression_rule(&mut self.p2p_ever_ok, &board, &mut pairs);
        p2p::outlier_rule(&board, &mut pairs);
        probe_results::probe_rule(sample, &board, &mut pairs);
        let (pcie, pcie_findings) = pcie::pcie_rule(
            &mut self.aer,
            &board,
            sample.hypervisor.as_deref(),
            now,
            &mut pairs,
        );

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
                        reasons: st.reasons,
                        since: None,
                    },
                }
            })
            .collect();
        let mut judged = judged;
        let mut failing_since = HashMap::new();
        for j in judged.iter_mut().filter(|j| j.weight.is_some()) {
            let key = (board.key(j.verdict.gpu), board.key(j.verdict.peer_gpu));
            let since = self.failing_since.get(&key).copied().unwrap_or(clock);
            j.verdict.since = Some(since);
            failing_since.insert(key, since);
        }
        // Only the pairs failing now: a pair that recovers starts over.
        self.failing_since = failing_since;
        let (mut findings, blame) = findings::findings(&board, &judged, notices, &self.rules);
        findings.extend(gpu_findings);
        findings.extend(pcie_findings);
        Judgement {
            pairs: judged.into_iter().map(|j| j.verdict).collect(),
            findings,
            blame,
            pcie,
        }
    }
}

#[cfg(test)]
mod tests;

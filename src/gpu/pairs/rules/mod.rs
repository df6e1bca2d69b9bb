//! The rules, one file per family, each adding reasons to the pairs' [`PairState`]s
//! (`super::reasons`); the order they run in is [`super::PairJudge::judge_at`]'s.
//!
//! - `links.rs`: rules 1-2, lost GPUs and inactive links;
//! - `counters.rs`: rule 3, NVLink error counters; `nvlink5.rs`: rule 3b, the NVLink5 counters;
//!   both over `window.rs`, the one windowed history of a link's counters;
//! - `gpu_state.rs`: rule 3c, NVML's word on a whole GPU;
//! - `p2p.rs`: rules 4-5, P2P regressions and outliers;
//! - `pcie.rs`: rule 7, the PCIe path under the GPUs;
//! - `probe_results.rs`: rule 8, the pair probe's verdicts placed on their pairs.
//!
//! [`PairState`]: super::reasons::PairState

pub(crate) mod counters;
pub(crate) mod gpu_state;
pub(crate) mod links;
pub(crate) mod nvlink5;
pub(crate) mod p2p;
pub(crate) mod pcie;
pub(crate) mod probe_results;
pub(crate) mod window;

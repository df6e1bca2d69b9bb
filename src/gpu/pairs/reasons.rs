//! How bad a pair is: each rule adds a typed [`PairReason`] with a [`Weight`] to a pair's
//! [`PairState`]; the pair's status is the worst weight ([`Weight::status`]): this is where a
//! pair is declared degraded or down.

use crate::model::{P2pCaps, PairReason, PairVerdict, TopologyLevel, Weight};

#[derive(Debug, Default)]
pub(super) struct PairState {
    /// Whether the sample had a `PairSample` for this pair (the first one counts).
    pub sampled: bool,
    pub p2p: Option<P2pCaps>,
    pub topology: Option<TopologyLevel>,
    pub links: Vec<u32>,
    pub reasons: Vec<PairReason>,
}

impl PairState {
    /// Adds `reason` unless the same words are there already.
    pub fn push(&mut self, reason: PairReason) {
        if !self.reasons.iter().any(|r| r.text == reason.text) {
            self.reasons.push(reason);
        }
    }
}

/// A pair with its verdict and the weight that decided it.
pub(super) struct Judged {
    pub verdict: PairVerdict,
    pub weight: Option<Weight>,
}

impl Judged {
    pub fn key(&self) -> (u32, u32) {
        (self.verdict.gpu, self.verdict.peer_gpu)
    }

    pub fn has(&self, gpu: u32) -> bool {
        self.verdict.gpu == gpu || self.verdict.peer_gpu == gpu
    }

    pub fn other(&self, gpu: u32) -> u32 {
        if self.verdict.gpu == gpu {
            self.verdict.peer_gpu
        } else {
            self.verdict.gpu
        }
    }
}

//! Rule 3b: the NVLink5 counters (Blackwell), per (GPU UUID, link), over the same sliding window
//! as rule 3.
//!
//! - Failed link recoveries (the link was declared down) at or above the replay/recovery
//!   threshold degrade the pairs the link serves, as replay errors do.
//! - Successful link recoveries at or above the same threshold: each one is a link retrain that
//!   stalls traffic, the event the DL recovery counter counted on earlier GPUs (which DCGM's
//!   health watch fails at 1), and a growing count has preceded links going down. A degrading
//!   reason (warning), never down.
//! - Symbol or effective errors growing at or above `nvlink5_errors_degraded_per_sec` between
//!   two samples, or a reported BER at or above `ber_degraded`: likewise a degrading reason.
//!   Growth below the rates is a warning finding of its own, as for CRC errors.

use std::collections::BTreeMap;
use std::time::Instant;

use super::window::{
    affected_pairs, grown, peak_rate, Counters, LinkWindows, Notice, Reading, Window,
};
use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::gpu::pairs::PairRules;
use crate::model::{GpuReading, LinkReading, Nvlink5Errors, PairReason, ReasonKind, Weight};
use crate::text;

pub(crate) type Nvlink5History = LinkWindows<Nvlink5Errors>;

impl Counters for Nvlink5Errors {
    fn each(&self) -> impl IntoIterator<Item = u64> {
        [
            self.recovery_successful,
            self.recovery_failed,
            self.recovery_events,
            self.symbol,
            self.effective,
        ]
    }
}

/// Rule 3b. Returns the growth that degraded nothing, for warnings.
pub(crate) fn nvlink5_rule(
    history: &mut Nvlink5History,
    rules: &PairRules,
    board: &Board<'_>,
    now: Instant,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> Vec<Notice> {
    let mut notices = Vec::new();
    let mut degrading: Vec<((u32, u32), PairReason)> = Vec::new();
    // A lost GPU's NVLink5 windows are dropped: its pairs are down already.
    let read = |gpu: &GpuReading, link: &LinkReading| {
        link.nvlink5.filter(|_| !gpu.lost).map(Reading::Counts)
    };
    history.advance(board, now, rules.window, read, |a, link, window| {
        let (mut reasons, mut below) = weigh(window, rules, a, link.link);
        let affected = affected_pairs(a, &link.peer, pairs);
        if affected.is_empty() {
            below.append(&mut reasons);
        }
        for &pair in &affected {
            degrading.extend(reasons.iter().map(|r| {
                let reason = PairReason::new(ReasonKind::Nvlink5Errors, Weight::Errors, r.clone());
                (pair, reason.naming(&[a]).on_links(&[link.link]))
            }));
        }
        notices.extend(Notice::of(a, link.link, below, affected));
    });
    for (pair, reason) in degrading {
        if let Some(st) = pairs.get_mut(&pair) {
            st.push(reason);
        }
    }
    notices
}

/// Link `l` of GPU `a`: the reasons that degrade the pairs it serves, and the growth below
/// the thresholds (a warning).
fn weigh(
    window: &Window<Nvlink5Errors>,
    rules: &PairRules,
    a: u32,
    l: u32,
) -> (Vec<String>, Vec<String>) {
    let threshold = rules.replay_recovery_degraded.max(1);
    let mut reasons = Vec::new();
    let mut below = Vec::new();
    for (what, amount) in [
        (
            "failed link recoveries",
            grown(window, |e| e.recovery_failed),
        ),
        (
            "successful link recoveries (degrading: each one stalls traffic)",
            grown(window, |e| e.recovery_successful),
        ),
    ] {
        if amount >= threshold {
            reasons.push(text::reason_nvlink5_count(what, a, l, amount, rules.window));
        } else if amount > 0 {
            below.push(text::growth(what, amount));
        }
    }
    let symbol = |e: &Nvlink5Errors| e.symbol;
    let effective = |e: &Nvlink5Errors| e.effective;
    for (what, amount, per_sec) in [
        (
            "symbol errors",
            grown(window, symbol),
            peak_rate(window, symbol),
        ),
        (
            "effective errors",
            grown(window, effective),
            peak_rate(window, effective),
        ),
    ] {
        if amount == 0 {
            continue;
        }
        if per_sec >= rules.nvlink5_errors_degraded_per_sec {
            reasons.push(text::reason_nvlink5_rate(
                what,
                a,
                l,
                amount,
                rules.window,
                per_sec,
                rules.nvlink5_errors_degraded_per_sec,
            ));
        } else {
            below.push(text::growth_at_rate(what, amount, per_sec));
        }
    }
    // The BERs the link reports now, not growth.
    let now = window.back().map(|(_, counts)| *counts);
    for (what, ber) in [
        ("effective BER", now.and_then(|c| c.effective_ber)),
        ("symbol BER", now.and_then(|c| c.symbol_ber)),
    ] {
        let Some(ber) = ber.map(|b| b.value()) else {
            continue;
        };
        if ber >= rules.ber_degraded {
            reasons.push(text::reason_ber(what, ber, a, l, rules.ber_degraded));
        }
    }
    (reasons, below)
}

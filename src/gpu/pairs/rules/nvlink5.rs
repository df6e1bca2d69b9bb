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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use super::counters::{affected_pairs, prune, push_with, Notice};
use crate::findings::text;
use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::gpu::pairs::PairRules;
use crate::model::Nvlink5Errors;
use crate::model::Weight;

pub(crate) type Nvlink5History = HashMap<(String, u32), VecDeque<(Instant, Nvlink5Errors)>>;

/// Rule 3b. Returns the growth that degraded nothing, for warnings.
pub(crate) fn nvlink5_rule(
    history: &mut Nvlink5History,
    rules: &PairRules,
    board: &Board<'_>,
    now: Instant,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> Vec<Notice> {
    let cutoff = now.checked_sub(rules.window);
    let threshold = rules.replay_recovery_degraded.max(1);
    let mut seen = HashSet::new();
    let mut notices = Vec::new();

    for (&a, gpu) in &board.gpus {
        if gpu.lost {
            continue;
        }
        for link in &gpu.links {
            let Some(now_counts) = link.nvlink5 else {
                continue;
            };
            let key = (board.key(a), link.link);
            seen.insert(key.clone());
            let h = history.entry(key).or_default();
            push_with(h, now, now_counts, went_down);
            prune(h, cutoff);
            let g = Growth::of(h);
            let l = link.link;

            let mut reasons = Vec::new();
            let mut below = Vec::new();
            let mut count = |amount: u64, what: &str, reasons: &mut Vec<String>| {
                if amount >= threshold {
                    reasons.push(text::reason_nvlink5_count(what, a, l, amount, rules.window));
                } else if amount > 0 {
                    below.push(text::growth(what, amount));
                }
            };
            count(g.failed, "failed link recoveries", &mut reasons);
            count(
                g.successful,
                "successful link recoveries (degrading: each one stalls traffic)",
                &mut reasons,
            );
            for (what, amount, per_sec) in [
                ("symbol errors", g.symbol, g.symbol_rate),
                ("effective errors", g.effective, g.effective_rate),
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
            for (what, ber) in [
                ("effective BER", now_counts.effective_ber),
                ("symbol BER", now_counts.symbol_ber),
            ] {
                let Some(ber) = ber.map(|b| b.value()) else {
                    continue;
                };
                if ber >= rules.ber_degraded {
                    reasons.push(text::reason_ber(what, ber, a, l, rules.ber_degraded));
                }
            }

            let affected = affected_pairs(a, &link.peer, pairs);
            if affected.is_empty() {
                below.append(&mut reasons);
            }
            for pair in &affected {
                if let Some(st) = pairs.get_mut(pair) {
                    for r in &reasons {
                        st.push(Weight::Errors, r.clone());
                    }
                }
            }
            if !below.is_empty() {
                notices.push(Notice {
                    gpu: a,
                    link: l,
                    parts: below,
                    affected,
                });
            }
        }
    }
    history.retain(|key, _| seen.contains(key));
    notices
}

fn went_down(old: &Nvlink5Errors, new: &Nvlink5Errors) -> bool {
    new.recovery_successful < old.recovery_successful
        || new.recovery_failed < old.recovery_failed
        || new.recovery_events < old.recovery_events
        || new.symbol < old.symbol
        || new.effective < old.effective
}

#[derive(Debug, Default)]
struct Growth {
    successful: u64,
    failed: u64,
    symbol: u64,
    effective: u64,
    /// The highest rates (per second) between two consecutive samples.
    symbol_rate: f64,
    effective_rate: f64,
}

impl Growth {
    fn of(history: &VecDeque<(Instant, Nvlink5Errors)>) -> Growth {
        let (Some((_, first)), Some((_, last))) = (history.front(), history.back()) else {
            return Growth::default();
        };
        let mut g = Growth {
            successful: last
                .recovery_successful
                .saturating_sub(first.recovery_successful),
            failed: last.recovery_failed.saturating_sub(first.recovery_failed),
            symbol: last.symbol.saturating_sub(first.symbol),
            effective: last.effective.saturating_sub(first.effective),
            ..Growth::default()
        };
        for ((t0, e0), (t1, e1)) in history.iter().zip(history.iter().skip(1)) {
            let dt = t1.saturating_duration_since(*t0).as_secs_f64();
            if dt > 0.0 {
                let per_sec = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
                g.symbol_rate = g.symbol_rate.max(per_sec(e0.symbol, e1.symbol));
                g.effective_rate = g.effective_rate.max(per_sec(e0.effective, e1.effective));
            }
        }
        g
    }
}

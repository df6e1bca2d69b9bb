//! Rule 3: NVLink error counters over a sliding window, per (GPU UUID, link).

use std::collections::BTreeMap;
use std::time::Instant;

use super::window::{
    affected_pairs, grown, peak_rate, Counters, LinkWindows, Notice, Reading, Window,
};
use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::gpu::pairs::PairRules;
use crate::model::{GpuReading, LinkErrors, LinkReading, PairReason, ReasonKind, Weight};
use crate::text;

pub(crate) type CounterHistory = LinkWindows<LinkErrors>;

impl Counters for LinkErrors {
    fn each(&self) -> impl IntoIterator<Item = u64> {
        [
            self.replay,
            self.recovery,
            self.crc_flit,
            self.crc_data,
            self.ecc_data,
        ]
    }
}

/// Per pair, per (GPU, counter): what degrades it.
type Degrading = BTreeMap<(u32, u32), BTreeMap<(u32, Counter), Agg>>;

/// Rule 3: error counters. Returns the growth that did not degrade anything (for warnings).
pub(crate) fn counter_rule(
    counters: &mut CounterHistory,
    rules: &PairRules,
    board: &Board<'_>,
    now: Instant,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> Vec<Notice> {
    let mut degrading = Degrading::new();
    let mut notices = Vec::new();
    let read = |gpu: &GpuReading, link: &LinkReading| {
        Some(match link.errors {
            // A lost GPU's pairs are down already; its counters (if any) wait for its return.
            _ if gpu.lost => Reading::Wait,
            Some(errors) => Reading::Counts(errors),
            None => Reading::Missing,
        })
    };
    counters.advance(board, now, rules.window, read, |a, link, window| {
        let growth = Growth::of(window);
        if growth.is_zero() {
            return;
        }
        let affected = affected_pairs(a, &link.peer, pairs);
        let (hits, below) = growth.weigh(rules, !affected.is_empty());
        for &pair in &affected {
            let per_pair = degrading.entry(pair).or_default();
            for &(counter, amount, rate) in &hits {
                let agg = per_pair.entry((a, counter)).or_default();
                agg.links.push(link.link);
                agg.total = agg.total.saturating_add(amount);
                agg.rate = agg.rate.max(rate);
            }
        }
        notices.extend(Notice::of(a, link.link, below, affected));
    });
    degrade(pairs, degrading, rules);
    notices
}

/// One reason per pair, GPU and counter, naming all the links whose growth it sums.
fn degrade(pairs: &mut BTreeMap<(u32, u32), PairState>, degrading: Degrading, rules: &PairRules) {
    for (pair, per_pair) in degrading {
        let Some(st) = pairs.get_mut(&pair) else {
            continue;
        };
        for ((gpu, counter), agg) in per_pair {
            let reason = match counter {
                Counter::Crc => text::reason_crc_rate(
                    gpu,
                    &agg.links,
                    agg.total,
                    agg.rate,
                    rules.crc_degraded_per_sec,
                    rules.window,
                ),
                _ => text::reason_counter_growth(
                    counter.long(),
                    gpu,
                    &agg.links,
                    agg.total,
                    rules.window,
                ),
            };
            st.push(
                PairReason::new(ReasonKind::LinkErrors, Weight::Errors, reason)
                    .naming(&[gpu])
                    .on_links(&agg.links),
            );
        }
    }
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

/// Growth of one link's counters across its window.
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
    fn of(window: &Window<LinkErrors>) -> Growth {
        Growth {
            replay: grown(window, |e| e.replay),
            recovery: grown(window, |e| e.recovery),
            ecc_data: grown(window, |e| e.ecc_data),
            crc: grown(window, crc),
            crc_rate: peak_rate(window, crc),
        }
    }

    fn is_zero(&self) -> bool {
        self.replay == 0 && self.recovery == 0 && self.ecc_data == 0 && self.crc == 0
    }

    /// What degrades the pairs the link serves (counter, amount, rate), if it serves any; and
    /// the growth worth a warning.
    fn weigh(
        &self,
        rules: &PairRules,
        serves_pairs: bool,
    ) -> (Vec<(Counter, u64, f64)>, Vec<String>) {
        let threshold = rules.replay_recovery_degraded.max(1);
        let mut hits = Vec::new();
        let mut below = Vec::new();
        for (counter, amount) in [
            (Counter::Replay, self.replay),
            (Counter::Recovery, self.recovery),
            (Counter::EccData, self.ecc_data),
        ] {
            if amount >= threshold && serves_pairs {
                hits.push((counter, amount, 0.0));
            } else if amount > 0 {
                below.push(text::growth(counter.long(), amount));
            }
        }
        if self.crc > 0 {
            // NaN never degrades; growth > 0 guarantees a positive rate.
            if self.crc_rate >= rules.crc_degraded_per_sec && serves_pairs {
                hits.push((Counter::Crc, self.crc, self.crc_rate));
            }
            // Any CRC growth is worth a warning, unless the pairs fail anyway (see
            // `findings`, which drops notices whose pairs are all not ok).
            below.push(text::growth_at_rate(
                Counter::Crc.long(),
                self.crc,
                self.crc_rate,
            ));
        }
        (hits, below)
    }
}

fn crc(e: &LinkErrors) -> u64 {
    e.crc_flit.saturating_add(e.crc_data)
}

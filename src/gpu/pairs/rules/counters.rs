//! Rule 3: NVLink error counters over a sliding window, per (GPU UUID, link).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use crate::findings::text;
use crate::gpu::pairs::board::{ordered, Board};
use crate::gpu::pairs::reasons::PairState;
use crate::gpu::pairs::PairRules;
use crate::model::Weight;
use crate::model::{LinkErrors, Peer};

/// Per (GPU key, link): the samples that cover the window, oldest first, plus the newest one
/// just outside it (the baseline growth is measured from).
pub(crate) type CounterHistory = HashMap<(String, u32), VecDeque<(Instant, LinkErrors)>>;

/// Rule 3: error counters. Returns the growth that did not degrade anything (for warnings).
pub(crate) fn counter_rule(
    counters: &mut CounterHistory,
    rules: &PairRules,
    board: &Board<'_>,
    now: Instant,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> Vec<Notice> {
    let cutoff = now.checked_sub(rules.window);
    let threshold = rules.replay_recovery_degraded.max(1);
    let mut seen = HashSet::new();
    // pair -> (GPU, counter) -> what degrades it
    let mut degrading: BTreeMap<(u32, u32), BTreeMap<(u32, Counter), Agg>> = BTreeMap::new();
    let mut notices = Vec::new();

    for (&a, gpu) in &board.gpus {
        for link in &gpu.links {
            let key = (board.key(a), link.link);
            seen.insert(key.clone());
            // A lost GPU's pairs are down already; its counters (if any) wait for its return.
            if gpu.lost || (link.errors.is_none() && !counters.contains_key(&key)) {
                continue;
            }
            let history = counters.entry(key).or_default();
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
                    below.push(text::growth(counter.long(), amount));
                }
            }
            if growth.crc > 0 {
                // NaN never degrades; growth > 0 guarantees a positive rate.
                if growth.crc_rate >= rules.crc_degraded_per_sec && !affected.is_empty() {
                    hits.push((Counter::Crc, growth.crc, growth.crc_rate));
                }
                // Any CRC growth is worth a warning, unless the pairs fail anyway (see
                // `findings`, which drops notices whose pairs are all not ok).
                below.push(text::growth_at_rate(
                    Counter::Crc.long(),
                    growth.crc,
                    growth.crc_rate,
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
    counters.retain(|key, _| seen.contains(key));

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
            st.push(Weight::Errors, reason);
        }
    }
    notices
}

/// Counter growth on one link that degraded nothing, for a `gpu_link_errors` warning.
pub(crate) struct Notice {
    pub gpu: u32,
    pub link: u32,
    pub parts: Vec<String>,
    /// The pairs the link serves; empty for a link to an unknown or non-GPU device.
    pub affected: Vec<(u32, u32)>,
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
    push_with(history, now, errors, went_down);
}

/// [`push_sample`] for any counters, with what "went down" means for them.
pub(crate) fn push_with<T: Copy>(
    history: &mut VecDeque<(Instant, T)>,
    now: Instant,
    errors: T,
    went_down: impl Fn(&T, &T) -> bool,
) {
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
pub(crate) fn prune<T>(history: &mut VecDeque<(Instant, T)>, cutoff: Option<Instant>) {
    let Some(cutoff) = cutoff else {
        return;
    };
    while history.len() >= 2 && history.get(1).is_some_and(|(t, _)| *t <= cutoff) {
        history.pop_front();
    }
}

/// The pairs whose traffic crosses a link of GPU `a`.
pub(crate) fn affected_pairs(
    a: u32,
    peer: &Peer,
    pairs: &BTreeMap<(u32, u32), PairState>,
) -> Vec<(u32, u32)> {
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

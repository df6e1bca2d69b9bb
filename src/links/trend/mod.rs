//! Links that fail slowly: each NVLink error counter kept over days (one sample per link per
//! hour, by GPU UUID), and the growth that is steady but too slow for the pair judge's 60 s
//! window to hold on to. Pure: samples in, trends and findings out; the state store keeps the
//! samples across restarts (`links::store`), the scanner feeds the keeper.
//!
//! The rule, per (GPU UUID, link, counter), over the kept samples in time order:
//! 1. A rise between two consecutive samples is growth, dated by the later sample. A fall is a
//!    reset (a driver reload, a GPU reset): no growth, the lower value is the new baseline,
//!    and the growth before it still counts.
//! 2. `per_hour`: all growth over the hours between the first and last sample (at least one).
//! 3. Days are 24 h periods counted back from now (day 0: the last 24 h), the last
//!    [`TrendRules::lookback_days`] of them. The steady run starts at the newest day that grew,
//!    which must be at most [`TrendRules::max_gap_days`] days back (it is still growing), and
//!    goes back over the days that grew while no more than `max_gap_days` days without growth
//!    lie between two of them.
//! 4. Growing steadily but slowly: the run holds at least [`TrendRules::min_days`] days that
//!    grew, and its growth per hour since its first growth is at most
//!    [`TrendRules::max_per_hour`] (faster growth is a link failing now: the pair judge's and
//!    the XIDs'). Since: the first sample of the run that showed growth.
//!
//! A single burst, however large, grows on one day (two at most): never steady. Flat counters
//! never grow.

mod keeper;
#[cfg(test)]
mod tests;
pub mod words;

pub use keeper::{Observed, TrendKeeper};

use std::collections::BTreeSet;
use std::time::Duration;

use crate::model::SteadyGrowth;

const DAY_MS: i64 = 24 * 3600 * 1000;
const HOUR_MS: f64 = 3600.0 * 1000.0;

/// The trend judge's thresholds and how much it keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrendRules {
    /// How long samples are kept (in memory and in the store): 10 days, so the 7 days looked
    /// back over are whole after a few days of the agent down.
    pub keep: Duration,
    /// At most one sample per link per `every` is kept (the first always).
    pub every: Duration,
    /// Days looked back over for the steady run.
    pub lookback_days: u32,
    /// Days that grew the run must hold.
    pub min_days: u32,
    /// Days without growth allowed between two that grew (and since the newest).
    pub max_gap_days: u32,
    /// Growth per hour above which it is not slow (240 a day).
    pub max_per_hour: f64,
}

impl Default for TrendRules {
    fn default() -> Self {
        TrendRules {
            keep: Duration::from_secs(10 * 24 * 3600),
            every: Duration::from_secs(3600),
            lookback_days: 7,
            min_days: 3,
            max_gap_days: 1,
            max_per_hour: 10.0,
        }
    }
}

impl TrendRules {
    /// Samples a link keeps at most: its `keep` at one per `every`, and a few to spare.
    pub fn max_per_link(&self) -> usize {
        let every = self.every.as_secs().max(1);
        usize::try_from(self.keep.as_secs() / every)
            .unwrap_or(usize::MAX)
            .saturating_add(2)
    }
}

/// One counter's judgement over its samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterTrend {
    /// All growth over the samples, resets not counted.
    pub growth: u64,
    pub per_hour: f64,
    pub steady: Option<SteadyGrowth>,
}

/// Judges one counter's samples (`(unix ms, value)`, in time order) at `now_ms` by the rule
/// above.
pub fn judge_counter(samples: &[(i64, u64)], now_ms: i64, rules: &TrendRules) -> CounterTrend {
    // (at, amount) of each rise; a fall is a new baseline.
    let rises: Vec<(i64, u64)> = samples
        .windows(2)
        .filter(|w| w[1].1 > w[0].1)
        .map(|w| (w[1].0, w[1].1 - w[0].1))
        .collect();
    let growth = rises.iter().fold(0u64, |a, &(_, n)| a.saturating_add(n));
    let span_h = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => ((b.0 - a.0) as f64 / HOUR_MS).max(1.0),
        _ => 1.0,
    };
    CounterTrend {
        growth,
        per_hour: growth as f64 / span_h,
        steady: steady(&rises, now_ms, rules),
    }
}

/// The day (0: the last 24 h) a time falls on, counted back from `now_ms`.
fn day_of(at_ms: i64, now_ms: i64) -> u32 {
    u32::try_from((now_ms - at_ms).max(0) / DAY_MS).unwrap_or(u32::MAX)
}

/// The steady run of rule 3 and 4, if there is one.
fn steady(rises: &[(i64, u64)], now_ms: i64, rules: &TrendRules) -> Option<SteadyGrowth> {
    let days: BTreeSet<u32> = rises
        .iter()
        .map(|&(at, _)| day_of(at, now_ms))
        .filter(|&d| d < rules.lookback_days)
        .collect();
    let newest = *days.first()?;
    if newest > rules.max_gap_days {
        return None;
    }
    let mut oldest = newest;
    let mut run_days = 1u32;
    for &d in days.iter().skip(1) {
        if d - oldest - 1 > rules.max_gap_days {
            break;
        }
        oldest = d;
        run_days += 1;
    }
    if run_days < rules.min_days {
        return None;
    }
    let in_run = rises.iter().filter(|&&(at, _)| {
        let d = day_of(at, now_ms);
        d >= newest && d <= oldest
    });
    let since_ms = in_run.clone().map(|&(at, _)| at).min()?;
    let growth = in_run.fold(0u64, |a, &(_, n)| a.saturating_add(n));
    let hours = ((now_ms - since_ms) as f64 / HOUR_MS).max(1.0);
    if growth as f64 / hours > rules.max_per_hour {
        return None;
    }
    Some(SteadyGrowth {
        since: crate::model::from_unix_ms(since_ms),
        growth,
        days: run_days,
        per_day: growth as f64 / (hours / 24.0).max(1.0),
    })
}

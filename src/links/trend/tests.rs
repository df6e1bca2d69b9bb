use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::model::{FindingKind, GpuReading, LinkCounter, LinkErrors, LinkReading, Peer, Subject};

const H: i64 = 3600 * 1000;
const D: i64 = 24 * H;
/// "Now" of the fixtures: 2026-09-10T00:00:00Z.
const NOW: i64 = 1_789_000_000_000 - 1_789_000_000_000 % D;

/// Hourly samples over `days` days ending at NOW, the value from `at(hours before now)`.
fn hourly(days: i64, value: impl Fn(i64) -> u64) -> Vec<(i64, u64)> {
    (0..=days * 24)
        .rev()
        .map(|h| (NOW - h * H, value(h)))
        .collect()
}

/// A counter that rises by one at 09:00 each day on the days `on` (days before NOW).
fn daily_rises(on: &'static [i64]) -> impl Fn(i64) -> u64 {
    // hours before now -> rises seen at or before that moment
    move |h| {
        on.iter()
            .filter(|&&d| NOW - h * H >= NOW - d * D - 15 * H)
            .count() as u64
    }
}

#[test]
fn steady_slow_growth_is_found_with_its_rate_and_since() {
    let rules = TrendRules::default();
    let samples = hourly(7, daily_rises(&[5, 4, 3, 2, 1]));
    let t = judge_counter(&samples, NOW, &rules);
    assert_eq!(t.growth, 5);
    let s = t.steady.expect("steady growth");
    assert_eq!(s.growth, 5);
    assert_eq!(s.days, 5);
    assert_eq!(
        crate::model::unix_ms(s.since),
        NOW - 5 * D - 15 * H,
        "the first rise"
    );
    assert!(
        (s.per_day - 5.0 / (5.0 + 15.0 / 24.0)).abs() < 1e-9,
        "{}",
        s.per_day
    );
    assert!((t.per_hour - 5.0 / (7.0 * 24.0)).abs() < 1e-9);
}

#[test]
fn a_single_burst_is_the_pair_judges_not_steady() {
    let rules = TrendRules::default();
    let samples = hourly(7, |h| if h <= 50 { 500 } else { 0 });
    let t = judge_counter(&samples, NOW, &rules);
    assert_eq!(t.growth, 500);
    assert!(t.steady.is_none());
}

#[test]
fn growth_too_fast_to_be_slow_is_not_steady() {
    let rules = TrendRules::default();
    // 20 an hour for 4 days: failing now, not wearing out.
    let samples = hourly(4, |h| (4 * 24 - h) as u64 * 20);
    let t = judge_counter(&samples, NOW, &rules);
    assert!(t.growth > 0);
    assert!(t.steady.is_none());
}

#[test]
fn flat_counters_have_no_trend() {
    let t = judge_counter(&hourly(7, |_| 42), NOW, &TrendRules::default());
    assert_eq!(t.growth, 0);
    assert_eq!(t.per_hour, 0.0);
    assert!(t.steady.is_none());
}

#[test]
fn a_reset_in_the_middle_keeps_the_growth_before_it() {
    let rules = TrendRules::default();
    let rises = daily_rises(&[6, 5, 4, 2, 1, 0]);
    // At 3.5 days back the driver reloads: the counter starts again from 0.
    let samples = hourly(7, |h| {
        let n = rises(h);
        if h <= 3 * 24 + 12 {
            n - 3
        } else {
            n + 100
        }
    });
    let t = judge_counter(&samples, NOW, &rules);
    assert_eq!(
        t.growth, 6,
        "the fall is no growth, the rises on both sides count"
    );
    let s = t.steady.expect("steady across the reset");
    assert_eq!(s.days, 6);
    assert_eq!(crate::model::unix_ms(s.since), NOW - 6 * D - 15 * H);
}

#[test]
fn a_gap_of_two_days_ends_the_run_and_old_growth_is_not_now() {
    let rules = TrendRules::default();
    // Rose on days 6, 5, 4, then not on 3 and 2: the run is days 1 and 0, too short.
    let t = judge_counter(&hourly(7, daily_rises(&[6, 5, 4, 1, 0])), NOW, &rules);
    assert!(t.steady.is_none());
    // Rose on days 6, 5, 4 and never since: not growing now.
    let t = judge_counter(&hourly(7, daily_rises(&[6, 5, 4])), NOW, &rules);
    assert_eq!(t.growth, 3);
    assert!(t.steady.is_none());
    // One quiet day between is allowed.
    let t = judge_counter(&hourly(7, daily_rises(&[4, 2, 1])), NOW, &rules);
    assert_eq!(t.steady.map(|s| s.days), Some(3));
}

fn gpu(index: u32, uuid: &str, recovery: u64) -> GpuReading {
    let link = |l: u32, recovery: u64| LinkReading {
        link: l,
        active: true,
        peer: Peer::Gpu(index ^ 1),
        errors: Some(LinkErrors {
            recovery,
            ..LinkErrors::default()
        }),
        nvlink5: None,
    };
    GpuReading {
        index,
        uuid: uuid.into(),
        links: vec![link(0, 0), link(3, recovery)],
        ..GpuReading::default()
    }
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms as u64)
}

#[test]
fn a_gpu_renumbered_keeps_its_history_by_uuid() {
    let mut keeper = TrendKeeper::new(TrendRules::default());
    let rises = daily_rises(&[5, 4, 3, 2, 1]);
    let mut last = Observed::default();
    for h in (0..=7 * 24).rev() {
        // Half way the GPU comes back as index 6 (a reboot renumbered the board).
        let index = if h > 3 * 24 { 2 } else { 6 };
        let other = if index == 2 { 6 } else { 2 };
        let gpus = [gpu(index, "GPU-b", rises(h)), gpu(other, "GPU-c", 0)];
        last = keeper.observe(&gpus, at(NOW - h * H));
    }
    assert_eq!(last.findings.len(), 1, "{:?}", last.findings);
    let f = &last.findings[0];
    assert_eq!(f.kind, FindingKind::GpuLinkErrorsGrowing);
    assert_eq!(f.subject, Subject::Gpu(6));
    assert!(
        f.message
            .contains("NVLink 3 (to GPU 7) recovery grew by 5 on 5 days"),
        "{}",
        f.message
    );
    let growing: Vec<_> = last.trends.iter().filter(|t| t.growing.is_some()).collect();
    assert_eq!(growing.len(), 1);
    assert_eq!((growing[0].gpu, growing[0].link), (6, 3));
    assert_eq!(growing[0].counter, LinkCounter::Recovery);
    assert_eq!(
        last.trends.len(),
        1,
        "flat links have no trend: {:?}",
        last.trends
    );
}

#[test]
fn one_sample_per_link_per_hour_is_kept_and_a_restart_judges_the_same() {
    let rules = TrendRules::default();
    let mut keeper = TrendKeeper::new(rules);
    let rises = daily_rises(&[5, 4, 3, 2, 1]);
    let mut stored = Vec::new();
    let mut last = Observed::default();
    // A scan a minute over the last 6 days.
    for m in (0..=6 * 24 * 60).rev() {
        let ms = NOW - m * 60_000;
        let gpus = [gpu(0, "GPU-a", rises(m / 60))];
        last = keeper.observe(&gpus, at(ms));
        stored.extend(std::mem::take(&mut last.to_store));
    }
    // Two links, one row each per hour: 6 days of hours and the first.
    assert_eq!(stored.len(), 2 * (6 * 24 + 1));
    // In memory the ends of each flat run: the flat link's two, the rising one's six runs.
    assert_eq!(keeper.len(), 2 + 6 * 2);
    let mut again = TrendKeeper::new(rules);
    again.resume(stored);
    let resumed = again.observe(&[gpu(0, "GPU-a", rises(0))], at(NOW + 1000));
    assert_eq!(resumed.findings, last.findings);
    assert_eq!(resumed.findings.len(), 1);
    assert!(
        resumed.to_store.is_empty(),
        "the last row is under an hour old"
    );
}

#[test]
fn samples_past_the_keep_are_dropped() {
    let rules = TrendRules::default();
    let mut keeper = TrendKeeper::new(rules);
    let mut stored = 0;
    for h in (0..=12 * 24).rev() {
        stored += keeper
            .observe(&[gpu(0, "GPU-a", 0)], at(NOW - h * H))
            .to_store
            .len();
    }
    assert_eq!(stored, 2 * (12 * 24 + 1), "every hour stored");
    assert_eq!(keeper.len(), 2 * 2, "a flat run's two ends in memory");
}

/// Hourly counts with rises, a burst and a reset over 12 days: what the keeper (flat runs
/// compacted, the oldest past `keep` dropped) makes of them is what the rule makes of every
/// hourly sample within `keep`.
#[test]
fn compacting_flat_runs_changes_no_judgement() {
    let rules = TrendRules::default();
    let value = |h: i64| -> u64 {
        let rises = daily_rises(&[11, 9, 5, 4, 2, 1, 0])(h);
        let burst = if h <= 8 * 24 { 30 } else { 0 };
        // A driver reload 3 days back: the counter starts over.
        if h <= 3 * 24 {
            rises - 4
        } else {
            rises + burst + 7
        }
    };
    let mut keeper = TrendKeeper::new(rules);
    let mut raw = Vec::new();
    for h in (0..=12 * 24).rev() {
        let now = NOW - h * H;
        raw.push((now, value(h)));
        let got = keeper.observe(&[gpu(0, "GPU-a", value(h))], at(now));
        let cutoff = now - rules.keep.as_millis() as i64;
        let within: Vec<(i64, u64)> = raw.iter().copied().filter(|&(t, _)| t >= cutoff).collect();
        let want = judge_counter(&within, now, &rules);
        let trend = got.trends.iter().find(|t| t.link == 3);
        assert_eq!(
            trend.map(|t| (t.per_hour, t.growing)),
            (want.growth > 0).then_some((want.per_hour, want.steady)),
            "at {h} h before the end"
        );
    }
    assert!(keeper.len() < 40, "{}", keeper.len());
}

#[test]
fn a_clock_set_back_does_not_hold_back_the_hourly_samples() {
    let mut keeper = TrendKeeper::new(TrendRules::default());
    let first = keeper.observe(&[gpu(0, "GPU-a", 3)], at(NOW));
    assert_eq!(
        first.to_store.len(),
        2,
        "the first sample of each link is kept"
    );
    // The clock was a day ahead and is corrected: the next hour's sample is kept again.
    let back = keeper.observe(&[gpu(0, "GPU-a", 3)], at(NOW - D + H));
    assert_eq!(back.to_store.len(), 2);
    assert_eq!(keeper.len(), 2, "the samples dated after now are gone");
}

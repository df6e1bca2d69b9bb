//! Rule 3: NVLink error counters over a sliding window.

use super::*;

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
        assert_only_pair_fails(
            &j,
            0,
            1,
            &["NVLink replay errors on GPU 0 link 0: +3 in the last 60 s"],
        );
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
            (Severity::Warning, "gpu_pair_degraded", "GPU 0 <-> GPU 1")
        );
        assert!(f.message.contains("nvidia-smi nvlink -e"));
    }
    // seen at 5 s; at 65 s that is more than 60 s ago
    let j = judge.judge(&s, secs_after(t0, 65));
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());
    // the history covers the window and one baseline, no more: samples 5..=65
    assert_eq!(judge.counters.by_link[&(uuid(0), 0)].len(), 13);
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
        words(&verdict(&j, 0, 1).reasons),
        vec!["NVLink replay errors on GPU 0 link 0: +5 in the last 60 s".to_string()]
    );
    let r = &verdict(&j, 0, 1).reasons[0];
    assert_eq!(
        (r.kind, r.weight, r.gpus.as_slice(), r.links.as_slice()),
        (
            crate::model::ReasonKind::LinkErrors,
            Weight::Errors,
            &[0][..],
            &[0][..]
        )
    );
    let j = judge.judge(&s, secs_after(t0, 95));
    // baseline now the sample at 30 s: +3
    assert_eq!(
        words(&verdict(&j, 0, 1).reasons),
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
        words(&verdict(&j, 0, 1).reasons),
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
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
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
        words(&verdict(&j, 0, 1).reasons),
        vec![
            "NVLink CRC errors on GPU 0 link 0: +1000 in the last 60 s, up to 200/s \
             (degraded at 100/s)"
                .to_string()
        ]
    );
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    assert_eq!(j.findings[0].kind.as_str(), "gpu_pair_degraded");
    assert_eq!(j.findings[0].subject.to_string(), "GPU 0 <-> GPU 1");
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
        words(&verdict(&j, 0, 1).reasons),
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
        words(&verdict(&j, 1, 2).reasons),
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
    assert_eq!(j.findings[0].kind.as_str(), "gpu_link_errors");
    assert_eq!(j.findings[0].subject.to_string(), "GPU 3");
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
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Warning, "gpu_link_errors", "GPU 1")
    );
    assert!(
        f.message.contains("link 4 replay +6, recovery +1"),
        "{}",
        f.message
    );
}

#[test]
fn a_window_carried_over_a_restart_keeps_its_pair_degraded_for_the_rest_of_it() {
    let t0 = Instant::now();
    let mut before = PairJudge::default();
    let mut s = mesh(4);
    before.judge(&s, t0);
    link_mut(&mut s, 0, 0).errors = Some(errs(3, 0, 0, 0, 0));
    let j = before.judge(&s, secs_after(t0, 5));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    // Carried at 10 s (one window: the baseline and the growth), taken up 20 s later.
    let carried = before.carry_windows(secs_after(t0, 10));
    assert_eq!(carried.len(), 1, "only windows that hold growth");
    assert_eq!(
        (carried[0].gpu.as_str(), carried[0].link),
        (uuid(0).as_str(), 0)
    );
    let mut after = PairJudge::default();
    let t1 = secs_after(t0, 30);
    after.resume_windows(carried, Duration::from_secs(20), t1);
    let j = after.judge(&s, t1);
    assert_eq!(
        verdict(&j, 0, 1).status,
        PairStatus::Degraded,
        "as before the restart"
    );
    // The growth seen at 5 s leaves the window at 65 s, as it would have without a restart.
    assert_eq!(
        verdict(&after.judge(&s, secs_after(t0, 60)), 0, 1).status,
        PairStatus::Degraded
    );
    assert!(all_ok(&after.judge(&s, secs_after(t0, 66))));
    // A fresh judge (no carry) takes the same counts as its baseline: ok at once.
    assert!(all_ok(&PairJudge::default().judge(&s, t1)));
}

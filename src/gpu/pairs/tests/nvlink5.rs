//! Rules 3b-3c: NVLink5 counters (Blackwell), NVML's recovery action, fabric health.

use super::*;
use crate::model::{Ber, Blame, FabricInfo, FabricState, Nvlink5Errors, RecoveryAction, SuspectBy};

/// `n` B200-like GPUs on NVSwitches: the DL counters absent, NVLink5 counters at 0.
fn b200(n: u32, links: u32) -> GpuSample {
    let mut s = nvswitch(n, links);
    for g in &mut s.gpus {
        for l in &mut g.links {
            l.errors = None;
            l.nvlink5 = Some(Nvlink5Errors::default());
        }
    }
    s
}

fn n5(s: &mut GpuSample, g: u32, l: u32) -> &mut Nvlink5Errors {
    link_mut(s, g, l).nvlink5.as_mut().expect("nvlink5")
}

#[test]
fn failed_recoveries_on_one_link_degrade_only_that_gpus_pairs_naming_the_link() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(4, 18);
    assert!(all_ok(&judge.judge(&s, t0)));
    n5(&mut s, 2, 7).recovery_failed = 1;
    n5(&mut s, 2, 7).recovery_events = 1;
    let j = judge.judge(&s, secs_after(t0, 5));
    assert_only_pairs_of(&j, 2, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 0, 2).reasons),
        vec!["NVLink failed link recoveries on GPU 2 link 7: +1 in the last 60 s".to_string()]
    );
    // Every pair of GPU 2 fails: one broken-GPU finding names it.
    assert_eq!(
        kinds(&j),
        vec![("gpu_pair_degraded", "GPU 2".to_string(), Severity::Critical)]
    );
    // Out of the window, healthy again.
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 70))));
}

#[test]
fn successful_recoveries_are_a_degrading_reason_never_down() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(2, 18);
    judge.judge(&s, t0);
    n5(&mut s, 0, 3).recovery_successful = 40;
    let j = judge.judge(&s, secs_after(t0, 5));
    let p = verdict(&j, 0, 1);
    assert_eq!(p.status, PairStatus::Degraded);
    assert_eq!(
        words(&p.reasons),
        vec![
            "NVLink successful link recoveries (degrading: each one stalls traffic) on GPU 0 \
             link 3: +40 in the last 60 s"
                .to_string()
        ]
    );
    assert!(j.findings.iter().all(|f| f.severity == Severity::Warning));
}

#[test]
fn symbol_errors_below_the_rate_are_a_warning_and_above_it_degrade_but_never_down() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(3, 18);
    judge.judge(&s, t0);
    // 10 in 60 s: 0.17/s, under 0.4/s.
    n5(&mut s, 1, 0).symbol = 10;
    let j = judge.judge(&s, secs_after(t0, 60));
    assert!(j.pairs.iter().all(|p| p.status == PairStatus::Ok));
    assert_eq!(
        kinds(&j),
        vec![("gpu_link_errors", "GPU 1".to_string(), Severity::Warning)]
    );
    assert!(
        j.findings[0].message.contains("link 0 symbol errors +10"),
        "{}",
        j.findings[0].message
    );
    // +1000 in 5 s: 200/s.
    n5(&mut s, 1, 0).symbol = 1010;
    let j = judge.judge(&s, secs_after(t0, 65));
    assert_only_pairs_of(&j, 1, PairStatus::Degraded);
    assert!(verdict(&j, 0, 1).reasons[0]
        .text
        .starts_with("NVLink symbol errors on GPU 1 link 0: +1010 in the last 60 s, up to 200/s"));
    assert!(j.pairs.iter().all(|p| p.status != PairStatus::Down));
}

#[test]
fn a_ber_over_the_threshold_degrades_without_history() {
    let mut s = b200(2, 2);
    n5(&mut s, 1, 1).symbol_ber = Some(Ber {
        mantissa: 3,
        exponent: 11,
    });
    // 15e-255 is how a link with nothing measured reads.
    n5(&mut s, 1, 0).effective_ber = Some(Ber {
        mantissa: 15,
        exponent: 255,
    });
    let j = judge_once(&s);
    let p = verdict(&j, 0, 1);
    assert_eq!(p.status, PairStatus::Degraded);
    assert_eq!(
        words(&p.reasons),
        vec!["NVLink symbol BER 3e-11 on GPU 1 link 1 (degrading at 1e-12)".to_string()]
    );
}

#[test]
fn a_counter_going_down_is_a_new_baseline() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(2, 1);
    n5(&mut s, 0, 0).recovery_failed = 5;
    judge.judge(&s, t0);
    n5(&mut s, 0, 0).recovery_failed = 0;
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 5))));
}

#[test]
fn each_recovery_action() {
    for (action, degraded) in [
        (RecoveryAction::None, false),
        (RecoveryAction::GpuReset, false),
        (RecoveryAction::NodeReboot, false),
        (RecoveryAction::DrainP2p, true),
        (RecoveryAction::DrainAndReset, true),
    ] {
        let mut s = b200(4, 2);
        gpu_mut(&mut s, 3).recovery_action = Some(action);
        let j = judge_once(&s);
        if degraded {
            assert_only_pairs_of(&j, 3, PairStatus::Degraded);
            assert!(verdict(&j, 0, 3).reasons[0].text.contains(action.as_str()));
        } else {
            assert!(all_ok(&j), "{action:?}");
        }
        let actions: Vec<_> = j
            .findings
            .iter()
            .filter(|f| f.kind.as_str() == "gpu_recovery_action")
            .collect();
        if action == RecoveryAction::None {
            assert!(j.findings.is_empty(), "{:?}", j.findings);
        } else {
            assert_eq!(actions.len(), 1, "{action:?}");
            assert_eq!(actions[0].subject, crate::model::Subject::Gpu(3));
            assert_eq!(actions[0].severity, Severity::Critical);
            assert!(actions[0].message.contains(action.as_str()));
        }
    }
}

fn fabric(state: FabricState, status: &str, degraded: bool, route: bool) -> FabricInfo {
    FabricInfo {
        state,
        status: status.into(),
        degraded_bandwidth: Some(degraded),
        route_unhealthy: Some(route),
        cluster_uuid: None,
        clique_id: None,
    }
}

#[test]
fn fabric_states_on_an_nvswitch_board_and_off_it() {
    use FabricState::*;
    for (info, problem) in [
        (fabric(Completed, "success", false, false), None),
        (
            fabric(NotStarted, "success", false, false),
            Some("its fabric registration has not started"),
        ),
        (
            fabric(InProgress, "success", false, false),
            Some("its fabric registration is not complete"),
        ),
        (
            fabric(Completed, "timeout", false, false),
            Some("its fabric registration failed (timeout)"),
        ),
        (
            fabric(Completed, "success", true, false),
            Some("the fabric reports degraded bandwidth"),
        ),
        (
            fabric(Completed, "success", false, true),
            Some("the fabric reports an unhealthy route"),
        ),
    ] {
        for board in ["nvswitch", "mesh"] {
            let mut s = if board == "nvswitch" {
                b200(4, 2)
            } else {
                mesh(4)
            };
            gpu_mut(&mut s, 1).fabric = Some(info.clone());
            let j = judge_once(&s);
            match problem {
                None => {
                    assert!(all_ok(&j));
                    assert!(j.findings.is_empty());
                }
                Some(p) => {
                    let f: Vec<_> = j
                        .findings
                        .iter()
                        .filter(|f| f.kind.as_str() == "gpu_fabric_unhealthy")
                        .collect();
                    assert_eq!(f.len(), 1, "{info:?}");
                    assert!(f[0].message.contains(p), "{}", f[0].message);
                    assert!(f[0].message.starts_with("GPU 1 ("), "{}", f[0].message);
                    if board == "nvswitch" {
                        assert_only_pairs_of(&j, 1, PairStatus::Degraded);
                    } else {
                        assert!(all_ok(&j), "{info:?} on a mesh");
                    }
                }
            }
        }
    }
}

#[test]
fn gpus_without_any_of_it_are_judged_as_before() {
    // No NVLink5 counters, no recovery action, no fabric: the DL mesh as the other tests see it.
    let s = mesh(4);
    assert!(s
        .gpus
        .iter()
        .all(|g| g.recovery_action.is_none() && g.fabric.is_none()));
    let j = judge_once(&s);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
}

#[test]
fn odd_nvlink5_values_do_not_panic() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(2, 2);
    *n5(&mut s, 0, 0) = Nvlink5Errors {
        recovery_successful: u64::MAX,
        recovery_failed: u64::MAX,
        recovery_events: u64::MAX,
        symbol: u64::MAX,
        effective: u64::MAX,
        // 15 x 10^0: not a rate, but what the bits can say.
        effective_ber: Some(Ber {
            mantissa: 15,
            exponent: 0,
        }),
        symbol_ber: Some(Ber::from_raw(u64::MAX)),
    };
    let j = judge.judge(&s, t0);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    // Down again (a reset), time backwards, the same instant twice.
    *n5(&mut s, 0, 0) = Nvlink5Errors::default();
    judge.judge(&s, secs_after(t0, 5));
    judge.judge(&s, t0);
    let j = judge.judge(&s, t0);
    assert!(all_ok(&j), "{:?}", j.pairs);
    // A link whose counters vanish forgets its baseline.
    link_mut(&mut s, 0, 0).nvlink5 = None;
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 10))));
}

#[test]
fn the_new_findings_read_as_one_sentence_each() {
    let mut s = b200(3, 2);
    gpu_mut(&mut s, 1).recovery_action = Some(RecoveryAction::DrainAndReset);
    gpu_mut(&mut s, 2).fabric = Some(fabric(FabricState::Completed, "timeout", false, false));
    let j = judge_once(&s);
    for f in j.findings.iter().filter(|f| {
        matches!(
            f.kind.as_str(),
            "gpu_recovery_action" | "gpu_fabric_unhealthy"
        )
    }) {
        assert!(!f.message.contains("  "), "{}", f.message);
    }
    let action = j
        .findings
        .iter()
        .find(|f| f.kind.as_str() == "gpu_recovery_action")
        .expect("recovery action finding");
    assert!(
        action.message.contains(
            "is drain_and_reset (to drain peer-to-peer traffic and reset the GPU: drain \
                       the node, then reset the GPU (`nvidia-smi -r -i 1`))"
        ),
        "{}",
        action.message
    );
}

#[test]
fn two_faulty_gpus_are_both_blamed_with_their_links_and_no_healthy_gpu_is() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(8, 18);
    judge.judge(&s, t0);
    // GPU 4: failed recoveries on link 9; GPU 2: symbol errors growing fast on link 3.
    n5(&mut s, 4, 9).recovery_failed = 3;
    n5(&mut s, 2, 3).symbol = 5000;
    let j = judge.judge(&s, secs_after(t0, 5));
    let blamed: Vec<(u32, SuspectBy)> = j.blame.suspects.iter().map(|s| (s.gpu, s.by)).collect();
    // Both fail with all seven peers; GPU 0 is in two failing pairs only.
    assert_eq!(
        blamed,
        vec![(2, SuspectBy::FailsWithAll), (4, SuspectBy::FailsWithAll)]
    );
    assert!(!j.blame.node_wide);
    let four = &j.blame.suspects[1];
    assert_eq!(four.bad_pairs, 7);
    assert_eq!(
        words(&four.reasons),
        vec!["NVLink failed link recoveries on GPU 4 link 9: +3 in the last 60 s".to_string()]
    );
    assert!(
        j.blame.suspects[0].reasons[0]
            .text
            .starts_with("NVLink symbol errors on GPU 2 link 3"),
        "{:?}",
        j.blame.suspects[0].reasons
    );
}

#[test]
fn a_healthy_board_blames_no_one_and_one_bad_switch_link_blames_its_gpu() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = b200(8, 18);
    judge.judge(&s, t0);
    assert_eq!(judge.judge(&s, secs_after(t0, 1)).blame, Blame::default());
    n5(&mut s, 5, 0).recovery_failed = 1;
    let j = judge.judge(&s, secs_after(t0, 5));
    // A switch link serves all of GPU 5's pairs: it fails with all.
    assert_eq!(j.blame.suspects.len(), 1);
    assert_eq!(j.blame.suspects[0].gpu, 5);
}

use std::time::{Duration, Instant};

use super::*;
use crate::fixtures::{gpu_board, judged, pair};
use crate::gpu::xid::FatalXids;
use crate::model::{Blame, Suspect, SuspectBy, XidCount};

const HOLD: Duration = Duration::from_secs(3600);

/// The snapshot's verdicts made as a scan makes them (`gpu::verdict`, its XIDs held across
/// calls), then rendered.
struct Judge(FatalXids);

impl Judge {
    fn decide(&mut self, s: &Snapshot, now: Instant) -> Desired {
        desired(&judged(s.clone(), &mut self.0, now))
    }
}

fn judge() -> Judge {
    Judge(FatalXids::new(HOLD))
}

fn with_xids(mut s: Snapshot, xids: &[(u32, u64, u64)]) -> Snapshot {
    s.xids = xids
        .iter()
        .map(|&(gpu, xid, count)| XidCount::on(gpu, xid, count))
        .collect();
    s
}

#[test]
fn a_healthy_board_is_false_on_both_with_reasons() {
    let d = judge().decide(&gpu_board(8), Instant::now());
    assert_eq!(d.link.status, Status::False);
    assert_eq!(d.link.reason, "GpuPairsHealthy");
    assert_eq!(d.link.message, "All 28 GPU pairs are ok.");
    assert_eq!(d.fault.status, Status::False);
    assert_eq!(d.fault.reason, "NoGpuFault");
    assert!(
        d.fault.message.contains("within the last 1h"),
        "{}",
        d.fault.message
    );
}

#[test]
fn a_down_pair_makes_link_degraded_true_naming_gpus_and_links() {
    let mut s = gpu_board(4);
    s.gpu_pairs[0] = PairVerdict {
        links: vec![0, 1, 2, 3],
        ..pair(0, 1, PairStatus::Down)
    };
    s.gpu_pairs[5] = pair(2, 3, PairStatus::Degraded);
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.link.status, Status::True);
    assert_eq!(d.link.reason, "GpuPairsDown");
    assert!(
        d.link.message.starts_with(
            "GPU pairs down: GPU 0 <-> GPU 1 (links 0, 1, 2, 3 of GPU 0); \
             GPU pairs degraded: GPU 2 <-> GPU 3."
        ),
        "{}",
        d.link.message
    );
    assert!(d.link.message.contains("drain the node"));
    // Links are not faults.
    assert_eq!(d.fault.status, Status::False);
}

#[test]
fn a_broken_gpu_is_named_as_the_pair_judge_blames_it() {
    let mut s = gpu_board(8);
    for p in s.gpu_pairs.iter_mut().filter(|p| p.peer_gpu == 7) {
        p.status = PairStatus::Degraded;
    }
    s.gpu_blame = Blame {
        suspects: vec![suspect(
            7,
            SuspectBy::FailsWithAll,
            7,
            "links of GPU 7 are inactive",
        )],
        node_wide: false,
    };
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.link.reason, "GpuPairsDegraded");
    assert!(d.link.message.contains("GPU 0 <-> GPU 7, GPU 1 <-> GPU 7"));
    assert!(
        d.link.message.contains(
            "GPU 7 fails with every other GPU (GPU 7: links of GPU 7 are inactive). Jobs \
             across these GPUs fail or fall back to slower paths: drain the node, then reset \
             GPU 7 (`nvidia-smi -r -i 7`) or reboot"
        ),
        "{}",
        d.link.message
    );
}

fn suspect(gpu: u32, by: SuspectBy, bad_pairs: usize, reason: &str) -> Suspect {
    Suspect {
        gpu,
        bad_pairs,
        by,
        reasons: vec![crate::model::PairReason::new(
            crate::model::ReasonKind::LinkInactive,
            crate::model::Weight::Down,
            reason.to_string(),
        )
        .naming(&[gpu])],
    }
}

/// The field's case: GPUs 2 and 4 at fault on an NVLink5 board. Every pair with either fails,
/// GPU 0 among them; only 2 and 4 are named for a reset, with their links.
#[test]
fn two_blamed_gpus_are_named_with_their_links_and_no_healthy_gpu_for_a_reset() {
    let mut s = gpu_board(8);
    for p in s
        .gpu_pairs
        .iter_mut()
        .filter(|p| [2, 4].contains(&p.gpu) || [2, 4].contains(&p.peer_gpu))
    {
        p.status = PairStatus::Degraded;
    }
    s.gpu_blame = Blame {
        suspects: vec![
            suspect(
                2,
                SuspectBy::FailsWithAll,
                7,
                "NVLink symbol errors on GPU 2 link 3: +5000 in the last 60 s, up to 1000/s",
            ),
            suspect(
                4,
                SuspectBy::FailsWithAll,
                7,
                "NVLink failed link recoveries on GPU 4 link 9: +3 in the last 60 s",
            ),
        ],
        node_wide: false,
    };
    let m = judge().decide(&s, Instant::now()).link.message;
    for part in [
        "GPU 2 and GPU 4 fail with every other GPU (GPU 2: NVLink symbol errors on GPU 2 link 3",
        "GPU 4: NVLink failed link recoveries on GPU 4 link 9",
        "reset GPU 2 and GPU 4 (`nvidia-smi -r -i 2`, `nvidia-smi -r -i 4`)",
    ] {
        assert!(m.contains(part), "{part:?} not in {m}");
    }
    assert!(!m.contains("-r -i 0"), "{m}");
    // Nothing blamed (every pair fails): the node, and no GPU named for a reset.
    s.gpu_blame = Blame {
        suspects: Vec::new(),
        node_wide: true,
    };
    let m = judge().decide(&s, Instant::now()).link.message;
    assert!(
        m.contains("the node, not one GPU") && !m.contains("nvidia-smi -r"),
        "{m}"
    );
}

#[test]
fn application_xids_are_no_fault_and_reset_or_reboot_xids_are() {
    let t0 = Instant::now();
    let mut j = judge();
    let d = j.decide(
        &with_xids(gpu_board(4), &[(1, 13, 5), (1, 31, 1), (2, 43, 1)]),
        t0,
    );
    assert_eq!(d.fault.status, Status::False, "{}", d.fault.message);

    let d = j.decide(&with_xids(gpu_board(4), &[(1, 13, 5), (3, 79, 1)]), t0);
    assert_eq!(d.fault.status, Status::True);
    assert_eq!(d.fault.reason, "Xid79");
    assert_eq!(
        d.fault.message,
        "XID 79 (GPU has fallen off the bus) on GPU 3: drain and reboot the node."
    );

    // A reset on GPU 0 and a reboot on GPU 3: the reboot is the reason, both are told.
    let d = j.decide(&with_xids(gpu_board(4), &[(0, 48, 1), (3, 79, 1)]), t0);
    assert_eq!(d.fault.reason, "Xid79");
    assert!(d
        .fault
        .message
        .contains("; XID 48 (Double Bit ECC Error) on GPU 0"));

    let mut j = judge();
    let d = j.decide(&with_xids(gpu_board(4), &[(2, 48, 1)]), t0);
    assert_eq!(d.fault.reason, "Xid48");
    assert!(d.fault.message.contains("Double Bit ECC Error"));
    assert!(
        d.fault.message.contains("reset the GPU"),
        "{}",
        d.fault.message
    );
}

#[test]
fn a_repeated_fatal_xid_is_told_with_its_times_and_the_hold() {
    let t0 = Instant::now();
    let mut j = judge();
    j.decide(&with_xids(gpu_board(4), &[(2, 79, 1)]), t0);
    let later = j.decide(&with_xids(gpu_board(4), &[(2, 79, 1)]), t0 + HOLD / 2);
    assert!(!later.fault.message.contains("times"));
    let again = j.decide(&with_xids(gpu_board(4), &[(2, 79, 3)]), t0 + HOLD / 2);
    assert!(
        again
            .fault
            .message
            .starts_with("XID 79 (GPU has fallen off the bus) seen 3 times on GPU 2 within 1h"),
        "{}",
        again.fault.message
    );
    assert!(again.fault.message.contains("contact the vendor"));
}

#[test]
fn a_lost_gpu_and_a_gpu_nvml_does_not_see_are_faults_named() {
    let mut s = gpu_board(8);
    s.gpus[3].lost = true;
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.fault.status, Status::True);
    assert_eq!(d.fault.reason, "GpuLost");
    assert!(
        d.fault
            .message
            .starts_with("GPU 3 (00000000:1B:00.0) is lost"),
        "{}",
        d.fault.message
    );

    let mut s = gpu_board(8);
    s.gpus.pop();
    let d = judge().decide(&with_xids(s, &[(1, 95, 1)]), Instant::now());
    assert_eq!(d.fault.reason, "GpuNotInNvml");
    assert!(
        d.fault
            .message
            .contains("lists 8 NVIDIA GPUs but NVML sees 7: 0000:1f:00.0 is missing"),
        "{}",
        d.fault.message
    );
    assert!(d
        .fault
        .message
        .contains("XID 95 (Uncontained memory error) on GPU 1"));
}

#[test]
fn without_nvml_a_gpu_node_is_unknown_and_a_node_without_gpus_is_false() {
    let mut s = gpu_board(8);
    s.nvml_up = false;
    s.gpus.clear();
    s.gpu_pairs.clear();
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.link.status, Status::Unknown);
    assert_eq!(d.fault.status, Status::Unknown);
    assert_eq!(d.fault.reason, "NvmlUnavailable");
    s.driver_gpus.clear();
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.link.status, Status::False);
    assert_eq!(d.link.reason, "NoGpus");
}

#[test]
fn messages_are_bounded_and_pairs_beyond_a_dozen_are_counted() {
    let mut s = gpu_board(16);
    for p in &mut s.gpu_pairs {
        p.status = PairStatus::Down;
        p.links = (0..18).collect();
    }
    let d = judge().decide(&s, Instant::now());
    assert!(d.link.message.len() <= crate::text::CONDITION_MESSAGE_MAX);
    let mut s = gpu_board(8);
    for p in &mut s.gpu_pairs {
        p.status = PairStatus::Degraded;
    }
    let d = judge().decide(&s, Instant::now());
    assert!(d.link.message.contains("and 16 more"), "{}", d.link.message);
}

#[test]
fn nvml_recovery_actions_are_told_by_how_far_they_go() {
    use crate::model::RecoveryAction;
    for (action, reason) in [
        (RecoveryAction::None, None),
        (RecoveryAction::DrainP2p, None),
        (RecoveryAction::GpuReset, Some("RecoveryActionGpuReset")),
        (RecoveryAction::NodeReboot, Some("RecoveryActionNodeReboot")),
        (
            RecoveryAction::DrainAndReset,
            Some("RecoveryActionDrainAndReset"),
        ),
    ] {
        let mut s = gpu_board(4);
        s.gpus[2].recovery_action = Some(action);
        let d = judge().decide(&s, Instant::now());
        match reason {
            None => {
                assert_eq!(d.fault.status, Status::False, "{action:?}");
                assert_eq!(d.fault.reason, "NoGpuFault");
            }
            Some(reason) => {
                assert_eq!(d.fault.status, Status::True, "{action:?}");
                assert_eq!(d.fault.reason, reason);
                assert!(
                    d.fault.message.starts_with(&format!(
                        "NVML's recovery action for GPU 2 (00000000:1A:00.0) is {}: drain the node",
                        action.as_str()
                    )),
                    "{}",
                    d.fault.message
                );
            }
        }
    }
}

#[test]
fn the_recovery_action_going_furthest_names_the_reason_before_xids() {
    use crate::model::RecoveryAction;
    let mut s = with_xids(gpu_board(4), &[(0, 79, 1)]);
    s.gpus[1].recovery_action = Some(RecoveryAction::GpuReset);
    s.gpus[3].recovery_action = Some(RecoveryAction::NodeReboot);
    let d = judge().decide(&s, Instant::now());
    assert_eq!(d.fault.reason, "RecoveryActionNodeReboot");
    let m = &d.fault.message;
    let (reboot, reset, xid) = (
        m.find("GPU 3 (").unwrap(),
        m.find("GPU 1 (").unwrap(),
        m.find("XID 79").unwrap(),
    );
    assert!(reboot < reset && reset < xid, "{m}");
}

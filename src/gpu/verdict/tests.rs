//! The decisions about one GPU, made once here (the Node conditions and the device taints only
//! render them: their tests check the words).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;
use crate::fixtures::{fails_with_all, gpu_board, judged};
use crate::model::{RecoveryAction, Snapshot, XidCount};

const HOLD: Duration = Duration::from_secs(3600);

fn with_xids(mut s: Snapshot, xids: &[(u32, u64, u64)]) -> Snapshot {
    s.xids = xids
        .iter()
        .map(|&(gpu, xid, count)| XidCount::on(gpu, xid, count))
        .collect();
    s
}

/// The verdicts of `s` with a fresh hold.
fn verdicts(s: Snapshot) -> Vec<GpuVerdict> {
    judged(s, &mut FatalXids::new(HOLD), Instant::now()).gpu_verdicts
}

fn outs(v: &[GpuVerdict]) -> Vec<(Option<u32>, OutReason)> {
    v.iter().filter_map(|v| Some((v.gpu, v.out?))).collect()
}

#[test]
fn a_healthy_board_is_one_clean_verdict_per_gpu() {
    let v = verdicts(gpu_board(4));
    assert_eq!(v.len(), 4);
    assert!(v.iter().all(|v| !v.is_fault() && v.out.is_none()));
    assert_eq!(v[2].uuid, "GPU-2");
}

#[test]
fn application_xids_are_not_held_and_reset_or_reboot_xids_are() {
    let v = verdicts(with_xids(
        gpu_board(4),
        &[(1, 13, 5), (1, 31, 1), (2, 43, 1)],
    ));
    assert!(v.iter().all(|v| v.held_xids.is_empty() && !v.is_fault()));
    let v = verdicts(with_xids(gpu_board(4), &[(0, 48, 1), (3, 79, 2)]));
    assert_eq!(v[3].held_xids.len(), 1);
    assert_eq!((v[3].held_xids[0].xid, v[3].held_xids[0].times), (79, 2));
    assert_eq!(v[3].held_xids[0].left, HOLD);
    assert_eq!(
        outs(&v),
        [(Some(0), OutReason::Xid(48)), (Some(3), OutReason::Xid(79))]
    );
}

#[test]
fn a_fatal_xid_holds_for_its_time_and_repeats_add_to_it() {
    let t0 = Instant::now();
    let mut fatal = FatalXids::new(HOLD);
    let mut at = |counts: &[(u32, u64, u64)], now| {
        judged(with_xids(gpu_board(4), counts), &mut fatal, now).gpu_verdicts
    };
    assert!(at(&[(2, 79, 1)], t0)[2].is_fault());
    let half = at(&[(2, 79, 1)], t0 + HOLD / 2);
    assert_eq!(half[2].held_xids[0].times, 1, "quiet, within the hold");
    assert_eq!(half[2].held_xids[0].left, HOLD / 2);
    let t1 = t0 + HOLD / 2 + Duration::from_secs(1);
    assert_eq!(at(&[(2, 79, 3)], t1)[2].held_xids[0].times, 3);
    assert_eq!(
        at(&[(2, 79, 3)], t0 + HOLD)[2].held_xids[0].times,
        2,
        "the first ages out"
    );
    assert!(!at(&[(2, 79, 3)], t1 + HOLD)[2].is_fault());
}

#[test]
fn a_history_that_starts_over_clears_the_held_xids() {
    let t0 = Instant::now();
    let mut fatal = FatalXids::new(HOLD);
    judged(with_xids(gpu_board(4), &[(2, 79, 2)]), &mut fatal, t0);
    // NVML loaded afresh (a driver reload): the counts are gone.
    let v = judged(gpu_board(4), &mut fatal, t0 + Duration::from_secs(5)).gpu_verdicts;
    assert!(!v[2].is_fault());
    // ... or lower than before: a new history, whose own XIDs count from there.
    let mut fatal = FatalXids::new(HOLD);
    judged(with_xids(gpu_board(4), &[(2, 79, 5)]), &mut fatal, t0);
    let s = with_xids(gpu_board(4), &[(2, 79, 1)]);
    let v = judged(s, &mut fatal, t0 + Duration::from_secs(5)).gpu_verdicts;
    assert_eq!(v[2].held_xids[0].times, 1);
}

#[test]
fn held_xids_follow_the_gpus_uuid_when_nvml_numbers_the_gpus_otherwise() {
    let t0 = Instant::now();
    let mut fatal = FatalXids::new(HOLD);
    judged(with_xids(gpu_board(4), &[(2, 79, 1)]), &mut fatal, t0);
    let carried = fatal.ages(t0);
    assert_eq!(carried[0].gpu, "GPU-2");
    // After a restart NVML calls that GPU 0.
    let mut after = FatalXids::new(HOLD);
    after.resume(carried, t0);
    let mut s = gpu_board(4);
    s.gpus[0].uuid = "GPU-2".into();
    s.gpus[2].uuid = "GPU-0".into();
    let v = judged(s, &mut after, t0 + Duration::from_secs(1)).gpu_verdicts;
    assert_eq!(outs(&v), [(Some(0), OutReason::Xid(79))]);
    // An older agent's, keyed by index, takes the UUID that index has now.
    let mut old = FatalXids::new(HOLD);
    old.resume(
        vec![crate::gpu::xid::HeldAges {
            gpu: "#3".into(),
            xid: 48,
            ages: vec![Duration::from_secs(5)],
        }],
        t0,
    );
    let v = judged(gpu_board(4), &mut old, t0).gpu_verdicts;
    assert_eq!(outs(&v), [(Some(3), OutReason::Xid(48))]);
    assert_eq!(old.ages(t0)[0].gpu, "GPU-3");
}

#[test]
fn a_lost_gpu_and_a_gpu_nvml_does_not_see_are_faults() {
    let mut s = gpu_board(8);
    s.gpus[3].lost = true;
    s.gpus[3].recovery_action = Some(RecoveryAction::GpuReset);
    s.gpus.pop();
    let v = verdicts(s);
    assert!(
        v[3].lost && v[3].recovery_action.is_none(),
        "being lost is the fault"
    );
    assert_eq!(v[3].out, Some(OutReason::Lost));
    let missing: Vec<&GpuVerdict> = v.iter().filter(|v| v.not_in_nvml).collect();
    assert_eq!(missing.len(), 1);
    assert_eq!(
        (missing[0].gpu, missing[0].pci_bus_id.as_str()),
        (None, "0000:1f:00.0")
    );
    assert!(missing[0].is_fault() && missing[0].out.is_none());
}

#[test]
fn nvml_recovery_actions_for_a_reset_or_reboot_are_faults_the_others_are_not() {
    for (action, fault) in [
        (RecoveryAction::None, false),
        (RecoveryAction::DrainP2p, false),
        (RecoveryAction::GpuReset, true),
        (RecoveryAction::NodeReboot, true),
        (RecoveryAction::DrainAndReset, true),
    ] {
        let mut s = gpu_board(4);
        s.gpus[2].recovery_action = Some(action);
        let v = verdicts(s);
        assert_eq!(v[2].is_fault(), fault, "{action:?}");
        assert_eq!(
            v[2].out,
            fault.then_some(OutReason::RecoveryAction(action)),
            "{action:?}"
        );
    }
}

#[test]
fn the_pair_judges_culprit_is_out_with_down_or_degraded() {
    let v = verdicts(fails_with_all(7, PairStatus::Down));
    assert_eq!(outs(&v), [(Some(7), OutReason::NvlinkDown)]);
    let c = v[7].culprit.as_ref().unwrap();
    assert!(c.fails_with_all && c.down && c.bad_pairs == 7);
    let v = verdicts(fails_with_all(3, PairStatus::Degraded));
    assert_eq!(outs(&v), [(Some(3), OutReason::PairDegraded)]);
    assert!(!v[3].is_fault(), "links are no GpuFault");
}

#[test]
fn either_end_a_node_wide_failure_and_no_nvml_put_no_gpu_out() {
    let mut s = fails_with_all(7, PairStatus::Down);
    s.gpu_blame.suspects[0].by = SuspectBy::EitherEnd;
    assert_eq!(outs(&verdicts(s)), []);
    let mut s = gpu_board(8);
    for p in &mut s.gpu_pairs {
        p.status = PairStatus::Down;
    }
    s.gpu_blame = Blame {
        suspects: Vec::new(),
        node_wide: true,
    };
    assert_eq!(outs(&verdicts(s)), []);
    let mut s = fails_with_all(7, PairStatus::Down);
    s.nvml_up = false;
    assert_eq!(
        verdicts(s),
        [],
        "nothing told without NVML, not healthy either"
    );
}

#[test]
fn lost_gpus_fatal_xids_and_recovery_actions_put_gpus_out_the_strongest_first() {
    let mut s = with_xids(
        fails_with_all(7, PairStatus::Down),
        &[(4, 79, 1), (5, 13, 1), (7, 79, 1), (2, 48, 1)],
    );
    s.gpus[7].lost = true;
    s.gpus[2].recovery_action = Some(RecoveryAction::GpuReset);
    s.gpus[1].recovery_action = Some(RecoveryAction::DrainP2p);
    let v = verdicts(s);
    assert_eq!(
        outs(&v),
        [
            (Some(2), OutReason::Xid(48)),
            (Some(4), OutReason::Xid(79)),
            (Some(7), OutReason::Lost)
        ]
    );
    assert!(v[2].out_besides_xids(), "its recovery action blames it too");
    assert!(!v[4].out_besides_xids());
}

#[test]
fn an_xid_on_a_gpu_nvml_does_not_list_is_held_on_its_address() {
    let mut s = gpu_board(8);
    s.gpus.pop(); // the driver lists 0000:1f:00.0, NVML does not
    s.xids = vec![XidCount {
        gpu: None,
        pci_bus_id: "0000:1f:00.0".into(),
        xid: 79,
        count: 1,
    }];
    let v = verdicts(s);
    let missing = v.iter().find(|v| v.not_in_nvml).unwrap();
    assert_eq!(missing.held_xids.len(), 1, "{missing:?}");
    assert_eq!(missing.held_xids[0].xid, 79);
}

#[test]
fn training_failures_are_told_on_their_gpu_by_address_listed_by_nvml_or_not() {
    let mut s = gpu_board(8);
    s.gpus.pop(); // the driver lists 0000:1f:00.0, NVML does not
    let training = [
        crate::model::TrainingCount {
            pci_bus_id: "0000:1a:00.0".into(),
            links: vec![3, 7],
            count: 2,
        },
        crate::model::TrainingCount {
            pci_bus_id: "0000:1f:00.0".into(),
            links: vec![0],
            count: 1,
        },
    ];
    let v = judge(&Facts {
        nvml_up: true,
        gpus: &s.gpus,
        driver_gpus: &s.driver_gpus,
        pairs: &s.gpu_pairs,
        blame: &s.gpu_blame,
        held: &[],
        training: &training,
        fatal_sxids: &[],
        pcie: &BTreeMap::new(),
        iommu: &BTreeMap::new(),
    });
    let told: Vec<(Option<u32>, Vec<u32>)> = v
        .iter()
        .filter_map(|v| Some((v.gpu, v.nvlink_training.clone()?.links)))
        .collect();
    assert_eq!(told, [(Some(2), vec![3, 7]), (None, vec![0])]);
    assert!(
        !v[2].is_fault(),
        "the fact explains; its XID, held, puts it out"
    );
    let f = kernel_findings(&v);
    assert_eq!(f.len(), 1, "a finding names a GPU by index: {f:?}");
    assert_eq!(
        (f[0].kind, &f[0].subject),
        (FindingKind::GpuNvlinkTrainingFailed, &Subject::Gpu(2))
    );
    assert!(
        f[0].message
            .contains("NVLinks 3, 7 of GPU 2 failed to train (2 times")
            && f[0].message.contains("nvidia-fabricmanager"),
        "{}",
        f[0].message
    );
}

#[test]
fn a_fatal_sxid_is_told_on_the_gpus_linked_to_its_switch_only() {
    let mut s = gpu_board(4);
    for g in &mut s.gpus[..2] {
        g.nvswitches = vec!["0000:05:00.0".into(), "0000:06:00.0".into()];
    }
    s.gpus[2].nvswitches = vec!["0000:06:00.0".into()];
    let sxid = |switch: &str, sxid, fatal| crate::model::SxidCount {
        switch: switch.into(),
        sxid,
        count: 1,
        fatal,
    };
    s.sxids = vec![
        sxid("0000:05:00.0", 24007, true),
        sxid("0000:05:00.0", 12028, false), // non-fatal: counted only
        sxid("0000:06:00.0", 12028, false),
        sxid("0000:09:00.0", 24007, true), // a switch no GPU links to
    ];
    let v = verdicts(s);
    let told: Vec<(Option<u32>, Vec<SwitchFatal>)> = v
        .iter()
        .filter(|v| !v.nvswitch_fatal.is_empty())
        .map(|v| (v.gpu, v.nvswitch_fatal.clone()))
        .collect();
    let on_05 = vec![SwitchFatal {
        switch: "0000:05:00.0".into(),
        sxids: vec![24007],
    }];
    assert_eq!(told, [(Some(0), on_05.clone()), (Some(1), on_05)]);
    assert!(v.iter().all(|v| v.out.is_none() && !v.is_fault()));
    let f = kernel_findings(&v);
    assert_eq!(f.len(), 2);
    assert_eq!(f[1].kind, FindingKind::GpuNvswitchFatal);
    assert!(
        f[1].message
            .contains("The NVSwitch 0000:05:00.0 (SXID 24007) that NVLinks of GPU 1 go to"),
        "{}",
        f[1].message
    );
}

#[test]
fn a_link_trained_down_and_iommu_faults_are_in_the_verdict_and_told_from_it() {
    use crate::gpu::pairs::PairJudge;
    use crate::model::{GpuSample, PcieDowntrain, PcieLink};
    let mut s = gpu_board(4);
    let full = PcieLink {
        gen: 5,
        max_gen: 5,
        width: 16,
        max_width: 16,
    };
    for g in &mut s.gpus {
        g.pcie_link = Some(full);
    }
    s.gpus[1].pcie_link = Some(PcieLink { width: 8, ..full });
    let sample = GpuSample {
        gpus: s.gpus.clone(),
        ..GpuSample::default()
    };
    let j = PairJudge::default().judge(&sample, Instant::now());
    let iommu = BTreeMap::from([(2, 3)]);
    let v = judge(&Facts {
        nvml_up: true,
        gpus: &s.gpus,
        driver_gpus: &s.driver_gpus,
        pairs: &j.pairs,
        blame: &j.blame,
        held: &[],
        training: &[],
        fatal_sxids: &[],
        pcie: &j.pcie,
        iommu: &iommu,
    });
    let down = PcieDowntrain {
        link: PcieLink { width: 8, ..full },
        busy: None,
        from_sysfs: false,
        bdf: String::new(),
    };
    assert_eq!(v[1].pcie, Some(down));
    assert!(v
        .iter()
        .enumerate()
        .all(|(i, v)| (i == 1) == v.pcie.is_some()));
    let faults: Vec<u64> = v.iter().map(|v| v.iommu_faults).collect();
    assert_eq!(faults, [0, 0, 3, 0]);
    // Facts with their fixes: neither takes a GPU out nor makes it a fault.
    assert!(v.iter().all(|v| v.out.is_none() && !v.is_fault()));
    // The finding is told from the verdict alone: the pair judge no longer tells it too.
    let pcie = pcie_findings(&v, &s.gpus);
    assert!(j
        .findings
        .iter()
        .all(|f| f.kind != FindingKind::GpuPcieDegraded));
    assert_eq!(pcie.len(), 1, "{pcie:?}");
    assert_eq!(pcie[0].subject, Subject::Gpu(1));
    assert!(pcie[0]
        .message
        .contains("runs at Gen5 x8, below the Gen5 x16"));
    let f = kernel_findings(&v);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].kind, &f[0].subject),
        (FindingKind::GpuIommuFault, &Subject::Gpu(2))
    );
    assert!(
        f[0].message.contains("blocked 3 DMAs of GPU 2"),
        "{}",
        f[0].message
    );
    // `check --json`'s gpu_verdicts[]: null and 0 when fine.
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json[0]["pcie"], serde_json::Value::Null);
    assert_eq!(json[0]["iommu_faults"], 0);
    assert_eq!(json[1]["pcie"]["width"], 8);
    assert_eq!(json[1]["pcie"]["max_width"], 16);
    assert_eq!(json[1]["pcie"]["from_sysfs"], false);
    assert_eq!(json[2]["iommu_faults"], 3);
}

use super::*;
use crate::fixtures::{fails_with_all, gpu_board, judged};
use crate::gpu::xid::FatalXids;
use crate::model::{PairStatus, RecoveryAction, XidCount};

/// What the verdicts of `s` (with these XID counts, held afresh) blame.
fn blamed_with(s: &Snapshot, xids: &[(u32, u64, u64)]) -> Vec<Blamed> {
    let mut s = s.clone();
    s.xids = xids
        .iter()
        .map(|&(gpu, xid, count)| XidCount::on(gpu, xid, count))
        .collect();
    let fatal = &mut FatalXids::new(Duration::from_secs(3600));
    blamed(&judged(s, fatal, Instant::now()))
}

#[test]
fn each_out_reason_is_told_with_its_value_and_words() {
    let b = blamed_with(&fails_with_all(7, PairStatus::Down), &[]);
    assert_eq!(b.len(), 1, "{b:#?}");
    assert_eq!((b[0].gpu, b[0].uuid.as_str()), (7, "GPU-7"));
    assert_eq!(b[0].value, "nvlink-down");
    assert_eq!(
        b[0].why,
        "GPU 7 fails with every peer GPU: its 7 pairs are down"
    );
    let b = blamed_with(&fails_with_all(3, PairStatus::Degraded), &[]);
    assert_eq!(b[0].value, "pair-degraded");
    let mut s = fails_with_all(7, PairStatus::Down);
    s.gpus[7].lost = true;
    s.gpus[2].recovery_action = Some(RecoveryAction::GpuReset);
    let b = blamed_with(&s, &[(4, 79, 1)]);
    let values: Vec<(u32, &str, bool)> = b
        .iter()
        .map(|b| (b.gpu, b.value.as_str(), b.held_xid_only))
        .collect();
    assert_eq!(
        values,
        [
            (2, "recovery-action", false),
            (4, "xid-79", true),
            (7, "gpu-lost", false)
        ]
    );
    assert!(b[1].why.starts_with("XID 79 ("), "{}", b[1].why);
}

fn wanted_gpus(w: &[Wanted]) -> Vec<u32> {
    w.iter().map(|w| w.gpu).collect()
}

#[test]
fn a_gpu_stays_wanted_for_the_hold_after_it_was_last_blamed_and_a_flap_changes_nothing() {
    let hold = Duration::from_secs(3600);
    let mut judge = TaintJudge::new(hold);
    let t0 = Instant::now();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    let bad = fails_with_all(7, PairStatus::Down);
    let first = judge.decide(blamed_with(&bad, &[]), t0, wall);
    assert_eq!(wanted_gpus(&first), [7]);
    assert_eq!(
        first[0].description,
        "GPU 7 fails with every peer GPU: its 7 pairs are down; since 2026-09-21T14:13:20Z (shmlink)"
    );
    // The link comes back, goes down again, comes back: one rule, the same, all along.
    let minute = Duration::from_secs(60);
    for (i, b) in [false, true, false].into_iter().enumerate() {
        let s = if b { bad.clone() } else { gpu_board(8) };
        let at = t0 + minute * (i as u32 + 1);
        let w = judge.decide(blamed_with(&s, &[]), at, wall + minute * (i as u32 + 1));
        assert_eq!(w, first, "after {} minutes", i + 1);
    }
    // Healthy for the hold since it was last blamed (minute 2): out of the list.
    let last = t0 + minute * 2;
    assert_eq!(judge.decide(Vec::new(), last + hold - minute, wall), first);
    assert_eq!(judge.decide(Vec::new(), last + hold, wall), Vec::new());
}

#[test]
fn a_held_xid_is_wanted_while_held_and_not_one_hold_more() {
    let hold = Duration::from_secs(3600);
    let mut judge = TaintJudge::new(hold);
    let t0 = Instant::now();
    let wall = SystemTime::UNIX_EPOCH;
    let s = gpu_board(8);
    let w = judge.decide(blamed_with(&s, &[(4, 48, 1)]), t0, wall);
    assert_eq!((wanted_gpus(&w), w[0].value.as_str()), (vec![4], "xid-48"));
    // The condition judge let the XID go (its hold over): the GPU is out of the list at once.
    let later = t0 + Duration::from_secs(10);
    assert_eq!(judge.decide(blamed_with(&s, &[]), later, wall), Vec::new());
}

#[test]
fn since_is_when_its_pairs_began_to_fail_where_the_pair_judge_knows() {
    let mut s = fails_with_all(7, PairStatus::Down);
    let began = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for p in s.gpu_pairs.iter_mut().filter(|p| p.peer_gpu == 7) {
        p.since = Some(began + Duration::from_secs(u64::from(p.gpu)));
    }
    let mut judge = TaintJudge::new(Duration::from_secs(60));
    let w = judge.decide(blamed_with(&s, &[]), Instant::now(), SystemTime::now());
    assert_eq!(w[0].since, began);
}

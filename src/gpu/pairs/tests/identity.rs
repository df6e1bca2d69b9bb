//! Identity across scans: GPUs matched by UUID, baselines of vanished GPUs dropped.

use super::*;

#[test]
fn reordered_gpus_are_matched_by_uuid() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    link_mut(&mut s, 0, 0).errors = Some(errs(10, 0, 0, 0, 0));
    assert!(all_ok(&judge.judge(&s, t0)));

    // NVML now enumerates them the other way round: index 1 is the GPU that was index 0
    let mut swapped = s.clone();
    swapped.gpus[0].index = 1;
    swapped.gpus[0].links[0].peer = Peer::Gpu(0);
    swapped.gpus[1].index = 0;
    swapped.gpus[1].links[0].peer = Peer::Gpu(1);
    let j = judge.judge(&swapped, secs_after(t0, 5));
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());

    // real growth on that GPU, under its new index
    swapped.gpus[0].links[0].errors = Some(errs(12, 0, 0, 0, 0));
    let j = judge.judge(&swapped, secs_after(t0, 10));
    assert_eq!(
        words(&verdict(&j, 0, 1).reasons),
        vec!["NVLink replay errors on GPU 1 link 0: +2 in the last 60 s".to_string()]
    );
}

#[test]
fn baselines_of_vanished_gpus_are_dropped() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let full = mesh(3);
    judge.judge(&full, t0);
    assert!(judge.counters.by_link.keys().any(|(u, _)| *u == uuid(2)));
    assert!(judge.p2p_ever_ok.keys().any(|(_, b)| *b == uuid(2)));

    let mut without = full.clone();
    without.gpus.retain(|g| g.index != 2);
    without.pairs.retain(|p| p.peer_gpu != 2);
    for g in &mut without.gpus {
        g.links.retain(|l| l.peer != Peer::Gpu(2));
    }
    let j = judge.judge(&without, secs_after(t0, 5));
    assert_eq!(j.pairs.len(), 1);
    assert!(all_ok(&j));
    assert!(!judge.counters.by_link.keys().any(|(u, _)| *u == uuid(2)));
    assert!(!judge
        .p2p_ever_ok
        .keys()
        .any(|(a, b)| *a == uuid(2) || *b == uuid(2)));

    // it comes back with higher counters and no P2P: neither is news about a baseline
    let mut back = full.clone();
    for l in &mut gpu_mut(&mut back, 2).links {
        l.errors = Some(errs(50, 0, 0, 0, 0));
    }
    let j = judge.judge(&back, secs_after(t0, 10));
    assert!(all_ok(&j), "{:#?}", j.pairs);
}

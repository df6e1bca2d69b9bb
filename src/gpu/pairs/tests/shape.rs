//! Rules and the shape of a judgement: defaults, every unordered pair once, sorted.

use super::*;

#[test]
fn defaults_follow_dcgm() {
    let r = PairRules::default();
    assert_eq!(r.window, Duration::from_secs(60));
    assert_eq!(r.replay_recovery_degraded, 1);
    assert_eq!(r.crc_degraded_per_sec, 100.0);
    assert_eq!(PairJudge::default().rules, r);
}

#[test]
fn every_unordered_pair_once_sorted() {
    let j = judge_once(&pcie8(None));
    let keys: Vec<(u32, u32)> = j.pairs.iter().map(|p| (p.gpu, p.peer_gpu)).collect();
    let mut expected = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            expected.push((a, b));
        }
    }
    assert_eq!(keys, expected);
    assert_eq!(keys.len(), 28);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
    let p = verdict(&j, 0, 7);
    assert_eq!(p.p2p, Some(caps(OK, OK, NS)));
    assert_eq!(p.topology, Some(TopologyLevel::System));
    assert!(p.links.is_empty());
}

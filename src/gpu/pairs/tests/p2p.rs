//! Rules 4-5: P2P capabilities that regressed, missing P2P data, and outliers per topology level.

use super::*;

#[test]
fn p2p_capability_that_was_ok_and_is_not() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    assert!(all_ok(&judge.judge(&s, t0)));
    set_p2p(&mut s, 0, 1, Some(caps(NS, OK, OK)));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    // read and atomics (built alike) regressed; no other pair to compare with
    assert_eq!(
        words(&verdict(&j, 0, 1).reasons),
        vec![
            "P2P read was ok and is now not_supported".to_string(),
            "P2P atomics was ok and is now not_supported".to_string(),
        ]
    );
    assert_eq!(j.findings.len(), 1);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_pair_degraded", "GPU 0 <-> GPU 1")
    );
    // a failed query is no verdict, and does not forget
    set_p2p(&mut s, 0, 1, None);
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 10))));
    set_p2p(&mut s, 0, 1, Some(caps(NS, OK, OK)));
    assert_eq!(
        verdict(&judge.judge(&s, secs_after(t0, 15)), 0, 1).status,
        PairStatus::Degraded
    );
    set_p2p(&mut s, 0, 1, Some(caps(OK, OK, OK)));
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 20))));
}

#[test]
fn p2p_never_ok_is_not_a_regression() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    set_p2p(&mut s, 0, 1, Some(caps(NS, NS, NS)));
    assert!(all_ok(&judge.judge(&s, t0)));
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 5))));
}

#[test]
fn missing_p2p_is_not_a_verdict() {
    let s = GpuSample {
        gpus: (0..3).map(|i| gpu(i, Vec::new())).collect(),
        pairs: Vec::new(),
        hypervisor: None,
        probes: Vec::new(),
    };
    let j = judge_once(&s);
    assert_eq!(j.pairs.len(), 3);
    assert!(all_ok(&j));
    assert!(j
        .pairs
        .iter()
        .all(|p| p.p2p.is_none() && p.topology.is_none()));
    assert!(j.findings.is_empty());
}

#[test]
fn unknown_topology_is_its_own_level() {
    let mut s = GpuSample {
        gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
        pairs: all_pairs(4, |_, _| (Some(caps(OK, OK, NS)), None)),
        hypervisor: None,
        probes: Vec::new(),
    };
    set_p2p(&mut s, 0, 1, Some(caps(NS, OK, NS)));
    // the only pair at level node: nothing to compare with
    let p23 = s
        .pairs
        .iter_mut()
        .find(|p| (p.gpu, p.peer_gpu) == (2, 3))
        .expect("pair");
    p23.topology = Some(TopologyLevel::Node);
    p23.p2p = Some(caps(NS, NS, NS));
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 2, 3).status, PairStatus::Ok);
    assert_only_pair_fails(
        &j,
        0,
        1,
        &["P2P read not_supported while 4 other pairs of unknown topology can"],
    );
    assert_eq!(j.findings[0].subject.to_string(), "GPU 0 <-> GPU 1");
}

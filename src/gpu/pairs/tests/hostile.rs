//! Hostile input: nothing a sample holds makes the judge panic.

use super::*;

#[test]
fn odd_input_does_not_panic() {
    let mut a = gpu(0, Vec::new());
    a.links = vec![
        LinkReading {
            link: 0,
            active: false,
            peer: Peer::Gpu(0),
            errors: Some(errs(u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX)),
            nvlink5: None,
        },
        LinkReading {
            link: 1,
            active: false,
            peer: Peer::Gpu(99),
            errors: None,
            nvlink5: None,
        },
        LinkReading {
            link: u32::MAX,
            active: true,
            peer: Peer::Gpu(1),
            errors: Some(LinkErrors::default()),
            nvlink5: None,
        },
    ];
    let mut b = gpu(1, vec![link(0, Peer::Switch)]);
    b.uuid.clear();
    let duplicate = gpu(1, vec![link(0, Peer::Gpu(0))]);
    let s = GpuSample {
        gpus: vec![a, b, duplicate],
        pairs: vec![
            pair(3, 3, Some(caps(NS, NS, NS)), None),
            pair(1, 0, Some(caps(OK, OK, OK)), Some(TopologyLevel::Single)),
            pair(0, 1, Some(caps(NS, NS, NS)), None),
        ],
        hypervisor: None,
        probes: Vec::new(),
    };
    let mut judge = PairJudge::new(PairRules {
        window: Duration::ZERO,
        replay_recovery_degraded: 0,
        crc_degraded_per_sec: f64::NAN,
        nvlink5_errors_degraded_per_sec: f64::NAN,
        ber_degraded: f64::NAN,
    });
    let t0 = Instant::now();
    let j = judge.judge(&s, t0);
    assert_eq!(j.pairs.len(), 1);
    let p = verdict(&j, 0, 1);
    assert_eq!(p.status, PairStatus::Ok, "{:?}", p.reasons);
    // the first of two samples of a pair counts
    assert_eq!(p.p2p, Some(caps(OK, OK, OK)));
    assert_eq!(p.topology, Some(TopologyLevel::Single));
    assert_eq!(p.links, vec![u32::MAX]);
    assert!(j.findings.is_empty());

    // time running backwards, same instant twice, counters at the top of their range
    let mut s2 = s.clone();
    s2.gpus[0].links[2].errors = Some(errs(5, 5, 5, 5, 5));
    let j = judge.judge(&s2, secs_after(t0, 10));
    // a zero window holds nothing recent enough to count
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    assert!(j.findings.is_empty());
    let j = judge.judge(&s2, t0);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    let j = judge.judge(&s2, t0);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    let j = judge.judge(&GpuSample::default(), t0);
    assert_eq!(j, Judgement::default());
    assert!(judge.counters.by_link.is_empty());
    assert!(judge.p2p_ever_ok.is_empty());
}

//! Rules 1-2: lost GPUs and links going inactive (and coming back).

use super::*;

#[test]
fn link_going_down_and_coming_back() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    link_mut(&mut s, 1, mesh_link(1, 2)).active = false;
    let j = judge.judge(&s, t0);
    assert_eq!(verdict(&j, 1, 2).status, PairStatus::Down);
    assert_only_pair_fails(&j, 1, 2, &["link 1 of GPU 1 to GPU 2 is inactive"]);
    assert_eq!(
        (
            j.findings[0].severity,
            j.findings[0].kind.as_str(),
            j.findings[0].subject.to_string().as_str()
        ),
        (Severity::Critical, "gpu_link_down", "GPU 1 <-> GPU 2")
    );
    link_mut(&mut s, 1, mesh_link(1, 2)).active = true;
    let j = judge.judge(&s, secs_after(t0, 5));
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
}

#[test]
fn inactive_links_to_unknown_or_pci_peers_are_ignored() {
    let mut s = mesh(2);
    let g = gpu_mut(&mut s, 0);
    g.links.push(LinkReading {
        link: 7,
        active: false,
        peer: Peer::Unknown,
        errors: None,
        nvlink5: None,
    });
    g.links.push(LinkReading {
        link: 8,
        active: false,
        peer: Peer::Pci("00000000:05:00.0".into()),
        errors: None,
        nvlink5: None,
    });
    let j = judge_once(&s);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
    assert_eq!(verdict(&j, 0, 1).links, vec![0]);
}

#[test]
fn lost_gpu_is_one_finding_and_its_pairs_are_down() {
    let mut s = GpuSample {
        gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
        pairs: all_pairs(4, |_, _| {
            (Some(caps(OK, OK, NS)), Some(TopologyLevel::Node))
        }),
        hypervisor: None,
        probes: Vec::new(),
    };
    gpu_mut(&mut s, 2).lost = true;
    for (a, b) in [(0, 2), (1, 2), (2, 3)] {
        set_p2p(&mut s, a, b, None);
    }
    let j = judge_once(&s);
    assert_only_pairs_of(&j, 2, PairStatus::Down);
    assert_eq!(
        words(&verdict(&j, 2, 3).reasons),
        vec!["GPU 2 is lost (fell off the bus)".to_string()]
    );
    let r = &verdict(&j, 2, 3).reasons[0];
    assert_eq!(
        (r.kind, r.weight, r.gpus.as_slice()),
        (crate::model::ReasonKind::GpuLost, Weight::Down, &[2][..])
    );
    assert_eq!(verdict(&j, 2, 3).p2p, None);
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_lost", "GPU 2")
    );
    assert!(f.message.contains(&uuid(2)));
    assert!(
        f.message.contains("pairs with GPUs 0, 1, 3 are down"),
        "{}",
        f.message
    );
    assert!(f.message.contains("nvidia-smi -r -i 2"));
}

#[test]
fn lone_lost_gpu_has_no_pairs_but_a_finding() {
    let mut g = gpu(0, Vec::new());
    g.lost = true;
    let j = judge_once(&GpuSample {
        gpus: vec![g],
        pairs: Vec::new(),
        hypervisor: None,
        probes: Vec::new(),
    });
    assert!(j.pairs.is_empty());
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].kind.as_str(), "gpu_lost");
    assert!(j.findings[0]
        .message
        .contains("so every job using it fails. Drain the node"));
}

#[test]
fn lost_gpu_and_an_unrelated_down_link() {
    let mut s = mesh(4);
    let g3 = gpu_mut(&mut s, 3);
    g3.lost = true;
    g3.links.clear();
    link_mut(&mut s, 0, mesh_link(0, 1)).active = false;
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Down);
    assert_eq!(verdict(&j, 0, 3).status, PairStatus::Down);
    assert_eq!(verdict(&j, 1, 2).status, PairStatus::Ok);
    let found: Vec<(&str, String)> = j
        .findings
        .iter()
        .map(|f| (f.kind.as_str(), f.subject.to_string()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("gpu_lost", "GPU 3".to_string()),
            ("gpu_link_down", "GPU 0 <-> GPU 1".to_string())
        ]
    );
}

#[test]
fn a_resumed_since_is_kept_by_a_pair_still_failing_and_dropped_by_one_that_is_not() {
    let t0 = Instant::now();
    let clock = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let before = clock - Duration::from_secs(180);
    let mut judge = PairJudge::default();
    judge.resume_failing_since(HashMap::from([
        ((uuid(1), uuid(2)), before),
        ((uuid(0), uuid(3)), before),
    ]));
    let mut s = mesh(4);
    link_mut(&mut s, 1, mesh_link(1, 2)).active = false;
    let j = judge.judge_at(&s, t0, clock);
    assert_eq!(
        verdict(&j, 1, 2).since,
        Some(before),
        "down before the restart"
    );
    assert_eq!(verdict(&j, 0, 3).since, None, "0-3 is ok now");
    // 0-3 failing later starts at its own time, not the stale one.
    link_mut(&mut s, 0, mesh_link(0, 3)).active = false;
    let later = clock + Duration::from_secs(10);
    let j = judge.judge_at(&s, secs_after(t0, 10), later);
    assert_eq!(verdict(&j, 0, 3).since, Some(later));
    assert_eq!(verdict(&j, 1, 2).since, Some(before));
}

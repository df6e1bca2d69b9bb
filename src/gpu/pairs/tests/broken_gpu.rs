//! The broken GPU 7: one bad GPU (or pair) on PCIe, mesh and NVSwitch boards, caught at first
//! sight, and the findings it makes.

use super::*;

#[test]
fn pcie_board_gpu7_without_p2p_is_caught_at_first_sight() {
    let j = judge_once(&pcie8(Some(7)));
    assert_only_pairs_of(&j, 7, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 0, 7).reasons),
        vec![
            "P2P read and write not_supported while 12 other pairs at topology level \
             system can"
                .to_string()
        ]
    );
    assert_eq!(
        words(&verdict(&j, 4, 7).reasons),
        vec![
            "P2P read and write not_supported while 9 other pairs at topology level node can"
                .to_string()
        ]
    );
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.kind.as_str(), "gpu_pair_degraded");
    assert_eq!(f.subject.to_string(), "GPU 7");
    assert!(f.message.contains(&uuid(7)), "{}", f.message);
    assert!(f
        .message
        .contains("all 7 of its pairs (pairs with GPUs 0-6) are degraded"));
    assert!(f.message.contains("at topology level node can"));
    assert!(f.message.contains("Drain the node"));
    assert!(f.message.contains("nvidia-smi topo -p2p rw"));
    assert!(f.message.contains("nvidia-smi nvlink -s -i 7"));
}

#[test]
fn board_without_p2p_anywhere_is_fine() {
    let mut s = pcie8(None);
    for p in &mut s.pairs {
        p.p2p = Some(caps(NS, NS, NS));
    }
    let j = judge_once(&s);
    assert_eq!(j.pairs.len(), 28);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
}

#[test]
fn p2p_only_within_a_socket_is_fine() {
    let mut s = pcie8(None);
    for p in &mut s.pairs {
        if p.topology == Some(TopologyLevel::System) {
            p.p2p = Some(caps(P2pStatus::ChipsetNotSupported, NS, NS));
        }
    }
    let j = judge_once(&s);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
    assert_eq!(
        verdict(&j, 0, 4).p2p.map(|c| c.read),
        Some(P2pStatus::ChipsetNotSupported)
    );
}

#[test]
fn mesh_gpu3_links_inactive_makes_its_pairs_down() {
    let mut s = mesh(4);
    for other in 0..3 {
        link_mut(&mut s, 3, mesh_link(3, other)).active = false;
        link_mut(&mut s, other, mesh_link(other, 3)).active = false;
    }
    let j = judge_once(&s);
    assert_only_pairs_of(&j, 3, PairStatus::Down);
    let p = verdict(&j, 0, 3);
    assert_eq!(p.links, vec![2]);
    assert_eq!(
        words(&p.reasons),
        vec![
            "link 2 of GPU 0 to GPU 3 is inactive".to_string(),
            "link 0 of GPU 3 to GPU 0 is inactive".to_string(),
        ]
    );
    assert_eq!(verdict(&j, 1, 2).links, vec![1]);
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_link_down", "GPU 3")
    );
    assert!(f
        .message
        .contains("all 3 of its pairs (pairs with GPUs 0-2) are down"));
    assert!(f.message.contains("link 2 of GPU 1 to GPU 3 is inactive"));
}

#[test]
fn healthy_mesh_lists_direct_links() {
    let j = judge_once(&mesh(4));
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());
    assert_eq!(verdict(&j, 0, 1).links, vec![0]);
    assert_eq!(verdict(&j, 0, 3).links, vec![2]);
    assert_eq!(verdict(&j, 2, 3).links, vec![2]);
}

#[test]
fn several_links_between_two_gpus_are_all_listed() {
    let mut s = GpuSample {
        gpus: vec![
            gpu(
                0,
                vec![
                    link(5, Peer::Gpu(1)),
                    link(1, Peer::Gpu(1)),
                    link(3, Peer::Gpu(1)),
                ],
            ),
            gpu(1, vec![link(0, Peer::Gpu(0))]),
        ],
        pairs: vec![pair(
            0,
            1,
            Some(caps(OK, OK, OK)),
            Some(TopologyLevel::Node),
        )],
        hypervisor: None,
        probes: Vec::new(),
    };
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 0, 1).links, vec![1, 3, 5]);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    // one of three links inactive is still down, per the contract
    link_mut(&mut s, 0, 3).active = false;
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Down);
    assert_eq!(
        words(&verdict(&j, 0, 1).reasons),
        vec!["link 3 of GPU 0 to GPU 1 is inactive".to_string()]
    );
    // two GPUs: always a pair finding
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].subject.to_string(), "GPU 0 <-> GPU 1");
    assert_eq!(j.findings[0].kind.as_str(), "gpu_link_down");
}

#[test]
fn nvswitch_gpu7_links_inactive_is_one_finding() {
    let mut s = nvswitch(8, 18);
    for l in &mut gpu_mut(&mut s, 7).links {
        l.active = false;
    }
    let j = judge_once(&s);
    assert_eq!(j.pairs.len(), 28);
    assert_only_pairs_of(&j, 7, PairStatus::Down);
    assert_eq!(
        words(&verdict(&j, 3, 7).reasons),
        vec!["all 18 NVSwitch links of GPU 7 are inactive".to_string()]
    );
    assert!(j.pairs.iter().all(|p| p.links.is_empty()));
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_link_down", "GPU 7")
    );
    assert!(f.message.contains(&uuid(7)));
    assert!(f.message.contains("pairs with GPUs 0-6"));
    assert_eq!(
        j.findings
            .iter()
            .filter(|f| f.message.contains("GPU 7"))
            .count(),
        1
    );
}

#[test]
fn nvswitch_gpu7_replay_errors_degrade_all_its_pairs() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = nvswitch(8, 18);
    let j = judge.judge(&s, t0);
    assert!(all_ok(&j));
    assert!(j.findings.is_empty());

    link_mut(&mut s, 7, 2).errors = Some(errs(3, 0, 0, 0, 0));
    link_mut(&mut s, 7, 5).errors = Some(errs(1, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert_only_pairs_of(&j, 7, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 0, 7).reasons),
        vec!["NVLink replay errors on GPU 7 links 2, 5: +4 in the last 60 s".to_string()]
    );
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_pair_degraded", "GPU 7")
    );
    assert!(f
        .message
        .contains("NVLink replay errors on GPU 7 links 2, 5"));
}

#[test]
fn nvswitch_gpu7_unresolved_links_caught_by_nvlink_p2p() {
    // The collector could not resolve GPU 7's dead links (peer unknown), but NVML's P2P
    // status says NVLink no longer reaches GPU 7 while it reaches the other 21 pairs.
    let mut s = nvswitch(8, 18);
    for l in &mut gpu_mut(&mut s, 7).links {
        l.active = false;
        l.peer = Peer::Unknown;
    }
    for a in 0..7 {
        set_p2p(&mut s, a, 7, Some(caps(OK, OK, NS)));
    }
    let j = judge_once(&s);
    assert_only_pairs_of(&j, 7, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 2, 7).reasons),
        vec![
            "P2P over NVLink not_supported while 21 other pairs on this NVSwitch fabric can"
                .to_string()
        ]
    );
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].subject.to_string(), "GPU 7");
    assert_eq!(j.findings[0].severity, Severity::Critical);
}

#[test]
fn nvlink_capability_is_not_compared_without_nvswitch() {
    // PCIe GPUs with NVLink bridges in pairs (0-1, 2-3): NVLink P2P only within a bridge.
    let s = GpuSample {
        gpus: vec![
            gpu(0, vec![link(0, Peer::Gpu(1))]),
            gpu(1, vec![link(0, Peer::Gpu(0))]),
            gpu(2, vec![link(0, Peer::Gpu(3))]),
            gpu(3, vec![link(0, Peer::Gpu(2))]),
        ],
        pairs: all_pairs(4, |a, b| {
            let bridged = (a, b) == (0, 1) || (a, b) == (2, 3);
            let nv = if bridged { OK } else { NS };
            (Some(caps(OK, OK, nv)), Some(TopologyLevel::Node))
        }),
        hypervisor: None,
        probes: Vec::new(),
    };
    let j = judge_once(&s);
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());
}

#[test]
fn mixed_models_are_compared_with_their_like() {
    // three T4s and an A100 under one NUMA node: P2P between different models is not
    // supported, which is the platform, not a broken GPU
    let mut s = GpuSample {
        gpus: (0..4).map(|i| gpu(i, Vec::new())).collect(),
        pairs: all_pairs(4, |_, b| {
            let st = if b == 3 {
                P2pStatus::GpuNotSupported
            } else {
                OK
            };
            (Some(caps(st, st, NS)), Some(TopologyLevel::Node))
        }),
        hypervisor: None,
        probes: Vec::new(),
    };
    for g in &mut s.gpus {
        g.name = if g.index == 3 {
            "NVIDIA A100-PCIE-40GB".into()
        } else {
            "Tesla T4".into()
        };
    }
    let j = judge_once(&s);
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());
    // a T4 pair failing where the other T4 pairs work is still caught
    set_p2p(&mut s, 1, 2, Some(caps(NS, NS, NS)));
    let j = judge_once(&s);
    assert_eq!(
        words(&verdict(&j, 1, 2).reasons),
        vec![
            "P2P read and write not_supported while 2 other pairs at topology level node can"
                .to_string()
        ]
    );
    assert_eq!(
        j.pairs
            .iter()
            .filter(|p| p.status != PairStatus::Ok)
            .count(),
        1
    );
}

#[test]
fn some_nvswitch_links_inactive_degrade() {
    let mut s = nvswitch(8, 18);
    link_mut(&mut s, 7, 3).active = false;
    link_mut(&mut s, 7, 4).active = false;
    let j = judge_once(&s);
    assert_only_pairs_of(&j, 7, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 6, 7).reasons),
        vec!["2 of 18 NVSwitch links of GPU 7 are inactive (links 3, 4)".to_string()]
    );
    assert_eq!(j.findings.len(), 1);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_pair_degraded", "GPU 7")
    );
}

#[test]
fn every_pair_down_is_one_node_finding() {
    let mut s = nvswitch(8, 12);
    for g in &mut s.gpus {
        for l in &mut g.links {
            l.active = false;
        }
    }
    let j = judge_once(&s);
    assert!(j.pairs.iter().all(|p| p.status == PairStatus::Down));
    assert_eq!(
        words(&verdict(&j, 0, 1).reasons),
        vec![
            "all 12 NVSwitch links of GPU 0 are inactive".to_string(),
            "all 12 NVSwitch links of GPU 1 are inactive".to_string(),
        ]
    );
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Critical, "gpu_link_down", "all GPUs")
    );
    assert!(f
        .message
        .contains("Every one of the 28 pairs of the 8 GPUs is down"));
    assert!(f.message.contains("nvidia-fabricmanager"));
    assert!(f
        .message
        .contains("all 12 NVSwitch links of GPU 7 are inactive"));
    assert!(!f.message.contains("more)"), "{}", f.message);
}

#[test]
fn two_broken_gpus_are_two_findings() {
    let mut s = nvswitch(8, 18);
    for g in [6, 7] {
        for l in &mut gpu_mut(&mut s, g).links {
            l.active = false;
        }
    }
    let j = judge_once(&s);
    let down = j
        .pairs
        .iter()
        .filter(|p| p.status == PairStatus::Down)
        .count();
    assert_eq!(down, 13);
    let subjects: Vec<String> = j.findings.iter().map(|f| f.subject.to_string()).collect();
    assert_eq!(subjects, vec!["GPU 6", "GPU 7"]);
    assert!(j
        .findings
        .iter()
        .all(|f| f.kind.as_str() == "gpu_link_down"));
}

#[test]
fn broken_gpu_and_an_unrelated_pair_are_two_findings() {
    let mut s = pcie8(Some(7));
    set_p2p(&mut s, 2, 3, Some(caps(OK, NS, NS)));
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 2, 3).status, PairStatus::Degraded);
    assert_eq!(
        words(&verdict(&j, 2, 3).reasons),
        vec!["P2P write not_supported while 8 other pairs at topology level node can".to_string()]
    );
    let subjects: Vec<String> = j.findings.iter().map(|f| f.subject.to_string()).collect();
    assert_eq!(subjects, vec!["GPU 7", "GPU 2 <-> GPU 3"]);
    assert_eq!(j.findings[1].kind.as_str(), "gpu_pair_degraded");
    assert_eq!(j.findings[1].severity, Severity::Critical);
}

#[test]
fn separate_failing_pairs_are_a_finding_each() {
    let mut s = pcie8(None);
    set_p2p(&mut s, 0, 1, Some(caps(NS, OK, NS)));
    set_p2p(
        &mut s,
        5,
        6,
        Some(caps(P2pStatus::Unknown, P2pStatus::GpuNotSupported, NS)),
    );
    let j = judge_once(&s);
    assert_eq!(
        words(&verdict(&j, 5, 6).reasons),
        vec![
            "P2P read unknown and write gpu_not_supported while 10 other pairs at topology \
             level node can"
                .to_string()
        ]
    );
    let subjects: Vec<String> = j.findings.iter().map(|f| f.subject.to_string()).collect();
    assert_eq!(subjects, vec!["GPU 0 <-> GPU 1", "GPU 5 <-> GPU 6"]);
    assert!(j.findings[0]
        .message
        .starts_with("GPU 0 <-> GPU 1 is degraded: P2P read"));
}

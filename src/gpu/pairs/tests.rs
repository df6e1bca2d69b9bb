use std::time::{Duration, Instant};

use super::*;
use crate::findings::Severity;
use crate::gpu::{
    GpuReading, LinkErrors, LinkReading, P2pCaps, P2pStatus, PairSample, Peer, TopologyLevel,
};

const OK: P2pStatus = P2pStatus::Ok;
const NS: P2pStatus = P2pStatus::NotSupported;

// ---- builders -------------------------------------------------------------------------

fn uuid(i: u32) -> String {
    format!("GPU-{i:08x}-aaaa-bbbb-cccc-000000000000")
}

fn gpu(index: u32, links: Vec<LinkReading>) -> GpuReading {
    GpuReading {
        index,
        uuid: uuid(index),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
        pcie_replays: Some(0),
        lost: false,
        links,
    }
}

fn link(l: u32, peer: Peer) -> LinkReading {
    LinkReading {
        link: l,
        active: true,
        peer,
        errors: Some(LinkErrors::default()),
    }
}

fn errs(replay: u64, recovery: u64, crc_flit: u64, crc_data: u64, ecc: u64) -> LinkErrors {
    LinkErrors {
        replay,
        recovery,
        crc_flit,
        crc_data,
        ecc_data: ecc,
    }
}

fn caps(read: P2pStatus, write: P2pStatus, nvlink: P2pStatus) -> P2pCaps {
    P2pCaps {
        read,
        write,
        nvlink,
        atomics: read,
    }
}

fn pair(a: u32, b: u32, p2p: Option<P2pCaps>, topology: Option<TopologyLevel>) -> PairSample {
    PairSample {
        gpu: a,
        peer_gpu: b,
        p2p,
        topology,
    }
}

/// Every unordered pair of `0..n`, described by `f`.
fn all_pairs(
    n: u32,
    f: impl Fn(u32, u32) -> (Option<P2pCaps>, Option<TopologyLevel>),
) -> Vec<PairSample> {
    let mut out = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let (p2p, topology) = f(a, b);
            out.push(pair(a, b, p2p, topology));
        }
    }
    out
}

/// Two sockets: GPUs of the same half share a NUMA node, the others meet at the system.
fn socket_level(n: u32, a: u32, b: u32) -> TopologyLevel {
    if (a < n / 2) == (b < n / 2) {
        TopologyLevel::Node
    } else {
        TopologyLevel::System
    }
}

/// 8 PCIe GPUs, no NVLink; P2P read/write ok everywhere except pairs with `broken`.
fn pcie8(broken: Option<u32>) -> GpuSample {
    GpuSample {
        gpus: (0..8).map(|i| gpu(i, Vec::new())).collect(),
        pairs: all_pairs(8, |a, b| {
            let bad = Some(a) == broken || Some(b) == broken;
            let st = if bad { NS } else { OK };
            (Some(caps(st, st, NS)), Some(socket_level(8, a, b)))
        }),
    }
}

/// `n` GPUs, each with one direct NVLink to every other: GPU a's links are numbered in the
/// order of its peers, so GPU 0's link 2 leads to GPU 3 and GPU 3's link 0 to GPU 0.
fn mesh(n: u32) -> GpuSample {
    GpuSample {
        gpus: (0..n)
            .map(|a| {
                let peers = (0..n).filter(|&b| b != a);
                gpu(
                    a,
                    peers
                        .enumerate()
                        .map(|(l, b)| link(l as u32, Peer::Gpu(b)))
                        .collect(),
                )
            })
            .collect(),
        pairs: all_pairs(n, |a, b| {
            (Some(caps(OK, OK, OK)), Some(socket_level(n, a, b)))
        }),
    }
}

fn mesh_link(a: u32, b: u32) -> u32 {
    if b < a {
        b
    } else {
        b - 1
    }
}

/// `n` GPUs on NVSwitches, `links` switch links each; P2P ok everywhere, NVLink included.
fn nvswitch(n: u32, links: u32) -> GpuSample {
    GpuSample {
        gpus: (0..n)
            .map(|a| gpu(a, (0..links).map(|l| link(l, Peer::Switch)).collect()))
            .collect(),
        pairs: all_pairs(n, |a, b| {
            (Some(caps(OK, OK, OK)), Some(socket_level(n, a, b)))
        }),
    }
}

fn gpu_mut(s: &mut GpuSample, index: u32) -> &mut GpuReading {
    s.gpus.iter_mut().find(|g| g.index == index).expect("gpu")
}

fn link_mut(s: &mut GpuSample, index: u32, l: u32) -> &mut LinkReading {
    gpu_mut(s, index)
        .links
        .iter_mut()
        .find(|x| x.link == l)
        .expect("link")
}

fn set_p2p(s: &mut GpuSample, a: u32, b: u32, p2p: Option<P2pCaps>) {
    s.pairs
        .iter_mut()
        .find(|p| p.gpu == a && p.peer_gpu == b)
        .expect("pair")
        .p2p = p2p;
}

fn verdict(j: &Judgement, a: u32, b: u32) -> &PairVerdict {
    j.pairs
        .iter()
        .find(|p| p.gpu == a && p.peer_gpu == b)
        .expect("verdict")
}

/// Every pair with `g` has `status`, every other pair is ok.
fn assert_only_pairs_of(j: &Judgement, g: u32, status: PairStatus) {
    for p in &j.pairs {
        if p.gpu == g || p.peer_gpu == g {
            assert_eq!(
                p.status, status,
                "{}-{}: {:?}",
                p.gpu, p.peer_gpu, p.reasons
            );
        } else {
            assert_eq!(
                p.status,
                PairStatus::Ok,
                "{}-{}: {:?}",
                p.gpu,
                p.peer_gpu,
                p.reasons
            );
            assert!(p.reasons.is_empty());
        }
    }
}

fn all_ok(j: &Judgement) -> bool {
    j.pairs
        .iter()
        .all(|p| p.status == PairStatus::Ok && p.reasons.is_empty())
}

fn secs_after(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

fn judge_once(sample: &GpuSample) -> Judgement {
    PairJudge::new(PairRules::default()).judge(sample, Instant::now())
}

// ---- rules and shape ------------------------------------------------------------------

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

// ---- the broken GPU 7 -----------------------------------------------------------------

#[test]
fn pcie_board_gpu7_without_p2p_is_caught_at_first_sight() {
    let j = judge_once(&pcie8(Some(7)));
    assert_only_pairs_of(&j, 7, PairStatus::Degraded);
    assert_eq!(
        verdict(&j, 0, 7).reasons,
        vec![
            "P2P read and write not_supported while 12 other pairs at topology level \
             system can"
                .to_string()
        ]
    );
    assert_eq!(
        verdict(&j, 4, 7).reasons,
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
        p.reasons,
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
    };
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 0, 1).links, vec![1, 3, 5]);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    // one of three links inactive is still down, per the contract
    link_mut(&mut s, 0, 3).active = false;
    let j = judge_once(&s);
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Down);
    assert_eq!(
        verdict(&j, 0, 1).reasons,
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
        verdict(&j, 3, 7).reasons,
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
        verdict(&j, 0, 7).reasons,
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
        verdict(&j, 2, 7).reasons,
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
        verdict(&j, 1, 2).reasons,
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
        verdict(&j, 6, 7).reasons,
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
        verdict(&j, 0, 1).reasons,
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
        verdict(&j, 2, 3).reasons,
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
        verdict(&j, 5, 6).reasons,
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

// ---- error counters over time ---------------------------------------------------------

#[test]
fn replay_growth_degrades_then_leaves_the_window() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    let j = judge.judge(&s, t0);
    assert!(all_ok(&j));

    link_mut(&mut s, 0, 0).errors = Some(errs(3, 0, 0, 0, 0));
    for t in (5..=60).step_by(5) {
        let j = judge.judge(&s, secs_after(t0, t));
        assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded, "at {t} s");
        assert_eq!(
            verdict(&j, 0, 1).reasons,
            vec!["NVLink replay errors on GPU 0 link 0: +3 in the last 60 s".to_string()]
        );
        assert_eq!(
            j.pairs
                .iter()
                .filter(|p| p.status != PairStatus::Ok)
                .count(),
            1
        );
        assert_eq!(j.findings.len(), 1);
        let f = &j.findings[0];
        assert_eq!(
            (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
            (Severity::Warning, "gpu_pair_degraded", "GPU 0 <-> GPU 1")
        );
        assert!(f.message.contains("nvidia-smi nvlink -e"));
    }
    // seen at 5 s; at 65 s that is more than 60 s ago
    let j = judge.judge(&s, secs_after(t0, 65));
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());
    // the history covers the window and one baseline, no more: samples 5..=65
    assert_eq!(judge.counters[&(uuid(0), 0)].len(), 13);
}

#[test]
fn growth_counts_from_the_newest_sample_outside_the_window() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    judge.judge(&s, t0);
    link_mut(&mut s, 0, 0).errors = Some(errs(2, 0, 0, 0, 0));
    assert_eq!(
        verdict(&judge.judge(&s, secs_after(t0, 30)), 0, 1).status,
        PairStatus::Degraded
    );
    link_mut(&mut s, 0, 0).errors = Some(errs(5, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 80));
    // baseline is the sample at 0 s (newest at or before 20 s): +5
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec!["NVLink replay errors on GPU 0 link 0: +5 in the last 60 s".to_string()]
    );
    let j = judge.judge(&s, secs_after(t0, 95));
    // baseline now the sample at 30 s: +3
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec!["NVLink replay errors on GPU 0 link 0: +3 in the last 60 s".to_string()]
    );
    let j = judge.judge(&s, secs_after(t0, 140));
    assert!(all_ok(&j));
}

#[test]
fn recovery_and_ecc_growth_are_reasons() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    judge.judge(&s, t0);
    link_mut(&mut s, 1, 0).errors = Some(errs(0, 2, 0, 0, 1));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec![
            "NVLink recovery errors on GPU 1 link 0: +2 in the last 60 s".to_string(),
            "NVLink ECC data errors on GPU 1 link 0: +1 in the last 60 s".to_string(),
        ]
    );
    assert_eq!(verdict(&j, 1, 2).status, PairStatus::Ok);
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].severity, Severity::Warning);
}

#[test]
fn slow_crc_growth_warns_but_the_pair_stays_ok() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    judge.judge(&s, t0);
    link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 3, 2, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert!(all_ok(&j));
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Warning, "gpu_link_errors", "GPU 0")
    );
    assert!(
        f.message.contains("link 0 CRC +5 (up to 1/s)"),
        "{}",
        f.message
    );
    assert!(f.message.contains(&uuid(0)));
    // the warning lasts while the growth is in the window
    let j = judge.judge(&s, secs_after(t0, 60));
    assert_eq!(j.findings.len(), 1);
    let j = judge.judge(&s, secs_after(t0, 66));
    assert!(j.findings.is_empty());
}

#[test]
fn fast_crc_growth_degrades_without_a_second_finding() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    judge.judge(&s, t0);
    link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 800, 200, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec![
            "NVLink CRC errors on GPU 0 link 0: +1000 in the last 60 s, up to 200/s \
             (degraded at 100/s)"
                .to_string()
        ]
    );
    assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
    assert_eq!(j.findings[0].kind.as_str(), "gpu_pair_degraded");
    assert_eq!(j.findings[0].subject.to_string(), "GPU 0 <-> GPU 1");
}

#[test]
fn crc_rate_is_between_consecutive_samples() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    judge.judge(&s, t0);
    // 90 over 1 s: below 100/s
    link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 90, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 1));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Ok);
    // another 150 over the next second: 150/s, though 240 over 2 s would average 120/s
    link_mut(&mut s, 0, 0).errors = Some(errs(0, 0, 240, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 2));
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec![
            "NVLink CRC errors on GPU 0 link 0: +240 in the last 60 s, up to 150/s \
             (degraded at 100/s)"
                .to_string()
        ]
    );
}

#[test]
fn counter_reset_is_a_new_baseline() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    link_mut(&mut s, 2, 1).errors = Some(errs(100, 7, 50, 50, 4));
    assert!(all_ok(&judge.judge(&s, t0)));
    // driver reload: every counter back near zero
    link_mut(&mut s, 2, 1).errors = Some(errs(3, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert!(all_ok(&j), "{:#?}", j.pairs);
    assert!(j.findings.is_empty());
    let j = judge.judge(&s, secs_after(t0, 10));
    assert!(all_ok(&j));
    link_mut(&mut s, 2, 1).errors = Some(errs(5, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 15));
    // GPU 2's link 1 leads to GPU 1
    assert_eq!(
        verdict(&j, 1, 2).reasons,
        vec!["NVLink replay errors on GPU 2 link 1: +2 in the last 60 s".to_string()]
    );
}

#[test]
fn unreadable_counters_keep_the_history_and_still_expire() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    judge.judge(&s, t0);
    link_mut(&mut s, 0, 0).errors = Some(errs(4, 0, 0, 0, 0));
    judge.judge(&s, secs_after(t0, 5));
    link_mut(&mut s, 0, 0).errors = None;
    let j = judge.judge(&s, secs_after(t0, 30));
    assert_eq!(verdict(&j, 0, 1).status, PairStatus::Degraded);
    let j = judge.judge(&s, secs_after(t0, 70));
    assert!(all_ok(&j));
    link_mut(&mut s, 0, 0).errors = Some(errs(4, 0, 0, 0, 0));
    assert!(all_ok(&judge.judge(&s, secs_after(t0, 75))));
}

#[test]
fn growth_below_a_raised_threshold_is_a_warning() {
    let t0 = Instant::now();
    let mut judge = PairJudge::new(PairRules {
        replay_recovery_degraded: 5,
        ..PairRules::default()
    });
    let mut s = mesh(4);
    judge.judge(&s, t0);
    link_mut(&mut s, 3, 2).errors = Some(errs(2, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert!(all_ok(&j));
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].kind.as_str(), "gpu_link_errors");
    assert_eq!(j.findings[0].subject.to_string(), "GPU 3");
    assert!(j.findings[0].message.contains("link 2 replay +2"));
    link_mut(&mut s, 3, 2).errors = Some(errs(7, 0, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 10));
    assert_eq!(verdict(&j, 2, 3).status, PairStatus::Degraded);
}

#[test]
fn errors_on_a_link_to_no_gpu_are_a_warning_only() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(2);
    gpu_mut(&mut s, 1)
        .links
        .push(link(4, Peer::Pci("00000000:05:00.0".into())));
    judge.judge(&s, t0);
    link_mut(&mut s, 1, 4).errors = Some(errs(6, 1, 0, 0, 0));
    let j = judge.judge(&s, secs_after(t0, 5));
    assert!(all_ok(&j));
    assert_eq!(j.findings.len(), 1);
    let f = &j.findings[0];
    assert_eq!(
        (f.severity, f.kind.as_str(), f.subject.to_string().as_str()),
        (Severity::Warning, "gpu_link_errors", "GPU 1")
    );
    assert!(
        f.message.contains("link 4 replay +6, recovery +1"),
        "{}",
        f.message
    );
}

// ---- P2P regressions, lost GPUs, flapping links -----------------------------------------

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
        verdict(&j, 0, 1).reasons,
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
fn link_going_down_and_coming_back() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = mesh(4);
    link_mut(&mut s, 1, mesh_link(1, 2)).active = false;
    let j = judge.judge(&s, t0);
    assert_eq!(verdict(&j, 1, 2).status, PairStatus::Down);
    assert_eq!(
        verdict(&j, 1, 2).reasons,
        vec!["link 1 of GPU 1 to GPU 2 is inactive".to_string()]
    );
    assert_eq!(
        j.pairs
            .iter()
            .filter(|p| p.status != PairStatus::Ok)
            .count(),
        1
    );
    assert_eq!(j.findings.len(), 1);
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
    });
    g.links.push(LinkReading {
        link: 8,
        active: false,
        peer: Peer::Pci("00000000:05:00.0".into()),
        errors: None,
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
    };
    gpu_mut(&mut s, 2).lost = true;
    for (a, b) in [(0, 2), (1, 2), (2, 3)] {
        set_p2p(&mut s, a, b, None);
    }
    let j = judge_once(&s);
    assert_only_pairs_of(&j, 2, PairStatus::Down);
    assert_eq!(
        verdict(&j, 2, 3).reasons,
        vec!["GPU 2 is lost (fell off the bus)".to_string()]
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
fn missing_p2p_is_not_a_verdict() {
    let s = GpuSample {
        gpus: (0..3).map(|i| gpu(i, Vec::new())).collect(),
        pairs: Vec::new(),
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
    assert_eq!(
        verdict(&j, 0, 1).reasons,
        vec!["P2P read not_supported while 4 other pairs of unknown topology can".to_string()]
    );
    assert_eq!(verdict(&j, 2, 3).status, PairStatus::Ok);
    assert_eq!(
        j.pairs
            .iter()
            .filter(|p| p.status != PairStatus::Ok)
            .count(),
        1
    );
    assert_eq!(j.findings.len(), 1);
    assert_eq!(j.findings[0].subject.to_string(), "GPU 0 <-> GPU 1");
}

// ---- identity across scans ------------------------------------------------------------

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
        verdict(&j, 0, 1).reasons,
        vec!["NVLink replay errors on GPU 1 link 0: +2 in the last 60 s".to_string()]
    );
}

#[test]
fn baselines_of_vanished_gpus_are_dropped() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let full = mesh(3);
    judge.judge(&full, t0);
    assert!(judge.counters.keys().any(|(u, _)| *u == uuid(2)));
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
    assert!(!judge.counters.keys().any(|(u, _)| *u == uuid(2)));
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

// ---- hostile input --------------------------------------------------------------------

#[test]
fn odd_input_does_not_panic() {
    let mut a = gpu(0, Vec::new());
    a.links = vec![
        LinkReading {
            link: 0,
            active: false,
            peer: Peer::Gpu(0),
            errors: Some(errs(u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX)),
        },
        LinkReading {
            link: 1,
            active: false,
            peer: Peer::Gpu(99),
            errors: None,
        },
        LinkReading {
            link: u32::MAX,
            active: true,
            peer: Peer::Gpu(1),
            errors: Some(LinkErrors::default()),
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
    };
    let mut judge = PairJudge::new(PairRules {
        window: Duration::ZERO,
        replay_recovery_degraded: 0,
        crc_degraded_per_sec: f64::NAN,
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
    assert!(judge.counters.is_empty());
    assert!(judge.p2p_ever_ok.is_empty());
}

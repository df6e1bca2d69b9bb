//! Tests of the pair judge, one file per rule family; the builders they share are here.
//!
//! `shape.rs` (rules and the shape of a judgement), `broken_gpu.rs` (one broken GPU on PCIe,
//! mesh and NVSwitch boards, and how findings group), `links.rs` (rules 1-2: lost GPUs,
//! inactive links), `counters.rs` (rule 3: error counters over time), `p2p.rs` (rules 4-5: P2P
//! regressions and outliers), `identity.rs` (GPUs matched by UUID across scans), `hostile.rs`
//! (odd input), `nvlink5.rs` (rules 3b-3c: NVLink5 counters, recovery action, fabric).

use std::time::{Duration, Instant};

use super::*;
use crate::model::Severity;
use crate::model::{
    GpuReading, LinkErrors, LinkReading, P2pCaps, P2pStatus, PairSample, Peer, TopologyLevel,
};

const OK: P2pStatus = P2pStatus::Ok;
const NS: P2pStatus = P2pStatus::NotSupported;

mod broken_gpu;
mod counters;
mod hostile;
mod identity;
mod links;
mod nvlink5;
mod p2p;
mod pcie;
mod shape;

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
        recovery_action: None,
        fabric: None,
        platform: None,
        vbios: None,
        links,
        nvswitches: Vec::new(),
        processes: Vec::new(),
        pcie_link: None,
        utilization_percent: None,
        pcie_path: Vec::new(),
    }
}

fn link(l: u32, peer: Peer) -> LinkReading {
    LinkReading {
        link: l,
        active: true,
        peer,
        errors: Some(LinkErrors::default()),
        nvlink5: None,
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
        hypervisor: None,
        probes: Vec::new(),
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
        hypervisor: None,
        probes: Vec::new(),
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
        hypervisor: None,
        probes: Vec::new(),
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

/// The reasons' words, as the JSON writes them.
fn words(reasons: &[crate::model::PairReason]) -> Vec<String> {
    reasons.iter().map(ToString::to_string).collect()
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

/// Pair `a`-`b` alone is not ok, for `reasons`, and it is the one finding.
fn assert_only_pair_fails(j: &Judgement, a: u32, b: u32, reasons: &[&str]) {
    assert_eq!(words(&verdict(j, a, b).reasons), reasons);
    assert_eq!(
        j.pairs
            .iter()
            .filter(|p| p.status != PairStatus::Ok)
            .count(),
        1
    );
    assert_eq!(j.findings.len(), 1);
}

/// The findings as (kind, subject, severity).
fn kinds(j: &Judgement) -> Vec<(&'static str, String, Severity)> {
    j.findings
        .iter()
        .map(|f| (f.kind.as_str(), f.subject.to_string(), f.severity))
        .collect()
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

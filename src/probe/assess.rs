//! Pure: the probe's outcomes, judged with what NVML knows of each pair's path.
//!
//! - A copy error, a corrupted byte, a copy that did not finish within its deadline or that
//!   took the worker down: `failed`, naming the direction.
//! - Peer access refused between two GPUs NVML says can do P2P (NVLink, or P2P read and write
//!   ok): `failed`. DCGM's P2P test skips such a pair and counts it as passing; it is exactly a
//!   GPU that lost P2P. Where NVML says they cannot, copies through host memory are expected.
//! - Bandwidth under half of what the pair's own path carries (its active NVLinks times their
//!   speed, or the PCIe generation and width both ends allow), or under half of the median of
//!   like pairs on the board (the same expected figure, three pairs or more): `degraded`.
//! - A GPU all of whose probed pairs fail or are degraded, with three GPUs or more and not all
//!   of them so, is named as the culprit, by the pair judge's rule (`gpu::blame`).
//!
//! This is the one judgement of a probe's result: `serve`'s pair judge takes these verdicts as
//! they are (rule 8), weighed by `ProbeStatus::weight`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Outcome, PeerLine, Probed};
use crate::gpu::blame::{self, PairOutcome};
use crate::gpu::pci::same_pci_device;
use crate::model::{GpuSample, P2pStatus, PairProbe, Peer, ProbeStatus};
use crate::text;

/// Peer access as CUDA answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerAccess {
    Granted,
    /// cuDeviceCanAccessPeer said no, or cuCtxEnablePeerAccess failed.
    Refused,
    /// The pair ended before it was asked (a context, a hang or a crash before).
    NotTried,
}

/// The way the sized copy went: between the GPUs, or (without peer access) staged through
/// host memory by the driver, when its speed is the host's and not the pair's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyPath {
    Peer,
    Host,
}

/// What a pair's copies did beyond its verdict: the table's PEER, PATH and VERIFIED columns,
/// and `--json`'s keys of the same names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CopyFacts {
    pub peer: PeerAccess,
    /// None: no copy was tried.
    pub path: Option<CopyPath>,
    /// The bytes read back were compared with those sent (`verified`: and matched).
    pub compared: bool,
}

/// What the probe found, by NVML index.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    pub pairs: Vec<PairProbe>,
    /// Each pair's copy facts, in the order of `pairs`.
    pub facts: Vec<CopyFacts>,
    /// GPUs that fail with every peer probed.
    pub culprits: Vec<u32>,
    /// CUDA devices NVML does not list (their pairs are not judged).
    pub unmatched: Vec<String>,
}

impl ProbeReport {
    pub fn all_ok(&self) -> bool {
        self.pairs.iter().all(|p| p.status == ProbeStatus::Ok)
    }
}

/// One NVLink's bandwidth per direction, GB/s: 25 for NVLink 2 to 4, 50 for NVLink 5
/// (Blackwell: the GPUs with NVLink5 counters).
fn link_gbps(nvlink5: bool) -> f64 {
    if nvlink5 {
        50.0
    } else {
        25.0
    }
}

/// One PCIe lane per direction, GB/s, after encoding (Gen1-2 8b/10b, Gen3+ 128b/130b).
fn lane_gbps(gen: u32) -> Option<f64> {
    Some(match gen {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.877,
        _ => return None,
    })
}

/// What the pair's own path carries per direction, GB/s, as NVML describes it.
pub fn expected_gbps(sample: &GpuSample, from: u32, to: u32) -> Option<f64> {
    let gpu = |i: u32| sample.gpus.iter().find(|g| g.index == i);
    let (a, b) = (gpu(from)?, gpu(to)?);
    let nvlink5 = |g: &crate::model::GpuReading| g.links.iter().any(|l| l.nvlink5.is_some());
    let switch_links = |g: &crate::model::GpuReading| {
        g.links
            .iter()
            .filter(|l| l.active && l.peer == Peer::Switch)
            .count()
    };
    let (sa, sb) = (switch_links(a), switch_links(b));
    if sa > 0 && sb > 0 {
        return Some(sa.min(sb) as f64 * link_gbps(nvlink5(a) && nvlink5(b)));
    }
    let direct = a
        .links
        .iter()
        .filter(|l| l.active && l.peer == Peer::Gpu(to))
        .count();
    if direct > 0 {
        return Some(direct as f64 * link_gbps(nvlink5(a) && nvlink5(b)));
    }
    let (la, lb) = (a.pcie_link?, b.pcie_link?);
    let gen = la.max_gen.min(lb.max_gen);
    let width = la.max_width.min(lb.max_width);
    Some(lane_gbps(gen)? * f64::from(width))
}

/// Whether NVML says the pair can do P2P, and over NVLink.
fn nvml_p2p(sample: &GpuSample, from: u32, to: u32) -> (bool, bool) {
    let gpu = |i: u32| sample.gpus.iter().find(|g| g.index == i);
    let nvlink = match (gpu(from), gpu(to)) {
        (Some(a), Some(b)) => {
            let switch = |g: &crate::model::GpuReading| {
                g.links.iter().any(|l| l.active && l.peer == Peer::Switch)
            };
            (switch(a) && switch(b)) || a.links.iter().any(|l| l.active && l.peer == Peer::Gpu(to))
        }
        _ => false,
    };
    let (lo, hi) = (from.min(to), from.max(to));
    let caps = sample
        .pairs
        .iter()
        .find(|p| p.gpu == lo && p.peer_gpu == hi)
        .and_then(|p| p.p2p);
    let rw = caps.is_some_and(|c| c.read == P2pStatus::Ok && c.write == P2pStatus::Ok);
    let nvlink = nvlink || caps.is_some_and(|c| c.nvlink == P2pStatus::Ok);
    (nvlink || rw, nvlink)
}

/// NVML's index of CUDA device `cuda`, by PCI bus id.
pub fn index_of(devices: &[String], sample: &GpuSample, cuda: i32) -> Option<u32> {
    let bus = devices.get(usize::try_from(cuda).ok()?)?;
    sample
        .gpus
        .iter()
        .find(|g| same_pci_device(&g.pci_bus_id, bus))
        .map(|g| g.index)
}

/// One pair's verdict as it ends (the progress line): all but the comparison with like pairs,
/// which needs the board's.
pub fn one(
    devices: &[String],
    sample: &GpuSample,
    (a, b): (i32, i32),
    outcome: &Outcome,
) -> Option<(PairProbe, CopyFacts)> {
    let (from, to) = (index_of(devices, sample, a)?, index_of(devices, sample, b)?);
    Some(pair_verdict(sample, from, to, outcome))
}

pub fn assess(probed: &Probed, sample: &GpuSample) -> ProbeReport {
    let index_of = |cuda: i32| index_of(&probed.devices, sample, cuda);
    let unmatched: Vec<String> = probed
        .devices
        .iter()
        .filter(|bus| {
            !sample
                .gpus
                .iter()
                .any(|g| same_pci_device(&g.pci_bus_id, bus))
        })
        .cloned()
        .collect();
    let mut judged: Vec<(PairProbe, CopyFacts)> = probed
        .outcomes
        .iter()
        .filter_map(|((a, b), outcome)| {
            let (from, to) = (index_of(*a)?, index_of(*b)?);
            Some(pair_verdict(sample, from, to, outcome))
        })
        .collect();
    judged.sort_by_key(|(p, _)| (p.from_gpu, p.to_gpu));
    let (mut pairs, facts): (Vec<PairProbe>, Vec<CopyFacts>) = judged.into_iter().unzip();
    slow_among_like(&mut pairs);
    let culprits = culprits(&pairs);
    ProbeReport {
        pairs,
        facts,
        culprits,
        unmatched,
    }
}

/// PEER and PATH from what peer access answered (None: not asked).
fn peer_facts(peer: Option<(bool, bool)>) -> (PeerAccess, Option<CopyPath>) {
    match peer {
        None => (PeerAccess::NotTried, None),
        Some((true, _)) => (PeerAccess::Granted, Some(CopyPath::Peer)),
        Some((false, true)) => (PeerAccess::Refused, Some(CopyPath::Host)),
        // Neither granted nor refused: the calls before it failed.
        Some((false, false)) => (PeerAccess::NotTried, None),
    }
}

/// (granted, refused) from a peer line.
fn answered(p: &PeerLine) -> (bool, bool) {
    (p.peer_access, p.peer_error.is_some())
}

/// One ordered pair's outcome against what its own path carries and what NVML says of P2P.
fn pair_verdict(
    sample: &GpuSample,
    from: u32,
    to: u32,
    outcome: &Outcome,
) -> (PairProbe, CopyFacts) {
    let expected = expected_gbps(sample, from, to);
    let mut p = PairProbe {
        from_gpu: from,
        to_gpu: to,
        status: ProbeStatus::Failed,
        peer_access: false,
        verified: false,
        gbps: None,
        expected_gbps: expected,
        reason: None,
    };
    let (l, peer) = match outcome {
        Outcome::Hung { after, peer } => {
            p.reason = Some(text::probe_hung(from, to, *after));
            return ended_early(p, peer.as_ref());
        }
        Outcome::Crashed { how, peer } => {
            p.reason = Some(text::probe_crashed(from, to, how));
            return ended_early(p, peer.as_ref());
        }
        Outcome::Ran(l) => (l, (l.peer_access, l.peer_error.is_some())),
    };
    let (peer, path) = peer_facts(Some(peer));
    // Compared: the copies ran to their end, where the bytes read back are compared.
    let compared = l.copy_error.is_none();
    let facts = CopyFacts {
        peer,
        path,
        compared,
    };
    let (p2p, nvlink) = nvml_p2p(sample, from, to);
    p.peer_access = l.peer_access;
    p.verified = compared && l.bad_offset.is_none();
    p.gbps = l
        .seconds
        .filter(|s| *s > 0.0)
        .map(|s| l.bytes as f64 / s / 1e9);
    p.reason = if let Some(e) = &l.copy_error {
        Some(text::probe_copy_error(from, to, e))
    } else if let Some(at) = l.bad_offset {
        Some(text::probe_corrupted(from, to, at, l.bytes))
    } else if !l.peer_access && p2p {
        Some(text::probe_peer_refused(
            from,
            to,
            nvlink,
            l.peer_error.as_deref(),
        ))
    } else {
        None
    };
    if p.reason.is_none() {
        p.status = ProbeStatus::Ok;
        if let (Some(g), Some(e)) = (p.gbps, expected) {
            if g < 0.5 * e {
                p.status = ProbeStatus::Degraded;
                p.reason = Some(text::probe_slow(from, to, g, e));
            }
        }
    }
    (p, facts)
}

/// A pair that hung or crashed: failed (its reason set), with what peer access had answered.
fn ended_early(mut p: PairProbe, peer: Option<&PeerLine>) -> (PairProbe, CopyFacts) {
    let (peer_state, path) = peer_facts(peer.map(answered));
    p.peer_access = peer_state == PeerAccess::Granted;
    let facts = CopyFacts {
        peer: peer_state,
        path,
        compared: false,
    };
    (p, facts)
}

/// Pairs far below their like pairs (the same expected figure, or none known) on the board.
fn slow_among_like(pairs: &mut [PairProbe]) {
    let key = |p: &PairProbe| p.expected_gbps.map(|e| e.round() as i64);
    let mut groups: BTreeMap<Option<i64>, Vec<f64>> = BTreeMap::new();
    for p in pairs.iter().filter(|p| p.status != ProbeStatus::Failed) {
        if let Some(g) = p.gbps {
            groups.entry(key(p)).or_default().push(g);
        }
    }
    let medians: BTreeMap<Option<i64>, f64> = groups
        .into_iter()
        .filter(|(_, v)| v.len() >= 3)
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, v[v.len() / 2])
        })
        .collect();
    for p in pairs.iter_mut().filter(|p| p.status == ProbeStatus::Ok) {
        let (Some(g), Some(m)) = (p.gbps, medians.get(&key(p))) else {
            continue;
        };
        if g < 0.5 * m {
            p.status = ProbeStatus::Degraded;
            p.reason = Some(text::probe_slow_among_like(p.from_gpu, p.to_gpu, g, *m));
        }
    }
}

/// GPUs every probed pair of which (either direction) is not ok, with three GPUs or more, and
/// not every GPU so (that is the node): the pair judge's rule, each direction a pair.
fn culprits(pairs: &[PairProbe]) -> Vec<u32> {
    let outcomes: Vec<PairOutcome<'_>> = pairs
        .iter()
        .map(|p| PairOutcome {
            gpu: p.from_gpu,
            peer_gpu: p.to_gpu,
            failing: p.status != ProbeStatus::Ok,
            // Only the GPUs are asked of the blame here, not its reasons.
            reasons: &[],
        })
        .collect();
    blame::failing_with_all(&blame::blame(&outcomes, &BTreeSet::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::gpu_reading;
    use crate::model::{LinkReading, P2pCaps, PairSample, PcieLink};
    use crate::probe::PairLine;
    use std::time::Duration;

    /// `n` GPUs with 18 active NVSwitch links each, at PCI buses 0x18 + index.
    fn nvswitch(n: u32) -> GpuSample {
        GpuSample {
            gpus: (0..n)
                .map(|i| crate::model::GpuReading {
                    pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
                    links: (0..18)
                        .map(|l| LinkReading {
                            link: l,
                            active: true,
                            peer: Peer::Switch,
                            errors: None,
                            nvlink5: None,
                        })
                        .collect(),
                    ..gpu_reading(i)
                })
                .collect(),
            ..GpuSample::default()
        }
    }

    /// CUDA lists the GPUs in reverse.
    fn probed(sample: &GpuSample, outcome: impl Fn(u32, u32) -> Outcome) -> Probed {
        let devices: Vec<String> = sample
            .gpus
            .iter()
            .rev()
            .map(|g| g.pci_bus_id.replace("00000000:", "0000:"))
            .collect();
        let n = devices.len() as i32;
        let nvml = |cuda: i32| (n - 1 - cuda) as u32;
        let mut outcomes = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    outcomes.push(((a, b), outcome(nvml(a), nvml(b))));
                }
            }
        }
        Probed {
            devices,
            outcomes,
            took: Duration::from_secs(1),
        }
    }

    fn ran(gbps: f64) -> PairLine {
        PairLine {
            from: 0,
            to: 0,
            peer_access: true,
            peer_error: None,
            copy_error: None,
            copy_code: None,
            bad_offset: None,
            seconds: Some(64e6 / (gbps * 1e9)),
            bytes: 64_000_000,
        }
    }

    fn status(r: &ProbeReport, from: u32, to: u32) -> (ProbeStatus, Option<String>) {
        let p = r
            .pairs
            .iter()
            .find(|p| p.from_gpu == from && p.to_gpu == to)
            .unwrap();
        (p.status, p.reason.clone())
    }

    #[test]
    fn pairs_are_named_by_nvml_index_and_judged_against_their_nvlinks() {
        let s = nvswitch(4);
        let r = assess(&probed(&s, |_, _| Outcome::Ran(ran(300.0))), &s);
        assert!(r.all_ok(), "{:?}", r.pairs);
        assert_eq!(r.pairs.len(), 12);
        assert_eq!(r.pairs[0].expected_gbps, Some(450.0));
        assert!((r.pairs[0].gbps.unwrap() - 300.0).abs() < 1e-6);
        let slow = assess(
            &probed(&s, |a, b| {
                Outcome::Ran(ran(if (a, b) == (1, 3) { 100.0 } else { 300.0 }))
            }),
            &s,
        );
        let (st, why) = status(&slow, 1, 3);
        assert_eq!(st, ProbeStatus::Degraded);
        assert!(why.unwrap().contains("under half of the 450.0 GB/s"));
        assert_eq!(status(&slow, 3, 1).0, ProbeStatus::Ok, "one direction only");
    }

    #[test]
    fn refused_peer_access_fails_only_where_nvml_says_p2p_works() {
        let mut s = nvswitch(4);
        let refused = |a: u32, b: u32| {
            let mut l = ran(300.0);
            if a == 3 || b == 3 {
                l.peer_access = false;
                l.peer_error = Some("cuCtxEnablePeerAccess failed: CUDA error 217 (...)".into());
            }
            Outcome::Ran(l)
        };
        let r = assess(&probed(&s, refused), &s);
        assert_eq!(
            r.pairs
                .iter()
                .filter(|p| p.status == ProbeStatus::Failed)
                .count(),
            6
        );
        assert_eq!(r.culprits, vec![3]);
        // A PCIe board whose NVML says P2P is not supported: host-staged copies are expected.
        for g in &mut s.gpus {
            g.links.clear();
        }
        s.pairs = (0..4)
            .flat_map(|a| (a + 1..4).map(move |b| (a, b)))
            .map(|(gpu, peer_gpu)| PairSample {
                gpu,
                peer_gpu,
                p2p: Some(P2pCaps {
                    read: P2pStatus::NotSupported,
                    write: P2pStatus::NotSupported,
                    nvlink: P2pStatus::NotSupported,
                    atomics: P2pStatus::NotSupported,
                }),
                topology: None,
            })
            .collect();
        let r = assess(&probed(&s, refused), &s);
        assert!(r.all_ok(), "{:?}", r.pairs);
        assert!(r.culprits.is_empty());
    }

    #[test]
    fn hangs_crashes_errors_and_corruption_fail_naming_the_direction() {
        let s = nvswitch(3);
        let r = assess(
            &probed(&s, |a, b| {
                match (a, b) {
                (0, 1) => Outcome::Hung {
                    after: Duration::from_secs(10),
                    peer: Some(PeerLine {
                        from: 0,
                        to: 1,
                        peer_access: true,
                        peer_error: None,
                    }),
                },
                (1, 0) => Outcome::Crashed {
                    how: "killed by signal 11".into(),
                    peer: None,
                },
                (1, 2) => Outcome::Ran(PairLine {
                    copy_error: Some("cuMemcpyPeer failed: CUDA error 700 (an illegal memory access was encountered)".into()),
                    copy_code: Some(700),
                    seconds: None,
                    ..ran(300.0)
                }),
                (2, 1) => Outcome::Ran(PairLine {
                    bad_offset: Some(32_000_000),
                    ..ran(300.0)
                }),
                _ => Outcome::Ran(ran(300.0)),
            }
            }),
            &s,
        );
        let why = |a, b| status(&r, a, b).1.unwrap();
        assert!(why(0, 1).contains("GPU 0 -> GPU 1 did not finish within 10 s"));
        assert!(why(1, 0).contains("GPU 1 -> GPU 0 crashed the probe (killed by signal 11)"));
        assert!(why(1, 2).contains("CUDA error 700"));
        assert!(why(2, 1).contains("offset 32000000 of 64000000"));
        assert_eq!(status(&r, 0, 2).0, ProbeStatus::Ok);
        // GPU 1 fails with both its peers, both ways.
        assert_eq!(r.culprits, vec![1]);
        // What is known of each: the hung copy had peer access and never finished; the crash
        // came before peer access was answered; the corrupt copy was compared and differed.
        let facts = |a, b| {
            let i = r
                .pairs
                .iter()
                .position(|p| (p.from_gpu, p.to_gpu) == (a, b))
                .unwrap();
            (r.pairs[i].peer_access, r.pairs[i].verified, r.facts[i])
        };
        let fact = |peer, path, compared| CopyFacts {
            peer,
            path,
            compared,
        };
        let (granted, peer) = (PeerAccess::Granted, Some(CopyPath::Peer));
        assert_eq!(facts(0, 1), (true, false, fact(granted, peer, false)));
        assert_eq!(
            facts(1, 0),
            (false, false, fact(PeerAccess::NotTried, None, false))
        );
        assert_eq!(facts(1, 2), (true, false, fact(granted, peer, false)));
        assert_eq!(facts(2, 1), (true, false, fact(granted, peer, true)));
        assert_eq!(facts(0, 2), (true, true, fact(granted, peer, true)));
    }

    #[test]
    fn a_refused_pair_copied_through_the_host_says_so() {
        let s = nvswitch(3);
        let r = assess(
            &probed(&s, |a, b| {
                let mut l = ran(300.0);
                if (a, b) == (2, 0) {
                    l.peer_access = false;
                    l.peer_error = Some("cuDeviceCanAccessPeer says no".into());
                }
                Outcome::Ran(l)
            }),
            &s,
        );
        let i = r
            .pairs
            .iter()
            .position(|p| (p.from_gpu, p.to_gpu) == (2, 0))
            .unwrap();
        assert_eq!(r.pairs[i].status, ProbeStatus::Failed);
        assert!(!r.pairs[i].peer_access);
        assert_eq!(
            r.facts[i],
            CopyFacts {
                peer: PeerAccess::Refused,
                path: Some(CopyPath::Host),
                compared: true
            }
        );
    }

    #[test]
    fn pcie_pairs_expect_what_both_ends_allow_and_a_slow_one_stands_out_among_its_like() {
        let mut s = nvswitch(4);
        for g in &mut s.gpus {
            g.links.clear();
            g.pcie_link = Some(PcieLink {
                gen: 3,
                max_gen: 4,
                width: 16,
                max_width: 16,
            });
        }
        assert!((expected_gbps(&s, 0, 1).unwrap() - 31.504).abs() < 1e-9);
        // GPU 2 -> GPU 0 at a tenth of the others.
        let slow_2_0 = |s: &GpuSample| {
            assess(
                &probed(s, |a, b| {
                    Outcome::Ran(ran(if (a, b) == (2, 0) { 2.0 } else { 20.0 }))
                }),
                s,
            )
        };
        let r = slow_2_0(&s);
        let (st, why) = status(&r, 2, 0);
        assert_eq!(st, ProbeStatus::Degraded);
        assert!(why
            .unwrap()
            .contains("2.0 GB/s, under half of the 31.5 GB/s"));
        // Without a link figure, the like pairs judge.
        for g in &mut s.gpus {
            g.pcie_link = None;
        }
        let r = slow_2_0(&s);
        let (st, why) = status(&r, 2, 0);
        assert_eq!(st, ProbeStatus::Degraded);
        assert!(why
            .unwrap()
            .contains("like pairs on this board copy (20.0 GB/s)"));
        assert_eq!(
            r.pairs
                .iter()
                .filter(|p| p.status != ProbeStatus::Ok)
                .count(),
            1
        );
    }

    #[test]
    fn a_cuda_device_nvml_does_not_list_is_left_out_and_said() {
        let s = nvswitch(2);
        let mut p = probed(&s, |_, _| Outcome::Ran(ran(300.0)));
        p.devices.push("0000:AA:00.0".into());
        p.outcomes.push(((2, 0), Outcome::Ran(ran(300.0))));
        let r = assess(&p, &s);
        assert_eq!(r.pairs.len(), 2);
        assert_eq!(r.unmatched, vec!["0000:AA:00.0".to_string()]);
    }
}

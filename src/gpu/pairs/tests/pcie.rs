//! Rule 7: the PCIe path under the GPUs of an 8-GPU PCIe board (no NVLink): two GPUs per
//! switch, four switches on two root ports.

use super::*;
use crate::model::{AcsState, AerTotals, PcieHop, PcieLink};

/// The path of GPU `g`: its own function, its switch's downstream port, the switch's upstream
/// port, the root port of its half of the board.
fn path(g: u32) -> Vec<PcieHop> {
    let switch = g / 2;
    let hop = |bdf: String, bridge: bool| PcieHop {
        bdf,
        bridge,
        aer: Some(AerTotals::default()),
        acs: if bridge {
            AcsState::Absent
        } else {
            AcsState::Unknown
        },
        link_width: None,
    };
    vec![
        hop(format!("0000:{:02x}:00.0", 0x20 + g), false),
        hop(format!("0000:{:02x}:{:02x}.0", 0x10 + switch, g % 2), true),
        hop(format!("0000:{:02x}:00.0", 0x08 + switch), true),
        hop(format!("0000:00:{:02x}.0", 1 + switch / 2), true),
    ]
}

fn board() -> GpuSample {
    let mut s = pcie8(None);
    for g in &mut s.gpus {
        g.pcie_path = path(g.index);
        g.pcie_link = Some(PcieLink {
            gen: 5,
            max_gen: 5,
            width: 16,
            max_width: 16,
        });
        g.utilization_percent = Some(0);
    }
    s
}

/// The judgement with the findings a scan tells of it: a link trained down is told from the
/// GPU verdict (`verdict::pcie_finding`), after the judge's own.
fn told(mut j: Judgement, s: &GpuSample) -> Judgement {
    for (i, d) in &j.pcie {
        if let Some(g) = s.gpus.iter().find(|g| g.index == *i) {
            j.findings.push(crate::gpu::verdict::pcie_finding(g, d));
        }
    }
    j
}

#[test]
fn a_lower_generation_is_judged_only_while_busy_and_a_narrow_link_at_any_load() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = board();
    gpu_mut(&mut s, 3).pcie_link = Some(PcieLink {
        gen: 3,
        max_gen: 5,
        width: 16,
        max_width: 16,
    });
    // Idle: links drop their generation to save power; nothing to say.
    let j = told(judge.judge(&s, t0), &s);
    assert!(all_ok(&j), "{:?}", j.pairs);
    assert!(j.findings.is_empty(), "{:?}", kinds(&j));
    gpu_mut(&mut s, 3).utilization_percent = Some(97);
    let j = told(judge.judge(&s, secs_after(t0, 1)), &s);
    assert_eq!(
        kinds(&j),
        vec![("gpu_pcie_degraded", "GPU 3".to_string(), Severity::Warning)]
    );
    assert!(
        j.findings[0]
            .message
            .contains("runs at Gen3 x16 while the GPU is busy (97% utilized), below the Gen5 x16"),
        "{}",
        j.findings[0].message
    );
    assert!(j.findings[0].message.contains("lspci -vv -s 0000:23:00.0"));
    // The GPU's finding alone: its pairs still work (slower), no pair fails.
    assert!(all_ok(&j), "{:?}", j.pairs);
    // x8 where x16 trains: told idle too, once for the GPU (not per pair).
    gpu_mut(&mut s, 3).utilization_percent = Some(0);
    gpu_mut(&mut s, 3).pcie_link = Some(PcieLink {
        gen: 5,
        max_gen: 5,
        width: 8,
        max_width: 16,
    });
    let j = told(judge.judge(&s, secs_after(t0, 2)), &s);
    assert_eq!(
        kinds(&j),
        vec![("gpu_pcie_degraded", "GPU 3".to_string(), Severity::Warning)]
    );
    assert!(
        j.findings[0].message.contains(
            "runs at Gen5 x8, below the Gen5 x16 it and its slot allow. Only 8 of its 16 lanes"
        ),
        "{}",
        j.findings[0].message
    );
    assert!(all_ok(&j), "{:?}", j.pairs);
    // A busy GPU at full speed is fine.
    gpu_mut(&mut s, 3).utilization_percent = Some(97);
    gpu_mut(&mut s, 3).pcie_link = Some(PcieLink {
        gen: 5,
        max_gen: 5,
        width: 16,
        max_width: 16,
    });
    assert!(told(judge.judge(&s, secs_after(t0, 3)), &s)
        .findings
        .is_empty());
}

#[test]
fn sysfs_tells_a_narrow_link_nvml_does_not() {
    let mut judge = PairJudge::default();
    let mut s = board();
    gpu_mut(&mut s, 5).pcie_link = None;
    gpu_mut(&mut s, 5).pcie_path[0].link_width = Some((8, 16));
    // A bridge's narrow link is not the GPU's.
    gpu_mut(&mut s, 2).pcie_path[1].link_width = Some((4, 16));
    let j = told(judge.judge(&s, Instant::now()), &s);
    assert_eq!(
        kinds(&j),
        vec![("gpu_pcie_degraded", "GPU 5".to_string(), Severity::Warning)]
    );
    assert!(
        j.findings[0].message.contains("runs at x8, below the x16"),
        "{}",
        j.findings[0].message
    );
}

#[test]
fn aer_errors_that_grow_on_a_gpu_or_a_bridge_above_it_are_found_for_a_while() {
    let t0 = Instant::now();
    let mut judge = PairJudge::default();
    let mut s = board();
    // Counts from before the agent started are no news.
    gpu_mut(&mut s, 2).pcie_path[1].aer = Some(AerTotals {
        correctable: 500,
        nonfatal: 0,
        fatal: 0,
    });
    assert!(told(judge.judge(&s, t0), &s).findings.is_empty());
    // GPU 2's downstream port counts 12 more correctable errors.
    gpu_mut(&mut s, 2).pcie_path[1].aer = Some(AerTotals {
        correctable: 512,
        nonfatal: 0,
        fatal: 0,
    });
    let j = told(judge.judge(&s, secs_after(t0, 10)), &s);
    assert_eq!(
        kinds(&j),
        vec![("gpu_pcie_errors", "GPU 2".to_string(), Severity::Warning)]
    );
    assert!(
        j.findings[0]
            .message
            .contains("+12 correctable at 0000:11:00.0 (the bridge above it)"),
        "{}",
        j.findings[0].message
    );
    assert!(all_ok(&j), "AER does not fail a pair");
    // The switch's upstream port, shared by GPUs 2 and 3: a non-fatal error is critical, for both.
    for g in [2, 3] {
        gpu_mut(&mut s, g).pcie_path[2].aer = Some(AerTotals {
            correctable: 0,
            nonfatal: 1,
            fatal: 0,
        });
    }
    let j = told(judge.judge(&s, secs_after(t0, 20)), &s);
    let got = kinds(&j);
    assert!(got.contains(&("gpu_pcie_errors", "GPU 2".to_string(), Severity::Critical)));
    assert!(got.contains(&("gpu_pcie_errors", "GPU 3".to_string(), Severity::Critical)));
    // No growth for the window: over.
    let j = told(judge.judge(&s, secs_after(t0, 20 + 601)), &s);
    assert!(j.findings.is_empty(), "{:?}", kinds(&j));
    // A total that goes down (reboot, hot reset) is a new baseline, not growth.
    gpu_mut(&mut s, 2).pcie_path[1].aer = Some(AerTotals::default());
    assert!(told(judge.judge(&s, secs_after(t0, 700)), &s)
        .findings
        .is_empty());
}

#[test]
fn acs_redirect_on_a_bridge_between_two_gpus_is_found_on_bare_metal_only() {
    let t0 = Instant::now();
    let mut s = board();
    // GPU 4's downstream port: ReqRedir+ CmpltRedir+ (what Linux sets under an IOMMU).
    gpu_mut(&mut s, 4).pcie_path[1].acs = AcsState::Control(0x001d);
    // GPU 6's only SrcValid: no redirect.
    gpu_mut(&mut s, 6).pcie_path[1].acs = AcsState::Control(0x0001);
    let j = told(PairJudge::default().judge(&s, t0), &s);
    assert_eq!(
        kinds(&j),
        vec![
            (
                "gpu_pair_degraded",
                "GPU 4 <-> GPU 5".to_string(),
                Severity::Warning
            ),
            ("pcie_acs_enabled", "node".to_string(), Severity::Warning)
        ]
    );
    let m = &j.findings[1].message;
    assert!(
        m.contains("0000:12:00.0 (ACSCtl 0x001d, between GPUs 4, 5)")
            && m.contains("setpci -s 0000:12:00.0 ECAP_ACS+0x6.w=0000"),
        "{m}"
    );
    // Only the pair below that switch crosses the bridge; pairs across root ports go through
    // the root complex anyway.
    assert_eq!(verdict(&j, 4, 5).status, PairStatus::Degraded);
    assert!(verdict(&j, 4, 5).reasons[0]
        .text
        .starts_with("ACS on PCIe bridge 0000:12:00.0"));
    assert_eq!(verdict(&j, 4, 6).status, PairStatus::Ok);
    assert_eq!(verdict(&j, 6, 7).status, PairStatus::Ok);
    // In a VM the bridges are emulated: not judged.
    s.hypervisor = Some("QEMU".into());
    let j = told(PairJudge::default().judge(&s, t0), &s);
    assert!(j.findings.is_empty() && all_ok(&j), "{:?}", kinds(&j));
    // Unknown (no CAP_SYS_ADMIN): not judged either.
    s.hypervisor = None;
    gpu_mut(&mut s, 4).pcie_path[1].acs = AcsState::Unknown;
    assert!(told(PairJudge::default().judge(&s, t0), &s)
        .findings
        .is_empty());
}

#[test]
fn nvlink_pairs_do_not_take_pcie_reasons() {
    let t0 = Instant::now();
    let mut s = mesh(4);
    for g in &mut s.gpus {
        g.pcie_path = path(g.index);
        g.utilization_percent = Some(90);
        g.pcie_link = Some(PcieLink {
            gen: 3,
            max_gen: 4,
            width: 16,
            max_width: 16,
        });
    }
    // An ACS bridge under an NVLink mesh: its P2P goes over NVLink.
    gpu_mut(&mut s, 0).pcie_path[1].acs = AcsState::Control(0x001d);
    let j = told(PairJudge::default().judge(&s, t0), &s);
    assert!(all_ok(&j), "{:?}", j.pairs);
    let got = kinds(&j);
    assert_eq!(
        got.iter().filter(|k| k.0 == "gpu_pcie_degraded").count(),
        4,
        "one per GPU: {got:?}"
    );
}

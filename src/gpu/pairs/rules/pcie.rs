//! Rule 7: the PCIe path under the GPUs, on boards where peer-to-peer traffic crosses it.
//!
//! - A GPU whose link is narrower than it and its slot allow, at any load; or of a lower
//!   generation while busy (NVML's utilization at [`BUSY_PERCENT`] or more): idle links drop
//!   their generation to save power, so an idle generation proves nothing (NVIDIA's nvidia-smi
//!   manual; DCGM checks only in P0).
//! - AER totals of the GPU or a bridge above it that grew within [`AER_WINDOW`]: a fatal or
//!   non-fatal error is critical, correctable ones a warning.
//! - A bridge between two GPUs below a common switch whose ACS redirects peer-to-peer requests
//!   or completions (or controls egress): P2P goes up to the root complex, slower, or is
//!   blocked (NCCL hangs). Not judged in a VM: its bridges are emulated.
//!
//! Pairs whose P2P runs over PCIe (no NVLink between them, no NVSwitch board) get a reason for
//! an ACS bridge between them (`Errors`: the pair works, slower, or hangs; a warning). A link
//! trained down is the GPU's finding alone: it slows every transfer of the GPU, and as a reason
//! on all its pairs it would read as a GPU failing with every peer.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::model::{AerTotals, Finding, FindingKind, P2pStatus, PcieHop, Severity, Subject};
use crate::model::{GpuReading, PairReason, PcieDowntrain, PcieLink, ReasonKind, Weight};
use crate::text;

/// NVML utilization at or above which a GPU is busy enough for its link to be at full speed.
pub const BUSY_PERCENT: u32 = 50;
/// How long AER growth keeps its finding.
pub const AER_WINDOW: Duration = Duration::from_secs(600);
/// Devices whose AER totals are remembered at most (a board has a few dozen).
const AER_KEPT: usize = 1024;

/// Growth of one device's three totals, by when it was seen.
#[derive(Debug, Default)]
pub(crate) struct AerTrack {
    last: AerTotals,
    grew: VecDeque<(Instant, AerTotals)>,
}

/// By the device's sysfs name.
pub(crate) type AerHistory = HashMap<String, AerTrack>;

pub(crate) fn pcie_rule(
    history: &mut AerHistory,
    board: &Board<'_>,
    hypervisor: Option<&str>,
    now: Instant,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) -> (BTreeMap<u32, PcieDowntrain>, Vec<Finding>) {
    // A link trained down is the GPU verdict's to tell (`verdict::pcie_findings`).
    let down = trained_down(board);
    let mut findings = aer_findings(history, board, now);
    // A VM's bridges are emulated: their ACS says nothing of the host's.
    if hypervisor.is_none() {
        findings.extend(acs_rule(board, pairs));
    }
    (down, findings)
}

/// The GPUs still there.
fn live<'a>(board: &'a Board<'_>) -> impl Iterator<Item = &'a GpuReading> {
    board.gpus.values().copied().filter(|g| !g.lost)
}

/// A GPU whose link is narrower than both ends allow (at any load: lanes do not train down to
/// save power, so x8 where x16 trains halves every host copy and P2P over PCIe), or slower
/// than they allow while busy (idle links drop their generation to save power): the GPU's
/// finding alone, one per GPU. The width is NVML's, else sysfs's (`current_link_width`,
/// `max_link_width` of the GPU's function).
fn trained_down(board: &Board<'_>) -> BTreeMap<u32, PcieDowntrain> {
    let mut down = BTreeMap::new();
    for g in live(board) {
        let busy = g.utilization_percent.filter(|&u| u >= BUSY_PERCENT);
        let sysfs = g.pcie_path.first().and_then(|h| h.link_width);
        let Some(link) = g.pcie_link.or_else(|| {
            sysfs.map(|(width, max_width)| PcieLink {
                gen: 0,
                max_gen: 0,
                width,
                max_width,
            })
        }) else {
            continue;
        };
        let narrow = link.width < link.max_width || sysfs.is_some_and(|(width, max)| width < max);
        let slow = busy.is_some() && link.gen < link.max_gen;
        if !narrow && !slow {
            continue;
        }
        let bdf = g.pcie_path.first().map_or("", |h| h.bdf.as_str());
        let (link, from_sysfs) = match sysfs {
            Some((width, max_width)) if width < max_width && link.width >= link.max_width => (
                PcieLink {
                    width,
                    max_width,
                    ..link
                },
                true,
            ),
            _ => (link, g.pcie_link.is_none()),
        };
        down.insert(
            g.index,
            PcieDowntrain {
                link,
                busy,
                from_sysfs,
                bdf: bdf.to_string(),
            },
        );
    }
    down
}

/// AER growth on a GPU's path within [`AER_WINDOW`]: one finding per GPU, critical when some
/// error was fatal or non-fatal.
fn aer_findings(history: &mut AerHistory, board: &Board<'_>, now: Instant) -> Vec<Finding> {
    let grown = aer_growth(history, live(board), now);
    let mut findings = Vec::new();
    for g in live(board) {
        let parts: Vec<(&PcieHop, AerTotals)> = g
            .pcie_path
            .iter()
            .filter_map(|h| Some((h, *grown.get(&h.bdf)?)))
            .collect();
        if parts.is_empty() {
            continue;
        }
        let severe = parts.iter().any(|(_, d)| d.fatal + d.nonfatal > 0);
        let mut f = Finding::new(
            FindingKind::GpuPcieErrors,
            Subject::Gpu(g.index),
            text::gpu_pcie_errors(g.index, &board.describe(g.index), &parts, AER_WINDOW),
        );
        if severe {
            f.severity = Severity::Critical;
        }
        findings.push(f);
    }
    findings
}

/// Bridges whose ACS redirects P2P between two GPUs: one finding for the node, and a reason
/// on each such pair whose P2P crosses PCIe.
fn acs_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) -> Option<Finding> {
    let mut redirecting: BTreeMap<&str, (u16, BTreeSet<u32>)> = BTreeMap::new();
    let mut acs_between: BTreeMap<(u32, u32), Vec<String>> = BTreeMap::new();
    let gpus: Vec<&GpuReading> = live(board).collect();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            for hop in between(&a.pcie_path, &b.pcie_path) {
                let crate::model::AcsState::Control(ctrl) = hop.acs else {
                    continue;
                };
                if !hop.acs.redirects() {
                    continue;
                }
                let e = redirecting
                    .entry(hop.bdf.as_str())
                    .or_insert((ctrl, BTreeSet::new()));
                e.1.extend([a.index, b.index]);
                acs_between
                    .entry((a.index.min(b.index), a.index.max(b.index)))
                    .or_default()
                    .push(text::reason_acs(&hop.bdf, ctrl));
            }
        }
    }
    // Reasons on the pairs whose P2P crosses PCIe.
    for (&(a, b), st) in pairs.iter_mut() {
        if board.nvswitch || !st.links.is_empty() || board.is_lost((a, b)) {
            continue;
        }
        if st.p2p.is_some_and(|c| c.nvlink == P2pStatus::Ok) {
            continue;
        }
        for r in acs_between.get(&(a, b)).into_iter().flatten() {
            st.push(PairReason::new(
                ReasonKind::PcieAcs,
                Weight::Errors,
                r.clone(),
            ));
        }
    }
    if redirecting.is_empty() {
        return None;
    }
    let bridges: Vec<(&str, u16, Vec<u32>)> = redirecting
        .iter()
        .map(|(bdf, (ctrl, gpus))| (*bdf, *ctrl, gpus.iter().copied().collect()))
        .collect();
    Some(Finding::new(
        FindingKind::PcieAcsEnabled,
        Subject::Node,
        text::pcie_acs_enabled(&bridges),
    ))
}

/// The ports where traffic between two GPUs below a common bridge (a switch) turns around:
/// on each side, the bridge just below the lowest common one. ACS redirect there sends P2P up
/// instead of across. None when they share no bridge (P2P crosses the root complex anyway).
fn between<'a>(a: &'a [PcieHop], b: &'a [PcieHop]) -> Vec<&'a PcieHop> {
    let Some((ia, ib)) = a.iter().enumerate().skip(1).find_map(|(i, h)| {
        let j = b.iter().skip(1).position(|x| x.bridge && x.bdf == h.bdf)?;
        h.bridge.then_some((i, j + 1))
    }) else {
        return Vec::new();
    };
    [&a[ia - 1], &b[ib - 1]]
        .into_iter()
        .filter(|h| h.bridge)
        .collect()
}

/// Each device's growth within the window, for the devices on these GPUs' paths; the history
/// of devices no longer seen is dropped.
fn aer_growth<'a>(
    history: &mut AerHistory,
    gpus: impl Iterator<Item = &'a GpuReading>,
    now: Instant,
) -> HashMap<String, AerTotals> {
    let mut seen = HashSet::new();
    for hop in gpus.flat_map(|g| &g.pcie_path) {
        let Some(totals) = hop.aer else { continue };
        if !seen.insert(hop.bdf.clone()) {
            continue;
        }
        match history.get_mut(&hop.bdf) {
            None => {
                if history.len() < AER_KEPT {
                    history.insert(
                        hop.bdf.clone(),
                        AerTrack {
                            last: totals,
                            grew: VecDeque::new(),
                        },
                    );
                }
            }
            Some(t) => {
                // A total that went down (a reboot's, a hot reset's) starts a new baseline.
                let d = AerTotals {
                    correctable: totals.correctable.saturating_sub(t.last.correctable),
                    nonfatal: totals.nonfatal.saturating_sub(t.last.nonfatal),
                    fatal: totals.fatal.saturating_sub(t.last.fatal),
                };
                if d != AerTotals::default() {
                    t.grew.push_back((now, d));
                }
                t.last = totals;
            }
        }
    }
    history.retain(|bdf, _| seen.contains(bdf));
    let mut out = HashMap::new();
    for (bdf, t) in history.iter_mut() {
        while t
            .grew
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > AER_WINDOW)
        {
            t.grew.pop_front();
        }
        if t.grew.is_empty() {
            continue;
        }
        let sum = t
            .grew
            .iter()
            .fold(AerTotals::default(), |s, (_, d)| AerTotals {
                correctable: s.correctable.saturating_add(d.correctable),
                nonfatal: s.nonfatal.saturating_add(d.nonfatal),
                fatal: s.fatal.saturating_add(d.fatal),
            });
        out.insert(bdf.clone(), sum);
    }
    out
}

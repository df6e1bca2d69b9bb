//! Pure: the kernel log's word on XIDs, made one count with NVML's. The driver prints each XID
//! to the kernel log (`NVRM: Xid (PCI:0000:3b:00): 79, ...`) and NVML delivers the same XID as an
//! event: [`super::XidCounts`] keeps both tallies and reports the larger, so an XID seen by both
//! counts once, and one that only the kernel saw (NVML's event thread not running, or behind)
//! still counts. A GPU that "has fallen off the bus" is XID 79's condition: the driver prints
//! that line beside its `Xid ... 79` line, so the two within [`SAME_EVENT`] are one XID 79.
//!
//! The kernel log is text others can shape: a process writes to /dev/kmsg (facility user), a
//! netfilter LOG rule prints a prefix its owner chose (`NVRM: Xid (0000:18:00): 48, IN=eth0
//! OUT= ...`, with `nf_log_all_netns` from any network namespace). So a line is an XID only in
//! the driver's own shape, and a fatal one (a reset, a reboot: what flips `GpuFault`, sets the
//! node taint and makes a DeviceTaintRule) counts only once NVML has its word for that GPU
//! ([`Word`]); until then, and for lookalikes, it is evidence: logged and counted apart
//! (`shmlink_gpu_xid_unconfirmed_total`), never acted on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::lookalike::{is_task_line, netfilter_fields};
use super::XidCounts;
use crate::gpu::pci::{pci_address, same_pci_device};
use crate::kernel_log::record::{leading_decimal, KmsgRecord};
use crate::model::GpuReading;

/// XID 79: "GPU has fallen off the bus" in NVIDIA's XID catalogue.
pub const FELL_OFF_BUS: u64 = 79;
/// An `Xid ... 79` line and a "fallen off the bus" line for one GPU this close are one event.
pub const SAME_EVENT: Duration = Duration::from_secs(10);
/// Fatal XIDs waiting for NVML's word, at most (a flood of lines cannot grow it).
const PENDING_MAX: usize = 256;

/// What the kernel said about a GPU, by its PCI address as the kernel prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelGpu {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...`; link for NVLink XIDs (74, 144-150) when
    /// the text names one.
    Xid {
        pci: String,
        xid: u64,
        link: Option<u32>,
        text: String,
    },
    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`
    FellOffBus { pci: String },
    /// The IOMMU blocked a DMA of the device at `pci` (`AMD-Vi: Event logged [IO_PAGE_FAULT
    /// device=0000:41:00.0 ...]`, `DMAR: [DMA Read] Request device [41:00.0] ... fault addr`):
    /// peer traffic the IOMMU does not map, a known cause of P2P hangs.
    IommuFault { pci: String },
    /// An NVSwitch SXID (`sxid.rs`), the first line of one.
    Sxid(super::sxid::Sxid),
    /// A line that reads like an XID but is not the driver's: written by a process, carrying a
    /// netfilter LOG record's fields, or not in the driver's shape. Evidence only.
    Lookalike {
        pci: String,
        xid: u64,
        why: &'static str,
    },
}

/// What a record says about a GPU, if anything: the driver's `NVRM: ` lines, in the driver's
/// own shape only. A process can name itself `NVRM: GPU 18:0 ` (its comm, 15 bytes) and crash
/// in a file named `fallen off the bus`: the kernel's crash line then begins like a driver
/// line, so a crash line (`comm[pid]: ...`) is never one, and the address must be whole
/// (`0000:18:00.0`), as the driver prints it. An XID line that is not the driver's is a
/// [`KernelGpu::Lookalike`].
pub fn kernel_gpu(record: &KmsgRecord) -> Option<KernelGpu> {
    if is_task_line(&record.message) {
        return None;
    }
    if let Some(s) = super::sxid::sxid(record) {
        return Some(KernelGpu::Sxid(s));
    }
    if record.is_kernel() && !netfilter_fields(&record.message) {
        if let Some(pci) = iommu_fault(&record.message) {
            return Some(KernelGpu::IommuFault { pci });
        }
    }
    let nvrm = record.message.trim_start().strip_prefix("NVRM: ")?;
    if !record.is_kernel() {
        return lookalike(
            nvrm,
            "written to the kernel log by a process (not the kernel's facility)",
        );
    }
    if netfilter_fields(&record.message) {
        return lookalike(
            nvrm,
            "a netfilter LOG record (its prefix is any rule's owner's text)",
        );
    }
    xid(nvrm).or_else(|| fell_off_bus(nvrm)).or_else(|| {
        lookalike(
            nvrm,
            "not in the driver's shape (`Xid (PCI:dddd:bb:dd): N, `)",
        )
    })
}

/// The device of an IOMMU IO page fault: AMD-Vi's `[IO_PAGE_FAULT device=0000:41:00.0 ...`
/// (or `<driver> 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT ...`, since Linux 5.x), Intel
/// DMAR's `DMAR: [DMA Read NO_PASID] Request device [41:00.0] ... fault addr`.
fn iommu_fault(message: &str) -> Option<String> {
    if let Some(at) = message.find("AMD-Vi: Event logged [IO_PAGE_FAULT") {
        let rest = &message[at..];
        if let Some(d) = rest.find("device=") {
            let token = rest[d + 7..].split([' ', ']']).next()?;
            return full_address(token);
        }
        // The device leads the line: `nvidia 0000:41:00.0: AMD-Vi: ...`.
        let head = message[..at].trim_end().trim_end_matches(':');
        return full_address(head.rsplit(' ').next()?);
    }
    let dmar = message.find("DMAR: [DMA ")?;
    let rest = &message[dmar..];
    if !rest.contains("fault addr") {
        return None;
    }
    let open = rest.find("Request device [")? + "Request device [".len();
    let token = rest[open..].split(']').next()?;
    full_address(token)
}

/// `0000:41:00.0`, or `41:00.0` (domain 0), as `pci::canonical` spells it.
fn full_address(token: &str) -> Option<String> {
    if !token.contains('.') {
        return None;
    }
    crate::gpu::pci::canonical(token)
}

/// `Xid (PCI:0000:3b:00): 79, <text>`, as the driver prints it (`krcReportXid`: `NVRM: Xid
/// (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, [pid=%s, name=%s, ]%s`).
fn xid(nvrm: &str) -> Option<KernelGpu> {
    let (pci, xid, text) = xid_parts(nvrm)?;
    let pci = pci.strip_prefix("PCI:")?;
    // A MIG instance's attribution after the address.
    let pci = pci.split(" GPU-I:").next().unwrap_or(pci);
    if pci.matches(':').count() != 2 {
        return None;
    }
    pci_address(pci)?;
    let nvlink = xid == 74 || xid == 136 || (144..=150).contains(&xid);
    Some(KernelGpu::Xid {
        pci: pci.to_owned(),
        xid,
        link: if nvlink { link_number(text) } else { None },
        text: text.to_owned(),
    })
}

/// `Xid (<address>): <xid>[, <text>]`: the address as written, the XID, the text.
fn xid_parts(nvrm: &str) -> Option<(&str, u64, &str)> {
    let rest = nvrm.strip_prefix("Xid (")?;
    let (address, rest) = rest.split_once(')')?;
    let (xid, rest) = leading_decimal::<u64>(rest.strip_prefix(": ")?)?;
    let text = rest.strip_prefix(',').unwrap_or(rest).trim();
    Some((address, xid, text))
}

/// An XID line that is not the driver's, with the address and XID it names, if it names both.
fn lookalike(nvrm: &str, why: &'static str) -> Option<KernelGpu> {
    let (address, xid, _) = xid_parts(nvrm)?;
    let pci = address.strip_prefix("PCI:").unwrap_or(address);
    let pci = pci.split(' ').next().unwrap_or(pci);
    pci_address(pci)?;
    Some(KernelGpu::Lookalike {
        pci: pci.to_owned(),
        xid,
        why,
    })
}

/// `link 6` or `Link 12` as a word (not the `NVLink 5` of a generation).
fn link_number(text: &str) -> Option<u32> {
    let bytes = text.as_bytes();
    text.match_indices("ink ").find_map(|(i, _)| {
        let l = *bytes.get(i.checked_sub(1)?)?;
        let word_start = i < 2 || !bytes[i - 2].is_ascii_alphanumeric();
        if (l == b'l' || l == b'L') && word_start {
            leading_decimal(&text[i + 4..]).map(|(n, _)| n)
        } else {
            None
        }
    })
}

/// `GPU 0000:3b:00.0: GPU has fallen off the bus.` or `GPU at 0000:3b:00.0 has fallen off the
/// bus.`; not `GPU at PCI:0000:3b:00: GPU-<uuid>`, which only names a GPU.
fn fell_off_bus(nvrm: &str) -> Option<KernelGpu> {
    let rest = nvrm.strip_prefix("GPU ")?;
    let (at, rest) = match rest.strip_prefix("at ") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (token, tail) = rest.split_once(' ')?;
    let pci = token.strip_suffix(':').unwrap_or(token);
    // domain:bus:device.function, as the driver prints it: never a short `18:0`.
    if pci.matches(':').count() != 2 || !pci.contains('.') {
        return None;
    }
    pci_address(pci)?;
    let said = if at {
        tail.starts_with("has fallen off the bus")
    } else {
        token.ends_with(':') && tail.starts_with("GPU has fallen off the bus")
    };
    said.then(|| KernelGpu::FellOffBus {
        pci: pci.to_owned(),
    })
}

/// Turns kernel records into XIDs to count, one per event.
#[derive(Debug, Default)]
pub struct KernelXids {
    /// Per PCI device (domain, bus, device: the two lines spell it differently): when an XID
    /// 79 was last counted, and whether from the "fallen off" line (true) or the Xid line.
    last_79: BTreeMap<(u32, u8, u8), (Instant, bool)>,
    /// XID 79s on NVML's GPUs waiting for a scan begun after them to say the GPU is lost.
    unconfirmed: Vec<(u32, Instant)>,
    /// Other fatal XIDs on NVML's GPUs waiting for NVML's word.
    pending: Vec<Pending>,
    /// Lookalikes already said at warn (per address and XID; the rest at debug).
    said: BTreeSet<(String, u64)>,
}

/// A fatal XID the kernel log told on one of NVML's GPUs, waiting for NVML's word.
#[derive(Debug, Clone, Copy)]
struct Pending {
    gpu: u32,
    xid: u64,
    link: Option<u32>,
    at: Instant,
    /// NVML's own tally of this XID on this GPU when the line was read.
    nvml_before: u64,
    /// The links the line says failed to train (`training.rs`), and the GPU's address.
    training: Option<(u64, (u32, u8, u8))>,
}

/// NVML's word for a fatal XID the kernel log told: what NVML itself says of that GPU, which no
/// text in the kernel log can shape. Without one the line is evidence, not a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// NVML delivered the same XID on that GPU (its event), since just before the line.
    Event,
    /// NVML's recovery action for the GPU asks for a reset, a reboot or a drain and reset.
    RecoveryAction,
    /// NVML finds the GPU lost, or lists it no more.
    Lost,
    /// An NVLink XID naming a link NVML reads inactive.
    LinkDown(u32),
}

impl Word {
    /// NVML's word on `gpu` (its reading, None if NVML lists it no more) for XID `xid` (naming
    /// `link`), given NVML's own tally of it before the line and now; None: NVML says nothing.
    pub fn of(
        gpu: Option<&GpuReading>,
        link: Option<u32>,
        nvml_before: u64,
        nvml_now: u64,
    ) -> Option<Word> {
        let Some(g) = gpu else {
            return Some(Word::Lost);
        };
        if nvml_now > nvml_before {
            Some(Word::Event)
        } else if g.lost {
            Some(Word::Lost)
        } else if g.recovery_action.is_some_and(|a| a.is_fault()) {
            Some(Word::RecoveryAction)
        } else {
            let down = link.filter(|l| g.links.iter().any(|r| r.link == *l && !r.active));
            down.map(Word::LinkDown)
        }
    }

    fn said(self) -> String {
        match self {
            Word::Event => "NVML delivered it too".into(),
            Word::RecoveryAction => "NVML asks for a reset".into(),
            Word::Lost => "NVML finds the GPU lost".into(),
            Word::LinkDown(l) => format!("NVML reads its link {l} inactive"),
        }
    }
}

impl KernelXids {
    /// The (PCI address, XID) to count for this record, if any (a lookalike: none).
    pub fn observe(&mut self, event: KernelGpu, at: Instant) -> Option<(String, u64)> {
        if let KernelGpu::Xid { xid, text, .. } = &event {
            // NVML's event of the same XID carries no sub-code: say what the line decides.
            if let Some(sub) = super::catalogue::nvlink5(*xid, text) {
                tracing::info!(
                    xid,
                    unit = sub.unit,
                    fatal = sub.fatal,
                    "XID {xid} {}: {} (NVIDIA's decode of NVLink 5 XIDs)",
                    sub.unit,
                    if sub.fatal {
                        "fatal, a GPU reset is needed"
                    } else {
                        "non-fatal, no reset unless XID 154 asks for one"
                    }
                );
            }
        }
        let (pci, xid, from_bus_line) = match event {
            KernelGpu::Xid { pci, xid, .. } if xid != FELL_OFF_BUS => return Some((pci, xid)),
            KernelGpu::Xid { pci, .. } => (pci, FELL_OFF_BUS, false),
            KernelGpu::FellOffBus { pci } => (pci, FELL_OFF_BUS, true),
            KernelGpu::Lookalike { .. } | KernelGpu::IommuFault { .. } | KernelGpu::Sxid(_) => {
                return None
            }
        };
        let Some(device) = pci_address(&pci) else {
            return Some((pci, xid)); // no address to pair the lines by
        };
        // The other line of the same event: already counted.
        let twin = self.last_79.get(&device).is_some_and(|&(when, bus_line)| {
            bus_line != from_bus_line && at.saturating_duration_since(when) < SAME_EVENT
        });
        if twin {
            self.last_79.remove(&device);
            return None;
        }
        self.last_79.insert(device, (at, from_bus_line));
        Some((pci, xid))
    }

    /// Counts what the kernel said with NVML's tallies (one count), each XID on the GPU at its
    /// PCI address among `gpus` (the last snapshot's); an address none of them has is logged.
    /// A fatal XID waits for NVML's word ([`KernelXids::confirm`]); a lookalike is counted
    /// apart.
    pub fn count(
        &mut self,
        events: Vec<KernelGpu>,
        gpus: &[GpuReading],
        counts: &XidCounts,
        now: Instant,
    ) {
        for event in events {
            if self.not_an_xid(&event, gpus, counts) {
                continue;
            }
            let (link, training) = match &event {
                KernelGpu::Xid {
                    pci,
                    xid,
                    link,
                    text,
                } => (
                    *link,
                    super::training::training_links(*xid, text).zip(pci_address(pci)),
                ),
                _ => (None, None),
            };
            let Some((pci, xid)) = self.observe(event, now) else {
                continue;
            };
            match gpus.iter().find(|g| same_pci_device(&g.pci_bus_id, &pci)) {
                Some(gpu) if xid == FELL_OFF_BUS && !gpu.lost => {
                    tracing::info!(
                        gpu = gpu.index,
                        "the kernel log says GPU {} ({pci}) fell off the bus (XID 79); counted \
                         once NVML finds it lost",
                        gpu.index
                    );
                    self.unconfirmed.push((gpu.index, now));
                }
                Some(gpu) if xid != FELL_OFF_BUS && super::catalogue::is_fatal(xid) => {
                    if self.pending.len() < PENDING_MAX {
                        self.pending.push(Pending {
                            gpu: gpu.index,
                            xid,
                            link,
                            at: now,
                            nvml_before: counts.nvml_count(gpu.index, xid),
                            training,
                        });
                    } else {
                        counts.record_unconfirmed(gpu.index, xid);
                    }
                }
                Some(gpu) => {
                    tracing::warn!(
                        gpu = gpu.index,
                        xid,
                        "the kernel log reports XID {xid} on GPU {} ({pci})",
                        gpu.index
                    );
                    counts.record_kernel(gpu.index, xid);
                    counts.record_training(training);
                }
                None => {
                    tracing::warn!(
                        xid,
                        "the kernel log reports XID {xid} on PCI {pci}, which is none of NVML's \
                         GPUs: kept by its address"
                    );
                    counts.record_kernel_at(&pci, xid);
                    counts.record_training(training);
                }
            }
        }
    }

    /// Counts what is not an XID (an SXID, an IOMMU fault, a lookalike); false: an XID.
    fn not_an_xid(&mut self, event: &KernelGpu, gpus: &[GpuReading], counts: &XidCounts) -> bool {
        match event {
            KernelGpu::Sxid(s) => {
                tracing::warn!(
                    switch = s.switch,
                    sxid = s.sxid,
                    fatal = s.fatal,
                    "the kernel log reports SXID {} on NVSwitch {}",
                    s.sxid,
                    s.switch
                );
                counts.record_sxid(s);
            }
            KernelGpu::Lookalike { pci, xid, why } => self.lookalike(pci, *xid, why, gpus, counts),
            KernelGpu::IommuFault { pci } => {
                // Only an NVIDIA GPU's (one NVML lists) is ours to tell.
                if let Some(g) = gpus.iter().find(|g| same_pci_device(&g.pci_bus_id, pci)) {
                    tracing::warn!(
                        gpu = g.index,
                        "the IOMMU blocked a DMA of GPU {} ({pci})",
                        g.index
                    );
                    counts.record_iommu(g.index);
                }
            }
            KernelGpu::Xid { .. } | KernelGpu::FellOffBus { .. } => return false,
        }
        true
    }

    /// A line that reads like an XID and is not the driver's: counted apart on the GPU at its
    /// address, said once per address and XID.
    fn lookalike(
        &mut self,
        pci: &str,
        xid: u64,
        why: &str,
        gpus: &[GpuReading],
        counts: &XidCounts,
    ) {
        let gpu = gpus.iter().find(|g| same_pci_device(&g.pci_bus_id, pci));
        if let Some(g) = gpu {
            counts.record_unconfirmed(g.index, xid);
        }
        let first = self.said.len() < 64 && self.said.insert((pci.to_owned(), xid));
        if first {
            tracing::warn!(
                xid,
                pci,
                "a kernel log line reads like XID {xid} on {pci} but is {why}: not counted as an \
                 XID, not acted on (shmlink_gpu_xid_unconfirmed_total)"
            );
        } else {
            tracing::debug!(xid, pci, "another XID lookalike: {why}");
        }
    }

    /// A scan that began at `scanned` read `gpus` from NVML: each XID 79 told before it is
    /// counted if NVML finds that GPU lost (or lists it no more), and dropped if NVML still
    /// reaches it; each other fatal XID told before it is counted with NVML's [`Word`], else
    /// counted as unconfirmed. Without NVML (`nvml_up` false) nothing is decided.
    pub fn confirm(
        &mut self,
        gpus: &[GpuReading],
        nvml_up: bool,
        scanned: Instant,
        counts: &XidCounts,
    ) {
        if !nvml_up {
            return;
        }
        self.pending.retain(|p| {
            if p.at >= scanned {
                return true; // NVML was read before the line: the next scan decides
            }
            let gpu = gpus.iter().find(|g| g.index == p.gpu);
            let nvml_now = counts.nvml_count(p.gpu, p.xid);
            match Word::of(gpu, p.link, p.nvml_before, nvml_now) {
                Some(word) => {
                    tracing::warn!(
                        gpu = p.gpu,
                        xid = p.xid,
                        "the kernel log reports XID {} on GPU {}, and {}",
                        p.xid,
                        p.gpu,
                        word.said()
                    );
                    counts.record_kernel(p.gpu, p.xid);
                    counts.record_training(p.training);
                }
                None => {
                    tracing::warn!(
                        gpu = p.gpu,
                        xid = p.xid,
                        "the kernel log reports XID {} on GPU {}, but NVML does not confirm it \
                         (no XID event, recovery action, lost GPU or link down): counted as \
                         unconfirmed, not acted on (a line a process or a netfilter LOG \
                         prefix could write?)",
                        p.xid,
                        p.gpu
                    );
                    counts.record_unconfirmed(p.gpu, p.xid);
                }
            }
            false
        });
        self.unconfirmed.retain(|&(index, at)| {
            if at >= scanned {
                return true; // NVML was read before the record: the next scan decides
            }
            match gpus.iter().find(|g| g.index == index) {
                Some(g) if !g.lost => tracing::warn!(
                    gpu = index,
                    "the kernel log said GPU {index} fell off the bus, but NVML still reaches \
                     it: XID 79 not counted (a line written to look like the driver's?)"
                ),
                _ => {
                    tracing::warn!(gpu = index, "the kernel log reports XID 79 on GPU {index}");
                    counts.record_kernel(index, FELL_OFF_BUS);
                }
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::kmsg::{self, records};
    use crate::kernel_log::parse_record;

    fn xid(pci: &str, xid: u64) -> KernelGpu {
        KernelGpu::Xid {
            pci: pci.into(),
            xid,
            link: None,
            text: String::new(),
        }
    }

    fn gpus(content: &str) -> Vec<Option<KernelGpu>> {
        records(content)
            .iter()
            .map(|r| kernel_gpu(&parse_record(r.as_bytes()).unwrap_or_else(|| panic!("{r}"))))
            .collect()
    }

    fn xid_event(pci: &str, xid: u64, link: Option<u32>, text: &str) -> Option<KernelGpu> {
        Some(KernelGpu::Xid {
            pci: pci.into(),
            xid,
            link,
            text: text.into(),
        })
    }

    #[test]
    fn xids_with_and_without_a_link() {
        assert_eq!(
            gpus(kmsg::XID),
            [
                xid_event(
                    "0000:3b:00",
                    79,
                    None,
                    "pid=1234, name=python3, GPU has fallen off the bus."
                ),
                xid_event(
                    "0000:18:00",
                    74,
                    Some(6),
                    "pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link \
                     6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
                ),
                xid_event(
                    "0000:18:00",
                    13,
                    None,
                    "pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): \
                     Out Of Range Address"
                ),
                xid_event(
                    "0000:1b:00",
                    145,
                    Some(12),
                    "pid='<unknown>', name=<unknown>, NVLink: Link 12 fatal error detected \
                     (0x8000)"
                ),
                xid_event(
                    "0000:1b:00",
                    74,
                    None,
                    "pid='<unknown>', name=<unknown>, NVLink 5 fatal error detected"
                ),
                xid_event("0000:03:00", 31, None, ""),
                // An old driver's form, without `PCI:`: the shape a netfilter prefix spells.
                Some(KernelGpu::Lookalike {
                    pci: "0000:03:00".into(),
                    xid: 13,
                    why: "not in the driver's shape (`Xid (PCI:dddd:bb:dd): N, `)"
                }),
            ]
        );
    }

    #[test]
    fn lines_a_netfilter_prefix_or_a_process_writes_are_lookalikes_and_a_mig_line_is_an_xid() {
        let got = gpus(kmsg::FORGED_XID);
        let why = |g: &Option<KernelGpu>| match g {
            Some(KernelGpu::Lookalike { pci, xid: 48, why }) if pci == "0000:18:00" => *why,
            other => panic!("{other:?}"),
        };
        assert!(why(&got[0]).contains("netfilter"), "{got:?}");
        assert!(
            why(&got[1]).contains("netfilter"),
            "the driver's whole shape in a prefix"
        );
        assert!(why(&got[2]).contains("process"), "{got:?}");
        assert_eq!(
            got[3],
            xid_event(
                "0000:18:00",
                94,
                None,
                "pid=7194, name=python3, Contained: CE User Channel (0x9). RST: No, D-RST: No"
            )
        );
    }

    /// The board the word tests use: GPU 0 at 18:00, GPU 1 at 3b:00, each with links 0-1 up.
    fn board() -> Vec<GpuReading> {
        let mut board: Vec<GpuReading> = (0..2).map(crate::fixtures::gpu_reading).collect();
        board[0].pci_bus_id = "00000000:18:00.0".into();
        board[1].pci_bus_id = "00000000:3B:00.0".into();
        for g in &mut board {
            g.links = (0..2)
                .map(|link| crate::model::LinkReading {
                    link,
                    active: true,
                    peer: crate::model::Peer::Unknown,
                    errors: None,
                    nvlink5: None,
                })
                .collect();
        }
        board
    }

    fn xid_on(pci: &str, xid: u64, link: Option<u32>) -> KernelGpu {
        KernelGpu::Xid {
            pci: pci.into(),
            xid,
            link,
            text: String::new(),
        }
    }

    #[test]
    fn a_fatal_xid_of_the_kernel_log_counts_only_with_nvmls_word() {
        let mut board = board();
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        let t0 = Instant::now();
        let soon = t0 - Duration::from_secs(1);
        let later = t0 + Duration::from_secs(1);
        // XID 48 on GPU 0: nothing before NVML's word is asked, nor from a scan begun before.
        k.count(vec![xid_on("0000:18:00", 48, None)], &board, &counts, t0);
        k.confirm(&board, true, soon, &counts);
        assert!(counts.snapshot().is_empty() && counts.unconfirmed().is_empty());
        // NVML says nothing of GPU 0: unconfirmed, never an XID.
        k.confirm(&board, true, later, &counts);
        assert!(counts.snapshot().is_empty());
        assert_eq!(counts.unconfirmed()[&(0, 48)], 1);
        // NVML's own event of it: an XID (one, with NVML's).
        k.count(vec![xid_on("0000:18:00", 48, None)], &board, &counts, t0);
        counts.record(0, 48);
        k.confirm(&board, true, later, &counts);
        assert_eq!(counts.snapshot()[&(0, 48)], 1);
        // NVML's recovery action asks for a reset.
        board[1].recovery_action = Some(crate::model::RecoveryAction::GpuReset);
        k.count(vec![xid_on("0000:3b:00", 95, None)], &board, &counts, t0);
        k.confirm(&board, true, later, &counts);
        assert_eq!(counts.snapshot()[&(1, 95)], 1);
        // An NVLink XID naming a link NVML reads inactive; the same naming an active one not.
        board[0].links[1].active = false;
        let nvlink = vec![
            xid_on("0000:18:00", 74, Some(1)),
            xid_on("0000:18:00", 74, Some(0)),
        ];
        k.count(nvlink, &board, &counts, t0);
        k.confirm(&board, true, later, &counts);
        assert_eq!(counts.snapshot()[&(0, 74)], 1);
        assert_eq!(counts.unconfirmed()[&(0, 74)], 1);
        // Without NVML nothing is decided; a non-fatal XID counts at once.
        k.count(vec![xid_on("0000:18:00", 48, None)], &board, &counts, t0);
        k.confirm(&board, false, later, &counts);
        assert_eq!(counts.unconfirmed()[&(0, 48)], 1);
        k.count(vec![xid_on("0000:18:00", 13, None)], &board, &counts, t0);
        assert_eq!(counts.snapshot()[&(0, 13)], 1);
    }

    #[test]
    fn iommu_page_faults_naming_a_gpu_are_told_on_that_gpu_only() {
        let lines = "3,901,1000,-;AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:18:00.0 \
                     domain=0x0000 address=0xfd000000 flags=0x0020]\n\
                     3,902,1001,-;nvidia 0000:3b:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT \
                     domain=0x0012 address=0x3bf000 flags=0x0020]\n\
                     3,903,1002,-;DMAR: [DMA Read NO_PASID] Request device [18:00.0] fault addr \
                     0x7f000000 [fault reason 0x06] PTE Read access is not set\n\
                     3,904,1003,-;DMAR: [DMA Write] Request device [c1:00.0] PASID ffffffff \
                     fault addr 0x1000 [fault reason 0x05] PTE Write access is not set\n\
                     12,905,1004,-;AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:18:00.0 \
                     domain=0x0000 address=0x0 flags=0x0]\n\
                     6,906,1005,-;DMAR: IOMMU enabled";
        let got = gpus(lines);
        let fault = |pci: &str| Some(KernelGpu::IommuFault { pci: pci.into() });
        assert_eq!(
            got,
            [
                fault("0000:18:00.0"),
                fault("0000:3b:00.0"),
                fault("0000:18:00.0"),
                fault("0000:c1:00.0"),
                None, // a process's write (facility user)
                None,
            ]
        );
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        // GPUs 0 (18:00) and 1 (3b:00) are NVML's; c1:00 is another device: not ours.
        k.count(
            got.into_iter().flatten().collect(),
            &board(),
            &counts,
            Instant::now(),
        );
        assert_eq!(counts.iommu(), BTreeMap::from([(0, 2), (1, 1)]));
        assert!(counts.snapshot().is_empty() && counts.by_address().is_empty());
        let mut recent = super::super::Recent::<u32>::default();
        let now = Instant::now();
        assert!(counts.iommu().iter().all(|(g, &n)| recent.lasts(g, n, now)));
        let said = crate::text::gpu_iommu_fault(0, counts.iommu()[&0]);
        assert!(said.contains("blocked 2 DMAs of GPU 0") && said.contains("iommu=pt"));
    }

    #[test]
    fn an_xid_on_a_gpu_nvml_does_not_list_is_kept_by_its_address() {
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        let t0 = Instant::now();
        // 0000:29:00 is none of the board's GPUs (NVML lost it, or never listed it).
        let lines = vec![
            xid_on("0000:29:00", 79, None),
            xid_on("0000:29:00", 48, None),
        ];
        k.count(lines, &board(), &counts, t0);
        assert!(counts.snapshot().is_empty());
        assert_eq!(
            counts.by_address(),
            BTreeMap::from([
                (("0000:29:00.0".to_string(), 48), 1),
                (("0000:29:00.0".to_string(), 79), 1)
            ])
        );
        // A lookalike at such an address stays nothing.
        let forged = gpus(kmsg::FORGED_XID).into_iter().flatten().take(1);
        let forged = forged.map(|g| match g {
            KernelGpu::Lookalike { xid, why, .. } => KernelGpu::Lookalike {
                pci: "0000:29:00".into(),
                xid,
                why,
            },
            other => other,
        });
        k.count(forged.collect(), &board(), &counts, t0);
        assert_eq!(counts.by_address().len(), 2);
    }

    #[test]
    fn a_lookalike_is_counted_apart_and_never_an_xid() {
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        let t0 = Instant::now();
        let forged = gpus(kmsg::FORGED_XID)
            .into_iter()
            .flatten()
            .take(3)
            .collect();
        k.count(forged, &board(), &counts, t0);
        k.confirm(&board(), true, t0 + Duration::from_secs(1), &counts);
        assert!(counts.snapshot().is_empty(), "{:?}", counts.snapshot());
        assert_eq!(counts.unconfirmed()[&(0, 48)], 3);
    }

    #[test]
    fn training_failures_count_with_their_xid_and_sxids_per_switch() {
        let lines = "4,1,100,-;NVRM: Xid (PCI:0000:18:00): 136, pid='<unknown>', name=<unknown>, \
                     NVLink: Link training failed for link 1(0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)\n\
                     4,2,101,-;NVRM: Xid (PCI:0000:29:00): 74, pid='<unknown>', name=<unknown>, \
                     NVLink: failed to train link 4 to remote PCI:0000:05:00\n\
                     12,3,102,-;NVRM: Xid (PCI:0000:3b:00): 136, pid='<unknown>', \
                     name=<unknown>, NVLink: Link training failed for link 0(0x1)\n\
                     3,4,103,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 36 \
                     sourcetrack TCEN0 crumbstore ECC DBE Error\n\
                     3,5,104,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 37 \
                     sourcetrack TCEN0 crumbstore ECC DBE Error\n\
                     3,6,105,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, Link \
                     32 egress non-posted PRIV error";
        let events: Vec<KernelGpu> = gpus(lines).into_iter().flatten().collect();
        assert!(matches!(
            &events[0],
            KernelGpu::Xid {
                xid: 136,
                link: Some(1),
                ..
            }
        ));
        assert!(
            matches!(&events[2], KernelGpu::Lookalike { xid: 136, .. }),
            "a process's write"
        );
        let mut board = board();
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        let t0 = Instant::now();
        k.count(events, &board, &counts, t0);
        // 29:00 is none of NVML's GPUs: kept by its address at once; GPU 0's waits for NVML.
        let training = |counts: &XidCounts| -> Vec<(String, Vec<u32>, u64)> {
            (counts.training().into_iter())
                .map(|t| (t.pci_bus_id, t.links, t.count))
                .collect()
        };
        assert_eq!(training(&counts), [("0000:29:00.0".into(), vec![4], 1)]);
        // NVML says nothing of GPU 0: the line is evidence, its links not counted.
        k.confirm(&board, true, t0 + Duration::from_secs(1), &counts);
        assert_eq!(training(&counts).len(), 1);
        assert_eq!(counts.unconfirmed()[&(0, 136)], 1);
        // NVML reads the named link inactive: its word.
        board[0].links[1].active = false;
        let again = gpus(lines).into_iter().flatten().take(1).collect();
        k.count(again, &board, &counts, t0);
        k.confirm(&board, true, t0 + Duration::from_secs(1), &counts);
        assert_eq!(counts.snapshot()[&(0, 136)], 1);
        assert_eq!(training(&counts)[0], ("0000:18:00.0".into(), vec![1], 1));
        let sxids: Vec<(String, u64, u64, bool)> = (counts.sxids().into_iter())
            .map(|s| (s.switch, s.sxid, s.count, s.fatal))
            .collect();
        assert_eq!(
            sxids,
            [
                ("0000:05:00.0".into(), 24007, 2, true),
                ("0000:08:00.0".into(), 12028, 1, false)
            ]
        );
    }

    #[test]
    fn only_the_fallen_off_the_bus_lines_are_fell_off_bus() {
        let bus = |pci: &str| {
            Some(KernelGpu::FellOffBus {
                pci: pci.to_owned(),
            })
        };
        assert_eq!(
            gpus(kmsg::NVRM),
            [
                bus("0000:3b:00.0"),
                bus("0000:3b:00.0"),
                None, // `GPU at PCI:...: GPU-<uuid>` only names the GPU
                None, // another NVRM line
                None, // a crash line whose comm is `NVRM: GPU 18:0 `
                None, // a crash line whose comm spells the whole driver line
            ]
        );
    }

    #[test]
    fn other_kernel_records_are_nothing() {
        assert!(gpus(kmsg::OTHER).iter().all(Option::is_none));
    }

    fn off(pci: &str) -> KernelGpu {
        KernelGpu::FellOffBus { pci: pci.into() }
    }

    #[test]
    fn a_gpu_fallen_off_the_bus_counts_once_nvml_finds_it_lost_and_never_while_nvml_reaches_it() {
        let mut board: Vec<GpuReading> = (0..2).map(crate::fixtures::gpu_reading).collect();
        board[0].pci_bus_id = "00000000:18:00.0".into();
        board[1].pci_bus_id = "00000000:3B:00.0".into();
        let counts = XidCounts::default();
        let mut k = KernelXids::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        k.count(vec![off("0000:18:00.0")], &board, &counts, t0);
        k.count(vec![xid("0000:3b:00", FELL_OFF_BUS)], &board, &counts, t0);
        assert!(counts.snapshot().is_empty(), "not before NVML says");
        // A scan that read NVML before the records decides nothing.
        k.confirm(&board, true, t0 - Duration::from_secs(1), &counts);
        assert!(counts.snapshot().is_empty());
        // Without NVML nothing is decided either.
        k.confirm(&board, false, later, &counts);
        assert!(counts.snapshot().is_empty());
        // NVML finds GPU 1 lost and still reaches GPU 0: only GPU 1's counts.
        board[1].lost = true;
        k.confirm(&board, true, later, &counts);
        assert_eq!(
            counts.snapshot().into_iter().collect::<Vec<_>>(),
            [((1, FELL_OFF_BUS), 1)]
        );
        k.confirm(&board, true, later, &counts);
        assert_eq!(counts.snapshot().len(), 1, "each decided once");
        // A GPU NVML already knows lost counts at once.
        k.count(
            vec![xid("0000:3b:00", FELL_OFF_BUS)],
            &board,
            &counts,
            later,
        );
        assert_eq!(counts.snapshot()[&(1, FELL_OFF_BUS)], 2);
    }

    #[test]
    fn an_xid_is_counted_as_it_comes() {
        let mut k = KernelXids::default();
        let t = Instant::now();
        assert_eq!(
            k.observe(xid("0000:3b:00", 13), t),
            Some(("0000:3b:00".into(), 13))
        );
        assert_eq!(
            k.observe(xid("0000:3b:00", 13), t),
            Some(("0000:3b:00".into(), 13))
        );
    }

    #[test]
    fn xid_79_and_its_fallen_off_the_bus_line_are_one_event_in_either_order() {
        let t = Instant::now();
        let mut k = KernelXids::default();
        assert_eq!(
            k.observe(xid("0000:3b:00", 79), t),
            Some(("0000:3b:00".into(), 79))
        );
        assert_eq!(
            k.observe(off("0000:3B:00.0"), t),
            None,
            "the same device, spelt as that line does"
        );
        let mut k = KernelXids::default();
        assert_eq!(
            k.observe(off("0000:3b:00"), t),
            Some(("0000:3b:00".into(), 79))
        );
        assert_eq!(
            k.observe(xid("0000:3b:00", 79), t + Duration::from_secs(1)),
            None
        );
        // A later fall is a new event.
        assert_eq!(
            k.observe(off("0000:3b:00"), t + Duration::from_secs(2)),
            Some(("0000:3b:00".into(), 79))
        );
        assert_eq!(
            k.observe(xid("0000:3b:00", 79), t + Duration::from_secs(60)),
            Some(("0000:3b:00".into(), 79)),
            "too far apart to be one event"
        );
        // Another GPU's line is its own.
        assert_eq!(
            k.observe(off("0000:5e:00"), t),
            Some(("0000:5e:00".into(), 79))
        );
    }
}

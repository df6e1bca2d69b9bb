//! Pure: the kernel log's word on XIDs, made one count with NVML's. The driver prints each XID
//! to the kernel log (`NVRM: Xid (PCI:0000:3b:00): 79, ...`) and NVML delivers the same XID as an
//! event: [`super::XidCounts`] keeps both tallies and reports the larger, so an XID seen by both
//! counts once, and one that only the kernel saw (NVML's event thread not running, or behind)
//! still counts. A GPU that "has fallen off the bus" is XID 79's condition: the driver prints
//! that line beside its `Xid ... 79` line, so the two within [`SAME_EVENT`] are one XID 79.
//! A GPU the kernel log says fell off the bus is counted once NVML, where it is loaded, finds it
//! lost too: NVML answers for the device itself, the log only for whoever wrote the line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::XidCounts;
use crate::gpu::pci::{pci_address, same_pci_device};
use crate::kernel_log::record::{leading_decimal, KmsgRecord};
use crate::model::GpuReading;

/// XID 79: "GPU has fallen off the bus" in NVIDIA's XID catalogue.
pub const FELL_OFF_BUS: u64 = 79;
/// An `Xid ... 79` line and a "fallen off the bus" line for one GPU this close are one event.
pub const SAME_EVENT: Duration = Duration::from_secs(10);

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
}

/// What a kernel-facility record says about a GPU, if anything: the driver's `NVRM: ` lines,
/// in the driver's own shape only. A process can name itself `NVRM: GPU 18:0 ` (its comm, 15
/// bytes) and crash in a file named `fallen off the bus`: the kernel's crash line then begins
/// like a driver line, so a crash line (`comm[pid]: ...`) is never one, and the address must be
/// whole (`0000:18:00.0`), as the driver prints it.
pub fn kernel_gpu(record: &KmsgRecord) -> Option<KernelGpu> {
    if !record.is_kernel() || is_task_line(&record.message) {
        return None;
    }
    let nvrm = record.message.trim_start().strip_prefix("NVRM: ")?;
    xid(nvrm).or_else(|| fell_off_bus(nvrm))
}

/// The kernel's lines about a task: `comm[pid]: ` (a segfault, a trap, a general protection
/// fault), whatever the comm holds. The driver's lines never have `[digits]: ` in them.
fn is_task_line(message: &str) -> bool {
    message.match_indices("]: ").any(|(i, _)| {
        let head = &message[..i];
        head.rfind('[').is_some_and(|open| {
            let digits = &head[open + 1..];
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
    })
}

/// `Xid (PCI:0000:3b:00): 79, <text>` (old drivers: no `PCI:`, no text).
fn xid(nvrm: &str) -> Option<KernelGpu> {
    let rest = nvrm.strip_prefix("Xid (")?;
    let (address, rest) = rest.split_once(')')?;
    let pci = address.strip_prefix("PCI:").unwrap_or(address);
    pci_address(pci)?;
    let (xid, rest) = leading_decimal::<u64>(rest.strip_prefix(": ")?)?;
    let text = rest.strip_prefix(',').unwrap_or(rest).trim();
    let nvlink = xid == 74 || (144..=150).contains(&xid);
    Some(KernelGpu::Xid {
        pci: pci.to_owned(),
        xid,
        link: if nvlink { link_number(text) } else { None },
        text: text.to_owned(),
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
}

impl KernelXids {
    /// The (PCI address, XID) to count for this record, if any.
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
    pub fn count(
        &mut self,
        events: Vec<KernelGpu>,
        gpus: &[GpuReading],
        counts: &XidCounts,
        now: Instant,
    ) {
        for event in events {
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
                Some(gpu) => {
                    tracing::warn!(
                        gpu = gpu.index,
                        xid,
                        "the kernel log reports XID {xid} on GPU {} ({pci})",
                        gpu.index
                    );
                    counts.record_kernel(gpu.index, xid);
                }
                None => tracing::warn!(
                    xid,
                    "the kernel log reports XID {xid} on PCI {pci}, which is none of NVML's GPUs"
                ),
            }
        }
    }

    /// A scan that began at `scanned` read `gpus` from NVML: each XID 79 told before it is
    /// counted if NVML finds that GPU lost (or lists it no more), and dropped if NVML still
    /// reaches it. Without NVML (`nvml_up` false) nothing is decided.
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
                xid_event(
                    "0000:03:00",
                    13,
                    None,
                    "0001 00000000 0000b197 000001b0 00000000"
                ),
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

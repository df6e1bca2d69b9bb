//! The XID tallies: per (GPU index, XID), as NVML's events and the kernel log tell them.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// XIDs seen since start, per (GPU index, XID), as NVML's events and the kernel log tell them.
/// Shared with the scan thread. The two see the same XIDs, so the count is the larger of their
/// tallies, not their sum (`kernel.rs`).
#[derive(Debug, Default)]
pub struct XidCounts {
    counts: Mutex<Tallies>,
}

/// Distinct (GPU, XID) tallies kept at most per source: a tally never shrinks, so a source that
/// could name any number would grow it without end.
const MAX_TALLIES: usize = 256;

#[derive(Debug, Default)]
struct Tallies {
    nvml: BTreeMap<(u32, u64), u64>,
    kernel: BTreeMap<(u32, u64), u64>,
    /// What the kernel log told without NVML's word (`kernel.rs`): evidence, never an XID.
    unconfirmed: BTreeMap<(u32, u64), u64>,
    /// XIDs the kernel log told on a GPU NVML does not list, by its PCI address
    /// (`pci::canonical`).
    by_address: BTreeMap<(String, u64), u64>,
    /// IOMMU IO page faults the kernel log told per GPU index (`kernel::KernelGpu::IommuFault`).
    iommu: BTreeMap<u32, u64>,
    /// NVLink training failures per GPU address (`pci::canonical`): (count, links' mask).
    training: BTreeMap<String, (u64, u64)>,
    /// NVSwitch SXIDs per (switch address, SXID): (count, fatal).
    sxids: BTreeMap<(String, u64), (u64, bool)>,
}

impl XidCounts {
    /// One XID NVML delivered.
    pub fn record(&self, gpu: u32, xid: u64) {
        if let Ok(mut t) = self.counts.lock() {
            bump(&mut t.nvml, gpu, xid);
        }
    }

    /// One XID the kernel log told; an XID NVIDIA's catalogue does not list is not one (the
    /// kernel log is text others can shape).
    pub fn record_kernel(&self, gpu: u32, xid: u64) {
        if super::catalogue::lookup(xid).is_none() {
            tracing::debug!(
                xid,
                "an XID outside NVIDIA's catalogue in the kernel log: not counted"
            );
            return;
        }
        if let Ok(mut t) = self.counts.lock() {
            bump(&mut t.kernel, gpu, xid);
        }
    }

    /// One XID the kernel log told on a GPU NVML does not list (not loaded, or the GPU lost to
    /// it), kept by the GPU's PCI address rather than dropped: NVML listing it no more is its
    /// word that something is wrong (`kernel::Word::Lost`).
    pub fn record_kernel_at(&self, pci: &str, xid: u64) {
        let Some(pci) = crate::gpu::pci::canonical(pci) else {
            return;
        };
        if super::catalogue::lookup(xid).is_none() {
            return;
        }
        if let Ok(mut t) = self.counts.lock() {
            let tally = &mut t.by_address;
            if let Some(n) = tally.get_mut(&(pci.clone(), xid)) {
                *n += 1;
            } else if tally.len() < MAX_TALLIES {
                tally.insert((pci, xid), 1);
            }
        }
    }

    /// One IOMMU fault naming GPU `gpu`.
    pub fn record_iommu(&self, gpu: u32) {
        if let Ok(mut t) = self.counts.lock() {
            if t.iommu.len() < MAX_TALLIES || t.iommu.contains_key(&gpu) {
                *t.iommu.entry(gpu).or_default() += 1;
            }
        }
    }

    /// One NVLink training failure (`training.rs`) the kernel log told, its links' mask and its
    /// GPU's (domain, bus, device); counted only where its XID is.
    pub fn record_training(&self, training: Option<(u64, (u32, u8, u8))>) {
        let Some((mask, (domain, bus, device))) = training else {
            return;
        };
        let pci = format!("{domain:04x}:{bus:02x}:{device:02x}.0");
        if let Ok(mut t) = self.counts.lock() {
            if t.training.len() < MAX_TALLIES || t.training.contains_key(&pci) {
                let (count, links) = t.training.entry(pci).or_default();
                *count += 1;
                *links |= mask;
            }
        }
    }

    /// The NVLink training failures per GPU address, links lowest first.
    pub fn training(&self) -> Vec<crate::model::TrainingCount> {
        let Ok(t) = self.counts.lock() else {
            return Vec::new();
        };
        t.training
            .iter()
            .map(|(pci, &(count, mask))| crate::model::TrainingCount {
                pci_bus_id: pci.clone(),
                links: super::training::links(mask),
                count,
            })
            .collect()
    }

    /// One NVSwitch SXID the kernel log told.
    pub fn record_sxid(&self, s: &super::sxid::Sxid) {
        if let Ok(mut t) = self.counts.lock() {
            let key = (s.switch.clone(), s.sxid);
            if t.sxids.len() < MAX_TALLIES || t.sxids.contains_key(&key) {
                let (count, fatal) = t.sxids.entry(key).or_default();
                *count += 1;
                *fatal |= s.fatal;
            }
        }
    }

    /// The SXIDs per switch and SXID.
    pub fn sxids(&self) -> Vec<crate::model::SxidCount> {
        let Ok(t) = self.counts.lock() else {
            return Vec::new();
        };
        t.sxids
            .iter()
            .map(
                |((switch, sxid), &(count, fatal))| crate::model::SxidCount {
                    switch: switch.clone(),
                    sxid: *sxid,
                    count,
                    fatal,
                },
            )
            .collect()
    }

    /// The IOMMU faults per GPU index.
    pub fn iommu(&self) -> BTreeMap<u32, u64> {
        self.counts
            .lock()
            .map(|t| t.iommu.clone())
            .unwrap_or_default()
    }

    /// The tallies by PCI address ([`XidCounts::record_kernel_at`]).
    pub fn by_address(&self) -> BTreeMap<(String, u64), u64> {
        self.counts
            .lock()
            .map(|t| t.by_address.clone())
            .unwrap_or_default()
    }

    /// A fatal XID the kernel log told that NVML did not confirm, or a line that only reads
    /// like one: counted apart (`shmlink_gpu_xid_unconfirmed_total`), never an XID.
    pub fn record_unconfirmed(&self, gpu: u32, xid: u64) {
        if super::catalogue::lookup(xid).is_none() {
            return;
        }
        if let Ok(mut t) = self.counts.lock() {
            bump(&mut t.unconfirmed, gpu, xid);
        }
    }

    /// NVML's own tally of `xid` on `gpu`.
    pub fn nvml_count(&self, gpu: u32, xid: u64) -> u64 {
        self.counts
            .lock()
            .ok()
            .and_then(|t| t.nvml.get(&(gpu, xid)).copied())
            .unwrap_or(0)
    }

    pub fn snapshot(&self) -> BTreeMap<(u32, u64), u64> {
        self.tallies()
    }

    /// The unconfirmed tallies ([`XidCounts::record_unconfirmed`]).
    pub fn unconfirmed(&self) -> BTreeMap<(u32, u64), u64> {
        self.counts
            .lock()
            .map(|t| t.unconfirmed.clone())
            .unwrap_or_default()
    }

    fn tallies(&self) -> BTreeMap<(u32, u64), u64> {
        let Ok(t) = self.counts.lock() else {
            return BTreeMap::new();
        };
        let mut out = t.nvml.clone();
        for (&key, &n) in &t.kernel {
            let count = out.entry(key).or_default();
            *count = (*count).max(n);
        }
        out
    }
}

/// Counts one; a new (GPU, XID) past [`MAX_TALLIES`] is dropped (and said once).
fn bump(tally: &mut BTreeMap<(u32, u64), u64>, gpu: u32, xid: u64) {
    if let Some(n) = tally.get_mut(&(gpu, xid)) {
        *n += 1;
    } else if tally.len() < MAX_TALLIES {
        tally.insert((gpu, xid), 1);
    } else if tally.len() == MAX_TALLIES {
        tracing::warn!(
            gpu,
            xid,
            "{MAX_TALLIES} distinct XIDs counted: further ones are not"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_outside_the_catalogue_and_past_the_cap_are_not_tallied() {
        let counts = XidCounts::default();
        counts.record_kernel(0, 987_654);
        assert!(counts.snapshot().is_empty());
        for gpu in 0..1000 {
            counts.record(gpu, 48);
        }
        assert_eq!(counts.snapshot().len(), MAX_TALLIES);
        counts.record(0, 48);
        assert_eq!(counts.snapshot()[&(0, 48)], 2, "a known one still counts");
    }

    #[test]
    fn nvml_and_the_kernel_seeing_the_same_xids_count_once() {
        let counts = XidCounts::default();
        counts.record(2, 79);
        counts.record_kernel(2, 79);
        counts.record_kernel(2, 13); // only the kernel saw it
        counts.record(3, 48);
        counts.record(3, 48);
        counts.record_kernel(3, 48);
        assert_eq!(
            counts.snapshot(),
            BTreeMap::from([((2, 13), 1), ((2, 79), 1), ((3, 48), 2)])
        );
    }
}

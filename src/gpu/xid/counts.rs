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

#[derive(Debug, Default)]
struct Tallies {
    nvml: BTreeMap<(u32, u64), u64>,
    kernel: BTreeMap<(u32, u64), u64>,
}

impl XidCounts {
    /// One XID NVML delivered.
    pub fn record(&self, gpu: u32, xid: u64) {
        if let Ok(mut t) = self.counts.lock() {
            *t.nvml.entry((gpu, xid)).or_default() += 1;
        }
    }

    /// One XID the kernel log told.
    pub fn record_kernel(&self, gpu: u32, xid: u64) {
        if let Ok(mut t) = self.counts.lock() {
            *t.kernel.entry((gpu, xid)).or_default() += 1;
        }
    }

    pub fn snapshot(&self) -> BTreeMap<(u32, u64), u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

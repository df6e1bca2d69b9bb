//! XID errors arrive as NVML events; a thread of its own waits for them (nvmlEventSetWait
//! blocks) and counts them per GPU and XID for the scans to pick up. [`RecentXids`] decides
//! which of them are findings (and so Events) now; `catalogue.rs` what each calls for.

pub mod catalogue;
pub mod kernel;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use crate::findings::text;

use crate::model::{Finding, FindingKind, Subject};

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

/// How long after its last increase an XID stays a finding (and one Event series).
pub const XID_LASTS: Duration = Duration::from_secs(600);

/// Pure: which XIDs were counted within the last [`XID_LASTS`].
#[derive(Debug, Default)]
pub struct RecentXids {
    /// Per (GPU index, XID): the count last seen and when it last grew.
    seen: BTreeMap<(u32, u64), (u64, Instant)>,
}

impl RecentXids {
    /// A `gpu_xid` finding for each XID whose count grew within [`XID_LASTS`] of `now`.
    pub fn findings(&mut self, counts: &BTreeMap<(u32, u64), u64>, now: Instant) -> Vec<Finding> {
        let mut out = Vec::new();
        for (&(gpu, xid), &count) in counts {
            let seen = self.seen.entry((gpu, xid)).or_insert((0, now));
            if count > seen.0 {
                *seen = (count, now);
            }
            if now.duration_since(seen.1) < XID_LASTS {
                out.push(Finding::new(
                    FindingKind::GpuXid,
                    Subject::Xid { gpu, xid },
                    text::xid(gpu, xid, count, catalogue::lookup(xid)),
                ));
            }
        }
        out
    }
}

/// How long one wait blocks: also how quickly the thread notices it should stop.
const WAIT_MS: u32 = 500;

/// Starts the XID thread; `None` when this NVML cannot deliver XID events (an old library
/// without the event symbols, or no GPU that supports them).
pub fn spawn(
    nvml: &'static Nvml,
    devices: Vec<(u32, Device<'static>)>,
    counts: Arc<XidCounts>,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    // An old library can register events yet lack the call that waits for them.
    if nvml.lib().nvmlEventSetWait_v2.is_err() {
        tracing::info!("XID events unavailable: this NVML has no nvmlEventSetWait_v2");
        return None;
    }
    let set = match register(nvml, &devices) {
        Ok(set) => set,
        Err(e) => {
            tracing::info!("XID events unavailable: {e}");
            return None;
        }
    };
    let handles: Vec<(usize, u32)> = devices
        .iter()
        // SAFETY: reading the handle's address only, to match events to GPUs.
        .map(|(i, d)| (unsafe { d.handle() } as usize, *i))
        .collect();
    std::thread::Builder::new()
        .name("xid".into())
        .spawn(move || {
            let mut logged_error = false;
            while !stop.load(Ordering::Relaxed) {
                match set.wait(WAIT_MS) {
                    Ok(event) => {
                        // SAFETY: as above.
                        let handle = unsafe { event.device.handle() } as usize;
                        let gpu = handles.iter().find(|(h, _)| *h == handle).map(|(_, i)| *i);
                        if let (Some(gpu), Some(XidError::Value(xid))) = (gpu, event.event_data) {
                            tracing::warn!(gpu, xid, "XID error");
                            counts.record(gpu, xid);
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        if !logged_error {
                            tracing::warn!("waiting for XID events: {e}");
                            logged_error = true;
                        }
                        std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                    }
                }
            }
        })
        .ok()
}

/// One event set with every GPU that supports XID events registered. A failed registration
/// frees the set (nvml-wrapper's behaviour), so the set is rebuilt without that GPU.
fn register(
    nvml: &'static Nvml,
    devices: &[(u32, Device<'static>)],
) -> Result<nvml_wrapper::EventSet<'static>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    let mut registered: Vec<usize> = Vec::new();
    for (n, (index, device)) in devices.iter().enumerate() {
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered.push(n);
            }
            Err(e) => {
                tracing::info!(gpu = index, "XID events not available: {e}");
                set = nvml.create_event_set()?;
                for &r in &registered {
                    set = devices[r]
                        .1
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|e| e.error)?;
                }
            }
        }
    }
    if registered.is_empty() {
        return Err(NvmlError::NotSupported);
    }
    Ok(set)
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

    #[test]
    fn an_xid_is_a_finding_until_it_has_been_quiet_for_its_time() {
        let mut recent = RecentXids::default();
        let t0 = Instant::now();
        let mut counts = BTreeMap::from([((7, 79), 1)]);
        let first = recent.findings(&counts, t0);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].subject, Subject::Xid { gpu: 7, xid: 79 });
        assert!(
            first[0].message.contains("XID 79 on GPU 7 (1 since"),
            "{}",
            first[0].message
        );
        counts.insert((7, 79), 2);
        // It grew: the time starts again from here.
        let t1 = t0 + Duration::from_secs(300);
        assert_eq!(recent.findings(&counts, t1).len(), 1);
        assert_eq!(
            recent
                .findings(&counts, t1 + XID_LASTS - Duration::from_secs(1))
                .len(),
            1
        );
        assert!(recent.findings(&counts, t1 + XID_LASTS).is_empty());
    }
}

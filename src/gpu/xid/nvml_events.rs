//! The XID event thread (`serve` only): NVML delivers XIDs as events; a thread of its own
//! waits for them (nvmlEventSetWait blocks) and counts them per GPU and XID for the scans.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::XidCounts;

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

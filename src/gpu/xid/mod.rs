//! Everything about XIDs, whoever tells them:
//!
//! - `catalogue.rs` (pure): what NVIDIA's XID catalogue says each calls for; whether that is
//!   fatal is [`crate::model::XidAction::is_fatal`];
//! - `nvml_events.rs`: NVML's XID events, on a thread of their own (`serve` only);
//! - `kernel.rs`: the driver's `NVRM: Xid` and "fallen off the bus" lines in the kernel log,
//!   made one event each and routed to the GPU at their PCI address;
//! - `training.rs` (pure): the NVLink links an XID 74 or 136 line says failed to train;
//! - `lookalike.rs` (pure): the shapes of a line that only looks like the driver's (a task's,
//!   netfilter's), which both readers refuse;
//! - `sxid.rs` (pure): NVSwitch SXID lines (`nvidia-nvswitchN: SXid (PCI:...): N, Fatal, ...`);
//! - `counts.rs`: the tallies of both, one count (the larger);
//! - `recent.rs` (pure): which are findings now, and how long fatal ones hold `GpuFault`.

pub mod catalogue;
pub mod counts;
pub mod kernel;
mod lookalike;
pub mod nvml_events;
pub mod recent;
pub mod saved;
pub mod sxid;
pub mod training;

pub use counts::XidCounts;
pub use nvml_events::spawn;
pub use recent::{FatalXids, Held, HeldAges, Recent, RecentXids, XID_LASTS};

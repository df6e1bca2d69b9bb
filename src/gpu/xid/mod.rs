//! Everything about XIDs, whoever tells them:
//!
//! - `catalogue.rs` (pure): what NVIDIA's XID catalogue says each calls for;
//! - `events.rs`: NVML's XID events, on a thread of their own (`serve` only);
//! - `kernel.rs`: the driver's `NVRM: Xid` and "fallen off the bus" lines in the kernel log,
//!   made one event each and routed to the GPU at their PCI address;
//! - `counts.rs`: the tallies of both, one count (the larger);
//! - `judge.rs` (pure): which are findings now, and which fatal ones hold `GpuFault`.

pub mod catalogue;
pub mod counts;
pub mod events;
pub mod judge;
pub mod kernel;

pub use counts::XidCounts;
pub use events::spawn;
pub use judge::{FatalXids, RecentXids, XID_LASTS};

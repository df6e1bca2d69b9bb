//! GPU link health from NVML: per-GPU link state and error counters, per-pair P2P status, and
//! a verdict per GPU pair (the readings and verdicts themselves are `model`'s). `nvml.rs` is the
//! only file that touches NVML; `pairs/` is pure; `xid/` is everything about XIDs; `pci.rs`
//! spells PCI addresses one way.

pub mod blame;
pub mod collector;
pub mod nvml;
pub mod pairs;
pub mod pci;
pub mod pcie;
pub mod users;
pub mod xid;

//! GPU link health from NVML: per-GPU link state and error counters, per-pair P2P status, and
//! a verdict per GPU pair (the readings and verdicts themselves are `model`'s). `nvml/` is the
//! only module that touches NVML; `pairs/` is pure; `blame.rs` is the one rule for which GPUs
//! failing pairs point at; `xid/` is everything about XIDs; `pci.rs` spells PCI addresses one
//! way; `verdict.rs` is the one verdict per GPU that every outlet renders.

pub mod blame;
pub mod collector;
pub mod node_info;
pub mod nvml;
pub mod pairs;
pub mod pci;
pub mod pcie;
pub mod users;
pub mod verdict;
pub mod xid;

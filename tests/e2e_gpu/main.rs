//! The end-to-end tests against the fake NVML (and the fake API server): `serve`, `check` and
//! `probe` run as the built binary on a fake GPU node, no runc container. One binary, each file a
//! module named as its file (`cargo test --test e2e_gpu conditions::`).

#[path = "../common/mod.rs"]
mod common;

mod conditions;
mod device_taint;
mod fleet;
mod forged;
mod forged_xid;
mod golden_metrics;
mod gpu;
mod pcie;
mod probe;
mod resume_holds;
mod xid_agree;

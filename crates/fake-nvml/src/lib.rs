//! A test double of `libnvidia-ml.so`: the NVML symbols shmlink reaches through nvml-wrapper,
//! answered from a JSON file named by `FAKE_NVML_CONFIG` and re-read whenever that file changes.
//! README.md documents the schema, the symbols and the rules (XID delivery, lost GPUs).
//!
//! Built with `cfg(fake_nvml_legacy)` (the fake-nvml-legacy package) it leaves out the symbols
//! an old driver lacks, so shmlink's handling of a partial library can be tested.

pub mod config;
mod ffi;
mod state;

pub use config::Config;
pub use state::CONFIG_ENV;

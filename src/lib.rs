//! shmlink: a node agent that watches each container's /dev/shm and the health of GPU links.
//!
//! One scan builds an immutable [`model::Snapshot`]; `check` prints it, `serve` keeps the last
//! one behind an `Arc` and serves `/metrics` from it. See ARCHITECTURE.md for the flow.

pub mod admit;
pub mod agent;
pub mod beneath;
pub mod cgroup;
pub mod check;
pub mod cli;
pub mod death_trace;
pub mod docker_records;
pub mod failures;
#[cfg(any(test, feature = "fixtures"))]
#[doc(hidden)]
pub mod fixtures;
pub mod fleet;
pub mod gpu;
pub mod host;
pub mod kernel_log;
pub mod kube;
pub mod links;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod preflight;
pub mod probe;
pub mod procfs;
pub mod report;
pub mod scan;
pub mod server;
pub mod shm;
pub mod state;
pub mod text;
pub mod units;

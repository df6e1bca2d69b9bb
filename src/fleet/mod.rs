//! `shmlink fleet`: the cluster read through its API from an operator's laptop (read-only):
//! the Node conditions and DeviceTaintRules the agents keep, their Events, and each agent's
//! GPUs and deaths through the API server's proxy, as one report of what is out, since when
//! and why, grouped by NVLink domain.
//!
//! `read.rs` is the only I/O (the API calls, each with its deadline and its own refusal);
//! `report.rs` builds the report (pure), `render.rs` writes it for a person (pure).

mod read;
pub mod render;
pub mod report;

use std::time::{Duration, SystemTime};

use kube::Client;

pub use report::FleetReport;

/// What `shmlink fleet` was asked.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// Where the agents' DaemonSet runs.
    pub namespace: String,
    /// How far back Events and deaths count.
    pub since: Duration,
}

/// Reads the cluster and builds the report.
pub async fn run(client: &Client, settings: &FleetSettings) -> FleetReport {
    let sources = read::read(client, settings).await;
    report::build(sources, SystemTime::now(), settings.since)
}

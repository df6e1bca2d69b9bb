//! Churn: `serve` scanning every 200 ms while containers come and go in batches. After each
//! batch ends its series are gone; at the end the agent's RSS and open descriptors are where
//! they were after warm-up, and its log holds no errors.
//!
//! CI churns 100 containers; `SHMLINK_SOAK_CONTAINERS=2000 cargo test --release --test
//! e2e_containers soak:: -- --nocapture` is the long run.

use crate::common;

use std::time::Instant;

use common::agent::Agent;
use common::{Container, ContainerSpec};

const BATCH: usize = 10;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Where each open descriptor of `pid` points.
fn fd_targets(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// Open descriptors at rest but the cgroup files `serve` keeps open between scans (as many as
/// the machine's cgroups, whoever made them): the least of a few looks, since a scan or a
/// scrape in flight holds some for a moment.
fn open_fds(pid: u32) -> usize {
    (0..10)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(37));
            fd_targets(pid)
                .iter()
                .filter(|t| !t.starts_with("/sys/fs/cgroup"))
                .count()
        })
        .min()
        .unwrap()
}

/// The kept cgroup files of cgroups that are gone: none once a scan found them gone.
fn gone_cgroup_files(pid: u32) -> Vec<std::path::PathBuf> {
    fd_targets(pid)
        .into_iter()
        .filter(|t| t.starts_with("/sys/fs/cgroup") && !t.exists())
        .collect()
}

/// Starts a batch (half in pods, half plain), waits for all of it in /metrics, ends it, waits
/// for all of it to be gone.
fn churn_batch(agent: &Agent) {
    let batch: Vec<Container> = (0..BATCH)
        .map(|i| {
            Container::start(ContainerSpec {
                pod_uid: (i % 2 == 0).then(common::random_pod_uid),
                ..ContainerSpec::default()
            })
        })
        .collect();
    let ids: Vec<String> = batch.iter().map(|c| c.id.clone()).collect();
    agent.wait_for_metrics("the batch", |b| {
        ids.iter().all(|id| b.contains(id.as_str()))
    });
    drop(batch);
    agent.wait_for_metrics("no series of the ended batch", |b| {
        !ids.iter().any(|id| b.contains(id.as_str()))
    });
}

#[test]
fn churned_containers_leave_no_series_and_no_growth() {
    // Its serve scans the whole host: no other test's containers, mounts or segments beside.
    common::host::alone();
    if !common::e2e_available() {
        return;
    }
    let total: usize = std::env::var("SHMLINK_SOAK_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let agent = Agent::start(&["--no-gpu"], &[]);
    agent.wait_ready();
    let pid = agent.pid();
    // Warm-up: caches, the allocator's arenas and the HTTP server reach their working size.
    churn_batch(&agent);
    let (rss_start, fds_start) = (rss_kib(pid), open_fds(pid));

    let started = Instant::now();
    let mut churned = 0;
    while churned < total {
        churn_batch(&agent);
        churned += BATCH;
    }
    let (rss_end, fds_end) = (rss_kib(pid), open_fds(pid));
    let log = agent.log_text();
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("WARN") || l.contains("panicked"))
        .collect();
    eprintln!(
        "SOAK {churned} containers churned in {:.0?}; RSS {rss_start} -> {rss_end} KiB; \
         open fds {fds_start} -> {fds_end}; {} warnings or errors logged",
        started.elapsed(),
        noisy.len()
    );
    assert!(noisy.is_empty(), "{noisy:#?}");
    assert_eq!(fds_end, fds_start, "descriptors leaked");
    // The batch's cgroups are gone and a scan since found them gone: their files are closed.
    // (Other cgroups of the machine may go meanwhile: theirs close by the next scan or two.)
    let closed = common::wait_until(std::time::Duration::from_secs(5), || {
        gone_cgroup_files(pid).is_empty()
    });
    assert!(
        closed,
        "files of gone cgroups kept open: {:?}",
        gone_cgroup_files(pid)
    );
    // Flat, allowing the allocator some slack; a leak per container would show over 100.
    assert!(
        rss_end <= rss_start + 2048,
        "RSS grew from {rss_start} to {rss_end} KiB"
    );
    assert!(agent.terminate().success());
}

//! Workload failures counted per container and kind, and what the failure watcher's sources
//! (container logs, the kernel log) read: [`SourceMetrics`], [`Metrics::record_sources`].

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::model::SourceStats;
use crate::model::{ContainerRef, FindingKind};

use super::shm::container_labels;
use super::{counter, register_counters, set_flag, FlagGauge, Metrics};

/// What the failure watcher's sources (container logs, the kernel log) read.
#[derive(Default)]
pub(super) struct SourceMetrics {
    log_lines: Counter,
    log_bytes: Counter,
    log_lines_dropped: Counter,
    log_bytes_skipped: Counter,
    kmsg_records: Counter,
    kmsg_lost: Counter,
    /// One series, made at the watcher's first report if the kernel log is on.
    kmsg_up: FlagGauge,
}

impl SourceMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = SourceMetrics::default();
        register_counters(
            registry,
            &[
                (
                    "shmlink_log_lines",
                    "Complete lines read from containers' logs",
                    &m.log_lines,
                ),
                (
                    "shmlink_log_bytes",
                    "Bytes read from containers' logs (gzipped files counted decompressed)",
                    &m.log_bytes,
                ),
                (
                    "shmlink_log_lines_dropped",
                    "Log lines holding a failure text dropped by the rate limits (per container, \
                     and per poll across containers)",
                    &m.log_lines_dropped,
                ),
                (
                    "shmlink_log_bytes_skipped",
                    "Bytes of rotated log files let go unread: written faster than read",
                    &m.log_bytes_skipped,
                ),
                (
                    "shmlink_kmsg_records",
                    "Kernel log records read",
                    &m.kmsg_records,
                ),
                (
                    "shmlink_kmsg_records_lost",
                    "Kernel log records overwritten before they were read",
                    &m.kmsg_lost,
                ),
            ],
        );
        registry.register(
            "shmlink_kmsg_up",
            "1 while the kernel log is read, 0 when it could not be opened; absent when off",
            m.kmsg_up.clone(),
        );
        m
    }
}

impl Metrics {
    /// What the failure watcher read since its last report (`None` at its first); counts
    /// are cumulative.
    pub fn record_sources(&self, now: &SourceStats, before: Option<&SourceStats>) {
        let m = &self.sources;
        let was = before.copied().unwrap_or_default();
        let (logs, was_logs) = (&now.logs, &was.logs);
        let counts = [
            (&m.log_lines, logs.lines, was_logs.lines),
            (&m.log_bytes, logs.bytes, was_logs.bytes),
            (
                &m.log_lines_dropped,
                logs.dropped_lines,
                was_logs.dropped_lines,
            ),
            (
                &m.log_bytes_skipped,
                logs.skipped_bytes,
                was_logs.skipped_bytes,
            ),
            (&m.kmsg_records, now.kmsg_records, was.kmsg_records),
            (&m.kmsg_lost, now.kmsg_lost, was.kmsg_lost),
        ];
        for (counter, now, was) in counts {
            counter.inc_by(now.saturating_sub(was));
        }
        self.add_errors("logs", logs.errors.saturating_sub(was_logs.errors));
        if let Some(open) = now.kmsg_open {
            set_flag(&m.kmsg_up, open);
            if before.is_none() {
                self.add_errors("kmsg", u64::from(!open));
            }
        }
    }
}

/// `shmlink_workload_failures_total`: the container's labels and `kind`.
pub(super) fn encode(
    encoder: &mut DescriptorEncoder,
    failure_counts: &[(ContainerRef, FindingKind, u64)],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "shmlink_workload_failures",
        "Failures told by a container's own log or by the kernel about its process",
        None,
        MetricType::Counter,
    )?;
    for (c, kind, count) in failure_counts {
        let labels = (container_labels!(c), [("kind", kind.as_str())]);
        counter(&mut metric, &labels, *count)?;
    }
    Ok(())
}

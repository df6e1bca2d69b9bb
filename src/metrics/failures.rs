//! Workload failures counted per container and kind, and what the failure watcher's sources
//! (container logs, the kernel log) read: [`SourceMetrics`], [`Metrics::record_sources`].

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::model::SourceStats;
use crate::model::{ContainerRef, Failure, FindingKind};

use super::{counter, gauge, register_counters, set_flag, FlagGauge, Metrics};

/// The newest failures `shmlink_workload_failure_last_info` carries: a node's few.
pub const LAST_FAILURES: usize = 10;

/// What the failure watcher's sources (container logs, the kernel log) read.
#[derive(Default)]
pub(super) struct SourceMetrics {
    log_lines: Counter,
    log_bytes: Counter,
    log_lines_dropped: Counter,
    log_bytes_skipped: Counter,
    log_resume_mismatches: Counter,
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
                    "shmlink_log_resume_mismatches",
                    "Log files whose saved position was not trusted after a restart: their \
                     inode now holds another file (read whole when written since, else from \
                     the end)",
                    &m.log_resume_mismatches,
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
            (
                &m.log_resume_mismatches,
                logs.resume_mismatches,
                was_logs.resume_mismatches,
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
        let labels = (labels_of(c), [("kind", kind.as_str())]);
        counter(&mut metric, &labels, *count)?;
    }
    Ok(())
}

/// `shmlink_workload_image_info`: the image of each container a failure was counted for, with
/// the counter's container labels (joined to `shmlink_workload_failures_total` on them: the
/// counter carries no image).
pub(super) fn encode_images(
    encoder: &mut DescriptorEncoder,
    images: &[(ContainerRef, String)],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "shmlink_workload_image_info",
        "The image of each container shmlink_workload_failures_total counts (its Pod's spec, or \
         Docker's record)",
        None,
        MetricType::Gauge,
    )?;
    for (c, image) in images {
        let labels = (labels_of(c), [("image", image.as_str())]);
        gauge(&mut metric, &labels, 1i64)?;
    }
    Ok(())
}

/// `shmlink_workload_failure_last_info`: the newest [`LAST_FAILURES`] failures the agent keeps
/// (newest first; one series per container and kind), each valued by when it happened (Unix
/// seconds), so a dashboard can list what died lately and why. No text of the failure: its
/// message holds the Pod's own words (its log line), and a metric is read beyond the Pod's
/// namespace; the words are on the Pod's Event and in `history`.
pub(super) fn encode_last(encoder: &mut DescriptorEncoder, failures: &[Failure]) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "shmlink_workload_failure_last_info",
        "The newest failures told (at most 10 per agent, one per container and kind), valued by \
         when each happened (Unix time); reason: the Pod's Event reason, where its words are",
        None,
        MetricType::Gauge,
    )?;
    let mut written: Vec<(ContainerRef, FindingKind)> = Vec::new();
    for f in failures.iter().rev().filter(|f| !f.is_workload_word()) {
        if written.len() == LAST_FAILURES {
            break;
        }
        let key = (f.placed.clone(), f.kind);
        if written.contains(&key) {
            continue;
        }
        written.push(key);
        let labels = (
            labels_of(&f.placed),
            [
                ("kind", f.kind.as_str()),
                ("reason", f.kind.event_reason().map_or("", |r| r.as_str())),
            ],
        );
        gauge(&mut metric, &labels, unix_seconds(f.at.time()))?;
    }
    Ok(())
}

/// A failure's container as the scan's series name one (an unknown part empty).
fn labels_of(c: &ContainerRef) -> [(&'static str, &str); 5] {
    [
        ("namespace", c.namespace.as_deref().unwrap_or("")),
        ("pod", c.pod.as_deref().unwrap_or("")),
        ("container", c.container.as_deref().unwrap_or("")),
        ("container_id", c.id_or_empty()),
        ("pod_uid", c.pod_uid.as_deref().unwrap_or("")),
    ]
}

/// Unix seconds; 0 before 1970 (the series still says what died).
fn unix_seconds(at: std::time::SystemTime) -> f64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_millis() as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwapOption;

    use crate::fixtures::failure;
    use crate::model::{FindingKind, Snapshot};

    use super::super::Metrics;
    use super::LAST_FAILURES;

    fn last_info(failures: Vec<crate::model::Failure>) -> Vec<String> {
        let snapshot = Snapshot {
            failures,
            ..Snapshot::default()
        };
        let metrics = Metrics::new(Arc::new(ArcSwapOption::from_pointee(snapshot)));
        let text = metrics.encode().unwrap();
        text.lines()
            .filter(|l| l.starts_with("shmlink_workload_failure_last_info{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_newest_failures_valued_by_their_time_carry_no_text_of_theirs() {
        let mut f = failure(FindingKind::ShmBusError, "ml", "trainer-0", "u0");
        f.placed.container_id = Some("c0".into());
        f.message = "trainer-0 died of SIGBUS: its log said password=hunter2".into();
        f.evidence = "password=hunter2 Bus error".into();
        assert_eq!(
            last_info(vec![f]),
            [
                "shmlink_workload_failure_last_info{namespace=\"ml\",pod=\"trainer-0\",\
                 container=\"trainer\",container_id=\"c0\",pod_uid=\"u0\",kind=\"shm_bus_error\",\
                 reason=\"ShmBusError\"} 1795428902.0"
            ]
        );
    }

    #[test]
    fn at_most_the_newest_ten_one_series_per_container_and_kind() {
        let mut all: Vec<_> = (0..15)
            .map(|i| {
                failure(
                    FindingKind::ShmAllocationFailed,
                    "ml",
                    &format!("p{i}"),
                    "u",
                )
            })
            .collect();
        // The same container and kind again, in other words: one series.
        let mut again = all[14].clone();
        again.message = "another death of the same kind".into();
        all.push(again);
        // PyTorch's word of a worker's death is not a failure of its own.
        let mut word = failure(FindingKind::ShmBusError, "ml", "w", "u");
        word.worker_pids = vec![7];
        all.push(word);
        let got = last_info(all);
        assert_eq!(got.len(), LAST_FAILURES, "{got:#?}");
        assert!(got[0].contains("pod=\"p14\""), "{}", got[0]);
        assert!(got[9].contains("pod=\"p5\""), "{}", got[9]);
        assert!(!got.iter().any(|l| l.contains("pod=\"w\"")));
        assert!(!got.iter().any(|l| l.contains("message=")));
        let before_1970 = std::time::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert_eq!(super::unix_seconds(before_1970), 0.0);
    }
}

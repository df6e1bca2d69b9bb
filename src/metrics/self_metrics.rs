//! The agent's own metrics: scan durations and errors, Kubernetes Events, Node condition writes,
//! the Pod cache, build info and when the last scan finished.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::model::CollectorRun;

use super::{register_counters, set_flag, FlagGauge, Metrics};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CollectorLabels {
    collector: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// The families [`Metrics`] holds, registered in the order they are written.
pub(super) struct SelfMetrics {
    pub(super) scan_duration: Family<CollectorLabels, Histogram>,
    pub(super) scan_errors: Family<CollectorLabels, Counter>,
    pub(super) kube_events: Family<ReasonLabels, Counter>,
    pub(super) kube_events_dropped: Counter,
    pub(super) node_condition_writes: Counter,
    pub(super) node_condition_write_errors: Counter,
    pub(super) kube_pod_cache_synced: FlagGauge,
    pub(super) death_trace_up: FlagGauge,
}

impl SelfMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = SelfMetrics {
            // 0.5 ms .. ~16 s
            scan_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            scan_errors: Family::default(),
            kube_events: Family::default(),
            kube_events_dropped: Counter::default(),
            node_condition_writes: Counter::default(),
            node_condition_write_errors: Counter::default(),
            kube_pod_cache_synced: FlagGauge::default(),
            death_trace_up: FlagGauge::default(),
        };
        registry.register(
            "shmlink_scan_duration_seconds",
            "Time one scan of a collector took",
            m.scan_duration.clone(),
        );
        registry.register(
            "shmlink_scan_errors",
            "Errors met while scanning (unreadable entries; vanished processes are not errors)",
            m.scan_errors.clone(),
        );
        registry.register(
            "shmlink_kube_events",
            "Kubernetes Events published",
            m.kube_events.clone(),
        );
        register_counters(
            registry,
            &[
            (
                "shmlink_kube_events_dropped",
                "Kubernetes Events or series updates dropped (too many waiting, or rejected by the API server)",
                &m.kube_events_dropped,
            ),
            (
                "shmlink_node_condition_writes",
                "Writes of this Node's GPU conditions (and taint) the API server accepted",
                &m.node_condition_writes,
            ),
            (
                "shmlink_node_condition_write_errors",
                "Writes of this Node's GPU conditions (and taint) that failed (retried with backoff)",
                &m.node_condition_write_errors,
            ),
            ],
        );
        registry.register(
            "shmlink_kube_pod_cache_synced",
            "1 once this node's Pod cache has synced (series carry pod names), 0 before; absent without Kubernetes",
            m.kube_pod_cache_synced.clone(),
        );
        registry.register(
            "shmlink_death_trace_up",
            "1 while the kernel's tracepoints tell SIGBUS faults and OOM victims at the moment (serve --death-trace), 0 when off or refused",
            m.death_trace_up.clone(),
        );
        // Both collectors' series exist from the start, so rate() works from the first scrape.
        for collector in ["shm", "gpu"] {
            let _ = m.scan_errors.get_or_create(&CollectorLabels { collector });
        }
        m
    }
}

impl Metrics {
    /// Whether the scan that is about to be exported had this node's Pods.
    pub fn set_pod_cache_synced(&self, synced: bool) {
        set_flag(&self.own.kube_pod_cache_synced, synced);
    }

    /// Whether deaths are traced at the moment (`--death-trace`).
    pub fn set_death_trace_up(&self, up: bool) {
        set_flag(&self.own.death_trace_up, up);
    }

    /// One Event published.
    pub fn count_kube_event(&self, reason: &str) {
        self.own
            .kube_events
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// An error met outside a scan (the kubelet's pod-resources API, say).
    pub fn count_error(&self, collector: &'static str) {
        self.add_errors(collector, 1);
    }

    /// Records how each collector fared in one scan.
    pub fn record_scan(&self, runs: &[CollectorRun]) {
        for run in runs {
            let collector = run.collector.as_str();
            self.own
                .scan_duration
                .get_or_create(&CollectorLabels { collector })
                .observe(run.duration.as_secs_f64());
            self.add_errors(collector, run.errors);
        }
    }

    /// `n` more errors of `collector` (its series made, even for 0).
    pub(super) fn add_errors(&self, collector: &'static str, n: u64) {
        self.own
            .scan_errors
            .get_or_create(&CollectorLabels { collector })
            .inc_by(n);
    }
}

/// `shmlink_build_info`, the one series written before the first scan.
pub(super) fn encode_build_info(encoder: &mut DescriptorEncoder) -> fmt::Result {
    encoder
        .encode_descriptor(
            "shmlink_build_info",
            "shmlink's version",
            None,
            MetricType::Gauge,
        )?
        .encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?
        .encode_gauge(&1i64)
}

/// `shmlink_last_scan_timestamp_seconds`, when the scan says when it finished.
pub(super) fn encode_last_scan(
    encoder: &mut DescriptorEncoder,
    taken_at: Option<std::time::SystemTime>,
) -> fmt::Result {
    let Some(taken) = taken_at else {
        return Ok(());
    };
    let secs = taken
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    encoder
        .encode_descriptor(
            "shmlink_last_scan_timestamp_seconds",
            "When the last complete scan finished (Unix time)",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&secs)
}

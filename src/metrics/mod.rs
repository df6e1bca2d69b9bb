//! `/metrics`: the last snapshot, encoded on each scrape by a custom collector (so series of
//! vanished containers simply stop being written), plus the agent's own counters.
//!
//! Nothing here scans: a scrape only reads the snapshot the scan thread last stored. This file
//! holds the registry, [`Metrics`] and the snapshot collector; each family is defined in the one
//! file of its concern: `shm`, `blind`, `failures`, `gpu`, `links`,
//! `self_metrics`.

mod blind;
mod device_taint;
mod failures;
mod gpu;
pub mod http;
mod nvswitch;
mod self_metrics;
mod shm;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::model::Snapshot;

pub use device_taint::DeviceTaintMetrics;
use failures::SourceMetrics;
use self_metrics::SelfMetrics;

pub use self_metrics::ReasonLabels;

/// The last complete scan, swapped in whole by the scan thread.
pub type SharedSnapshot = Arc<ArcSwapOption<Snapshot>>;

/// The content type of what [`Metrics::encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub struct Metrics {
    registry: Registry,
    /// The agent's own families (scan durations and errors, Events, the Pod cache, ...).
    own: SelfMetrics,
    /// Events dropped: the queue to the API server was full, or the API server rejected them.
    /// This and the two below are handles on `own`'s counters, for the Kubernetes tasks.
    pub kube_events_dropped: Counter,
    /// Node condition (and taint) writes the API server accepted, and those that failed.
    pub node_condition_writes: Counter,
    pub node_condition_write_errors: Counter,
    /// The DeviceTaintRules' series, exported once [`Metrics::register_device_taints`] is called.
    pub device_taints: DeviceTaintMetrics,
    /// The HTTP listener's refusals and sheddings (`server::listen`).
    pub http: http::HttpMetrics,
    sources: SourceMetrics,
}

impl Metrics {
    pub fn new(snapshot: SharedSnapshot) -> Self {
        let mut registry = Registry::default();
        // The registry writes its own families in the order registered, then the collector's.
        let own = SelfMetrics::register(&mut registry);
        registry.register_collector(Box::new(SnapshotCollector { snapshot }));
        let sources = SourceMetrics::register(&mut registry);
        let http = http::HttpMetrics::default();
        http.register(&mut registry);
        Metrics {
            http,
            registry,
            kube_events_dropped: own.kube_events_dropped.clone(),
            node_condition_writes: own.node_condition_writes.clone(),
            node_condition_write_errors: own.node_condition_write_errors.clone(),
            device_taints: DeviceTaintMetrics::default(),
            own,
            sources,
        }
    }

    /// Families owned elsewhere (the state store's), registered before the Metrics is shared.
    pub fn register_more(&mut self, register: impl FnOnce(&mut Registry)) {
        register(&mut self.registry);
    }

    /// Exports the DeviceTaintRules' series (serve --gpu-device-taint on).
    pub fn register_device_taints(&mut self) {
        let handles = self.device_taints.clone();
        handles.register(&mut self.registry);
    }

    /// The OpenMetrics text of everything.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Writes the snapshot's series on each scrape.
#[derive(Debug)]
struct SnapshotCollector {
    snapshot: SharedSnapshot,
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        self_metrics::encode_build_info(&mut encoder)?;
        let guard = self.snapshot.load();
        let Some(snapshot) = guard.as_deref() else {
            return Ok(());
        };
        shm::encode(&mut encoder, &snapshot.shm)?;
        blind::encode(&mut encoder, &snapshot.blind)?;
        failures::encode(&mut encoder, &snapshot.failure_counts)?;
        failures::encode_images(&mut encoder, &snapshot.failure_images)?;
        failures::encode_last(&mut encoder, &snapshot.failures)?;
        gpu::encode(&mut encoder, snapshot)?;
        nvswitch::encode(&mut encoder, &snapshot.sxids)?;
        self_metrics::encode_last_scan(&mut encoder, snapshot.taken_at)
    }
}

/// A gauge with no series until it is first set, then one series with no labels, written
/// `name 1` (a `Family` with an empty label set writes `name{} 1`): "absent when off".
#[derive(Debug, Clone, Default)]
struct FlagGauge {
    value: Arc<AtomicI64>,
    set: Arc<AtomicBool>,
}

impl EncodeMetric for FlagGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        if !self.set.load(Ordering::Relaxed) {
            return Ok(());
        }
        encoder.encode_gauge(&self.value.load(Ordering::Relaxed))
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    /// Unset: not even its HELP and TYPE, as an empty family.
    fn is_empty(&self) -> bool {
        !self.set.load(Ordering::Relaxed)
    }
}

fn set_flag(gauge: &FlagGauge, on: bool) {
    gauge.value.store(i64::from(on), Ordering::Relaxed);
    gauge.set.store(true, Ordering::Relaxed);
}

/// Plain counters, registered in this order.
fn register_counters(registry: &mut Registry, counters: &[(&str, &str, &Counter)]) {
    for (name, help, metric) in counters {
        registry.register(*name, *help, (*metric).clone());
    }
}

/// One counter series of a family the collector writes.
fn counter(metric: &mut MetricEncoder, labels: &impl EncodeLabelSet, value: u64) -> fmt::Result {
    metric
        .encode_family(labels)?
        .encode_counter::<NoLabelSet, _, u64>(&value, None)
}

/// One gauge series of a family the collector writes.
fn gauge(
    metric: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    metric.encode_family(labels)?.encode_gauge(&value)
}

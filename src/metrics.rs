//! `/metrics`: the last snapshot, encoded on each scrape by a custom collector (so series of
//! vanished containers simply stop being written), plus the agent's own counters.
//!
//! Nothing here scans: a scrape only reads the snapshot the scan thread last stored.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::gpu::PairStatus;
use crate::incidents::watch::SourceStats;
use crate::scan::CollectorRun;
use crate::snapshot::{ShmReading, Snapshot};

/// The last complete scan, swapped in whole by the scan thread.
pub type SharedSnapshot = Arc<ArcSwapOption<Snapshot>>;

/// The content type of what [`Metrics::encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CollectorLabels {
    collector: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

pub struct Metrics {
    registry: Registry,
    scan_duration: Family<CollectorLabels, Histogram>,
    scan_errors: Family<CollectorLabels, Counter>,
    pub kube_events: Family<ReasonLabels, Counter>,
    /// Events dropped: the queue to the API server was full, or the API server rejected them.
    pub kube_events_dropped: Counter,
    /// Node condition (and taint) writes the API server accepted, and those that failed.
    pub node_condition_writes: Counter,
    pub node_condition_write_errors: Counter,
    /// 1 once this node's Pod cache has synced, 0 before; absent without Kubernetes.
    kube_pod_cache_synced: Family<Vec<(String, String)>, Gauge>,
    sources: SourceMetrics,
}

/// What the failure watcher's sources (container logs, the kernel log) read.
#[derive(Default)]
struct SourceMetrics {
    log_lines: Counter,
    log_bytes: Counter,
    log_lines_dropped: Counter,
    kmsg_records: Counter,
    kmsg_lost: Counter,
    /// One series, made at the watcher's first report if the kernel log is on.
    kmsg_up: Family<Vec<(String, String)>, Gauge>,
}

impl SourceMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "shmlink_log_lines",
            "Complete lines read from containers' logs",
            self.log_lines.clone(),
        );
        registry.register(
            "shmlink_log_bytes",
            "Bytes read from containers' logs (gzipped files counted decompressed)",
            self.log_bytes.clone(),
        );
        registry.register(
            "shmlink_log_lines_dropped",
            "Log lines holding a failure text dropped by the per-container rate limit",
            self.log_lines_dropped.clone(),
        );
        registry.register(
            "shmlink_kmsg_records",
            "Kernel log records read",
            self.kmsg_records.clone(),
        );
        registry.register(
            "shmlink_kmsg_records_lost",
            "Kernel log records overwritten before they were read",
            self.kmsg_lost.clone(),
        );
        registry.register(
            "shmlink_kmsg_up",
            "1 while the kernel log is read, 0 when it could not be opened; absent when off",
            self.kmsg_up.clone(),
        );
    }
}

impl Metrics {
    pub fn new(snapshot: SharedSnapshot) -> Self {
        let mut registry = Registry::default();
        let scan_duration = Family::<CollectorLabels, Histogram>::new_with_constructor(|| {
            // 0.5 ms .. ~16 s
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let scan_errors = Family::<CollectorLabels, Counter>::default();
        let kube_events = Family::<ReasonLabels, Counter>::default();
        let kube_events_dropped = Counter::default();
        registry.register(
            "shmlink_scan_duration_seconds",
            "Time one scan of a collector took",
            scan_duration.clone(),
        );
        registry.register(
            "shmlink_scan_errors",
            "Errors met while scanning (unreadable entries; vanished processes are not errors)",
            scan_errors.clone(),
        );
        registry.register(
            "shmlink_kube_events",
            "Kubernetes Events published",
            kube_events.clone(),
        );
        registry.register(
            "shmlink_kube_events_dropped",
            "Kubernetes Events dropped (queue full, or rejected by the API server)",
            kube_events_dropped.clone(),
        );
        let node_condition_writes = Counter::default();
        let node_condition_write_errors = Counter::default();
        registry.register(
            "shmlink_node_condition_writes",
            "Writes of this Node's GPU conditions (and taint) the API server accepted",
            node_condition_writes.clone(),
        );
        registry.register(
            "shmlink_node_condition_write_errors",
            "Writes of this Node's GPU conditions (and taint) that failed (retried with backoff)",
            node_condition_write_errors.clone(),
        );
        let kube_pod_cache_synced = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "shmlink_kube_pod_cache_synced",
            "1 once this node's Pod cache has synced (series carry pod names), 0 before; absent without Kubernetes",
            kube_pod_cache_synced.clone(),
        );
        // Both collectors' series exist from the start, so rate() works from the first scrape.
        for collector in ["shm", "gpu"] {
            let _ = scan_errors.get_or_create(&CollectorLabels { collector });
        }
        registry.register_collector(Box::new(SnapshotCollector { snapshot }));
        let sources = SourceMetrics::default();
        sources.register(&mut registry);
        Metrics {
            registry,
            scan_duration,
            scan_errors,
            kube_events,
            kube_events_dropped,
            node_condition_writes,
            node_condition_write_errors,
            kube_pod_cache_synced,
            sources,
        }
    }

    /// What the failure watcher read since its last report (`None` at its first); counts
    /// are cumulative.
    pub fn record_sources(&self, now: &SourceStats, before: Option<&SourceStats>) {
        let m = &self.sources;
        let was = before.copied().unwrap_or_default();
        let (logs, was_logs) = (&now.logs, &was.logs);
        m.log_lines
            .inc_by(logs.lines.saturating_sub(was_logs.lines));
        m.log_bytes
            .inc_by(logs.bytes.saturating_sub(was_logs.bytes));
        m.log_lines_dropped
            .inc_by(logs.dropped_lines.saturating_sub(was_logs.dropped_lines));
        m.kmsg_records
            .inc_by(now.kmsg_records.saturating_sub(was.kmsg_records));
        m.kmsg_lost
            .inc_by(now.kmsg_lost.saturating_sub(was.kmsg_lost));
        let errors = |collector| {
            self.scan_errors
                .get_or_create(&CollectorLabels { collector })
        };
        errors("logs").inc_by(logs.errors.saturating_sub(was_logs.errors));
        if let Some(open) = now.kmsg_open {
            m.kmsg_up.get_or_create(&Vec::new()).set(i64::from(open));
            if before.is_none() {
                errors("kmsg").inc_by(u64::from(!open));
            }
        }
    }

    /// Whether the scan that is about to be exported had this node's Pods.
    pub fn set_pod_cache_synced(&self, synced: bool) {
        self.kube_pod_cache_synced
            .get_or_create(&Vec::new())
            .set(i64::from(synced));
    }

    /// One Event published.
    pub fn count_kube_event(&self, reason: &str) {
        self.kube_events
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// An error met outside a scan (the kubelet's pod-resources API, say).
    pub fn count_error(&self, collector: &'static str) {
        self.scan_errors
            .get_or_create(&CollectorLabels { collector })
            .inc();
    }

    /// Records how each collector fared in one scan.
    pub fn record_scan(&self, runs: &[CollectorRun]) {
        for run in runs {
            let labels = CollectorLabels {
                collector: run.collector.as_str(),
            };
            self.scan_duration
                .get_or_create(&labels)
                .observe(run.duration.as_secs_f64());
            self.scan_errors.get_or_create(&labels).inc_by(run.errors);
        }
    }

    /// The OpenMetrics text of everything.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
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
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut build = encoder.encode_descriptor(
            "shmlink_build_info",
            "shmlink's version",
            None,
            MetricType::Gauge,
        )?;
        build
            .encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?
            .encode_gauge(&1i64)?;

        let guard = self.snapshot.load();
        let Some(snapshot) = guard.as_deref() else {
            return Ok(());
        };
        encode_shm(&mut encoder, &snapshot.shm)?;
        encode_failures(&mut encoder, snapshot)?;
        encode_gpus(&mut encoder, snapshot)?;

        encoder
            .encode_descriptor(
                "shmlink_nvml_up",
                "1 when NVML is loaded and answering",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&i64::from(snapshot.nvml_up))?;
        encoder
            .encode_descriptor(
                "shmlink_gpu_devices",
                "NVIDIA GPUs the driver lists (/proc/driver/nvidia/gpus), whether or not NVML loads",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(snapshot.driver_gpus.len() as i64))?;
        if let Some(taken) = snapshot.taken_at {
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
                .encode_gauge(&secs)?;
        }
        Ok(())
    }
}

type ShmValue = fn(&ShmReading) -> Option<u64>;

const SHM_GAUGES: [(&str, &str, ShmValue); 7] = [
    (
        "shmlink_shm_size_bytes",
        "tmpfs size of the container's /dev/shm (absent when unlimited)",
        |r| r.size_bytes,
    ),
    (
        "shmlink_shm_used_bytes",
        "Bytes used in the container's /dev/shm (statvfs)",
        |r| r.used_bytes,
    ),
    (
        "shmlink_shm_used_peak_bytes",
        "Highest bytes used in the container's /dev/shm since the previous scan",
        |r| r.used_peak_bytes,
    ),
    (
        "shmlink_shm_available_bytes",
        "Bytes that can still be written: min(tmpfs free, memory cgroup headroom)",
        |r| r.available_bytes,
    ),
    (
        "shmlink_shm_memory_limit_bytes",
        "Lowest memory limit of the cgroup the container's tmpfs pages are charged to",
        |r| r.memory_limit_bytes,
    ),
    (
        "shmlink_shm_host_ipc",
        "1 when the container shares the host's IPC namespace",
        |r| Some(u64::from(r.host_ipc)),
    ),
    (
        "shmlink_shm_mounted",
        "1 when the container has a /dev/shm mount (no series when it could not be measured)",
        |r| r.mounted.map(u64::from),
    ),
];

fn encode_shm(
    encoder: &mut DescriptorEncoder,
    readings: &[ShmReading],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in SHM_GAUGES {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for r in readings {
            if let Some(v) = value(r) {
                let labels = shm_labels(r);
                metric.encode_family(&labels)?.encode_gauge(&v)?;
            }
        }
    }
    Ok(())
}

fn shm_labels(r: &ShmReading) -> [(&'static str, &str); 5] {
    [
        ("namespace", r.namespace.as_deref().unwrap_or("")),
        ("pod", r.pod.as_deref().unwrap_or("")),
        ("container", r.container.as_deref().unwrap_or("")),
        ("container_id", r.container_id.as_str()),
        ("pod_uid", r.pod_uid.as_deref().unwrap_or("")),
    ]
}

fn encode_failures(
    encoder: &mut DescriptorEncoder,
    snapshot: &Snapshot,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "shmlink_workload_failures",
        "Failures told by a container's own log or by the kernel about its process",
        None,
        MetricType::Counter,
    )?;
    for (c, kind, count) in &snapshot.failure_counts {
        let labels = [
            ("namespace", c.namespace.as_deref().unwrap_or("")),
            ("pod", c.pod.as_deref().unwrap_or("")),
            ("container", c.container.as_deref().unwrap_or("")),
            ("container_id", c.container_id.as_str()),
            ("pod_uid", c.pod_uid.as_deref().unwrap_or("")),
            ("kind", kind.as_str()),
        ];
        metric
            .encode_family(&labels)?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(count, None)?;
    }
    Ok(())
}

fn encode_gpus(
    encoder: &mut DescriptorEncoder,
    snapshot: &Snapshot,
) -> Result<(), std::fmt::Error> {
    if snapshot.gpus.is_empty() {
        return Ok(());
    }
    let gauge = MetricType::Gauge;
    let counter = MetricType::Counter;
    let mut info =
        encoder.encode_descriptor("shmlink_gpu_info", "GPUs NVML reports", None, gauge)?;
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        let labels = [
            ("gpu", gpu.as_str()),
            ("uuid", &g.uuid),
            ("name", &g.name),
            ("pci_bus_id", &g.pci_bus_id),
        ];
        info.encode_family(&labels)?.encode_gauge(&1i64)?;
    }
    let mut lost = encoder.encode_descriptor(
        "shmlink_gpu_lost",
        "1 when NVML reports the GPU lost (fell off the bus)",
        None,
        gauge,
    )?;
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        lost.encode_family(&[("gpu", gpu.as_str())])?
            .encode_gauge(&i64::from(g.lost))?;
    }
    let mut replays = encoder.encode_descriptor(
        "shmlink_gpu_pcie_replays",
        "PCIe replay counter",
        None,
        counter,
    )?;
    for g in &snapshot.gpus {
        if let Some(n) = g.pcie_replays {
            let gpu = g.index.to_string();
            replays
                .encode_family(&[("gpu", gpu.as_str())])?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&n, None)?;
        }
    }
    let mut up = encoder.encode_descriptor(
        "shmlink_nvlink_up",
        "1 when the NVLink is active",
        None,
        gauge,
    )?;
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        for l in &g.links {
            let (link, peer) = (l.link.to_string(), l.peer.to_string());
            let labels = [("gpu", gpu.as_str()), ("link", &link), ("peer", &peer)];
            up.encode_family(&labels)?
                .encode_gauge(&i64::from(l.active))?;
        }
    }
    let mut errors = encoder.encode_descriptor(
        "shmlink_nvlink_errors",
        "NVLink data-link error counters",
        None,
        counter,
    )?;
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        for l in &g.links {
            let (link, peer) = (l.link.to_string(), l.peer.to_string());
            // The DL counters, and on NVLink5 GPUs their COUNT fields (new `type` values).
            let dl = l.errors.map(|e| {
                [
                    ("replay", e.replay),
                    ("recovery", e.recovery),
                    ("crc_flit", e.crc_flit),
                    ("crc_data", e.crc_data),
                    ("ecc_data", e.ecc_data),
                ]
            });
            let n5 = l.nvlink5.map(|e| {
                [
                    ("recovery_successful", e.recovery_successful),
                    ("recovery_failed", e.recovery_failed),
                    ("recovery_events", e.recovery_events),
                    ("symbol", e.symbol),
                    ("effective", e.effective),
                ]
            });
            for (kind, value) in dl.into_iter().flatten().chain(n5.into_iter().flatten()) {
                let labels = [
                    ("gpu", gpu.as_str()),
                    ("link", &link),
                    ("peer", &peer),
                    ("type", kind),
                ];
                errors
                    .encode_family(&labels)?
                    .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                        &value, None,
                    )?;
            }
        }
    }
    let mut ber = encoder.encode_descriptor(
        "shmlink_nvlink_ber",
        "NVLink5 bit error rate NVML reports for the link",
        None,
        gauge,
    )?;
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        for l in &g.links {
            let Some(e) = l.nvlink5 else { continue };
            let (link, peer) = (l.link.to_string(), l.peer.to_string());
            for (kind, value) in [("effective", e.effective_ber), ("symbol", e.symbol_ber)] {
                let Some(value) = value else { continue };
                let labels = [
                    ("gpu", gpu.as_str()),
                    ("link", &link),
                    ("peer", &peer),
                    ("kind", kind),
                ];
                ber.encode_family(&labels)?.encode_gauge(&value.value())?;
            }
        }
    }
    let mut action = encoder.encode_descriptor(
        "shmlink_gpu_recovery_action",
        "1 for NVML's recovery action for the GPU, when it gives one",
        None,
        gauge,
    )?;
    for g in &snapshot.gpus {
        let Some(a) = g.recovery_action else { continue };
        let gpu = g.index.to_string();
        action
            .encode_family(&[("gpu", gpu.as_str()), ("action", a.as_str())])?
            .encode_gauge(&1i64)?;
    }
    let mut p2p = encoder.encode_descriptor(
        "shmlink_gpu_p2p_ok",
        "1 when NVML reports P2P OK for the capability",
        None,
        gauge,
    )?;
    for pair in &snapshot.gpu_pairs {
        let Some(caps) = pair.p2p else { continue };
        let (a, b) = (pair.gpu.to_string(), pair.peer_gpu.to_string());
        for (capability, status) in caps.iter() {
            let labels = [
                ("gpu", a.as_str()),
                ("peer_gpu", &b),
                ("capability", capability),
            ];
            p2p.encode_family(&labels)?
                .encode_gauge(&i64::from(status == crate::gpu::P2pStatus::Ok))?;
        }
    }
    let mut healthy = encoder.encode_descriptor(
        "shmlink_gpu_pair_healthy",
        "1 when the GPU pair is ok, 0 degraded or down",
        None,
        gauge,
    )?;
    for pair in &snapshot.gpu_pairs {
        let (a, b) = (pair.gpu.to_string(), pair.peer_gpu.to_string());
        healthy
            .encode_family(&[("gpu", a.as_str()), ("peer_gpu", &b)])?
            .encode_gauge(&i64::from(pair.status == PairStatus::Ok))?;
    }
    let mut xids = encoder.encode_descriptor(
        "shmlink_gpu_xid_errors",
        "XID errors since the agent started",
        None,
        counter,
    )?;
    for x in &snapshot.xids {
        let (gpu, xid) = (x.gpu.to_string(), x.xid.to_string());
        xids.encode_family(&[("gpu", gpu.as_str()), ("xid", &xid)])?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&x.count, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

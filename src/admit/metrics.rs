//! `shmlink admit`'s own metrics: its decisions, how long each answer took, the certificate's
//! reloads and expiry. A registry of its own: `admit` is a process apart from `serve`.

use std::fmt;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{Mode, Outcome};
use crate::metrics::http::HttpMetrics;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    mode: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

pub struct AdmissionMetrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    duration: Histogram,
    reloads: Family<ReloadLabels, Counter>,
    handshakes_failed: Counter,
    not_after: Gauge<i64, AtomicI64>,
    /// Both listeners' refusals and sheddings (`crate::server::listen`).
    pub http: HttpMetrics,
}

impl AdmissionMetrics {
    pub fn new() -> Arc<Self> {
        let mut m = AdmissionMetrics {
            decisions: Family::default(),
            // 50 µs .. ~1.6 s: a decision is microseconds; the API server gives up at 3 s.
            duration: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            reloads: Family::default(),
            handshakes_failed: Counter::default(),
            not_after: Gauge::default(),
            http: HttpMetrics::default(),
            registry: Registry::default(),
        };
        let registry = &mut m.registry;
        registry.register(
            "shmlink_admission_decisions",
            "Admission requests answered, by the mode applied and what it came to",
            m.decisions.clone(),
        );
        registry.register(
            "shmlink_admission_duration_seconds",
            "Time from a request's body read to its answer",
            m.duration.clone(),
        );
        registry.register(
            "shmlink_admission_tls_reloads",
            "Certificate and key pairs read again from disk after a change, by result",
            m.reloads.clone(),
        );
        registry.register(
            "shmlink_admission_tls_handshake_failures",
            "TLS handshakes that failed or timed out (a caBundle the API server holds that does \
             not match the served certificate shows here, while failurePolicy Ignore admits \
             every Pod unchecked)",
            m.handshakes_failed.clone(),
        );
        registry.register(
            "shmlink_admission_tls_not_after_timestamp_seconds",
            "The served certificate's notAfter, in seconds since the epoch",
            m.not_after.clone(),
        );
        m.http.register(registry);
        // Both reload results exist from the start: an alert on errors needs a series at 0.
        for result in ["ok", "error"] {
            let _ = m.reloads.get_or_create(&ReloadLabels { result });
        }
        Arc::new(m)
    }

    pub fn decided(&self, mode: Mode, outcome: Outcome, took: Duration) {
        let labels = DecisionLabels {
            mode: mode.as_str(),
            outcome: outcome.as_str(),
        };
        self.decisions.get_or_create(&labels).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// Counts a failed handshake; the count so far.
    pub fn handshake_failed(&self) -> u64 {
        self.handshakes_failed.inc() + 1
    }

    pub fn serving_until(&self, not_after: i64) {
        self.not_after.set(not_after);
    }

    pub fn not_after(&self) -> i64 {
        self.not_after.get()
    }

    /// The OpenMetrics text of everything.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(4 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_reloads_and_expiry_are_written_under_their_contract_names() {
        let m = AdmissionMetrics::new();
        m.decided(Mode::Warn, Outcome::NotPod, Duration::from_micros(120));
        m.decided(Mode::Warn, Outcome::NotPod, Duration::from_micros(80));
        m.decided(Mode::Mutate, Outcome::Error, Duration::from_micros(10));
        m.reloaded(true);
        assert_eq!(m.handshake_failed(), 1);
        m.serving_until(1_936_742_400);
        let text = m.encode().unwrap();
        for line in [
            r#"shmlink_admission_decisions_total{mode="warn",outcome="not_pod"} 2"#,
            r#"shmlink_admission_decisions_total{mode="mutate",outcome="error"} 1"#,
            "shmlink_admission_duration_seconds_count 3",
            r#"shmlink_admission_tls_reloads_total{result="ok"} 1"#,
            r#"shmlink_admission_tls_reloads_total{result="error"} 0"#,
            "shmlink_admission_tls_handshake_failures_total 1",
            "shmlink_admission_tls_not_after_timestamp_seconds 1936742400",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}

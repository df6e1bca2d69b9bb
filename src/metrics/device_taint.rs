//! The agent's DeviceTaintRules (`serve --gpu-device-taint`): registered only when that is on,
//! so a node without it exports no such series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EffectLabels {
    effect: String,
}

/// Handles the device-taint task writes.
#[derive(Debug, Clone, Default)]
pub struct DeviceTaintMetrics {
    in_force: Family<EffectLabels, Gauge>,
    /// API calls for rules and slices that failed (retried).
    pub errors: Counter,
}

impl DeviceTaintMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "shmlink_gpu_device_taints",
            "DeviceTaintRules of this agent in force, by effect (serve --gpu-device-taint)",
            self.in_force.clone(),
        );
        registry.register(
            "shmlink_gpu_device_taint_errors",
            "API calls for this agent's DeviceTaintRules and this node's ResourceSlices that failed (retried with backoff)",
            self.errors.clone(),
        );
        // Every effect's series exists from the start: 0 is an answer, absence is not.
        for effect in ["None", "NoSchedule", "NoExecute"] {
            self.set_in_force(effect, 0);
        }
    }

    pub fn set_in_force(&self, effect: &str, n: i64) {
        self.in_force
            .get_or_create(&EffectLabels {
                effect: effect.to_string(),
            })
            .set(n);
    }
}

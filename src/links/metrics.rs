//! The link trends (`links::trend`): each tracked link counter's growth per hour over the days
//! kept, and since when the steadily growing ones grow. `metrics::gpu` calls it with the
//! snapshot's trends; it writes through prometheus-client alone, so `metrics/` imports it and not
//! the other way round.

use std::fmt;
use std::time::UNIX_EPOCH;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::model::LinkTrend;

/// `shmlink_gpu_nvlink_error_growth_per_hour` (every counter that grew) and
/// `shmlink_gpu_nvlink_errors_growing_since_timestamp_seconds` (only those judged growing).
pub(crate) fn encode(encoder: &mut DescriptorEncoder, trends: &[LinkTrend]) -> fmt::Result {
    let labels = |t: &LinkTrend| {
        [
            ("gpu", t.gpu.to_string()),
            ("link", t.link.to_string()),
            ("counter", t.counter.as_str().to_string()),
        ]
    };
    let mut rate = encoder.encode_descriptor(
        "shmlink_gpu_nvlink_error_growth_per_hour",
        "NVLink error counter growth per hour over the days kept (up to 10), resets not counted",
        None,
        MetricType::Gauge,
    )?;
    for t in trends.iter().filter(|t| t.per_hour > 0.0) {
        rate.encode_family(&labels(t))?.encode_gauge(&t.per_hour)?;
    }
    let mut since = encoder.encode_descriptor(
        "shmlink_gpu_nvlink_errors_growing_since_timestamp_seconds",
        "When an NVLink error counter began growing steadily but slowly (a link wearing out)",
        None,
        MetricType::Gauge,
    )?;
    for t in trends {
        let Some(g) = t.growing else { continue };
        let secs = g
            .since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        since
            .encode_family(&labels(t))?
            .encode_gauge(&i64::try_from(secs).unwrap_or(i64::MAX))?;
    }
    Ok(())
}

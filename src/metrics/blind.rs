//! `shmlink_blind{reason}`: why the last scan could not see everything, one series per reason
//! in force (none when it saw all).

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::model::Blind;

use super::gauge;

pub(super) fn encode(encoder: &mut DescriptorEncoder, blind: &[Blind]) -> fmt::Result {
    if blind.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(
        "shmlink_blind",
        "1 for each reason the last scan could not see every container (no_processes, \
         no_cgroups, containers_unreadable, some_containers_unreadable)",
        None,
        MetricType::Gauge,
    )?;
    for reason in blind {
        gauge(&mut metric, &[("reason", reason.as_str())], 1i64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwapOption;

    use crate::metrics::Metrics;
    use crate::model::{Blind, Snapshot};

    fn encoded(blind: Vec<Blind>) -> String {
        let snapshot = Snapshot {
            blind,
            ..Snapshot::default()
        };
        Metrics::new(Arc::new(ArcSwapOption::from_pointee(snapshot)))
            .encode()
            .unwrap()
    }

    #[test]
    fn one_series_per_reason_in_force_none_without() {
        let text = encoded(vec![Blind::NoProcesses, Blind::NoCgroups]);
        assert!(
            text.contains("shmlink_blind{reason=\"no_processes\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("shmlink_blind{reason=\"no_cgroups\"} 1\n"),
            "{text}"
        );
        assert_eq!(text.matches("shmlink_blind{").count(), 2);
        assert!(!encoded(Vec::new()).contains("shmlink_blind"));
    }
}

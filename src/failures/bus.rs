//! Pure: how a SIGBUS death is judged. `/dev/shm` is named the cause when it was full at the
//! moment's reading or at the scans' (last reading, peak; for a judged line, the scans' around
//! its moment: `RecentReadings::peak_around`); the workload only when /dev/shm was
//! read at the moment (a tracepoint's reading) and was not full; without such a reading the death
//! is `bus_error_unmeasured`: a scan seconds before says nothing of a tmpfs filled since.

use crate::model::{Detected, FailureSource, FindingKind, MemorySource, MemorySplit, ShmReading};

/// The judged kind and the split said with it. `at_moment`: the reading is the one taken the
/// moment the kernel told the death.
pub fn judged(
    d: &Detected,
    reading: Option<&ShmReading>,
    at_moment: bool,
    ratio: f64,
) -> (FindingKind, Option<MemorySplit>) {
    let peak = reading.and_then(|r| r.used_peak_bytes.or(r.used_bytes));
    // Read at the moment, the numbers are the moment's whoever told the death: what `check`
    // knows a stored account by when it merges (`same::with_stored`).
    let memory = MemorySplit {
        limit_bytes: reading.and_then(|r| r.memory_limit_bytes),
        usage_bytes: None,
        shm_bytes: peak,
        anon_bytes: None,
        source: if at_moment {
            MemorySource::Tracepoint
        } else {
            memory_source(d.source)
        },
    };
    let kind = if shm_was_full(reading, ratio) {
        FindingKind::ShmBusError
    } else if at_moment && reading.is_some_and(|r| r.used_bytes.is_some()) {
        FindingKind::WorkloadBusError
    } else {
        FindingKind::BusErrorUnmeasured
    };
    (kind, Some(memory))
}

/// Whether the container's /dev/shm was at `ratio` of its effective limit or more at its last
/// reading or peak.
pub fn shm_was_full(reading: Option<&ShmReading>, ratio: f64) -> bool {
    let Some(r) = reading else {
        return false;
    };
    let Some(peak) = r.used_peak_bytes.or(r.used_bytes) else {
        return false;
    };
    let limit = r
        .used_bytes
        .zip(r.available_bytes)
        .and_then(|(u, a)| u.checked_add(a))
        .or(r.size_bytes);
    limit.is_some_and(|l| l > 0 && peak as f64 >= ratio * l as f64)
}

/// Where a split the source did not give comes from.
pub fn memory_source(source: FailureSource) -> MemorySource {
    match source {
        FailureSource::Docker => MemorySource::Docker,
        FailureSource::MemoryCgroup => MemorySource::MemoryCgroup,
        FailureSource::Kernel => MemorySource::KernelLog,
        FailureSource::Tracepoint => MemorySource::Tracepoint,
        FailureSource::PodStatus | FailureSource::Log => MemorySource::PodStatus,
    }
}

/// How a SIGBUS death ended, SIGBUS said once: `SIGBUS, exit status 135`, `SIGBUS; its log
/// said "..."`. kubelet's reason `Error` says nothing an exit status does not.
pub fn exit_words(d: &Detected) -> String {
    match (&d.exit, d.source) {
        (Some(e), _) => {
            let mut parts = vec!["SIGBUS".to_string()];
            if let Some(c) = e.code {
                parts.push(format!("exit status {c}"));
            }
            if let Some(r) = e
                .reason
                .as_deref()
                .filter(|r| !r.is_empty() && *r != "Error")
            {
                parts.push(format!("reason {r}"));
            }
            parts.join(", ")
        }
        (None, FailureSource::Log) => format!("SIGBUS; its log said \"{}\"", d.evidence),
        (None, FailureSource::Tracepoint) => format!("SIGBUS: {}", d.evidence),
        (None, _) => "SIGBUS".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ContainerRef;
    use std::time::SystemTime;

    const MIB: u64 = 1 << 20;

    fn reading(used: u64) -> ShmReading {
        crate::fixtures::shm_reading("c", 64 * MIB, used)
    }

    #[test]
    fn not_full_is_the_workloads_only_with_a_reading_at_the_moment() {
        let d = Detected::new(
            ContainerRef::default(),
            FindingKind::WorkloadBusError,
            SystemTime::now(),
            FailureSource::PodStatus,
            "",
        );
        let half = reading(32 * MIB);
        let full = reading(63 * MIB);
        let k = |r: Option<&ShmReading>, m: bool| judged(&d, r, m, 0.9).0;
        assert_eq!(k(Some(&full), false), FindingKind::ShmBusError);
        assert_eq!(k(Some(&full), true), FindingKind::ShmBusError);
        assert_eq!(k(Some(&half), true), FindingKind::WorkloadBusError);
        // A scan's reading seconds before says nothing of a tmpfs filled since.
        assert_eq!(k(Some(&half), false), FindingKind::BusErrorUnmeasured);
        assert_eq!(k(None, false), FindingKind::BusErrorUnmeasured);
        // A moment whose /dev/shm could not be read is no reading.
        let mut blind = half.clone();
        blind.used_bytes = None;
        blind.used_peak_bytes = None;
        assert_eq!(k(Some(&blind), true), FindingKind::BusErrorUnmeasured);
    }
}

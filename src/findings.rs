//! Pure decisions: how full is full, and what a person should be told. Shared by `check`,
//! `serve` and (later) `preflight`, so every surface says the same thing.

use crate::snapshot::{Finding, Severity, ShmReading, ShmStatus};
use crate::units::human_bytes;

/// `--shm-warn-ratio` / `--shm-critical-ratio`, validated so that 0 < warn <= critical <= 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    warn: f64,
    critical: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("thresholds must satisfy 0 < warn ({warn}) <= critical ({critical}) <= 1")]
pub struct BadThresholds {
    warn: f64,
    critical: f64,
}

impl Thresholds {
    pub fn new(warn: f64, critical: f64) -> Result<Self, BadThresholds> {
        if warn > 0.0 && warn <= critical && critical <= 1.0 {
            Ok(Thresholds { warn, critical })
        } else {
            Err(BadThresholds { warn, critical })
        }
    }

    pub fn warn(&self) -> f64 {
        self.warn
    }

    pub fn critical(&self) -> f64 {
        self.critical
    }

    pub fn status(&self, reading: &ShmReading) -> ShmStatus {
        match reading.fullness() {
            Some(f) if f >= self.critical => ShmStatus::Critical,
            Some(f) if f >= self.warn => ShmStatus::Warning,
            _ => ShmStatus::Ok,
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            warn: 0.80,
            critical: 0.95,
        }
    }
}

/// Sets each reading's status and returns the findings for those that are not ok.
pub fn evaluate_shm(readings: &mut [ShmReading], thresholds: &Thresholds) -> Vec<Finding> {
    let mut findings = Vec::new();
    for reading in readings.iter_mut() {
        reading.status = thresholds.status(reading);
        if let Some(finding) = shm_finding(reading) {
            findings.push(finding);
        }
    }
    findings
}

fn shm_finding(r: &ShmReading) -> Option<Finding> {
    let (severity, kind) = match r.status {
        ShmStatus::Ok => return None,
        ShmStatus::Warning => (Severity::Warning, "shm_nearly_full"),
        ShmStatus::Critical => (Severity::Critical, "shm_exhausted"),
    };
    let used = r.used_bytes.unwrap_or(0);
    let available = r.available_bytes.unwrap_or(0);
    let limit = used.saturating_add(available);
    let pct = r.fullness().unwrap_or(0.0) * 100.0;
    let memory_bound = match (r.memory_limit_bytes, r.size_bytes) {
        // The memory cgroup's headroom, not the tmpfs, is what runs out first.
        (Some(_), Some(size)) => limit < size,
        (Some(_), None) => true,
        _ => false,
    };
    let mut message = format!(
        "/dev/shm {pct:.0}% full: {} used, {} more can be written",
        human_bytes(used),
        human_bytes(available),
    );
    if let Some(size) = r.size_bytes {
        message.push_str(&format!(" (tmpfs size {}", human_bytes(size)));
        if let Some(mem) = r.memory_limit_bytes {
            message.push_str(&format!(", memory limit {}", human_bytes(mem)));
        }
        message.push(')');
    }
    message.push_str(". ");
    if memory_bound {
        message.push_str(
            "The memory limit, not the tmpfs size, is what runs out: tmpfs pages count against \
             the container's memory limit, so raise the memory limit along with /dev/shm.",
        );
    } else {
        message.push_str(
            "Give it a larger /dev/shm: in Kubernetes an emptyDir with medium: Memory and a \
             sizeLimit mounted at /dev/shm; in Docker --shm-size (or --ipc=host). tmpfs pages \
             count against the memory limit, so leave room for them there too.",
        );
    }
    Some(Finding {
        severity,
        kind,
        subject: r.subject(),
        message,
    })
}

/// The container runtime's default /dev/shm (Docker's and containerd's).
pub const RUNTIME_DEFAULT_SHM: u64 = 64 << 20;

/// A container on the runtime's default 64 MiB tmpfs (not a sized emptyDir, not host IPC).
pub fn on_runtime_default(r: &ShmReading) -> bool {
    r.mounted
        && !r.host_ipc
        && r.fs_type.as_deref() == Some("tmpfs")
        && r.size_bytes == Some(RUNTIME_DEFAULT_SHM)
}

/// `shm_runtime_default`: a GPU workload (the caller knows it asks for GPUs) on the runtime's
/// default 64 MiB /dev/shm, where DataLoader workers and NCCL die once it fills.
pub fn runtime_default_finding(r: &ShmReading) -> Option<Finding> {
    on_runtime_default(r).then(|| Finding {
        severity: Severity::Warning,
        kind: "shm_runtime_default",
        subject: r.subject(),
        message: "requests GPUs but runs on the container runtime's default 64 MiB /dev/shm: \
                  PyTorch DataLoader workers and NCCL die with bus errors once it fills. Mount an \
                  emptyDir with medium: Memory and a sizeLimit (e.g. 8Gi) at /dev/shm, and raise \
                  the memory limit by as much (tmpfs pages count against it)."
            .to_string(),
    })
}


#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn reading(size: Option<u64>, used: Option<u64>, available: Option<u64>) -> ShmReading {
        ShmReading {
            namespace: None,
            pod: None,
            pod_uid: None,
            container: None,
            container_id: "0123456789abcdef0123".into(),
            pid: 1,
            cgroup: "/x".into(),
            host_ipc: false,
            mounted: true,
            fs_type: Some("tmpfs".into()),
            size_bytes: size,
            used_bytes: used,
            available_bytes: available,
            memory_limit_bytes: None,
            memory_shmem_bytes: None,
            status: ShmStatus::Ok,
        }
    }

    #[test]
    fn thresholds_must_be_ordered_and_within_one() {
        assert!(Thresholds::new(0.8, 0.95).is_ok());
        assert!(Thresholds::new(0.9, 0.9).is_ok());
        assert!(Thresholds::new(0.95, 0.8).is_err());
        assert!(Thresholds::new(0.0, 0.5).is_err());
        assert!(Thresholds::new(0.5, 1.5).is_err());
        assert!(Thresholds::new(f64::NAN, 0.9).is_err());
    }

    #[test]
    fn status_follows_the_ratio_against_the_effective_limit() {
        let t = Thresholds::default();
        assert_eq!(
            t.status(&reading(Some(64 * MIB), Some(10 * MIB), Some(54 * MIB))),
            ShmStatus::Ok
        );
        // exactly 80% is a warning
        assert_eq!(
            t.status(&reading(Some(100 * MIB), Some(80 * MIB), Some(20 * MIB))),
            ShmStatus::Warning
        );
        assert_eq!(
            t.status(&reading(Some(100 * MIB), Some(96 * MIB), Some(4 * MIB))),
            ShmStatus::Critical
        );
        // a 1 GiB tmpfs with only 5 MiB of memory headroom left is critical though the tmpfs is 40% used
        assert_eq!(
            t.status(&reading(Some(1024 * MIB), Some(400 * MIB), Some(5 * MIB))),
            ShmStatus::Critical
        );
    }

    #[test]
    fn unknown_numbers_are_ok_not_a_guess() {
        let t = Thresholds::default();
        assert_eq!(t.status(&reading(None, None, Some(MIB))), ShmStatus::Ok);
        assert_eq!(t.status(&reading(Some(0), Some(0), Some(0))), ShmStatus::Ok);
    }

    #[test]
    fn findings_name_the_container_and_the_fix() {
        let mut rs = vec![
            reading(Some(64 * MIB), Some(62 * MIB), Some(2 * MIB)),
            reading(Some(64 * MIB), Some(MIB), Some(63 * MIB)),
        ];
        let findings = evaluate_shm(&mut rs, &Thresholds::default());
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].kind, "shm_exhausted");
        assert_eq!(findings[0].severity, Severity::Critical);
        assert_eq!(findings[0].subject, "container 0123456789ab");
        assert!(
            findings[0].message.contains("62.0 MiB used"),
            "{}",
            findings[0].message
        );
        assert!(findings[0].message.contains("medium: Memory"));
        assert_eq!(rs[0].status, ShmStatus::Critical);
        assert_eq!(rs[1].status, ShmStatus::Ok);
    }

    #[test]
    fn a_memory_bound_finding_says_to_raise_the_memory_limit() {
        let mut r = reading(Some(1024 * MIB), Some(100 * MIB), Some(10 * MIB));
        r.memory_limit_bytes = Some(256 * MIB);
        let findings = evaluate_shm(std::slice::from_mut(&mut r), &Thresholds::default());
        assert_eq!(findings[0].kind, "shm_nearly_full");
        assert!(
            findings[0].message.contains("raise the memory limit"),
            "{}",
            findings[0].message
        );
    }
}

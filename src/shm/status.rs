//! Pure: how full is full for one container's /dev/shm, and which shm findings a scan makes.

use crate::model::{Finding, FindingKind, Subject};
use crate::model::{ShmReading, ShmStatus};
use crate::text;

/// How full a /dev/shm is (of what it can take) for a warning, unless `--shm-warn-ratio` says.
pub const SHM_WARN_RATIO: f64 = 0.80;
/// ... and for a critical finding, unless `--shm-critical-ratio` says.
pub const SHM_CRITICAL_RATIO: f64 = 0.95;

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
            warn: SHM_WARN_RATIO,
            critical: SHM_CRITICAL_RATIO,
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
        if let Some(error) = &reading.error {
            findings.push(Finding::new(
                FindingKind::ShmUnmeasured,
                Subject::container(reading),
                text::shm_unmeasured(reading, error),
            ));
        }
    }
    findings
}

/// Everything a scan finds about /dev/shm: fullness (setting each reading's status) and, where
/// `requests_gpu` says a container's Pod (by UID) asks for GPUs, the runtime's default 64 MiB;
/// None: the Pods are not known.
pub fn shm_findings(
    readings: &mut [ShmReading],
    thresholds: &Thresholds,
    requests_gpu: Option<impl Fn(&str) -> bool>,
) -> Vec<Finding> {
    let uses_gpu = |r: &ShmReading| match (&requests_gpu, r.pod_uid.as_deref()) {
        (Some(requests_gpu), Some(uid)) => requests_gpu(uid),
        _ => false,
    };
    shm_findings_by(readings, thresholds, uses_gpu)
}

/// As [`shm_findings`], with the GPU question asked of each reading: a Pod's container by its
/// Pod, a plain Docker container by Docker's record of it (by container ID).
pub fn shm_findings_by(
    readings: &mut [ShmReading],
    thresholds: &Thresholds,
    uses_gpu: impl Fn(&ShmReading) -> bool,
) -> Vec<Finding> {
    let mut findings = evaluate_shm(readings, thresholds);
    findings.extend(readings.iter().filter_map(leftovers_finding));
    findings.extend(
        readings
            .iter()
            .filter(|r| uses_gpu(r))
            .filter_map(runtime_default_finding),
    );
    findings
}

fn shm_finding(r: &ShmReading) -> Option<Finding> {
    let kind = match r.status {
        ShmStatus::Ok => return None,
        ShmStatus::Warning => FindingKind::ShmNearlyFull,
        ShmStatus::Critical => FindingKind::ShmExhausted,
    };
    Some(Finding::new(kind, Subject::container(r), text::shm_full(r)))
}

/// `shm_leftover_segments`: a young container's /dev/shm held files from before it started.
pub fn leftovers_finding(r: &ShmReading) -> Option<Finding> {
    let l = r.leftovers.as_ref().filter(|l| l.count > 0)?;
    Some(Finding::new(
        FindingKind::ShmLeftoverSegments,
        Subject::container(r),
        text::shm_leftovers(r, l),
    ))
}

/// The container runtime's default /dev/shm (Docker's and containerd's).
pub const RUNTIME_DEFAULT_SHM: u64 = 64 << 20;

/// A container on the runtime's default 64 MiB tmpfs (not a sized emptyDir, not host IPC).
pub fn on_runtime_default(r: &ShmReading) -> bool {
    r.mounted == Some(true)
        && !r.host_ipc
        && r.fs_type.as_deref() == Some("tmpfs")
        && r.size_bytes == Some(RUNTIME_DEFAULT_SHM)
}

/// `shm_runtime_default`: a GPU workload (the caller knows it asks for GPUs) on the runtime's
/// default 64 MiB /dev/shm, where DataLoader workers and NCCL die once it fills.
pub fn runtime_default_finding(r: &ShmReading) -> Option<Finding> {
    on_runtime_default(r).then(|| {
        Finding::new(
            FindingKind::ShmRuntimeDefault,
            Subject::container(r),
            text::shm_runtime_default(r),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::model::{FindingKind, Severity};

    #[test]
    fn an_unmeasured_dev_shm_is_a_warning_finding_not_healthy() {
        let mut r = fixtures::shm_reading("abcdef0123456789", 0, 0);
        r.mounted = None;
        (r.size_bytes, r.used_bytes, r.available_bytes) = (None, None, None);
        r.error = Some("measuring /dev/shm: Permission denied (os error 13)".into());
        let findings = evaluate_shm(std::slice::from_mut(&mut r), &Thresholds::default());
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].kind, FindingKind::ShmUnmeasured);
        assert_eq!(findings[0].severity, Severity::Warning);
        assert!(findings[0].message.contains("Permission denied"));
        assert!(!on_runtime_default(&r));
    }

    const MIB: u64 = 1 << 20;

    fn reading(size: Option<u64>, used: Option<u64>, available: Option<u64>) -> ShmReading {
        ShmReading {
            size_bytes: size,
            used_bytes: used,
            available_bytes: available,
            ..fixtures::shm_reading("0123456789abcdef0123", 0, 0)
        }
    }

    #[test]
    fn a_docker_container_given_gpus_on_the_default_gets_docker_words() {
        let mut default = reading(Some(64 * MIB), Some(0), Some(64 * MIB));
        (default.mounted, default.fs_type) = (Some(true), Some("tmpfs".into()));
        default.pod_uid = None;
        default.container = Some("trainer".into());
        let mut sized = default.clone();
        (sized.container_id, sized.size_bytes) = ("f".repeat(64), Some(1024 * MIB));
        let mut no_gpu = default.clone();
        no_gpu.container_id = "e".repeat(64);
        let gpu_ids = [default.container_id.clone(), sized.container_id.clone()];
        let mut rs = vec![default, sized, no_gpu];
        let findings = shm_findings_by(&mut rs, &Thresholds::default(), |r| {
            gpu_ids.contains(&r.container_id)
        });
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].kind, FindingKind::ShmRuntimeDefault);
        let message = &findings[0].message;
        assert!(message.contains("trainer"), "{message}");
        assert!(message.contains("--shm-size"), "{message}");
        assert!(message.contains("--ipc=host"), "{message}");
        assert!(
            !message.contains("emptyDir"),
            "not Kubernetes YAML: {message}"
        );
        // The Pods not known, a Pod's container is not asked about by shm_findings.
        let findings = shm_findings(&mut rs, &Thresholds::default(), None::<fn(&str) -> bool>);
        assert!(findings.is_empty(), "{findings:?}");
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
        assert_eq!(findings[0].kind, FindingKind::ShmExhausted);
        assert_eq!(findings[0].severity, Severity::Critical);
        assert_eq!(findings[0].subject.to_string(), "container 0123456789ab");
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
        assert_eq!(findings[0].kind, FindingKind::ShmNearlyFull);
        assert!(
            findings[0].message.contains("raise the memory limit"),
            "{}",
            findings[0].message
        );
    }
}

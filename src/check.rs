//! `shmlink check`: one scan of this machine, and the failures told since `--since` through the
//! same pipeline `serve` feeds as things happen (`failures::Pipeline`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;

use crate::cli::KubeMode;
use crate::failures::correlate::finding;
use crate::failures::same::with_stored;
use crate::failures::sources::read_back;
use crate::failures::{Mode, Pipeline, Sources};
use crate::gpu::xid::{saved, HeldAges};
use crate::host::HostError;
use crate::kube::events::GpuHolders;
use crate::kube::exits::deaths;
use crate::kube::pods::{list_once, PodIndex};
use crate::kube::KubeError;
use crate::model::{Failure, Severity, Snapshot};
use crate::scan::{ScanSettings, Scanner};
use crate::state::{self, Filter, Unavailable};

/// Stored failures read at most (the newest).
const STORED_MAX: usize = 10_000;

/// Everything `check` is asked.
#[derive(Debug, Clone)]
pub struct CheckSettings {
    pub scan: ScanSettings,
    pub sources: Sources,
    /// How far back failures are told.
    pub since: Duration,
    /// serve's store, whose failures over the same window are told too (None: not read).
    pub state_dir: Option<PathBuf>,
    /// Whether this node's Pods are listed (names, deaths their statuses record).
    pub kube: KubeMode,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Host(#[from] HostError),
    // Each says its cause once, in its text (it is logged as text too): no source besides.
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("listing this node's pods: {0}")]
    Kube(KubeError),
    #[error("listing this node's pods: {0}")]
    ListPods(kube::Error),
}

/// One scan, with the failures told since `since` as findings too (worst first).
pub fn run(settings: &CheckSettings) -> Result<Snapshot, CheckError> {
    let listed = pods_once(settings.kube, &settings.scan.node)?;
    let pods = listed.as_deref().map(|p| PodIndex::new(p.iter()));
    let proc_root = &settings.scan.host.proc_root;
    let held = (settings.state_dir.as_deref()).and_then(|d| serve_held_xids(d, proc_root));
    let mut scan = settings.scan.clone();
    if let Some(hold) = held.as_ref().and_then(|(_, hold)| *hold) {
        scan.gpu_fault_hold = hold;
    }
    let mut scanner = Scanner::for_check(&scan)?;
    // serve's link counters over the days, judged with this scan's sample as serve would.
    if let Some(dir) = settings.state_dir.as_deref() {
        scanner.resume_link_samples(stored_links(dir));
    }
    // serve's fatal XIDs still within their hold: the same GPU verdicts as serve's.
    if let Some((held, _)) = held {
        scanner.resume_held_xids(held, Instant::now());
    }
    let scanned = Instant::now();
    let mut snapshot = scanner.scan_with(pods.as_ref()).snapshot;
    if let Some(mut ledger) = settings.state_dir.as_deref().and_then(serve_job_links) {
        crate::links::jobs::feed(&mut ledger, &mut snapshot, SystemTime::now(), false);
    }
    let since = SystemTime::now() - settings.since;
    let mut pipeline = Pipeline::new(&settings.sources, Mode::ReadBack { since });
    let kernel_gpus = read_back(&mut pipeline, &settings.sources, since);
    // The kernel log's XIDs since then, counted into the same GPU verdicts serve makes.
    scanner.count_kernel_gpus(&mut snapshot, kernel_gpus, scanned);
    // The deaths the Pods' statuses record, as serve tells them from the watch.
    pipeline.exits(listed.iter().flatten().flat_map(deaths).map(|(_, d)| d));
    pipeline.after_scan(&snapshot, Instant::now());
    let failures = pipeline.tell(Some(&snapshot), pods.as_ref(), &GpuHolders::new());
    // What serve told and check could not read again (a rotated log, a wrapped kernel ring, a
    // Pod gone), once each.
    let failures = match settings.state_dir.as_deref() {
        Some(dir) => with_stored(failures, stored(dir, since)),
        None => failures,
    };
    snapshot.findings.extend(failures.iter().map(finding));
    snapshot
        .findings
        .sort_by_key(|f| std::cmp::Reverse(f.severity));
    snapshot.failures = failures;
    Ok(snapshot)
}

/// The failures serve stored since `since`; none where there is no store (serve never ran
/// here with one) or it cannot be read (said).
fn stored(dir: &Path, since: SystemTime) -> Vec<Failure> {
    let filter = Filter {
        since: Some(since),
        limit: STORED_MAX,
        ..Filter::default()
    };
    serves(dir, "the failures", state::read_failures(dir, &filter)).unwrap_or_default()
}

/// What serve stored in `dir`, as `read` gave it; None where there is no store (serve never ran
/// here with one) or it cannot be read (said, naming `what`).
fn serves<T>(dir: &Path, what: &str, read: Result<T, Unavailable>) -> Option<T> {
    match read {
        Ok(v) => Some(v),
        Err(Unavailable::Dir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            None
        }
        Err(Unavailable::Dir { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            tracing::warn!(
                "{what} serve stored in {} are left out: this user may not read them (run as \
                 root)",
                dir.display()
            );
            None
        }
        Err(e) => {
            tracing::warn!("{e}; {what} serve stored are left out");
            None
        }
    }
}

/// serve's ledger of the containers' NVLinks, so a failure's `gpu_links` says what serve's would
/// (check alone has one sample: no baseline). None without it, said when unreadable.
fn serve_job_links(dir: &Path) -> Option<crate::model::JobLinks> {
    let read = state::read_checkpoint(dir, crate::links::JOB_LINKS_KEY);
    let value = serves(dir, "the NVLink baselines (gpu_links)", read)??;
    serde_json::from_value(value)
        .ok()
        .and_then(crate::model::JobLinks::restore)
}

/// The fatal XIDs serve holds (this boot's) and the hold it holds them for; None without a
/// store, or when unreadable (said).
fn serve_held_xids(dir: &Path, proc_root: &Path) -> Option<(Vec<HeldAges>, Option<Duration>)> {
    let read = state::read_checkpoint(dir, saved::HELD_XIDS_KEY);
    let value = serves(dir, "the fatal XIDs held", read)??;
    let boot_id = crate::state::boot_id(proc_root);
    match saved::restore_xids(&value, &boot_id, SystemTime::now()) {
        Ok(held) => Some((held?, saved::saved_hold(&value))),
        Err(e) => {
            tracing::warn!("the fatal XIDs serve stored do not parse ({e}): left out");
            None
        }
    }
}

/// The link counters serve stored; none where there is no store or it cannot be read (said).
fn stored_links(dir: &Path) -> Vec<crate::model::LinkSample> {
    serves(dir, "the link counters", state::read_link_samples(dir)).unwrap_or_default()
}

/// `check`'s exit status: 2 when the scan was blind to everything (it could not run, in
/// effect: nothing it says is known), 1 for any warning or critical finding or a partly blind
/// scan (some containers went unread: not a clean bill), else 0.
pub fn exit_status(snapshot: &Snapshot) -> u8 {
    if snapshot.blind_totally().next().is_some() {
        return 2;
    }
    match snapshot.worst_severity() {
        Some(Severity::Warning | Severity::Critical) => 1,
        None if !snapshot.blind.is_empty() => 1,
        None => 0,
    }
}

/// This node's Pods for a one-shot `check`: `auto` goes on without them when the API server
/// cannot be had, `on` fails.
fn pods_once(mode: KubeMode, node: &str) -> Result<Option<Vec<Pod>>, CheckError> {
    if mode == KubeMode::Off {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CheckError::Runtime)?;
    let listed = runtime.block_on(async {
        let Some(client) = crate::kube::connect(mode).await.map_err(CheckError::Kube)? else {
            return Ok(None);
        };
        list_once(client, node)
            .await
            .map(Some)
            .map_err(CheckError::ListPods)
    });
    match listed {
        Err(e) if mode == KubeMode::Auto => {
            tracing::warn!("{e}; going on without pod names");
            Ok(None)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Blind, Finding, FindingKind, Subject};

    fn with(blind: Vec<Blind>, finding: bool) -> Snapshot {
        Snapshot {
            blind,
            findings: if finding {
                vec![Finding::new(
                    FindingKind::ShmNearlyFull,
                    Subject::Node,
                    "x".into(),
                )]
            } else {
                Vec::new()
            },
            ..Snapshot::default()
        }
    }

    #[test]
    fn check_takes_up_serves_job_links_from_its_store() {
        use crate::links::JOB_LINKS_KEY;
        use crate::model::{GpuReading, JobLinks, LinkErrors, LinkReading, Peer};
        use crate::state::{Identity, Options, StateMetrics, Store};
        use std::collections::HashSet;
        let sample = |recovery| {
            [GpuReading {
                uuid: "GPU-a".into(),
                links: vec![LinkReading {
                    link: 0,
                    active: true,
                    peer: Peer::Switch,
                    errors: Some(LinkErrors {
                        recovery,
                        ..LinkErrors::default()
                    }),
                    nvlink5: None,
                }],
                ..GpuReading::default()
            }]
        };
        let running: HashSet<String> = ["c1".to_string()].into();
        let mut serves = JobLinks::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        serves.feed(&sample(0), &running, t0, true);
        serves.feed(&sample(3), &running, t0 + Duration::from_secs(10), true);
        let tmp = tempfile::tempdir().unwrap();
        assert!(serve_job_links(tmp.path()).is_none(), "no store: null");
        let me = Identity {
            node: "n".into(),
            boot_id: "b".into(),
        };
        let store = Store::open(
            tmp.path(),
            &me,
            Options::default(),
            &StateMetrics::default(),
        )
        .unwrap();
        store
            .sender()
            .put(JOB_LINKS_KEY, serde_json::to_value(serves.save()).unwrap());
        drop(store);
        let mut back = serve_job_links(tmp.path()).expect("serve's ledger");
        assert_eq!(back.deltas("c1", &[0]), serves.deltas("c1", &[0]));
        // check's own sample adds what grew since, and no baseline of its own.
        let now: HashSet<String> = ["c1".to_string(), "c2".to_string()].into();
        back.feed(&sample(5), &now, t0 + Duration::from_secs(20), false);
        let d = back.deltas("c1", &[0]).unwrap();
        assert_eq!(d.changed[0].delta.recovery, 5);
        assert!(back.deltas("c2", &[0]).is_none());
    }

    #[test]
    fn blind_exits_2_partly_blind_1() {
        assert_eq!(exit_status(&with(vec![], false)), 0);
        assert_eq!(exit_status(&with(vec![], true)), 1);
        assert_eq!(
            exit_status(&with(vec![Blind::SomeContainersUnreadable], false)),
            1
        );
        assert_eq!(
            exit_status(&with(vec![Blind::SomeContainersUnreadable], true)),
            1
        );
        for total in [
            Blind::NoProcesses,
            Blind::NoCgroups,
            Blind::ContainersUnreadable,
        ] {
            assert_eq!(exit_status(&with(vec![total], false)), 2);
            assert_eq!(
                exit_status(&with(vec![total], true)),
                2,
                "blind beats findings"
            );
        }
    }
}

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;

use super::planner::{truncate, NOTE_MAX};
use super::*;
use crate::fixtures;
use crate::gpu::xid::{RecentXids, XID_LASTS};
use crate::kube::pods::PodIndex;
use crate::model::{Finding, FindingKind, Severity, Subject};
use crate::model::{ShmReading, ShmStatus, Snapshot, XidCount};

const UID: &str = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
const HEARTBEAT: Duration = Duration::from_secs(300);

const SHM_NEARLY_FULL: EventReason = EventReason::ShmNearlyFull;
const SHM_EXHAUSTED: EventReason = EventReason::ShmExhausted;
const SHM_RUNTIME_DEFAULT: EventReason = EventReason::ShmRuntimeDefault;
const GPU_LINK_DEGRADED: EventReason = EventReason::GpuLinkDegraded;
const GPU_LINK_DOWN: EventReason = EventReason::GpuLinkDown;
const GPU_LINK_RECOVERED: EventReason = EventReason::GpuLinkRecovered;
const GPU_XID: EventReason = EventReason::GpuXid;

fn pods() -> PodIndex {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "trainer-0", "namespace": "ml", "uid": UID},
        "spec": {"containers": [{"name": "trainer",
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"containerStatuses": [{"name": "trainer", "containerID": "containerd://aaaa",
            "image": "x", "imageID": "", "ready": true, "restartCount": 0}]}
    }))
    .unwrap();
    PodIndex::new([&pod])
}

/// `status` is what the default thresholds make of `used_mib` of a 1 GiB tmpfs.
fn reading(status: ShmStatus, used_mib: u64) -> ShmReading {
    let r = fixtures::in_pod(
        fixtures::shm_reading("aaaa", 1 << 30, used_mib << 20),
        "ml",
        "trainer-0",
        UID,
        "trainer",
    );
    ShmReading { status, ..r }
}

fn gpu_finding(kind: FindingKind, subject: Subject) -> Finding {
    let message = format!("{subject} is unwell");
    Finding {
        severity: Severity::Critical,
        kind,
        subject,
        message,
    }
}

/// The snapshot a scan makes of these readings (statuses and shm findings as the scan sets
/// them), with these GPU findings and eight GPUs.
fn snapshot(shm: Vec<ShmReading>, findings: Vec<Finding>) -> Snapshot {
    let want: Vec<ShmStatus> = shm.iter().map(|r| r.status).collect();
    let mut snap = fixtures::scanned("node-a", shm, Some(&pods()));
    let got: Vec<ShmStatus> = snap.shm.iter().map(|r| r.status).collect();
    assert_eq!(
        got, want,
        "the thresholds judge these readings as the test says"
    );
    snap.gpus = (0..8).map(fixtures::gpu_reading).collect();
    snap.findings.extend(findings);
    snap
}

fn holders() -> GpuHolders {
    GpuHolders::from([("GPU-7".to_string(), vec![("ml".into(), "trainer-0".into())])])
}

fn published(msgs: &[EventMsg]) -> Vec<(EventReason, String, u64)> {
    msgs.iter()
        .filter_map(|m| match m {
            EventMsg::Publish(e) => Some((
                e.reason,
                format!(
                    "{}/{}",
                    e.regarding.kind.as_deref().unwrap_or(""),
                    e.regarding.name.as_deref().unwrap_or("")
                ),
                e.id,
            )),
            EventMsg::Ended(_) => None,
        })
        .collect()
}

fn ended(msgs: &[EventMsg]) -> Vec<u64> {
    msgs.iter()
        .filter_map(|m| match m {
            EventMsg::Ended(id) => Some(*id),
            EventMsg::Publish(_) => None,
        })
        .collect()
}

#[test]
fn a_nearly_full_shm_is_one_event_on_its_pod_until_the_heartbeat() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let pods = pods();
    let t0 = Instant::now();
    let snap = snapshot(vec![reading(ShmStatus::Warning, 900)], vec![]);
    let first = p.plan(&snap, Some(&pods), &holders(), t0);
    let events = published(&first);
    assert_eq!(events.len(), 1, "{first:?}");
    assert_eq!(
        (events[0].0, events[0].1.as_str()),
        (SHM_NEARLY_FULL, "Pod/trainer-0")
    );
    let EventMsg::Publish(spec) = &first[0] else {
        unreachable!()
    };
    assert_eq!(spec.regarding.uid.as_deref(), Some(UID));
    assert_eq!(spec.regarding.namespace.as_deref(), Some("ml"));
    assert!(spec.note.contains("88% full"), "{}", spec.note);
    assert!(spec.note.contains("medium: Memory"), "{}", spec.note);

    // The same condition in the next scans: nothing, until the heartbeat updates its series.
    assert_eq!(
        p.plan(&snap, Some(&pods), &holders(), t0 + Duration::from_secs(5)),
        vec![]
    );
    let beat = p.plan(&snap, Some(&pods), &holders(), t0 + HEARTBEAT);
    assert_eq!(
        published(&beat),
        vec![(SHM_NEARLY_FULL, "Pod/trainer-0".into(), events[0].2)]
    );
}

#[test]
fn a_change_of_level_is_a_new_event_and_ends_the_old_one() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let pods = pods();
    let t0 = Instant::now();
    let warn = p.plan(
        &snapshot(vec![reading(ShmStatus::Warning, 900)], vec![]),
        Some(&pods),
        &holders(),
        t0,
    );
    let crit = p.plan(
        &snapshot(vec![reading(ShmStatus::Critical, 1000)], vec![]),
        Some(&pods),
        &holders(),
        t0 + Duration::from_secs(5),
    );
    let new = published(&crit);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].0, SHM_EXHAUSTED);
    assert_ne!(
        new[0].2,
        published(&warn)[0].2,
        "a new Event, not a series update"
    );
    assert_eq!(ended(&crit), vec![published(&warn)[0].2]);
    let ok = p.plan(
        &snapshot(vec![reading(ShmStatus::Ok, 10)], vec![]),
        Some(&pods),
        &holders(),
        t0 + Duration::from_secs(10),
    );
    assert_eq!(published(&ok), vec![]);
    assert_eq!(ended(&ok), vec![new[0].2]);
}

#[test]
fn no_pod_events_before_the_pod_cache_has_synced() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let msgs = p.plan(
        &snapshot(vec![reading(ShmStatus::Critical, 1000)], vec![]),
        None,
        &holders(),
        Instant::now(),
    );
    assert_eq!(msgs, vec![]);
}

#[test]
fn a_gpu_workload_on_the_runtime_default_shm_is_told_the_yaml() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let mut r = reading(ShmStatus::Ok, 1);
    r.size_bytes = Some(64 << 20);
    r.available_bytes = Some(63 << 20);
    let msgs = p.plan(
        &snapshot(vec![r], vec![]),
        Some(&pods()),
        &holders(),
        Instant::now(),
    );
    let EventMsg::Publish(spec) = &msgs[0] else {
        panic!("{msgs:?}")
    };
    assert_eq!(spec.reason, SHM_RUNTIME_DEFAULT);
    assert!(spec.note.contains("medium: Memory"), "{}", spec.note);
    assert!(spec.note.contains("mountPath: /dev/shm"), "{}", spec.note);
    assert_eq!(msgs.len(), 1);
}

#[test]
fn a_degraded_gpu_is_an_event_on_the_node_and_on_the_pod_holding_it_then_a_recovery() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let pods = pods();
    let t0 = Instant::now();
    let bad = snapshot(
        vec![],
        vec![gpu_finding(FindingKind::GpuPairDegraded, Subject::Gpu(7))],
    );
    let msgs = p.plan(&bad, Some(&pods), &holders(), t0);
    let events = published(&msgs);
    let subjects: Vec<_> = events.iter().map(|e| (e.0, e.1.as_str())).collect();
    assert_eq!(
        subjects,
        vec![
            (GPU_LINK_DEGRADED, "Node/node-a"),
            (GPU_LINK_DEGRADED, "Pod/trainer-0")
        ]
    );
    let healthy = snapshot(vec![], vec![]);
    let after = p.plan(
        &healthy,
        Some(&pods),
        &holders(),
        t0 + Duration::from_secs(5),
    );
    let mut recovered: Vec<_> = published(&after).into_iter().map(|e| (e.0, e.1)).collect();
    recovered.sort();
    assert_eq!(
        recovered,
        vec![
            (GPU_LINK_RECOVERED, "Node/node-a".to_string()),
            (GPU_LINK_RECOVERED, "Pod/trainer-0".to_string())
        ]
    );
    let mut gone = ended(&after);
    gone.retain(|id| events.iter().any(|e| e.2 == *id));
    assert_eq!(gone.len(), 2, "both conditions ended");
}

#[test]
fn degraded_to_down_is_a_new_event_not_a_recovery() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let t0 = Instant::now();
    p.plan(
        &snapshot(
            vec![],
            vec![gpu_finding(FindingKind::GpuPairDegraded, Subject::Gpu(7))],
        ),
        None,
        &holders(),
        t0,
    );
    let msgs = p.plan(
        &snapshot(
            vec![],
            vec![gpu_finding(FindingKind::GpuLinkDown, Subject::Gpu(7))],
        ),
        None,
        &holders(),
        t0 + Duration::from_secs(5),
    );
    let reasons: Vec<_> = published(&msgs).into_iter().map(|e| e.0).collect();
    assert_eq!(reasons, vec![GPU_LINK_DOWN]);
}

#[test]
fn two_gpus_failing_on_one_node_are_two_events() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let msgs = p.plan(
        &snapshot(
            vec![],
            vec![
                gpu_finding(FindingKind::GpuPairDegraded, Subject::Gpu(3)),
                gpu_finding(FindingKind::GpuPairDegraded, Subject::Gpu(7)),
            ],
        ),
        None,
        &GpuHolders::new(),
        Instant::now(),
    );
    let events = published(&msgs);
    assert_eq!(events.len(), 2);
    assert_ne!(events[0].2, events[1].2);
    let names: HashSet<_> = msgs
        .iter()
        .filter_map(|m| match m {
            EventMsg::Publish(e) => Some(e.name.clone()),
            EventMsg::Ended(_) => None,
        })
        .collect();
    assert_eq!(names.len(), 2, "distinct Event names");
}

#[test]
fn an_xid_is_an_event_and_a_repeat_updates_its_series_at_once() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let pods = pods();
    let t0 = Instant::now();
    // The GPU collector's part: which XIDs are findings at `t`.
    let mut recent = RecentXids::default();
    let mut scan = |count: u64, t: Instant| {
        let mut snap = snapshot(vec![], vec![]);
        snap.xids = vec![XidCount::on(7, 79, count)];
        snap.findings = recent.findings(&BTreeMap::from([((7, 79), count)]), t);
        snap
    };
    let first = published(&p.plan(&scan(1, t0), Some(&pods), &holders(), t0));
    assert_eq!(first.len(), 2, "node and pod: {first:?}");
    assert!(first.iter().all(|e| e.0 == GPU_XID));
    let t = t0 + Duration::from_secs(5);
    assert_eq!(p.plan(&scan(1, t), Some(&pods), &holders(), t), vec![]);
    let t = t0 + Duration::from_secs(10);
    let again = published(&p.plan(&scan(2, t), Some(&pods), &holders(), t));
    assert_eq!(
        again.iter().map(|e| e.2).collect::<Vec<_>>(),
        first.iter().map(|e| e.2).collect::<Vec<_>>(),
        "the same Events' series"
    );
    // Quiet for XID_LASTS: the condition ends.
    let t = t0 + XID_LASTS + Duration::from_secs(11);
    let later = p.plan(&scan(2, t), Some(&pods), &holders(), t);
    assert_eq!(published(&later), vec![]);
    assert_eq!(ended(&later).len(), 2);
}

#[test]
fn long_notes_are_cut_to_the_api_limit_on_a_char_boundary() {
    let note = truncate("é".repeat(1000));
    assert!(note.len() <= NOTE_MAX);
    assert!(note.ends_with("..."));
}

#[test]
fn a_pod_failing_the_same_way_on_every_restart_keeps_one_series() {
    use super::planner::FAILURE_LASTS;
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let t0 = Instant::now();
    let shm = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "trainer-0", UID);
    let first = p.plan_failures(std::slice::from_ref(&shm), t0);
    let events = published(&first);
    assert_eq!(
        events
            .iter()
            .map(|e| (e.0, e.1.as_str()))
            .collect::<Vec<_>>(),
        vec![(EventReason::ShmAllocationFailed, "Pod/trainer-0")]
    );
    let EventMsg::Publish(spec) = &first[0] else {
        unreachable!()
    };
    assert_eq!(spec.regarding.uid.as_deref(), Some(UID));
    assert_eq!(spec.note, shm.message);
    // The restart fails the same way: the same Event's series, at once.
    let again =
        published(&p.plan_failures(std::slice::from_ref(&shm), t0 + Duration::from_secs(40)));
    assert_eq!(again[0].2, events[0].2);
    // Another reason on the same Pod is its own Event.
    let crash = fixtures::failure(FindingKind::GpuJobCrashed, "ml", "trainer-0", UID);
    let other = published(&p.plan_failures(&[crash], t0 + Duration::from_secs(41)));
    assert_eq!(other[0].0, EventReason::GpuJobCrashed);
    assert_ne!(other[0].2, events[0].2);
    // Scans in between do not end them; quiet for FAILURE_LASTS does.
    let scan = p.plan(
        &snapshot(vec![], vec![]),
        None,
        &holders(),
        t0 + Duration::from_secs(60),
    );
    assert!(ended(&scan).is_empty(), "{scan:?}");
    let later = p.plan(
        &snapshot(vec![], vec![]),
        None,
        &holders(),
        t0 + Duration::from_secs(41) + FAILURE_LASTS,
    );
    assert_eq!(ended(&later).len(), 2);
    let anew = published(&p.plan_failures(&[shm], t0 + FAILURE_LASTS * 2));
    assert_ne!(anew[0].2, events[0].2, "a new Event after the quiet hour");
}

#[test]
fn a_failure_without_a_pod_is_no_event() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let mut f = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "x", UID);
    f.placed.namespace = None;
    f.placed.pod = None;
    f.placed.pod_uid = None;
    assert_eq!(p.plan_failures(&[f], Instant::now()), vec![]);
}

#[test]
fn open_failure_series_go_on_after_a_restart_and_unconfirmed_ones_are_sent_again() {
    use std::collections::HashMap;
    let t0 = Instant::now();
    let shm = fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "trainer-0", UID);
    let crash = fixtures::failure(FindingKind::GpuJobCrashed, "ml", "trainer-0", UID);
    let mut first = EventPlanner::new("node-a", HEARTBEAT);
    first.plan_failures(&[shm.clone(), shm.clone()], t0);
    first.plan_failures(std::slice::from_ref(&crash), t0);
    // Stored with the failures, read back as JSON.
    let json = serde_json::to_string(&first.open_series()).unwrap();
    let saved: Vec<OpenSeries> = serde_json::from_str(&json).unwrap();
    let counts: Vec<(&str, i32)> = saved.iter().map(|s| (s.reason.as_str(), s.count)).collect();
    assert_eq!(
        counts.iter().copied().collect::<HashMap<_, _>>(),
        HashMap::from([("ShmAllocationFailed", 2), ("GpuJobCrashed", 1)])
    );
    let shm_name = saved
        .iter()
        .find(|s| s.reason == "ShmAllocationFailed")
        .unwrap()
        .name
        .clone();
    let crash_name = saved
        .iter()
        .find(|s| s.reason == "GpuJobCrashed")
        .unwrap()
        .name
        .clone();

    // The API server had confirmed the crash's Event and one of the two shm failures.
    let confirmed = HashMap::from([(shm_name.clone(), 1), (crash_name, 1)]);
    let mut second = EventPlanner::new("node-a", HEARTBEAT);
    let resend = second.resume_failures(saved.clone(), &confirmed, t0, SystemTime::now());
    assert_eq!(resend.len(), 1, "{resend:?}");
    assert_eq!(resend[0].spec.name, shm_name);
    assert_eq!((resend[0].assigned, resend[0].confirmed), (2, 1));
    assert_eq!(resend[0].spec.reason, EventReason::ShmAllocationFailed);
    // A death after the restart on the same Pod and reason: the same Event, counted on.
    let next = second.plan_failures(std::slice::from_ref(&shm), t0 + Duration::from_secs(1));
    let EventMsg::Publish(spec) = &next[0] else {
        unreachable!()
    };
    assert_eq!(spec.name, shm_name);
    assert_eq!(spec.id, resend[0].spec.id);
    let counted = second.open_series();
    assert_eq!(
        counted.iter().find(|s| s.name == shm_name).unwrap().count,
        3
    );

    // Nothing confirmed: every series is sent again whole. Stale series are sent, not resumed.
    let mut third = EventPlanner::new("node-a", HEARTBEAT);
    let later = SystemTime::now() + super::planner::FAILURE_LASTS * 2;
    let resend = third.resume_failures(saved, &HashMap::new(), t0, later);
    assert_eq!(resend.len(), 2);
    assert!(third.open_series().is_empty());
    third.plan_failures(&[shm], t0);
    assert_ne!(third.open_series()[0].name, shm_name, "a new series");
}

#[test]
fn a_link_wearing_out_is_a_warning_on_the_node_and_the_pod_holding_its_gpu() {
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let pods = pods();
    let note = "NVLink errors on GPU 7 grow a little every day: NVLink 14 ...";
    let growing = Finding::new(
        FindingKind::GpuLinkErrorsGrowing,
        Subject::Gpu(7),
        note.into(),
    );
    let msgs = p.plan(
        &snapshot(vec![], vec![growing]),
        Some(&pods),
        &holders(),
        Instant::now(),
    );
    let specs: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            EventMsg::Publish(e) => Some(e),
            EventMsg::Ended(_) => None,
        })
        .collect();
    let who: Vec<_> = specs
        .iter()
        .map(|e| (e.reason.as_str(), e.regarding.kind.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        who,
        vec![
            ("GpuLinkErrorsGrowing", "Node"),
            ("GpuLinkErrorsGrowing", "Pod")
        ]
    );
    for e in specs {
        assert_eq!(e.type_, EventType::Warning);
        assert!(e.note.contains(note), "{}", e.note);
    }
}

/// The planner (scan conditions, their recoveries, failures, resumed series) and the device
/// taints' Node Events take turns: every Event of the run has its own ID and name, each name in
/// the contract's form.
#[test]
fn the_planner_and_the_device_taints_take_ids_and_names_from_one_owner() {
    use std::collections::HashMap;
    let t0 = Instant::now();
    let mut p = EventPlanner::new("node-a", HEARTBEAT);
    let taints = p.ids();
    // One ID is one name (a series update repeats both), and one name one ID.
    let mut by_id: HashMap<u64, String> = HashMap::new();
    let mut by_name: HashMap<String, u64> = HashMap::new();
    let mut record = |msgs: &[EventMsg]| {
        for m in msgs {
            if let EventMsg::Publish(e) = m {
                assert_eq!(by_id.entry(e.id).or_insert_with(|| e.name.clone()), &e.name);
                assert_eq!(*by_name.entry(e.name.clone()).or_insert(e.id), e.id);
            }
        }
    };
    let down = vec![gpu_finding(FindingKind::GpuLinkDown, Subject::Gpu(7))];
    for round in 0..6u64 {
        let now = t0 + Duration::from_secs(round);
        // A link down on even rounds, recovered on odd ones: a new Event each time.
        let findings = if round % 2 == 0 { down.clone() } else { vec![] };
        record(&p.plan(&snapshot(vec![], findings), Some(&pods()), &holders(), now));
        record(&taints.once(
            p.node_ref(),
            EventReason::GpuDeviceTainted,
            EventType::Warning,
            format!("rule {round}"),
        ));
        let uid = format!("uid-{round}");
        let f = fixtures::failure(FindingKind::GpuJobCrashed, "ml", "trainer-0", &uid);
        record(&p.plan_failures(&[f.clone(), f], now));
    }
    record(&taints.once(
        p.node_ref(),
        EventReason::GpuDeviceTaintLifted,
        EventType::Normal,
        "lifted".into(),
    ));
    // A series resumed keeps its stored name and takes a new ID from the same owner.
    let saved = p.open_series();
    let resumed = p.resume_failures(saved, &Default::default(), t0, SystemTime::now());
    assert_eq!(resumed.len(), 6);
    for r in &resumed {
        assert!(!by_id.contains_key(&r.spec.id) && by_name.contains_key(&r.spec.name));
    }
    // 3 downs and 3 recoveries on the Node and the Pod holding GPU 7, 6 failure series (each
    // told twice), 7 taint Events.
    assert_eq!(by_id.len(), 6 * 2 + 6 + 7, "{by_id:?}");
    for name in by_name.keys() {
        let parts: Vec<&str> = name.split('.').collect();
        assert!(
            matches!(parts[..], [_, "shmlink", run, n]
                if u64::from_str_radix(run, 16).is_ok() && u64::from_str_radix(n, 16).is_ok()),
            "{name}"
        );
    }
    assert!(by_name.keys().any(|n| n.starts_with("node-a.shmlink.")));
    assert!(by_name.keys().any(|n| n.starts_with("trainer-0.shmlink.")));

    // From two threads at once (the scan thread and the runtime's task): no ID twice.
    let taken: Vec<u64> = std::thread::scope(|s| {
        let a = s.spawn(|| (0..1000).map(|_| p.ids().id()).collect::<Vec<_>>());
        let b = s.spawn(|| (0..1000).map(|_| taints.id()).collect::<Vec<_>>());
        [a.join().unwrap(), b.join().unwrap()].concat()
    });
    let distinct: HashSet<u64> = taken.iter().copied().collect();
    assert_eq!(distinct.len(), 2000);
    assert!(distinct.iter().all(|id| !by_id.contains_key(id)));
    assert!(resumed.iter().all(|r| !distinct.contains(&r.spec.id)));
}

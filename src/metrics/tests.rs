//! The whole `/metrics` text of a rich fixed snapshot and fixed self metrics against
//! `testdata/encode.txt` (before the first scan: `encode_empty.txt`), so a change to any family's
//! name, HELP, TYPE, labels, order or values shows. Regenerate with
//! `SHMLINK_BLESS=1 cargo test --lib metrics::tests`, then read the diff.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use arc_swap::ArcSwapOption;

use crate::fixtures::{gpu_board, in_pod, shm_reading, MIB};
use crate::model::LogStats;
use crate::model::SourceStats;
use crate::model::{
    Ber, LinkErrors, LinkReading, Nvlink5Errors, P2pCaps, P2pStatus, PairStatus, Peer,
    RecoveryAction,
};
use crate::model::{CollectorName, CollectorRun};
use crate::model::{ContainerRef, FindingKind};
use crate::model::{GpuReading, PairVerdict, ShmReading};
use crate::model::{Snapshot, XidCount};

use super::Metrics;

/// GPU 0 in an NVLink domain on a Blackwell-like platform, with its VBIOS; the others as an
/// older GPU says nothing of them; the node's driver, fabric manager and kernel.
fn set_fleet_keys(s: &mut Snapshot) {
    s.gpus[0].fabric = Some(crate::model::FabricInfo {
        state: crate::model::FabricState::Completed,
        status: "success".into(),
        degraded_bandwidth: Some(false),
        route_unhealthy: Some(false),
        cluster_uuid: Some("7f3c0d5e-0b1a-4c2d-9e8f-001122334455".into()),
        clique_id: Some(32766),
    });
    s.gpus[0].platform = Some(crate::model::PlatformInfo {
        chassis_serial: "1821724000123".into(),
        slot: 9,
        tray: 4,
        host_id: 0,
        module_id: 1,
    });
    s.gpus[0].vbios = Some("97.00.A5.00.01".into());
    s.node_info = crate::model::NodeInfo {
        driver: Some("570.133.20".into()),
        fabric_manager: Some("570.133.20".into()),
        kernel: Some("6.8.0-1017-nvidia".into()),
    };
}

/// Every kind of shm reading (named, unlimited, unmounted, unmeasured, host IPC), failures
/// placed and not, three GPUs (DL counters, NVLink5 counters with and without BERs, lost,
/// recovery actions), pairs ok / degraded / down with and without P2P, XIDs.
fn rich_snapshot() -> Snapshot {
    let mut s = gpu_board(3);
    s.shm = shm_readings();
    set_pcie(&mut s.gpus[1]);
    s.gpu_probes = pair_probes();
    set_gpu_users(&mut s);
    s.failure_counts = failure_counts(&s.shm[0]);
    s.failure_images = vec![(
        crate::model::ContainerRef::of(&s.shm[0]),
        "nvcr.io/nvidia/pytorch:24.05-py3".into(),
    )];
    let mut told =
        crate::fixtures::failure(FindingKind::ShmAllocationFailed, "ml", "trainer-0", "uid-0");
    told.placed.container_id = Some("c0ffee01".into());
    s.failures = vec![told];
    set_links(&mut s.gpus);
    set_fleet_keys(&mut s);
    set_pairs(&mut s.gpu_pairs);
    // GPU 2, lost, fails with both peers: the pair judge's culprit.
    s.gpu_blame = crate::model::Blame {
        suspects: vec![crate::model::Suspect {
            gpu: 2,
            bad_pairs: 2,
            by: crate::model::SuspectBy::FailsWithAll,
            reasons: vec![crate::model::PairReason::new(
                crate::model::ReasonKind::GpuLost,
                crate::model::Weight::Down,
                "GPU 2 is lost".into(),
            )
            .naming(&[2])],
        }],
        node_wide: false,
    };
    s.xids = vec![XidCount::on(1, 79, 1), XidCount::on(0, 48, 3)];
    s.taken_at = Some(UNIX_EPOCH + Duration::from_millis(1_795_000_000_250));
    s.link_trends = link_trends();
    s
}

/// GPU 0's link 1: recoveries growing steadily for five days; its replays grew once.
fn link_trends() -> Vec<crate::model::LinkTrend> {
    use crate::model::{LinkCounter, LinkTrend, Peer, SteadyGrowth};
    let trend = |counter, per_hour, growing| LinkTrend {
        gpu: 0,
        uuid: "GPU-0".into(),
        link: 1,
        peer: Peer::Gpu(1),
        counter,
        per_hour,
        growing,
    };
    let steady = SteadyGrowth {
        since: UNIX_EPOCH + Duration::from_secs(1_794_568_000),
        growth: 12,
        days: 5,
        per_day: 2.4,
    };
    vec![
        trend(LinkCounter::Replay, 0.25, None),
        trend(LinkCounter::Recovery, 0.1, Some(steady)),
    ]
}

/// Named (the trainer's, in a Pod, with a memory limit and a peak), unlimited (host IPC),
/// unmounted, unmeasured (an error).
fn shm_readings() -> Vec<ShmReading> {
    let mut named = in_pod(
        shm_reading("c0ffee01", 64 * MIB, 60 * MIB),
        "ml",
        "trainer-0",
        "uid-0",
        "trainer",
    );
    named.memory_limit_bytes = Some(1 << 30);
    named.used_peak_bytes = Some(63 * MIB);
    let mut unlimited = shm_reading("c0ffee02", 0, 0);
    (unlimited.size_bytes, unlimited.used_bytes) = (None, None);
    unlimited.available_bytes = Some(512 * MIB);
    unlimited.used_peak_bytes = None;
    unlimited.host_ipc = true;
    let mut unmounted = shm_reading("c0ffee03", 0, 0);
    unmounted.mounted = Some(false);
    (unmounted.size_bytes, unmounted.used_bytes) = (None, None);
    (unmounted.available_bytes, unmounted.used_peak_bytes) = (None, None);
    let mut unmeasured = unmounted.clone();
    unmeasured.container_id = "c0ffee04".into();
    unmeasured.mounted = None;
    unmeasured.error = Some("permission denied".into());
    vec![named, unlimited, unmounted, unmeasured]
}

/// A GPU busy on a link trained down, behind a switch port that counts AER errors and
/// redirects P2P.
fn set_pcie(gpu: &mut GpuReading) {
    gpu.pcie_link = Some(crate::model::PcieLink {
        gen: 3,
        max_gen: 5,
        width: 8,
        max_width: 16,
    });
    gpu.pcie_path = vec![
        crate::model::PcieHop {
            bdf: "0000:19:00.0".into(),
            bridge: false,
            aer: Some(crate::model::AerTotals::default()),
            acs: crate::model::AcsState::Unknown,
            link_width: None,
        },
        crate::model::PcieHop {
            bdf: "0000:18:08.0".into(),
            bridge: true,
            aer: Some(crate::model::AerTotals {
                correctable: 12,
                nonfatal: 1,
                fatal: 0,
            }),
            acs: crate::model::AcsState::Control(0x001d),
            link_width: None,
        },
    ];
}

/// The pair probe: 0 -> 1 fine, 1 -> 0 corrupted.
fn pair_probes() -> Vec<crate::model::PairProbe> {
    let probe = |from, to, ok: bool| crate::model::PairProbe {
        from_gpu: from,
        to_gpu: to,
        status: if ok {
            crate::model::ProbeStatus::Ok
        } else {
            crate::model::ProbeStatus::Failed
        },
        peer_access: true,
        verified: ok,
        gbps: Some(if ok { 312.5 } else { 300.0 }),
        expected_gbps: Some(450.0),
        reason: None,
    };
    vec![probe(0, 1, true), probe(1, 0, false)]
}

/// The trainer's processes on GPUs 0 and 2; a container the scan did not measure on GPU 1.
fn set_gpu_users(s: &mut Snapshot) {
    let at = std::time::SystemTime::UNIX_EPOCH;
    for (pid, gpus, container_id) in [(10, [0, 2], "c0ffee01"), (11, [1, 1], "c0ffee99")] {
        s.gpu_users.seen(pid, None, None, gpus.into(), at, || {
            Some(ContainerRef::by_id(container_id, None))
        });
    }
}

/// Two kinds of failure of the `named` container, and one placed nowhere.
fn failure_counts(named: &ShmReading) -> Vec<(ContainerRef, FindingKind, u64)> {
    vec![
        (ContainerRef::of(named), FindingKind::ShmAllocationFailed, 2),
        (ContainerRef::of(named), FindingKind::NcclP2pDisabled, 1),
        (ContainerRef::default(), FindingKind::GpuJobCrashed, 1),
    ]
}

/// GPU 0: DL counters, NVLink5 counters with BERs, an inactive link; GPU 1: NVLink5 counters
/// with and without a BER, PCIe replays; GPU 2 lost. Their recovery actions.
fn set_links(gpus: &mut [GpuReading]) {
    let dl = LinkErrors {
        replay: 1,
        recovery: 2,
        crc_flit: 3,
        crc_data: 4,
        ecc_data: 5,
    };
    let n5 = Nvlink5Errors {
        recovery_successful: 6,
        recovery_failed: 7,
        recovery_events: 8,
        symbol: 9,
        effective: 10,
        effective_ber: Some(Ber {
            mantissa: 3,
            exponent: 12,
        }),
        symbol_ber: Some(Ber {
            mantissa: 15,
            exponent: 255,
        }),
    };
    let link = |link, active, peer, errors, nvlink5| LinkReading {
        link,
        active,
        peer,
        errors,
        nvlink5,
    };
    gpus[0].links = vec![
        link(0, true, Peer::Gpu(1), Some(dl), None),
        link(1, false, Peer::Switch, None, None),
        link(
            2,
            true,
            Peer::Pci("0000:99:00.0".into()),
            Some(dl),
            Some(n5),
        ),
    ];
    gpus[0].recovery_action = Some(RecoveryAction::None);
    let no_ber = Nvlink5Errors {
        effective_ber: None,
        ..n5
    };
    gpus[1].links = vec![
        link(0, true, Peer::Gpu(0), None, Some(n5)),
        link(1, true, Peer::Unknown, None, Some(no_ber)),
    ];
    gpus[1].recovery_action = Some(RecoveryAction::DrainP2p);
    gpus[1].pcie_replays = Some(17);
    gpus[2].lost = true;
    gpus[2].pcie_replays = None;
}

/// Pair 0 ok with P2P, pair 1 degraded with partial P2P, pair 2 down.
fn set_pairs(pairs: &mut [PairVerdict]) {
    let ok = P2pStatus::Ok;
    pairs[0].p2p = Some(P2pCaps {
        read: ok,
        write: ok,
        nvlink: ok,
        atomics: P2pStatus::NotSupported,
    });
    pairs[1].status = PairStatus::Degraded;
    pairs[1].p2p = Some(P2pCaps {
        read: P2pStatus::ChipsetNotSupported,
        write: ok,
        nvlink: P2pStatus::Unknown,
        atomics: ok,
    });
    pairs[2].status = PairStatus::Down;
}

/// Self metrics with one value each, as a running agent would have them.
fn record_self_metrics(m: &Metrics) {
    let run = |collector, millis, errors| CollectorRun {
        collector,
        duration: Duration::from_millis(millis),
        errors,
    };
    m.record_scan(&[
        run(CollectorName::Shm, 3, 0),
        run(CollectorName::Gpu, 40, 2),
    ]);
    m.record_scan(&[run(CollectorName::Shm, 1, 1)]);
    m.count_error("pod_resources");
    m.count_kube_event("ShmNearlyFull");
    m.count_kube_event("ShmNearlyFull");
    m.count_kube_event("GpuLinkDown");
    m.kube_events_dropped.inc();
    m.node_condition_writes.inc_by(4);
    m.node_condition_write_errors.inc();
    m.set_pod_cache_synced(true);
    m.set_death_trace_up(true);
    let first = SourceStats {
        logs: LogStats {
            files: 2,
            bytes: 1000,
            lines: 10,
            dropped_lines: 1,
            skipped_bytes: 4096,
            errors: 1,
            resume_mismatches: 1,
        },
        kmsg_open: Some(false),
        kmsg_records: 5,
        kmsg_lost: 0,
    };
    let second = SourceStats {
        logs: LogStats {
            bytes: 1500,
            lines: 16,
            errors: 2,
            ..first.logs
        },
        kmsg_records: 9,
        kmsg_lost: 2,
        ..first
    };
    m.record_sources(&first, None);
    m.record_sources(&second, Some(&first));
}

/// The version made a placeholder, and the series of the self metrics' label families (kept in
/// a HashMap by prometheus-client, so in no fixed order) put in label order, each series' own
/// lines (a histogram's sum, count, buckets) left as written.
fn normalized(text: &str) -> String {
    const UNORDERED: [&str; 3] = [
        "shmlink_scan_duration_seconds",
        "shmlink_scan_errors",
        "shmlink_kube_events",
    ];
    // A line's labels without `le`: the same for every line of one series.
    fn series(line: &str) -> String {
        let labels = line.split_once('{').map_or("", |(_, rest)| rest);
        let labels = labels.split_once('}').map_or("", |(inner, _)| inner);
        let labels = labels.split(',').filter(|l| !l.starts_with("le="));
        labels.collect::<Vec<_>>().join(",")
    }
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    let text = text.replace(&version, "version=\"VERSION\"");
    let mut out: Vec<&str> = Vec::new();
    let mut block: Vec<&str> = Vec::new();
    let mut sorting = false;
    for line in text.lines() {
        if line.starts_with('#') {
            block.sort_by_key(|l| series(l));
            out.append(&mut block);
            sorting = line
                .strip_prefix("# TYPE ")
                .and_then(|rest| rest.split(' ').next())
                .is_some_and(|name| UNORDERED.contains(&name));
            out.push(line);
        } else if sorting {
            block.push(line);
        } else {
            out.push(line);
        }
    }
    block.sort_by_key(|l| series(l));
    out.append(&mut block);
    out.join("\n") + "\n"
}

/// `got` against the checked-in `testdata/<file>`; with SHMLINK_BLESS set, `got` is written there.
fn assert_text(file: &str, expected: &str, got: &str) {
    // Issue 37: a series without labels is `name 1`, never `name{} 1`.
    assert!(!got.contains("{}"), "a series with empty braces:\n{got}");
    if std::env::var_os("SHMLINK_BLESS").is_some() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics/testdata");
        std::fs::write(format!("{dir}/{file}"), got).unwrap();
        return;
    }
    assert_eq!(
        got, expected,
        "the /metrics text differs from testdata/{file}"
    );
}

#[test]
fn encode_is_the_checked_in_text() {
    let metrics = Metrics::new(Arc::new(ArcSwapOption::from_pointee(rich_snapshot())));
    record_self_metrics(&metrics);
    let got = normalized(&metrics.encode().unwrap());
    assert_text("encode.txt", include_str!("testdata/encode.txt"), &got);
}

/// Before the first scan: build info, the two collectors' error counters at 0, and the
/// counters that exist from the start.
#[test]
fn before_the_first_scan() {
    let metrics = Metrics::new(Arc::new(ArcSwapOption::empty()));
    let got = normalized(&metrics.encode().unwrap());
    assert_text(
        "encode_empty.txt",
        include_str!("testdata/encode_empty.txt"),
        &got,
    );
}

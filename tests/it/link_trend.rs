//! Links that fail slowly, played over a week with a clock the test controls: an 8-GPU NVSwitch
//! board (18 links a GPU) sampled every hour into a real state store, one link's recovery
//! counter growing three times a day from the third day, another link with one burst. The store
//! is closed and opened again half way (a restart); at the end serve's keeper and check's
//! (the store read read-only, its one sample appended) must both find that link and only it.
//! The last test runs the real `serve` and `check` on six days of rows a controlled clock wrote
//! (serve's own clock is the machine's: the days are dated back from now instead).

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use rusqlite::{Connection, OpenFlags};
use shmlink::links::trend::{TrendKeeper, TrendRules};
use shmlink::metrics::Metrics;
use shmlink::model::{
    FindingKind, GpuReading, LinkCounter, LinkErrors, LinkReading, Peer, Snapshot, Subject,
};
use shmlink::state::{self, Identity, Options, StateMetrics, Store};

const H: i64 = 3600 * 1000;
const D: i64 = 24 * H;
/// The first sample: 2026-09-03T00:00:00Z.
const T0: i64 = 1_788_393_600_000;
const HOURS: i64 = 7 * 24;
const GPUS: u32 = 8;
const LINKS: u32 = 18;
/// The wearing link: GPU 3's link 14, recoveries at 03:00, 11:00 and 19:00 from day 2 on.
const BAD: (u32, u32) = (3, 14);
const BAD_FROM_DAY: i64 = 2;

fn recoveries_by(h: i64) -> u64 {
    (BAD_FROM_DAY * 24..=h)
        .filter(|x| [3, 11, 19].contains(&(x % 24)))
        .count() as u64
}

/// The board at hour `h`: flat counters everywhere (some never zero), the wearing link, and
/// GPU 5's link 2 with 40 replays in one burst at hour 30.
fn board(h: i64) -> Vec<GpuReading> {
    (0..GPUS)
        .map(|g| GpuReading {
            index: g,
            uuid: format!("GPU-{g:08x}-trend"),
            name: "NVIDIA B200".into(),
            links: (0..LINKS)
                .map(|l| {
                    let mut e = LinkErrors {
                        crc_flit: u64::from(g + l) % 3 * 7,
                        ..LinkErrors::default()
                    };
                    if (g, l) == BAD {
                        e.recovery = 505 + recoveries_by(h);
                    }
                    if (g, l) == (5, 2) && h >= 30 {
                        e.replay = 40;
                    }
                    LinkReading {
                        link: l,
                        active: true,
                        peer: Peer::Switch,
                        errors: Some(e),
                        nvlink5: None,
                    }
                })
                .collect(),
            ..GpuReading::default()
        })
        .collect()
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms as u64)
}

fn identity() -> Identity {
    Identity {
        node: "node-a".into(),
        boot_id: "boot-1".into(),
    }
}

fn open(dir: &Path, clock: &Arc<AtomicI64>) -> Store {
    let clock = clock.clone();
    let options = Options {
        clock: Arc::new(move || at(clock.load(Ordering::SeqCst))),
        ..Options::default()
    };
    Store::open(dir, &identity(), options, &StateMetrics::default()).unwrap()
}

fn rows(dir: &Path) -> i64 {
    let c =
        Connection::open_with_flags(dir.join("state.sqlite3"), OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    c.query_row("SELECT count(*) FROM link_counters", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_week_of_hourly_counters_finds_the_link_wearing_out_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let clock = Arc::new(AtomicI64::new(T0));
    let mut store = open(dir, &clock);
    let mut keeper = TrendKeeper::new(TrendRules::default());
    let mut last = Default::default();
    for h in 0..=HOURS {
        if h == HOURS / 2 {
            // A restart: the keeper and the store go, the rows come back from the file.
            assert!(store.flush(Duration::from_secs(10)));
            drop(store);
            store = open(dir, &clock);
            keeper = TrendKeeper::new(TrendRules::default());
            keeper.resume(store.take_link_samples());
            // In memory only the ends of flat runs: 142 flat links, the burst's link (two
            // runs) and the wearing link (six runs, the last one sample) of 12,096 rows.
            assert_eq!(keeper.len(), 142 * 2 + 2 * 2 + (5 * 2 + 1));
        }
        // Four scans an hour; one row per link per hour is kept.
        for quarter in 0..4 {
            let now = T0 + h * H + quarter * 15 * 60 * 1000;
            if h == HOURS && quarter > 0 {
                break;
            }
            clock.store(now, Ordering::SeqCst);
            let observed = keeper.observe(&board(h), at(now));
            store.sender().link_samples(observed.to_store.clone());
            last = observed;
        }
    }
    assert!(store.flush(Duration::from_secs(10)));
    let now = T0 + HOURS * H;

    // serve's judgement: one finding, GPU 3, naming link 14, its peer, the counter, the rate
    // and since the first recovery of day 2.
    assert_eq!(last.findings.len(), 1, "{:#?}", last.findings);
    let f = &last.findings[0];
    eprintln!("finding: {}", f.message);
    assert_eq!(f.kind, FindingKind::GpuLinkErrorsGrowing);
    assert_eq!(f.subject, Subject::Gpu(3));
    let since = humantime::format_rfc3339_seconds(at(T0 + BAD_FROM_DAY * D + 3 * H));
    assert_eq!(since.to_string(), "2026-09-05T03:00:00Z");
    assert!(
        f.message.contains(&format!(
            "NVLink 14 (to the NVSwitch) recovery grew by 15 on 5 days since {since} (3.1 a day"
        )),
        "{}",
        f.message
    );
    let growing: Vec<_> = last.trends.iter().filter(|t| t.growing.is_some()).collect();
    assert_eq!(growing.len(), 1, "only the wearing link: {growing:#?}");
    let t = growing[0];
    assert_eq!((t.gpu, t.link, t.counter), (3, 14, LinkCounter::Recovery));
    let g = t.growing.unwrap();
    assert_eq!((g.growth, g.days, g.since), (15, 5, at(T0 + 2 * D + 3 * H)));
    assert!((t.per_hour - 15.0 / HOURS as f64).abs() < 1e-9);
    // The burst has a rate but is no finding; flat links have no trend at all.
    let others: Vec<_> = last
        .trends
        .iter()
        .map(|t| (t.gpu, t.link, t.counter))
        .collect();
    assert_eq!(
        others,
        vec![(3, 14, LinkCounter::Recovery), (5, 2, LinkCounter::Replay)]
    );

    // check's judgement: the store read-only, this scan's sample appended: the same finding.
    let stored = state::read_link_samples(dir).unwrap();
    assert_eq!(stored.len(), (GPUS * LINKS) as usize * (HOURS + 1) as usize);
    let mut check = TrendKeeper::new(TrendRules::default());
    check.resume(stored);
    let checked = check.observe(&board(HOURS), at(now + 60_000));
    assert_eq!(checked.findings, last.findings);

    // What a scrape says of it.
    let snapshot = Snapshot {
        gpus: board(HOURS),
        link_trends: last.trends.clone(),
        ..Snapshot::default()
    };
    let text = Metrics::new(Arc::new(ArcSwapOption::from_pointee(snapshot)))
        .encode()
        .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("shmlink_gpu_nvlink_error"))
        .collect();
    eprintln!("{}", lines.join("\n"));
    let since_s = (T0 + 2 * D + 3 * H) / 1000;
    assert!(lines.contains(&&*format!(
        "shmlink_gpu_nvlink_errors_growing_since_timestamp_seconds{{gpu=\"3\",link=\"14\",counter=\"recovery\"}} {since_s}"
    )));
    assert_eq!(lines.len(), 3, "two rates and one since: {lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with(
        "shmlink_gpu_nvlink_error_growth_per_hour{gpu=\"5\",link=\"2\",counter=\"replay\"}"
    )));

    // One row per link per hour: 24 a day; the file's size after the week.
    let per_link_day = rows(dir) as f64 / f64::from(GPUS * LINKS) / 7.0;
    assert!((per_link_day - 24.0).abs() < 0.2, "{per_link_day}");
    drop(store);
    let bytes = std::fs::metadata(dir.join("state.sqlite3")).unwrap().len();
    eprintln!(
        "rows: {} ({per_link_day:.2} per link per day), store file after a week: {bytes} bytes",
        rows(dir)
    );
    assert!(bytes < 8 << 20, "{bytes}");

    // Twelve days after the first sample the first two days are past the 10 kept.
    clock.store(T0 + 12 * D, Ordering::SeqCst);
    let store = open(dir, &clock);
    assert!(store.flush(Duration::from_secs(10)));
    drop(store);
    assert_eq!(
        rows(dir),
        i64::from(GPUS * LINKS) * (HOURS + 1 - 2 * 24),
        "rows older than 10 days pruned"
    );
}

#[test]
fn a_store_of_before_the_link_table_gets_it_and_keeps_its_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let clock = Arc::new(AtomicI64::new(T0));
    drop(open(dir, &clock));
    // As an older binary made it: no link table.
    let c = Connection::open(dir.join("state.sqlite3")).unwrap();
    c.execute_batch("DROP TABLE link_counters").unwrap();
    drop(c);
    assert!(state::read_link_samples(dir).unwrap().is_empty());
    let store = open(dir, &clock);
    let mut keeper = TrendKeeper::new(TrendRules::default());
    store
        .sender()
        .link_samples(keeper.observe(&board(0), at(T0)).to_store);
    assert!(store.flush(Duration::from_secs(10)));
    drop(store);
    assert_eq!(rows(dir), i64::from(GPUS * LINKS));
    let c = Connection::open(dir.join("state.sqlite3")).unwrap();
    let version: i64 = c
        .query_row("SELECT schema_version FROM meta", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1);
}

/// The preset's GPU 3, link 14: six days of hourly rows with its recoveries growing three a
/// day, dated back from now, then the real `serve` (the fake NVML one more recovery on) and
/// `check` judge them with their own live sample.
#[test]
fn serve_and_check_find_the_stored_days_with_their_live_sample() {
    use common::agent::{sample, Agent};
    use common::fake_nvml::{self, FakeNvml};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut config = fake_nvml::preset("nvswitch-8");
    let uuids: Vec<String> = config["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    let seeded = common::link_days::seed(dir, "node-trend", &uuids, 18, BAD.0, BAD.1);
    let stored_rows = rows(dir);
    assert_eq!(stored_rows, seeded.rows);
    assert_eq!(stored_rows, 8 * 18 * (6 * 24 + 1));
    config["gpus"][3]["links"][14]["errors"]["recovery"] = serde_json::json!(seeded.last_count + 1);
    let fake = FakeNvml::new(&config);
    let since_s = seeded.since_s;
    let dir_s = dir.to_str().unwrap();

    let agent = Agent::start_gpu(&fake, &["--state-dir", dir_s, "--node-name", "node-trend"]);
    let labels = [("gpu", "3"), ("link", "14"), ("counter", "recovery")];
    let since = |b: &str| {
        sample(
            b,
            "shmlink_gpu_nvlink_errors_growing_since_timestamp_seconds",
            &labels,
        )
    };
    let body = agent.wait_for_metrics("the growing link's since", |b| since(b).is_some());
    assert_eq!(since(&body), Some(since_s as f64));
    let rate = sample(&body, "shmlink_gpu_nvlink_error_growth_per_hour", &labels).unwrap();
    assert!(rate > 0.1 && rate < 0.2, "16 over 6 days: {rate}");
    let growing = body
        .lines()
        .filter(|l| l.starts_with("shmlink_gpu_nvlink_errors_growing_since"))
        .count();
    assert_eq!(growing, 1, "{body}");
    // Two more recoveries while serve runs (the fake NVML's config rewritten): the next scan's
    // sample is judged with the days at once, the rate rises and the since stays.
    config["gpus"][3]["links"][14]["errors"]["recovery"] = serde_json::json!(seeded.last_count + 3);
    fake.write(&config);
    let body = agent.wait_for_metrics("the rate after two more recoveries", |b| {
        sample(b, "shmlink_gpu_nvlink_error_growth_per_hour", &labels).is_some_and(|r| r > rate)
    });
    let faster = sample(&body, "shmlink_gpu_nvlink_error_growth_per_hour", &labels).unwrap();
    assert!(
        (faster / rate - 18.0 / 16.0).abs() < 0.01,
        "{rate} -> {faster}"
    );
    assert_eq!(since(&body), Some(since_s as f64));
    assert!(
        common::wait_until(Duration::from_secs(10), || agent
            .log_text()
            .contains("finding began: NVLink errors on GPU 3 grow a little every day")),
        "{}",
        agent.log_text()
    );
    assert!(agent.terminate().success());
    assert_eq!(
        rows(dir),
        stored_rows + 8 * 18,
        "serve stored its first sample (the last row was over an hour old) and no more"
    );

    let report = fake.check_json(&[
        "--state-dir",
        dir_s,
        "--node-name",
        "node-trend",
        "--kmsg",
        "off",
        "--pod-log-root",
        "off",
        "--docker-root",
        "off",
    ]);
    let found: Vec<&serde_json::Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "gpu_link_errors_growing")
        .collect();
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0]["subject"], "GPU 3");
    assert_eq!(found[0]["severity"], "warning");
    let since = humantime::format_rfc3339_seconds(at(since_s * 1000)).to_string();
    let message = found[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "NVLink 14 (to the NVSwitch) recovery grew by 18 on 5 days since {since}"
        )),
        "{message}"
    );
    assert_eq!(rows(dir), stored_rows + 8 * 18, "check wrote nothing");
}

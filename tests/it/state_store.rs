//! The state store on real files: each way of opening (fresh, truncated, corrupt, another
//! node's, another boot's, a newer schema's, an unwritable place, a full disk), the ordering of
//! checkpoints after history, batching, and history over a day with a clock the test controls.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};
use serde_json::json;
use shmlink::model::{Failure, Finding, FindingKind, Subject};
use shmlink::state::{
    self, FindingEvent, Identity, Options, Retention, StateMetrics, Store, Unavailable,
};

fn me() -> Identity {
    Identity {
        node: "node-a".into(),
        boot_id: "boot-1".into(),
    }
}

fn failure(ns: &str, pod: &str, at: SystemTime) -> Failure {
    let mut f = shmlink::fixtures::failure(FindingKind::ShmAllocationFailed, ns, pod, "");
    f.placed.pod_uid = None;
    f.placed.container_id = Some("c0ffee".into());
    f.at = at.into();
    f.evidence = "ERROR: Unexpected bus error encountered in worker".into();
    f.message = "the DataLoader ran out of /dev/shm".into();
    f
}

fn open(dir: &Path, id: &Identity, m: &StateMetrics) -> Result<Store, Unavailable> {
    Store::open(dir, id, Options::default(), m)
}

/// A store with one failure and one checkpoint, closed (its last batch committed).
fn stored(dir: &Path) {
    let m = StateMetrics::default();
    let store = open(dir, &me(), &m).unwrap();
    let tx = store.sender();
    tx.failure(&failure("ml", "trainer-0", SystemTime::now()), false);
    tx.put("kmsg", json!({"seq": 42}));
    drop(tx);
    drop(store);
}

/// `stored`, then opened again as `id`; the store and its metrics.
fn stored_then_opened_as(dir: &Path, id: &Identity) -> (Store, StateMetrics) {
    stored(dir);
    let m = StateMetrics::default();
    let store = open(dir, id, &m).unwrap();
    (store, m)
}

fn db(dir: &Path) -> std::path::PathBuf {
    dir.join("state.sqlite3")
}

fn count(dir: &Path, table: &str) -> i64 {
    let c = Connection::open_with_flags(db(dir), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

fn asides(dir: &Path, reason: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with(&format!("state.sqlite3.{reason}-"))
                && !n.contains("-wal")
                && !n.contains("-shm")
        })
        .collect();
    v.sort();
    v
}

fn resets(m: &StateMetrics, reason: &str) -> u64 {
    m.resets
        .get_or_create(&vec![("reason".into(), reason.into())])
        .get()
}

#[test]
fn a_fresh_store_is_private_in_wal_mode_and_keeps_what_was_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    stored(&dir);
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        fs::metadata(db(&dir)).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let c = Connection::open(db(&dir)).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(c);
    let m = StateMetrics::default();
    let store = open(&dir, &me(), &m).unwrap();
    assert!(!store.boot_changed());
    assert_eq!(store.get("kmsg"), Some(&json!({"seq": 42})));
    assert_eq!(m.up.get(), 1);
    let h = state::read_history(&dir, &state::Filter::default()).unwrap();
    assert_eq!(h.failures.len(), 1);
    assert_eq!(h.failures[0]["found_late"], json!(false));
    assert_eq!(h.failures[0]["pod"], json!("trainer-0"));
}

fn assert_moved_aside_and_fresh(dir: &Path, reason: &str) {
    let m = StateMetrics::default();
    let store = open(dir, &me(), &m).expect("a fresh store in its place");
    assert_eq!(resets(&m, reason), 1);
    assert_eq!(
        asides(dir, reason).len(),
        1,
        "moved aside as state.sqlite3.{reason}-<time>"
    );
    assert_eq!(store.get("kmsg"), None);
    drop(store);
    assert_eq!(count(dir, "failures"), 0);
}

#[test]
fn a_truncated_store_is_moved_aside_and_begun_afresh() {
    let tmp = tempfile::tempdir().unwrap();
    stored(tmp.path());
    let f = fs::OpenOptions::new()
        .write(true)
        .open(db(tmp.path()))
        .unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len > 4096, "a store of several pages ({len} bytes)");
    f.set_len(len / 2 + 7).unwrap();
    drop(f);
    assert_moved_aside_and_fresh(tmp.path(), "corrupt");
}

#[test]
fn a_store_with_a_corrupt_page_is_moved_aside_and_begun_afresh() {
    let tmp = tempfile::tempdir().unwrap();
    stored(tmp.path());
    let mut bytes = fs::read(db(tmp.path())).unwrap();
    // Every page after the first overwritten: the schema's pages and the tables' roots.
    for b in &mut bytes[4096..] {
        *b = 0xA5;
    }
    fs::write(db(tmp.path()), &bytes).unwrap();
    assert_moved_aside_and_fresh(tmp.path(), "corrupt");
}

#[test]
fn a_file_that_is_not_a_database_is_moved_aside() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(db(tmp.path()), vec![b'x'; 8192]).unwrap();
    assert_moved_aside_and_fresh(tmp.path(), "corrupt");
}

#[test]
fn another_nodes_store_is_moved_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let other = Identity {
        node: "node-b".into(),
        ..me()
    };
    let (store, m) = stored_then_opened_as(tmp.path(), &other);
    assert_eq!(resets(&m, "foreign_node"), 1);
    assert_eq!(asides(tmp.path(), "foreign_node").len(), 1);
    assert_eq!(store.get("kmsg"), None);
}

#[test]
fn another_boots_store_is_kept_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let rebooted = Identity {
        boot_id: "boot-2".into(),
        ..me()
    };
    let (store, m) = stored_then_opened_as(tmp.path(), &rebooted);
    assert!(store.boot_changed());
    assert_eq!(
        store.get("kmsg"),
        Some(&json!({"seq": 42})),
        "checkpoints stay, the caller judges"
    );
    drop(store);
    assert_eq!(count(tmp.path(), "failures"), 1, "history stays valid");
    // The next start in the same boot is no longer a change.
    let store = open(tmp.path(), &rebooted, &m).unwrap();
    assert!(!store.boot_changed());
}

#[test]
fn a_newer_schema_is_neither_read_nor_written_nor_moved() {
    let tmp = tempfile::tempdir().unwrap();
    stored(tmp.path());
    let c = Connection::open(db(tmp.path())).unwrap();
    c.execute("UPDATE meta SET schema_version = 99", [])
        .unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    drop(c);
    let before = fs::read(db(tmp.path())).unwrap();
    let m = StateMetrics::default();
    let err = open(tmp.path(), &me(), &m).err().expect("refused");
    assert!(matches!(err, Unavailable::Newer { found: 99, .. }), "{err}");
    assert_eq!(m.up.get(), 0);
    assert_eq!(fs::read(db(tmp.path())).unwrap(), before, "untouched");
    assert!(asides(tmp.path(), "corrupt").is_empty());
    let read = state::read_history(tmp.path(), &state::Filter::default());
    assert!(matches!(read, Err(Unavailable::Newer { .. })));
}

#[test]
fn at_most_three_stores_are_kept_aside() {
    let tmp = tempfile::tempdir().unwrap();
    for stamp in [100, 200, 300, 400] {
        fs::write(
            tmp.path().join(format!("state.sqlite3.corrupt-{stamp}")),
            "x",
        )
        .unwrap();
    }
    fs::write(db(tmp.path()), vec![b'x'; 8192]).unwrap();
    let m = StateMetrics::default();
    drop(open(tmp.path(), &me(), &m).unwrap());
    let kept = asides(tmp.path(), "corrupt");
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(!kept
        .iter()
        .any(|n| n.ends_with("-100") || n.ends_with("-200")));
}

#[test]
fn history_needs_a_store_and_never_creates_one() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(state::read_history(tmp.path(), &state::Filter::default()).is_err());
    assert!(!db(tmp.path()).exists());
}

/// A reader in its own transaction never sees a checkpoint without the deaths sent before it:
/// the writer sends (death i, position i) pairs while another connection reads both at once.
#[test]
fn a_position_is_never_committed_before_the_deaths_sent_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    let path = db(tmp.path());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let c = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            let mut reads = 0u64;
            let mut seen_max = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let (deaths, pos): (i64, Option<i64>) = c
                    .query_row(
                        "SELECT (SELECT count(*) FROM failures),
                                (SELECT CAST(value AS INTEGER) FROM checkpoints WHERE key = 'pos')",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .unwrap();
                let pos = pos.unwrap_or(0);
                assert!(
                    deaths >= pos,
                    "position {pos} committed with only {deaths} deaths"
                );
                seen_max = seen_max.max(pos);
                reads += 1;
            }
            (reads, seen_max)
        }
    });
    for i in 1..=300i64 {
        tx.failure(&failure("ml", &format!("p{i}"), SystemTime::now()), false);
        tx.put("pos", json!(i));
        if i % 30 == 0 {
            std::thread::sleep(Duration::from_millis(120));
        }
    }
    assert!(tx.flush(Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let (reads, seen_max) = reader.join().unwrap();
    assert!(
        reads > 10,
        "the reader read while the writer wrote ({reads} reads)"
    );
    assert_eq!(seen_max, 300);
    assert_eq!(count(tmp.path(), "failures"), 300);
}

#[test]
fn a_flood_is_committed_in_few_transactions() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    let started = std::time::Instant::now();
    let finding = Finding::new(
        FindingKind::GpuXid,
        Subject::Gpu(3),
        "XID 79 on GPU 3".into(),
    );
    for i in 0..5000 {
        tx.finding(&finding, FindingEvent::Began, SystemTime::now());
        tx.put(&format!("log/{}", i % 300), json!({"offset": i}));
    }
    assert!(tx.flush(Duration::from_secs(10)));
    let secs = started.elapsed().as_secs_f64();
    let commits = m.commits.get();
    assert!(
        commits as f64 <= secs.ceil() + 2.0,
        "{commits} commits in {secs:.2}s"
    );
    assert_eq!(
        m.rows_written.get(),
        5000 + 300,
        "puts of one key in a batch are one row"
    );
    assert_eq!(m.dropped.get(), 0);
    drop(store);
    assert_eq!(count(tmp.path(), "findings"), 5000);
    assert_eq!(count(tmp.path(), "checkpoints"), 300);
}

/// A flood fills the writer's queue: history rows are dropped (counted), but a death and the
/// position past it (a Told record) wait for room and are stored.
#[test]
fn a_told_record_waits_for_room_in_a_full_queue() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    let finding = Finding::new(
        FindingKind::GpuXid,
        Subject::Gpu(3),
        "XID 79 on GPU 3".into(),
    );
    // Sent until one is refused: the writer takes at most a full batch a gap (10,000 a second),
    // so a sender that outruns it fills the queue however loaded the machine is; a fixed count
    // could be drained as fast as it was sent.
    let mut sent = 0u64;
    while m.dropped.get() == 0 && sent < 20_000_000 {
        tx.finding(&finding, FindingEvent::Began, SystemTime::now());
        sent += 1;
    }
    assert!(m.dropped.get() > 0, "the queue was full after {sent} sent");
    let dropped = m.dropped.get();
    let death = failure("ml", "after-the-flood", SystemTime::now());
    assert!(
        tx.told(&[death], vec![("checkpoint".into(), json!({"offset": 42}))]),
        "waited for room"
    );
    assert_eq!(m.dropped.get(), dropped, "not dropped");
    assert!(tx.flush(Duration::from_secs(20)));
    drop(tx);
    drop(store);
    let h = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    assert!(h.failures.iter().any(|f| f["pod"] == "after-the-flood"));
}

/// A day of failures, one every 10 minutes, two namespaces; the clock is the test's.
#[test]
fn history_over_a_day_filters_by_time_namespace_and_pod_and_prunes_oldest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let clock_s = Arc::new(AtomicU64::new(1_800_000_000));
    let clock = {
        let c = clock_s.clone();
        Arc::new(move || UNIX_EPOCH + Duration::from_secs(c.load(Ordering::Relaxed)))
    };
    let options = |keep: Retention| Options {
        retention: keep,
        clock: clock.clone(),
        ..Options::default()
    };
    let m = StateMetrics::default();
    let store = Store::open(tmp.path(), &me(), options(Retention::default()), &m).unwrap();
    let tx = store.sender();
    for i in 0..144u64 {
        let at = t0 + Duration::from_secs(i * 600);
        let ns = if i % 2 == 0 { "ml" } else { "infer" };
        tx.failure(&failure(ns, &format!("job-{}", i % 4), at), false);
    }
    drop(tx);
    drop(store);
    let end = t0 + Duration::from_secs(144 * 600);
    let read = |since_h: u64, ns: Option<&str>, pod: Option<&str>| {
        state::read_history(
            tmp.path(),
            &state::Filter {
                since: Some(end - Duration::from_secs(since_h * 3600)),
                namespace: ns.map(Into::into),
                pod: pod.map(Into::into),
                limit: 0,
            },
        )
        .unwrap()
    };
    assert_eq!(read(1, None, None).failures.len(), 6);
    assert_eq!(read(24, None, None).failures.len(), 144);
    assert_eq!(read(24, Some("ml"), None).failures.len(), 72);
    assert_eq!(read(24, Some("ml"), Some("job-2")).failures.len(), 36);
    let h = read(24, None, None);
    let first = h.failures.first().unwrap()["at"]
        .as_str()
        .unwrap()
        .to_string();
    let last = h.failures.last().unwrap()["at"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(first < last, "oldest first");
    let limited = state::read_history(
        tmp.path(),
        &state::Filter {
            limit: 10,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(limited.truncated);
    assert_eq!(
        limited.failures.last().unwrap()["at"].as_str().unwrap(),
        last
    );
    assert!(state::history::render(&h).contains("ml/job-0/trainer  shm_allocation_failed"));

    // Twelve hours later with a day's retention: the first half is gone, oldest first.
    clock_s.store(1_800_000_000 + 144 * 600 + 12 * 3600, Ordering::Relaxed);
    let day = Retention {
        max_age: Duration::from_secs(24 * 3600),
        ..Retention::default()
    };
    drop(Store::open(tmp.path(), &me(), options(day), &m).unwrap());
    assert_eq!(count(tmp.path(), "failures"), 72);
    // A bound on rows, then on bytes.
    let rows = Retention {
        max_rows: 50,
        ..day
    };
    drop(Store::open(tmp.path(), &me(), options(rows), &m).unwrap());
    assert_eq!(count(tmp.path(), "failures"), 50);
    assert_eq!(read(1, None, None).failures.len(), 6, "the newest stay");
    let newest_ten: u64 = h.failures[134..]
        .iter()
        .map(|f| f.to_string().len() as u64)
        .sum();
    let bytes = Retention {
        max_bytes: newest_ten,
        ..day
    };
    drop(Store::open(tmp.path(), &me(), options(bytes), &m).unwrap());
    assert_eq!(count(tmp.path(), "failures"), 10);
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A tmpfs of `size` at `at`, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs");
        Tmpfs(at.into())
    }

    fn read_only(&self) {
        let ok = std::process::Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remounting read-only");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn root_or_skip(what: &str) -> bool {
    if is_root() {
        return true;
    }
    assert_ne!(
        std::env::var("SHMLINK_E2E").as_deref(),
        Ok("require"),
        "{what} needs root (SHMLINK_E2E=require)"
    );
    eprintln!("SKIP {what}: needs root to mount a tmpfs");
    false
}

#[test]
fn a_read_only_place_runs_without_the_store_and_moves_nothing() {
    if !root_or_skip("read-only state dir") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs_ = Tmpfs::mount(tmp.path(), "4m");
    // An empty read-only place: nothing to create.
    fs_.read_only();
    let m = StateMetrics::default();
    assert!(open(&tmp.path().join("state"), &me(), &m).is_err());
    assert_eq!(m.up.get(), 0);
    // A store made, then its filesystem turned read-only: not moved aside, not opened.
    drop(fs_);
    let fs_ = Tmpfs::mount(tmp.path(), "4m");
    stored(tmp.path());
    fs_.read_only();
    let m = StateMetrics::default();
    assert!(open(tmp.path(), &me(), &m).is_err());
    assert_eq!(m.up.get(), 0);
    assert_eq!(resets(&m, "corrupt"), 0);
    assert!(db(tmp.path()).exists());
    // history still reads it.
    let h = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    assert_eq!(h.failures.len(), 1);
}

#[test]
fn a_full_disk_stops_the_writes_not_the_agent_and_a_freed_one_is_written_again() {
    if !root_or_skip("full disk") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let _fs = Tmpfs::mount(tmp.path(), "1m");
    let m = StateMetrics::default();
    let retry = Duration::from_millis(500);
    let options = Options {
        retry_after: retry,
        ..Options::default()
    };
    let store = Store::open(tmp.path(), &me(), options, &m).unwrap();
    let tx = store.sender();
    // Another writer fills what is left of the disk.
    let ballast = tmp.path().join("ballast");
    let _ = fs::write(&ballast, vec![0u8; 1 << 20]);
    let mut big = failure("ml", "flood", SystemTime::now());
    big.evidence = "x".repeat(4000);
    for _ in 0..200 {
        tx.failure(&big, false);
    }
    assert!(
        tx.flush(Duration::from_secs(20)),
        "the writer still answers"
    );
    assert_eq!(m.up.get(), 0, "said: shmlink_state_up 0");
    assert!(m.dropped.get() > 0);
    // Later records are dropped and counted, never block.
    let before = m.dropped.get();
    tx.failure(&big, false);
    assert!(tx.flush(Duration::from_secs(5)));
    assert_eq!(m.dropped.get(), before + 1);
    // The disk freed: after the retry delay the next batch is written, and it says so.
    fs::remove_file(&ballast).unwrap();
    std::thread::sleep(retry + Duration::from_millis(100));
    let small = failure("ml", "after", SystemTime::now());
    tx.failure(&small, false);
    assert!(tx.flush(Duration::from_secs(5)));
    assert_eq!(m.up.get(), 1, "written again: shmlink_state_up 1");
    drop(tx);
    drop(store);
    let h = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    assert!(
        h.failures.iter().any(|f| f["pod"] == "after"),
        "the failure after the disk was freed is stored"
    );
    // A full disk at the start: opening fails cleanly.
    let filler = tmp.path().join("filler");
    let _ = fs::write(&filler, vec![0u8; 2 << 20]);
    let other = tmp.path().join("second");
    let m = StateMetrics::default();
    assert!(open(&other, &me(), &m).is_err());
    assert_eq!(m.up.get(), 0);
}

/// The store's cost at 300 containers: every 200 ms each container's log position, a log flood
/// of 5,000 records a second and a death a second, for 10 s. Prints commits/s and rows/s; run
/// under `strace -f -c -e trace=fsync,fdatasync` for the fsyncs (BENCHMARKS.md).
#[test]
#[ignore = "a benchmark: cargo test --test it state_store:: -- --ignored --nocapture"]
fn bench_300_containers_and_a_log_flood() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    let finding = Finding::new(
        FindingKind::GpuXid,
        Subject::Gpu(3),
        "XID 79 on GPU 3".into(),
    );
    let cpu = |_: ()| rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let cpu0 = cpu(());
    let started = std::time::Instant::now();
    let mut tick = 0u64;
    while started.elapsed() < Duration::from_secs(10) {
        for c in 0..300 {
            tx.put(
                &format!("log/{c}"),
                json!({"inode": c, "offset": tick * 4096}),
            );
        }
        for _ in 0..1000 {
            tx.finding(&finding, FindingEvent::Began, SystemTime::now());
        }
        if tick.is_multiple_of(5) {
            tx.failure(
                &failure("ml", &format!("p{tick}"), SystemTime::now()),
                false,
            );
        }
        tick += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(tx.flush(Duration::from_secs(10)));
    let secs = started.elapsed().as_secs_f64();
    let cpu1 = cpu(());
    let cpu_s = (cpu1.tv_sec - cpu0.tv_sec) as f64 + (cpu1.tv_nsec - cpu0.tv_nsec) as f64 / 1e9;
    println!(
        "{secs:.1}s: {} commits ({:.1}/s), {} rows ({:.0}/s), {} dropped, CPU {:.1}% of a core",
        m.commits.get(),
        m.commits.get() as f64 / secs,
        m.rows_written.get(),
        m.rows_written.get() as f64 / secs,
        m.dropped.get(),
        cpu_s / secs * 100.0
    );
    assert!(m.commits.get() as f64 / secs <= 10.5);
}

/// Set in the child `a_told_record_is_committed_whole_even_when_killed` starts: it writes.
const TOLD_CHILD: &str = "SHMLINK_TEST_TOLD_WRITER";

/// (failures, the checkpoint `pos`) as committed now (Err while the tables are being made).
fn deaths_and_pos(c: &Connection) -> rusqlite::Result<(i64, i64)> {
    c.query_row(
        "SELECT (SELECT count(*) FROM failures),
                (SELECT CAST(value AS INTEGER) FROM checkpoints WHERE key = 'pos')",
        [],
        |r| Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?.unwrap_or(0))),
    )
}

/// The writer child, killed however the test ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child's part: failures told, each with the checkpoint that passes it, until killed.
fn told_writer(dir: &Path) {
    let m = StateMetrics::default();
    let store = open(dir, &me(), &m).unwrap();
    let tx = store.sender();
    let mut i = 0i64;
    loop {
        let f = failure("ml", &format!("p{}", i + 1), SystemTime::now());
        if tx.told(&[f], vec![("pos".into(), json!(i + 1))]) {
            i += 1;
        }
        // As serve does for a death: wait for its commit now and then.
        if i % 7 == 0 {
            tx.flush(Duration::from_secs(1));
        }
    }
}

#[test]
fn a_told_record_is_committed_whole_even_when_killed() {
    if let Some(dir) = std::env::var_os(TOLD_CHILD) {
        told_writer(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Child(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                // Its whole name in the one test binary (tests/it/main.rs): module and test.
                concat!(
                    module_path!(),
                    "::a_told_record_is_committed_whole_even_when_killed"
                )
                .split_once("::")
                .map_or("", |(_, name)| name),
                "--nocapture",
            ])
            .env(TOLD_CHILD, tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let path = db(tmp.path());
    assert!(
        (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(25));
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .is_ok_and(|c| deaths_and_pos(&c).is_ok_and(|(deaths, _)| deaths > 0))
        }),
        "the writer never committed"
    );
    // Every commit a reader sees holds each failure with its checkpoint: both or neither.
    let c = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let started = std::time::Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let (deaths, pos) = deaths_and_pos(&c).unwrap();
        assert_eq!(
            deaths, pos,
            "a failure without its checkpoint, or one ahead of it"
        );
        reads += 1;
    }
    drop(c);
    // SIGKILL mid-stream: what was committed is still whole.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let c = Connection::open(&path).unwrap();
    let (deaths, pos) = deaths_and_pos(&c).unwrap();
    println!("{reads} reads while writing; {deaths} failures committed before the kill");
    assert!(deaths > 10, "{deaths}");
    assert_eq!(deaths, pos);
}

/// What serve's scan thread waits before a failure's Event goes out: its Told record committed
/// (the writer commits at once when asked). Printed: the round trips measured here.
#[test]
fn a_told_commit_is_waited_for_briefly() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    let mut waits = Vec::new();
    for i in 0..50 {
        let f = failure("ml", &format!("p{i}"), SystemTime::now());
        let started = std::time::Instant::now();
        assert!(tx.told(&[f], vec![("checkpoint".into(), json!({"i": i}))]));
        assert!(tx.flush(Duration::from_secs(1)), "commit {i} not confirmed");
        waits.push(started.elapsed());
    }
    waits.sort();
    println!(
        "told + commit: median {:?}, max {:?} over {} deaths",
        waits[waits.len() / 2],
        waits[waits.len() - 1],
        waits.len()
    );
    assert_eq!(count(tmp.path(), "failures"), 50);
    assert_eq!(m.commits.get(), 50, "one transaction per Told record");
}

#[test]
fn a_failure_stored_before_named_from_reads_with_it_null_and_a_named_one_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let mut named = failure("ml", "job-1", at);
    named.named_from = Some("errno 28 (ENOSPC) on /dev/shm/torch_1 in Python's OSError".into());
    store.sender().failure(&named, false);
    drop(store);
    // The row an older shmlink wrote: its JSON has no `named_from`.
    let mut old = serde_json::to_value(failure("ml", "job-0", at)).unwrap();
    old.as_object_mut().unwrap().remove("named_from");
    old["found_late"] = json!(false);
    Connection::open(db(tmp.path()))
        .unwrap()
        .execute(
            "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json)
             VALUES (?1, 'ml', 'job-0', 'shm_allocation_failed', 0, ?2)",
            rusqlite::params![1_800_000_000_000i64, old.to_string()],
        )
        .unwrap();
    let filter = state::Filter::default();
    let h = state::read_history(tmp.path(), &filter).unwrap();
    let by_pod = |pod: &str| {
        h.failures
            .iter()
            .find(|f| f["pod"] == pod)
            .unwrap_or_else(|| panic!("{pod}: {h:?}"))
            .clone()
    };
    assert_eq!(by_pod("job-0")["named_from"], serde_json::Value::Null);
    assert_eq!(
        by_pod("job-1")["named_from"],
        "errno 28 (ENOSPC) on /dev/shm/torch_1 in Python's OSError"
    );
    let failures = state::read_failures(tmp.path(), &filter).unwrap();
    assert_eq!(failures.len(), 2, "the old row reads as a Failure too");
    assert!(failures.iter().any(|f| f.named_from.is_none()));
}

/// Rows an older agent stored: its time as text of any fraction (`.500`), without the fields
/// added since. `history` and `/api/v1/failures` serve the row as stored; `check` and a
/// restart read it as a failure at that moment; a row whose `at` is no time is left out.
#[test]
fn rows_an_older_agent_stored_read_back_at_their_moment() {
    let tmp = tempfile::tempdir().unwrap();
    drop(open(tmp.path(), &me(), &StateMetrics::default()).unwrap());
    let at = UNIX_EPOCH + Duration::from_millis(1_795_000_001_500);
    let old = |pod: &str, at_text: &str| {
        let mut v = serde_json::to_value(failure("ml", pod, at)).unwrap();
        let map = v.as_object_mut().unwrap();
        map.remove("named_from");
        map.insert("at".into(), json!(at_text));
        v.to_string()
    };
    let c = Connection::open(db(tmp.path())).unwrap();
    for (pod, at_text) in [
        ("old-0", "2026-11-18T11:06:41.500Z"),
        ("old-1", "2026-11-18T12:06:41.5+01:00"),
        ("broken", "yesterday"),
    ] {
        c.execute(
            "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json) VALUES (?1, 'ml', ?2, 'shm_allocation_failed', 0, ?3)",
            rusqlite::params![shmlink::model::unix_ms(at), pod, old(pod, at_text)],
        )
        .unwrap();
    }
    drop(c);
    assert_eq!(
        humantime::format_rfc3339_millis(at).to_string(),
        "2026-11-18T11:06:41.500Z"
    );
    let h = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    assert_eq!(
        h.failures[0]["at"], "2026-11-18T11:06:41.500Z",
        "served as stored"
    );
    let back = state::read_failures(tmp.path(), &state::Filter::default()).unwrap();
    let pods: Vec<_> = back
        .iter()
        .map(|f| f.placed.pod.as_deref().unwrap())
        .collect();
    assert_eq!(pods, ["old-0", "old-1"], "the row with no time is left out");
    for f in &back {
        assert_eq!(f.at.time(), at);
        assert_eq!(f.named_from, None);
        assert_eq!(
            serde_json::to_value(f).unwrap()["at"],
            "2026-11-18T11:06:41.5Z"
        );
    }
}

/// SQLite's "dead man switch" byte of `-shm` (`os_unix.c`: `(22 + 8) * 4 + 8`): every connection
/// holds a shared lock on it while open, and one that finds it unlocked takes itself for the
/// first and resets `-shm`.
const SHM_DMS: i64 = 128;

/// Whether another process finds byte `at` of `file` locked (F_GETLK for a write lock: any lock
/// this process holds there conflicts). A forked child asks: were this process to open the file
/// itself, closing the descriptor would drop its own locks.
fn locked_for_others(file: &Path, at: i64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap();
    // SAFETY: the child calls only open, fcntl and _exit (async-signal-safe), then exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            let mut lock: libc::flock = std::mem::zeroed();
            lock.l_type = libc::F_WRLCK as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            lock.l_start = at;
            lock.l_len = 1;
            let code = if fd < 0 || libc::fcntl(fd, libc::F_GETLK, &mut lock) != 0 {
                2
            } else {
                i32::from(lock.l_type == libc::F_UNLCK as libc::c_short)
            };
            libc::_exit(code)
        }
    }
    assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child did not exit: {status}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 2, "the child could not ask about {}", file.display());
    code == 0
}

/// `serve` reads its own store while its writer holds it open (`/api/v1/failures`, the
/// failures told before a restart). Those reads must leave the writer's locks alone: without
/// them the next program to open the store (`shmlink history`, another reader) resets `-shm`
/// under the writer, which then dies of SIGBUS in its mapping.
#[test]
fn reading_the_store_in_the_writers_process_leaves_the_writers_locks() {
    let tmp = tempfile::tempdir().unwrap();
    let m = StateMetrics::default();
    let store = open(tmp.path(), &me(), &m).unwrap();
    let tx = store.sender();
    tx.failure(&failure("ml", "trainer-0", SystemTime::now()), false);
    tx.put("kmsg", json!({"seq": 42}));
    assert!(tx.flush(Duration::from_secs(5)), "no commit");
    let shm = tmp.path().join("state.sqlite3-shm");
    assert!(
        locked_for_others(&shm, SHM_DMS),
        "the writer holds no lock on -shm"
    );

    let history = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    assert_eq!(history.failures.len(), 1);
    let pages = state::read_history_pages(tmp.path(), &state::Filter::default()).unwrap();
    drop(pages);
    assert_eq!(
        state::read_checkpoint(tmp.path(), "kmsg").unwrap(),
        Some(json!({"seq": 42}))
    );
    assert!(
        locked_for_others(&shm, SHM_DMS),
        "reading the store dropped the writer's lock on -shm"
    );

    // And the writer goes on beside a reader's connection.
    let other =
        Connection::open_with_flags(db(tmp.path()), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    tx.put("kmsg", json!({"seq": 43}));
    assert!(tx.flush(Duration::from_secs(5)), "no commit");
    let seq: String = other
        .query_row(
            "SELECT value FROM checkpoints WHERE key = 'kmsg'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(seq, r#"{"seq":43}"#);
}

//! The store turned against its host or the agent (issue 51): what sits at `state.sqlite3` (a
//! symlink, a FIFO, another program's database, a hard link), a state directory others may
//! write, and a storm of one Pod's deaths that must not erase another Pod's history.

use crate::common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};
use shmlink::model::{Failure, FindingKind};
use shmlink::state::{self, Identity, Options, StateMetrics, Store, Unavailable};

fn me() -> Identity {
    Identity {
        node: "node-a".into(),
        boot_id: "boot-1".into(),
    }
}

fn db(dir: &Path) -> std::path::PathBuf {
    dir.join("state.sqlite3")
}

fn resets(m: &StateMetrics, reason: &str) -> u64 {
    m.resets
        .get_or_create(&vec![("reason".into(), reason.into())])
        .get()
}

/// The names moved aside for `reason` (the main files, not their -wal or -shm).
fn asides(dir: &Path, reason: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().into_string().unwrap_or_default();
            n.starts_with(&format!("state.sqlite3.{reason}-"))
                && !n.ends_with("-wal")
                && !n.ends_with("-shm")
                && !n.ends_with("-journal")
        })
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Opens on a thread of its own: an open that blocks (a FIFO) fails the test instead of
/// hanging it.
fn open_within(dir: &Path, wait: Duration) -> (Result<Store, Unavailable>, StateMetrics) {
    let (tx, rx) = mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let m = StateMetrics::default();
        let got = Store::open(&dir, &me(), Options::default(), &m);
        let _ = tx.send((got, m));
    });
    rx.recv_timeout(wait)
        .expect("the store's open returned in time (it blocked)")
}

/// A store made in `dir` and closed.
fn made(dir: &Path) {
    drop(Store::open(dir, &me(), Options::default(), &StateMetrics::default()).unwrap());
}

fn is_regular_store(path: &Path) {
    let meta = fs::symlink_metadata(path).unwrap();
    assert!(meta.file_type().is_file(), "{path:?} is a regular file");
    let c = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM meta", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "shmlink's meta row");
}

/// The store and its companions removed (a reader's connection leaves -wal and -shm).
fn clear(dir: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = fs::remove_file(dir.join(format!("state.sqlite3{suffix}")));
    }
}

/// A database of another program: a table of its own, no `meta`.
fn someone_elses_database(path: &Path) {
    let c = Connection::open(path).unwrap();
    c.execute_batch(
        "CREATE TABLE users (name TEXT, password TEXT);
         INSERT INTO users VALUES ('root', 'hunter2');",
    )
    .unwrap();
}

#[test]
fn a_symlink_at_the_stores_name_is_set_aside_and_what_it_points_to_is_never_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    // Each target the old open wrote through: an empty file (created over), another
    // program's database (no meta: truncated and rewritten), a text file.
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let empty = elsewhere.join("empty");
    fs::write(&empty, "").unwrap();
    let theirs = elsewhere.join("theirs.db");
    someone_elses_database(&theirs);
    let text = elsewhere.join("passwd");
    fs::write(&text, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    for target in [&empty, &theirs, &text] {
        let before = fs::read(target).unwrap();
        clear(&dir);
        std::os::unix::fs::symlink(target, db(&dir)).unwrap();
        let (opened, m) = open_within(&dir, Duration::from_secs(10));
        let store = opened.expect("a fresh store in the link's place");
        drop(store);
        assert!(fs::read(target).unwrap() == before, "{target:?} untouched");
        assert_eq!(fs::metadata(target).unwrap().len(), before.len() as u64);
        assert_eq!(resets(&m, "not_regular"), 1, "{target:?}");
        is_regular_store(&db(&dir));
        let aside = asides(&dir, "not_regular");
        assert!(
            aside
                .iter()
                .any(|p| fs::read_link(p).ok().as_deref() == Some(target.as_path())),
            "the link itself moved aside: {aside:?}"
        );
    }
    // A link at the -wal's name: never written through either.
    clear(&dir);
    let wal = dir.join("state.sqlite3-wal");
    std::os::unix::fs::symlink(&text, &wal).unwrap();
    let before = fs::read(&text).unwrap();
    let (opened, _) = open_within(&dir, Duration::from_secs(10));
    let store = opened.unwrap();
    store.sender().put("k", serde_json::json!(1));
    assert!(store.flush(Duration::from_secs(5)));
    drop(store);
    assert!(
        fs::read(&text).unwrap() == before,
        "the -wal link's target untouched"
    );
    // history, check and the HTTP endpoint never read through a link.
    clear(&dir);
    std::os::unix::fs::symlink(&theirs, db(&dir)).unwrap();
    let read = state::read_history(&dir, &state::Filter::default());
    assert!(read.is_err(), "a link is not read as the store");
}

#[test]
fn a_fifo_at_the_stores_name_never_blocks_the_open_nor_a_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        db(dir),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // A reader first: `history`, `check` and /api/v1/failures read the same file.
    let (tx, rx) = mpsc::channel();
    let d = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(state::read_history(&d, &state::Filter::default()).is_err());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a reader returned in time (it blocked on the FIFO)"),
        "a FIFO is no store to read"
    );
    let (opened, m) = open_within(dir, Duration::from_secs(10));
    drop(opened.expect("a fresh store in the FIFO's place"));
    assert_eq!(resets(&m, "not_regular"), 1);
    is_regular_store(&db(dir));
    let aside = asides(dir, "not_regular");
    assert_eq!(aside.len(), 1);
    assert!(fs::symlink_metadata(&aside[0])
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn another_programs_database_is_moved_aside_whole_never_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    someone_elses_database(&db(dir));
    let before = fs::read(db(dir)).unwrap();
    let (opened, m) = open_within(dir, Duration::from_secs(10));
    drop(opened.expect("a fresh store"));
    assert_eq!(resets(&m, "not_shmlink"), 1);
    let aside = asides(dir, "not_shmlink");
    assert_eq!(
        aside.len(),
        1,
        "moved aside as state.sqlite3.not_shmlink-<time>"
    );
    assert!(fs::read(&aside[0]).unwrap() == before, "byte for byte");
    is_regular_store(&db(dir));
}

#[test]
fn a_hard_link_at_the_stores_name_is_not_taken_for_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    // The agent's own store elsewhere, linked in: written through the link, it would be
    // written there too.
    let other = tmp.path().join("other");
    made(&other);
    fs::hard_link(db(&other), db(&dir)).unwrap();
    let before = fs::read(db(&other)).unwrap();
    let (opened, m) = open_within(&dir, Duration::from_secs(10));
    drop(opened.unwrap());
    assert_eq!(resets(&m, "not_regular"), 1);
    assert!(
        fs::read(db(&other)).unwrap() == before,
        "the linked store untouched"
    );
    assert_eq!(fs::metadata(db(&dir)).unwrap().nlink(), 1);
}

#[test]
fn a_state_directory_others_may_write_is_made_private_and_anothers_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let (opened, _) = open_within(&dir, Duration::from_secs(10));
    drop(opened.unwrap());
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    // Owned by another user: anyone with its owner's rights could plant what the agent opens.
    if rustix::process::geteuid().is_root() {
        let theirs = tmp.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        let (opened, m) = open_within(&theirs, Duration::from_secs(10));
        let err = opened.err().expect("refused");
        assert!(err.to_string().contains("4242"), "{err}");
        assert_eq!(m.up.get(), 0);
        assert!(!db(&theirs).exists(), "nothing made there");
    }
}

fn failure(pod: &str, kind: FindingKind, at: SystemTime) -> Failure {
    let mut f = shmlink::fixtures::failure(kind, "ml", pod, "");
    f.placed.pod_uid = None;
    f.placed.container_id = Some(format!("{pod}-c0ffee"));
    f.at = at.into();
    f.evidence = "ERROR: Unexpected bus error encountered in worker. This might be caused by \
                  insufficient shared memory (shm)."
        .into();
    f.message = format!(
        "container ml/{pod}/trainer could not allocate shared memory: the DataLoader's \
         workers share batches through /dev/shm, which was full; give the Pod a bigger \
         /dev/shm (an emptyDir of medium Memory with a sizeLimit) or fewer workers. {}",
        "x".repeat(400)
    );
    f
}

/// The red team's storm (82,000 deaths of one Pod told in 80 s filled the history's 64 MiB and
/// erased another Pod's failures) at a tenth of its scale, caps and all: 8,200 deaths against
/// 10,000 rows and 6.4 MiB. The other Pod's stay; the storm keeps its newest and a count.
#[test]
fn a_storm_of_one_pods_deaths_never_erases_another_pods_history() {
    let tmp = tempfile::tempdir().unwrap();
    let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let m = StateMetrics::default();
    let tenth = || Options {
        retention: state::Retention {
            max_rows: 10_000,
            max_bytes: (64 << 20) / 10,
            ..state::Retention::default()
        },
        ..Options::default()
    };
    let store = Store::open(tmp.path(), &me(), tenth(), &m).unwrap();
    let tx = store.sender();
    for i in 0..3 {
        let f = failure(
            "victim-0",
            FindingKind::ShmAllocationFailed,
            t0 + Duration::from_secs(i),
        );
        assert!(tx.told(&[f], Vec::new()));
    }
    let storm = 8_200u64;
    let kind = FindingKind::ShmAllocationFailed;
    for chunk in (0..storm).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<Failure> = chunk
            .iter()
            .map(|i| {
                failure(
                    "storm-0",
                    kind,
                    t0 + Duration::from_millis(10_000 + i * 1000 / 103),
                )
            })
            .collect();
        assert!(tx.told(&batch, Vec::new()));
    }
    drop(tx);
    drop(store);
    // The next start prunes (at most once a minute while running; at once after a start).
    drop(Store::open(tmp.path(), &me(), tenth(), &m).unwrap());
    let all = state::Filter {
        since: Some(t0 - Duration::from_secs(1)),
        ..Default::default()
    };
    let h = state::read_history(tmp.path(), &all).unwrap();
    let of = |pod: &str| h.failures.iter().filter(|f| f["pod"] == pod).count();
    assert_eq!(of("victim-0"), 3, "the other Pod's failures stay");
    assert_eq!(of("storm-0"), state::history::PER_OWNER as usize);
    let pruned = &h.pruned;
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert_eq!(pruned[0].pod.as_deref(), Some("storm-0"));
    assert_eq!(pruned[0].kind, kind.as_str());
    assert_eq!(pruned[0].count, storm - state::history::PER_OWNER);
    // The newest are the ones kept.
    let newest = h.failures.last().unwrap()["at"]
        .as_str()
        .unwrap()
        .to_string();
    let last = failure(
        "storm-0",
        kind,
        t0 + Duration::from_millis(10_000 + (storm - 1) * 1000 / 103),
    );
    assert_eq!(newest, last.at.to_string());
    let text = state::history::render(&h);
    assert!(
        text.contains(&format!(
            "{} more shm_allocation_failed",
            storm - state::history::PER_OWNER
        )),
        "{text}"
    );
}

/// An open that cannot finish (here: another process holds the database exclusively, as a hung
/// disk would hold a read) does not hold up the start: past its wait the agent goes on without
/// a store, said as the store's other troubles are (`shmlink_state_up 0`).
#[test]
fn a_store_that_does_not_open_in_time_is_gone_without() {
    let tmp = tempfile::tempdir().unwrap();
    made(tmp.path());
    let holder = Connection::open(db(tmp.path())).unwrap();
    holder
        .execute_batch(
            "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; SELECT count(*) FROM meta;",
        )
        .unwrap();
    let m = StateMetrics::default();
    let started = std::time::Instant::now();
    let wait = Duration::from_millis(300);
    let got = Store::open_within(tmp.path(), &me(), Options::default(), &m, wait);
    assert!(
        matches!(got, Err(Unavailable::TimedOut { .. })),
        "{:?}",
        got.err()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(m.up.get(), 0);
    drop(holder);
    // Free again: the next start opens it.
    let m = StateMetrics::default();
    drop(
        Store::open_within(
            tmp.path(),
            &me(),
            Options::default(),
            &m,
            Duration::from_secs(10),
        )
        .unwrap(),
    );
    assert_eq!(m.up.get(), 1);
}

/// A row an older agent stored with the line whole (a secret, a bidi override) is served
/// redacted and written out by `history` and `/api/v1/failures`, which read the same way.
#[test]
fn a_row_an_older_agent_stored_whole_is_served_redacted() {
    let tmp = tempfile::tempdir().unwrap();
    made(tmp.path());
    let mut f = failure("old-0", FindingKind::ShmAllocationFailed, SystemTime::now());
    f.evidence = "token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln bus error \u{202e}exe".into();
    f.message = format!("its log said \"{}\"", f.evidence);
    let row = state::history::FailureRow::new(&f, false);
    let c = Connection::open(db(tmp.path())).unwrap();
    c.execute(
        "INSERT INTO failures (at_ms, namespace, pod, kind, found_late, json) VALUES (?1, ?2, ?3, ?4, 0, ?5)",
        rusqlite::params![row.at_ms, row.namespace, row.pod, row.kind, row.json],
    )
    .unwrap();
    drop(c);
    let h = state::read_history(tmp.path(), &state::Filter::default()).unwrap();
    let served = serde_json::to_string(&h).unwrap();
    assert!(
        !served.contains("eyJ") && !served.contains('\u{202e}'),
        "{served}"
    );
    assert_eq!(
        h.failures[0]["evidence"],
        "token=<redacted> bus error \\u{202e}exe"
    );
    let text = state::history::render(&h);
    assert!(
        !text.contains("eyJ") && !text.contains('\u{202e}'),
        "{text}"
    );
}

/// The red team's start against the release binary: a FIFO where `serve`'s store goes blocked its
/// start for ever. `serve` starts, answers, and keeps a fresh store; the FIFO is set aside.
#[test]
fn serve_starts_with_a_fifo_where_its_store_goes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        db(&dir),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let agent = common::agent::Agent::start(
        &[
            "--no-gpu",
            "--kmsg",
            "off",
            "--death-trace",
            "off",
            "--state-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    agent.wait_ready();
    let body = agent.metrics();
    let m = |name: &str, labels: &[(&str, &str)]| common::agent::sample(&body, name, labels);
    assert_eq!(m("shmlink_state_up", &[]), Some(1.0), "{body}");
    assert_eq!(
        m("shmlink_state_resets_total", &[("reason", "not_regular")]),
        Some(1.0)
    );
    assert!(asides(&dir, "not_regular").len() == 1);
    assert!(fs::symlink_metadata(db(&dir))
        .unwrap()
        .file_type()
        .is_file());
    assert!(agent.terminate().success());
}

//! Floods: each poll's bytes and kept lines shared between containers; rotated files written
//! faster than read let go; log files and their descriptors capped.

use super::*;
use crate::logs::follow::{KEPT_PER_POLL, MAX_UNREAD_DELETED, POLL_TOTAL};

/// A line of about 1 KiB that holds no failure text.
fn filler() -> String {
    cri(&[&"f".repeat(1000)])
}

/// `n` containers' live logs (`c0`, `c1`, ...), empty, followed by serve's tailer from now.
fn followed_containers(node: &Node, n: usize) -> (Vec<PathBuf>, LogTailer) {
    let logs: Vec<PathBuf> = (0..n)
        .map(|i| node.container(&format!("c{i}")).join("0.log"))
        .collect();
    for log in &logs {
        append(log, "");
    }
    (logs, from_end(node))
}

#[test]
fn flooding_containers_share_each_polls_bytes_and_each_is_read_in_every_poll() {
    let node = Node::new();
    let (logs, mut tailer) = followed_containers(&node, 40);
    // 40 containers write 1 MiB each, their failure last: 40 MiB, more than two polls read.
    let flood = filler().repeat(1 << 10);
    for log in &logs {
        append(log, &flood);
        append(log, cri(&[SHM]));
    }
    let total = logs.len() as u64 * (flood.len() + cri(&[SHM]).len()) as u64;
    let mut told = Vec::new();
    let mut read = Vec::new();
    while tailer.stats().bytes < total && read.len() < 10 {
        let before = tailer.stats().bytes;
        told.push(tailer.poll_matching(|t| t.ends_with(SHM.as_bytes())).len());
        read.push(tailer.stats().bytes - before);
    }
    let each = POLL_TOTAL / 40 * 40; // equal shares
    assert_eq!(read, [each, each, total - 2 * each]);
    // In equal shares every container is two-fifths through its flood after the first poll, so
    // every failure is told by the third; one after another (4 MiB each) the first four would
    // have been told in the first poll and the last eight not before the fourth.
    assert_eq!(told, [0, 0, 40]);
}

#[test]
fn a_poll_hands_on_at_most_its_kept_lines_and_the_containers_after_wait_their_turn() {
    let node = Node::new();
    let (logs, mut tailer) = followed_containers(&node, 10);
    for log in &logs {
        append(log, cri(&[SHM]).repeat(1000));
    }
    let first = tailer.poll();
    assert_eq!(first.len(), KEPT_PER_POLL as usize);
    // c0-c3 whole, c4 cut where the allowance ran out: the rest of what it read is dropped
    // and counted; c5-c9 are not read yet.
    assert_eq!(tailer.stats().dropped_lines, 904);
    let second = tailer.poll();
    assert_eq!(second[0].origin, pod("c5"), "the next poll begins after c4");
    let mut told = first.len() + second.len();
    for _ in 0..3 {
        told += tailer.poll().len();
    }
    assert_eq!(told as u64 + tailer.stats().dropped_lines, 10_000);
    assert_eq!(
        tailer.stats().dropped_lines,
        2 * 904,
        "one container cut a poll"
    );
}

/// The log files this process holds open that have been deleted, under `dir`.
fn deleted_open_under(dir: &Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            let t = target.to_string_lossy();
            t.starts_with(&*dir.to_string_lossy()) && t.ends_with(" (deleted)")
        })
        .count()
}

#[test]
fn a_deleted_rotated_file_is_drained_up_to_the_cap_then_let_go_and_counted() {
    let node = Node::new();
    let dir = node.container("fast");
    let log = dir.join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    let wanted = |t: &[u8]| t.ends_with(SHM.as_bytes()) || t.starts_with(b"after");

    // 10 MiB written, 4 read, then rotated and deleted: the 6 left are under the cap, drained.
    append(&log, filler().repeat(10 << 10));
    append(&log, cri(&[SHM]));
    assert!(tailer.poll_matching(wanted).is_empty());
    fs::remove_file(&log).unwrap();
    append(&log, cri(&["after 1"]));
    let mut told = Vec::new();
    for _ in 0..3 {
        told.extend(tailer.poll_matching(wanted));
    }
    assert_eq!(texts(&told), [SHM, "after 1"]);
    assert_eq!(tailer.stats().skipped_bytes, 0);

    // 80 MiB written faster than read, then rotated and deleted: its fd would hold 76 MiB of
    // disk the node believes freed. Past the cap it is let go, what it held counted.
    let flood = filler().repeat(80 << 10);
    append(&log, &flood);
    append(&log, cri(&[SHM]));
    assert!(tailer.poll_matching(wanted).is_empty());
    let unread = (flood.len() + cri(&[SHM]).len()) as u64 - (4 << 20);
    assert!(unread > MAX_UNREAD_DELETED);
    fs::rename(&log, dir.join("0.log.20261126-031500")).unwrap();
    assert_eq!(deleted_open_under(node.tmp.path()), 0);
    fs::remove_file(dir.join("0.log.20261126-031500")).unwrap();
    assert_eq!(deleted_open_under(node.tmp.path()), 1, "the fd holds it");
    append(&log, cri(&["after 2"]));
    assert_eq!(texts(&tailer.poll_matching(wanted)), ["after 2"]);
    assert_eq!(tailer.stats().skipped_bytes, unread);
    assert_eq!(deleted_open_under(node.tmp.path()), 0, "let go");
}

#[test]
fn log_files_past_the_open_cap_wait_for_a_place_and_count_once() {
    let node = Node::new();
    for i in 0..12 {
        append(
            &node.container(&format!("c{i:02}")).join("0.log"),
            cri(&[&format!("c{i:02}")]),
        );
    }
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    tailer.follower.cap_open_files(8);
    let first: Vec<String> = tailer.poll().into_iter().map(|l| l.text).collect();
    assert_eq!(first.len(), 8);
    assert_eq!(tailer.follower.tally().open.open(), 8);
    assert!(tailer.poll().is_empty(), "still no place");
    assert_eq!(tailer.stats().errors, 4, "each refused file counted once");
    // Four of the containers read go: their places go to the four that waited, which are read
    // from their start.
    for name in &first[..4] {
        fs::remove_dir_all(node.pods().join(POD).join(name)).unwrap();
    }
    let mut later: Vec<String> = Vec::new();
    for _ in 0..3 {
        later.extend(tailer.poll().into_iter().map(|l| l.text));
    }
    let mut waited: Vec<String> = (0..12)
        .map(|i| format!("c{i:02}"))
        .filter(|c| !first.contains(c))
        .collect();
    later.sort();
    waited.sort();
    assert_eq!(later, waited);
    assert_eq!(tailer.follower.tally().open.open(), 8);
}

#[test]
fn thousands_of_restart_logs_in_one_directory_open_only_the_newest_few() {
    let node = Node::new();
    let dir = node.container("many");
    for n in 0..3000 {
        append(
            &dir.join(format!("{n}.log")),
            cri(&[&format!("restart {n}")]),
        );
    }
    let now = SystemTime::now();
    for n in [7, 1500, 2998, 2999] {
        set_mtime(&dir.join(format!("{n}.log")), now + Duration::from_secs(n));
    }
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let mut told: Vec<String> = tailer.poll().into_iter().map(|l| l.text).collect();
    told.sort();
    assert_eq!(
        told,
        ["restart 1500", "restart 2998", "restart 2999", "restart 7"]
    );
    assert_eq!(tailer.follower.tally().open.open(), 4);
    assert_eq!(tailer.stats().files, 4);
}

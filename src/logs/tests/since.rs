//! check's catch-up: rotated, gzipped and live files written at or after `since`, in order.

use super::*;

#[test]
fn since_reads_rotated_plain_and_gz_files_then_the_live_one_and_drops_older_lines() {
    let node = Node::new();
    let dir = node.container("pytorch");
    // Wholly before `since`, by its time: never opened.
    let old = dir.join("0.log.20261123-090000.gz");
    gzip(&old, &cri_at(&ts(9, 0, 0), &["ancient"]));
    set_mtime(&old, time(9, 0, 0));
    let gz = dir.join("0.log.20261123-100001.gz");
    let text = cri_at(&ts(9, 59, 59), &["too early"]) + &cri_at(&ts(10, 0, 1), &["from gz"]);
    gzip(&gz, &text);
    set_mtime(&gz, time(10, 0, 1));
    let plain = dir.join("0.log.20261123-101000");
    append(&plain, cri_at(&ts(10, 5, 0), &["from rotated"]));
    set_mtime(&plain, time(10, 5, 0));
    // Being compressed: the plain twin is read, the .gz not.
    gzip(
        &dir.join("0.log.20261123-101000.gz"),
        &cri_at(&ts(10, 5, 0), &["twin"]),
    );
    let log = dir.join("0.log");
    append(&log, cri_at(&ts(10, 12, 0), &["from live", SHM]));
    set_mtime(&log, time(10, 12, 0));

    let mut tailer = eager(LogTailer::since(node.settings(), time(10, 0, 0)));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["from gz", "from rotated", "from live", SHM]);
    assert!(lines.iter().all(|l| l.origin == pod("pytorch")));
    assert_eq!(
        tailer.stats().files,
        3,
        "neither the ancient one nor the twin is opened"
    );
    assert!(tailer.poll().is_empty());
    append(&log, cri_at(&ts(10, 16, 0), &["later"]));
    assert_eq!(texts(&tailer.poll()), ["later"]);
}

#[test]
fn since_skips_a_live_file_last_written_before_it_but_follows_it() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri_at(&ts(9, 0, 0), &["old"]));
    set_mtime(&log, time(9, 0, 0));
    let mut tailer = eager(LogTailer::since(node.settings(), time(10, 0, 0)));
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.stats().bytes, 0);
    append(&log, cri_at(&ts(10, 1, 0), &["new"]));
    assert_eq!(texts(&tailer.poll()), ["new"]);
}

#[test]
fn docker_since_reads_rotated_files_oldest_first() {
    let node = Node::new();
    let dir = node.docker_dir();
    let base = dir.join(format!("{ID}-json.log"));
    let with = |suffix: &str| PathBuf::from(format!("{}{suffix}", base.display()));
    gzip(&with(".2.gz"), &docker_line("two\n", &ts(10, 1, 0)));
    append(&with(".1"), docker_line("one\n", &ts(10, 2, 0)));
    append(&base, docker_line("live\n", &ts(10, 3, 0)));
    append(&dir.join("config.v2.json"), "{}\n");
    let mut tailer = eager(LogTailer::since(node.settings(), time(10, 0, 0)));
    assert_eq!(texts(&tailer.poll()), ["two", "one", "live"]);
}

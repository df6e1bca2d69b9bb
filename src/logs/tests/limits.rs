//! Bounds and hostile input: the rate limit, huge lines, garbage and binary files, floods, unreadable files.

use super::*;

#[test]
fn the_rate_limit_drops_and_counts_per_container() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    let quiet = node.container("sidecar").join("0.log");
    append(&log, "");
    append(&quiet, "");
    let mut settings = node.settings();
    settings.max_lines_per_sec = 10;
    let mut tailer = eager(LogTailer::from_end(settings));
    let flood: Vec<String> = (0..100).map(|i| format!("step {i}")).collect();
    let flood: Vec<&str> = flood.iter().map(String::as_str).collect();
    append(&log, cri_at(&ts(10, 15, 2), &flood));
    append(&quiet, cri_at(&ts(10, 15, 2), &["sidecar ok"]));
    let lines = tailer.poll();
    assert_eq!(lines.len(), 11);
    assert_eq!(
        lines[..10]
            .iter()
            .filter(|l| l.origin == pod("pytorch"))
            .count(),
        10
    );
    assert_eq!(
        lines[10].text, "sidecar ok",
        "another container has its own bucket"
    );
    assert_eq!(tailer.stats().dropped_lines, 90);
    assert_eq!(tailer.stats().lines, 101, "every line read is counted");
    // Two seconds later (by the lines' time) the bucket is full again.
    append(&log, cri_at(&ts(10, 15, 4), &[SHM, "b", "c"]));
    assert_eq!(texts(&tailer.poll()), [SHM, "b", "c"]);
}

#[test]
fn the_rate_limit_counts_only_the_lines_kept_so_a_noisy_job_still_tells_its_failure() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, "");
    let mut settings = node.settings();
    settings.max_lines_per_sec = 10;
    let mut tailer = eager(LogTailer::from_end(settings));
    let mut lines: Vec<String> = (0..1000).map(|i| format!("step {i} loss 0.1")).collect();
    lines.push(SHM.to_string());
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    append(&log, cri_at(&ts(10, 15, 2), &lines));
    let kept = tailer.poll_matching(|text| text.starts_with(b"RuntimeError"));
    assert_eq!(texts(&kept), [SHM]);
    let stats = tailer.stats();
    assert_eq!((stats.lines, stats.dropped_lines), (1001, 0));
    // A flood of wanted lines is still limited.
    let flood = vec![SHM; 100];
    append(&log, cri_at(&ts(10, 15, 2), &flood));
    let kept = tailer.poll_matching(|text| text.starts_with(b"RuntimeError"));
    assert_eq!(kept.len(), 9, "one token went to the first line");
    assert_eq!(tailer.stats().dropped_lines, 91);
}

#[test]
fn a_huge_line_is_truncated_at_max_line() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    let part = format!("{} stdout P {}\n", ts(10, 15, 2), "x".repeat(16 * 1024));
    append(&log, part.repeat(10));
    append(&log, format!("{} stdout F end\n", ts(10, 15, 2)));
    // And one physical line of 1 MiB, which no runtime writes.
    append(
        &log,
        format!("{} stdout F {}\n", ts(10, 15, 3), "y".repeat(1 << 20)),
    );
    append(&log, cri(&[SHM]));
    let lines = tailer.poll();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].is_truncated() && lines[0].text.starts_with("xxx"));
    assert!(lines[1].is_truncated() && lines[1].text.starts_with("yyy"));
    assert_eq!(lines[1].text.len(), MAX_LINE + TRUNCATED_MARK.len());
    assert!(!lines[2].is_truncated());
    assert_eq!(lines[2].text, SHM);
}

#[test]
fn garbage_lines_are_skipped() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    append(&log, "not a CRI line\n\n\u{0}\u{1}\n");
    append(&log, cri(&[SHM]));
    append(&log, "2026-11-23T10:15:02Z stdin F nope\n");
    assert_eq!(texts(&tailer.poll()), [SHM]);
    assert_eq!(tailer.stats().errors, 0);
}

/// Deterministic noise with some newlines in it.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn a_binary_file_does_not_panic() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, noise(1 << 20));
    append(
        &node.docker_dir().join(format!("{ID}-json.log")),
        noise(1 << 20),
    );
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    tailer.poll();
    let mut tailer = from_end(&node);
    // A valid line that follows binary bytes without a newline is lost with them; the next one
    // is read.
    append(&log, noise(1 << 20));
    append(&log, b"\n");
    append(&log, cri(&[SHM]));
    assert_eq!(texts(&tailer.poll()), [SHM]);
}

#[test]
fn one_flooding_file_does_not_starve_the_others() {
    let node = Node::new();
    let flood = node.container("flood").join("0.log");
    let quiet = node.container("quiet").join("0.log");
    append(&flood, "");
    append(&quiet, "");
    let mut tailer = from_end(&node);
    let line = cri(&[&"f".repeat(1000)]);
    append(&flood, line.repeat(6 << 10)); // 6 MiB
    append(&quiet, cri(&[SHM]));
    let first = tailer.poll();
    assert!(first.iter().any(|l| l.text == SHM));
    let flooded = first.iter().filter(|l| l.origin == pod("flood")).count();
    assert!(flooded < 6 << 10, "{flooded} lines in one poll");
    let second = tailer.poll();
    assert_eq!(flooded + second.len(), 6 << 10, "the rest comes next");
}

#[test]
fn an_unreadable_file_counts_one_error() {
    use std::os::unix::fs::PermissionsExt;
    if rustix::process::geteuid().is_root() {
        return; // root reads a file whatever its mode
    }
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri(&["a"]));
    fs::set_permissions(&log, fs::Permissions::from_mode(0o000)).unwrap();
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    assert!(tailer.poll().is_empty());
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.stats().errors, 1);
}

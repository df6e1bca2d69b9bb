//! Following live files: appends, unfinished lines, new files, truncation, deletion.

use super::*;

#[test]
fn from_end_skips_existing_content_and_reads_appends() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri(&["old history", "more history"]));
    let mut tailer = from_end(&node);
    assert!(tailer.poll().is_empty());
    append(&log, cri(&["Epoch 3: loss 0.12", SHM]));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["Epoch 3: loss 0.12", SHM]);
    assert_eq!(lines[1].origin, pod("pytorch"));
    assert_eq!(lines[1].at, time(10, 15, 2));
    assert!(tailer.poll().is_empty());
    let stats = tailer.stats();
    assert_eq!((stats.files, stats.lines, stats.errors), (1, 2, 0));
    assert_eq!(stats.bytes, cri(&["Epoch 3: loss 0.12", SHM]).len() as u64);
}

#[test]
fn an_unfinished_line_waits_for_its_newline() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    let line = cri(&[SHM]);
    let (head, tail) = line.split_at(40);
    append(&log, head);
    assert!(tailer.poll().is_empty());
    append(&log, tail);
    assert_eq!(texts(&tailer.poll()), [SHM]);
}

#[test]
fn a_new_restart_file_and_a_new_container_are_read_from_their_start() {
    let node = Node::new();
    let dir = node.container("pytorch");
    append(&dir.join("0.log"), cri(&["first run"]));
    let mut tailer = from_end(&node);
    append(&dir.join("1.log"), cri(&["second run starts", SHM]));
    append(
        &node.container("sidecar").join("0.log"),
        cri(&["sidecar up"]),
    );
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["second run starts", SHM, "sidecar up"]);
    assert_eq!(lines[2].origin, pod("sidecar"));
}

#[test]
fn truncation_reads_again_from_the_start() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(
        &log,
        cri(&["a long line of old history that will be truncated away"]),
    );
    let mut tailer = from_end(&node);
    append(&log, cri(&["more"]));
    assert_eq!(texts(&tailer.poll()), ["more"]);
    File::options()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&log, cri(&["after truncation"]));
    assert_eq!(texts(&tailer.poll()), ["after truncation"]);
}

#[test]
fn a_deleted_pod_is_drained_and_forgotten_without_error() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    append(&log, cri(&[SHM]));
    fs::remove_dir_all(node.pods().join(POD)).unwrap();
    assert_eq!(texts(&tailer.poll()), [SHM]);
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.follower.tracked(), 0);
    assert_eq!(tailer.stats().errors, 0);
}

//! Rotation: renamed files drained first, gzipped twins, undone rotations, Docker's numbered files.

use super::*;

#[test]
fn rotation_by_rename_drains_the_old_file_first() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, cri(&["before start"]));
    let mut tailer = from_end(&node);
    append(&log, cri(&["unread before rotation"]));
    let rotated = dir.join("0.log.20261123-101502");
    fs::rename(&log, &rotated).unwrap();
    // The runtime writes to its old fd until it reopens.
    append(&rotated, cri(&["written before reopen"]));
    append(&log, cri(&["new file", SHM]));
    assert_eq!(
        texts(&tailer.poll()),
        [
            "unread before rotation",
            "written before reopen",
            "new file",
            SHM
        ]
    );
    append(&log, cri(&["after"]));
    assert_eq!(texts(&tailer.poll()), ["after"]);
}

#[test]
fn a_rotated_file_that_is_then_gzipped_is_not_read_twice() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, "");
    let mut tailer = from_end(&node);
    append(&log, cri(&["a"]));
    assert_eq!(texts(&tailer.poll()), ["a"]);
    let rotated = dir.join("0.log.20261123-101502");
    fs::rename(&log, &rotated).unwrap();
    append(&log, cri(&["b"]));
    assert_eq!(texts(&tailer.poll()), ["b"]);
    // Kubelet compresses to .tmp, renames to .gz, removes the plain file.
    gzip(&dir.join("0.log.20261123-101502.gz"), &cri(&["a"]));
    assert!(
        tailer.poll().is_empty(),
        "the plain and the gzipped file at once"
    );
    fs::remove_file(&rotated).unwrap();
    append(&log, cri(&["c"]));
    assert_eq!(texts(&tailer.poll()), ["c"]);
    assert!(tailer.poll().is_empty());
}

#[test]
fn a_rotation_undone_is_not_read_twice() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, cri(&["history"]));
    let mut tailer = from_end(&node);
    append(&log, cri(&["a"]));
    assert_eq!(texts(&tailer.poll()), ["a"]);
    // Kubelet renames, the runtime fails to reopen, kubelet renames back.
    let rotated = dir.join("0.log.20261123-101502");
    fs::rename(&log, &rotated).unwrap();
    append(&rotated, cri(&["b"]));
    assert_eq!(texts(&tailer.poll()), ["b"]);
    fs::rename(&rotated, &log).unwrap();
    append(&log, cri(&["c"]));
    assert_eq!(texts(&tailer.poll()), ["c"]);
    // Undone before the old fd was drained: it goes on as the live one.
    fs::rename(&log, &rotated).unwrap();
    tailer.follower.discover();
    fs::rename(&rotated, &log).unwrap();
    append(&log, cri(&["d"]));
    assert_eq!(texts(&tailer.poll()), ["d"]);
    assert_eq!(
        tailer.stats().files,
        2,
        "reopened once, after the first undo"
    );
}

#[test]
fn a_file_rotated_before_it_was_seen_is_read_then_the_live_one() {
    let node = Node::new();
    node.container("pytorch");
    let mut tailer = from_end(&node);
    let dir = node.container("burst");
    append(&dir.join("0.log.20261123-101502"), cri(&["burst 1"]));
    append(&dir.join("0.log"), cri(&["burst 2"]));
    assert_eq!(texts(&tailer.poll()), ["burst 1", "burst 2"]);
    assert!(tailer.poll().is_empty());
}

#[test]
fn docker_split_lines_are_joined_and_rotation_drains_the_old_file() {
    let node = Node::new();
    let dir = node.docker_dir();
    let log = dir.join(format!("{ID}-json.log"));
    append(&log, docker_line("old\n", &ts(10, 0, 0)));
    let mut tailer = from_end(&node);
    let t = ts(10, 15, 2);
    append(&log, docker_line("RuntimeError: unable to allocate ", &t));
    append(&log, docker_line("shared memory(shm)\n", &t));
    let lines = tailer.poll();
    assert_eq!(
        texts(&lines),
        ["RuntimeError: unable to allocate shared memory(shm)"]
    );
    assert_eq!(lines[0].origin, ContainerRef::by_id(ID, None));
    append(&log, docker_line("unread\n", &t));
    fs::rename(&log, dir.join(format!("{ID}-json.log.1"))).unwrap();
    append(&log, docker_line("new file\n", &t));
    assert_eq!(texts(&tailer.poll()), ["unread", "new file"]);
}

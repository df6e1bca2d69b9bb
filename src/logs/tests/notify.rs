//! serve's inotify: idle files are not looked at, a write or a new file is read by the next poll,
//! and the periodic full poll catches what a lost watch would have missed.

use super::*;

/// serve's tailer with inotify deciding, and no full poll in the test's lifetime.
fn notified(node: &Node) -> LogTailer {
    let mut tailer = LogTailer::from_end(node.settings());
    tailer.follower.safety = Duration::from_secs(3600);
    assert!(tailer.follower.is_notified(), "inotify is there");
    tailer.poll(); // the first poll reads everything once
    tailer
}

#[test]
fn idle_files_are_not_read_and_a_write_is_read_by_the_next_poll() {
    let node = Node::new();
    let a = node.container("a").join("0.log");
    let b = node.container("b").join("0.log");
    append(&a, cri(&["old"]));
    append(&b, "");
    append(&node.docker_dir().join(format!("{ID}-json.log")), "");
    let mut tailer = notified(&node);
    // The two roots, the pod, its two containers, `containers`, the Docker container.
    assert_eq!(tailer.follower.notifier().unwrap().watches(), 7);
    let visits = tailer.follower.visits;
    let walks = tailer.follower.walks;
    for _ in 0..5 {
        assert!(tailer.poll().is_empty());
    }
    assert_eq!(
        tailer.follower.visits, visits,
        "no directory read while idle"
    );
    assert_eq!(
        tailer.follower.walks, walks,
        "no walk while nothing changed"
    );

    append(&a, cri(&[SHM]));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), [SHM]);
    assert_eq!(lines[0].origin, pod("a"));
    assert_eq!(
        tailer.follower.visits,
        visits + 1,
        "only the directory written to"
    );
    assert_eq!(
        tailer.follower.walks, walks,
        "an append is no change of the tree"
    );
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.follower.visits, visits + 1);

    append(
        &node.docker_dir().join(format!("{ID}-json.log")),
        docker_line("docker says\n", &ts(10, 15, 2)),
    );
    assert_eq!(texts(&tailer.poll()), ["docker says"]);
}

#[test]
fn new_pods_containers_and_rotations_are_read_without_waiting_for_a_full_poll() {
    let node = Node::new();
    let a = node.container("a").join("0.log");
    append(&a, "");
    let mut tailer = notified(&node);

    // A new container directory in the existing pod, then a new pod.
    append(&node.container("b").join("0.log"), cri(&["b started"]));
    assert_eq!(texts(&tailer.poll()), ["b started"]);
    let other_pod = node
        .pods()
        .join("ml-team_other-0_11111111-2222-3333-4444-555555555555/c");
    fs::create_dir_all(&other_pod).unwrap();
    append(&other_pod.join("0.log"), cri(&["c started"]));
    assert_eq!(texts(&tailer.poll()), ["c started"]);
    // Its writes are watched too.
    append(&other_pod.join("0.log"), cri(&[SHM]));
    assert_eq!(texts(&tailer.poll()), [SHM]);

    // Rotation: the old file drained first, then the new one.
    append(&a, cri(&["before rotation"]));
    fs::rename(&a, node.container("a").join("0.log.20261123-101503")).unwrap();
    append(&a, cri(&["after rotation"]));
    assert_eq!(texts(&tailer.poll()), ["before rotation", "after rotation"]);
    // A restart's new file.
    append(&node.container("a").join("1.log"), cri(&["restarted"]));
    assert_eq!(texts(&tailer.poll()), ["restarted"]);

    // A Docker container appears.
    let other = "ab".repeat(32);
    let dir = node.docker().join("containers").join(&other);
    fs::create_dir(&dir).unwrap();
    append(
        &dir.join(format!("{other}-json.log")),
        docker_line("new docker container\n", &ts(10, 15, 2)),
    );
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["new docker container"]);
    assert_eq!(lines[0].origin, ContainerRef::by_id(&other, None));
}

#[test]
fn what_one_poll_leaves_unread_is_read_by_the_next_without_a_new_write() {
    let node = Node::new();
    let log = node.container("flood").join("0.log");
    append(&log, "");
    let mut tailer = notified(&node);
    // More than one poll's budget (4 MiB), the failure last.
    let filler = "x".repeat(1000);
    let mut text = cri(&vec![filler.as_str(); 6000]);
    text.push_str(&cri(&[SHM]));
    append(&log, text);
    let mut found = Vec::new();
    for _ in 0..4 {
        found.extend(
            tailer
                .poll()
                .into_iter()
                .filter(|l| l.text == SHM)
                .map(|l| l.text),
        );
    }
    assert_eq!(found, [SHM], "read to its end over the next polls");
}

#[test]
fn a_lost_watch_is_caught_by_the_full_poll() {
    let node = Node::new();
    let a = node.container("a").join("0.log");
    append(&a, "");
    let mut tailer = notified(&node);
    let key = (0, format!("{POD}/a"));
    tailer.follower.notifier().unwrap().forget(&key);
    append(&a, cri(&[SHM]));
    assert!(
        tailer.poll().is_empty(),
        "nothing tells of the write: not read before the full poll"
    );
    tailer.follower.safety = Duration::ZERO;
    assert_eq!(texts(&tailer.poll()), [SHM]);
    // The full poll's walk watches the directory again.
    tailer.follower.safety = Duration::from_secs(3600);
    append(&a, cri(&["watched again"]));
    assert_eq!(texts(&tailer.poll()), ["watched again"]);
}

#[test]
fn a_removed_container_directory_is_dropped_and_its_watches_with_it() {
    let node = Node::new();
    append(&node.container("a").join("0.log"), "");
    append(&node.container("b").join("0.log"), "");
    let mut tailer = notified(&node);
    assert_eq!(tailer.follower.tracked(), 2);
    fs::remove_dir_all(node.container("b")).unwrap();
    tailer.poll();
    tailer.poll();
    assert_eq!(tailer.follower.tracked(), 1);
    // Roots, `containers`, the pod, "a" (no Docker container directory here).
    assert_eq!(tailer.follower.notifier().unwrap().watches(), 5);
}

#[test]
fn a_file_written_on_after_its_first_read_in_a_new_directory_is_read_to_its_end() {
    let node = Node::new();
    let mut tailer = notified(&node);
    let long = cri(&[&"x".repeat(60_000)]);
    let log = node.container("late").join("0.log");
    append(&log, long.repeat(9));
    let mut n = tailer.poll().len();
    append(&log, long.repeat(118));
    for _ in 0..5 {
        n += tailer.poll().len();
    }
    assert_eq!(n, 127);
}

/// Issue 36: past the agent's cap of watches a new container directory is refused (counted
/// once as an error), the follower polls every file instead, and its lines are still read.
#[test]
fn past_the_cap_of_watches_a_new_directory_is_polled_and_counted_once() {
    let node = Node::new();
    append(&node.container("a").join("0.log"), cri(&["old"]));
    let mut tailer = notified(&node);
    let held = tailer.follower.notifier().unwrap().watches();
    tailer.follower.notifier().unwrap().set_max_watches(held);
    let errors = tailer.stats().errors;
    let b = node.container("b").join("0.log");
    append(&b, "");
    tailer.poll();
    tailer.poll();
    append(&b, cri(&[SHM]));
    assert_eq!(texts(&tailer.poll()), [SHM], "read by polling");
    assert_eq!(tailer.follower.notifier().unwrap().watches(), held);
    assert_eq!(tailer.stats().errors, errors + 1);
    for _ in 0..3 {
        tailer.poll();
    }
    assert_eq!(tailer.stats().errors, errors + 1, "counted once");
    // A directory watched already is not refused at the cap: "a" is still read.
    append(&node.container("a").join("0.log"), cri(&["again"]));
    assert_eq!(texts(&tailer.poll()), ["again"]);
}

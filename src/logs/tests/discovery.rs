//! Discovery: a still tree is stat'ed, not listed; a changed or missing directory is listed again.

use super::*;

/// Sets the mtime of every directory under `root` (and of `root`) to a minute ago, as a tree
/// nobody has touched for a while looks.
fn age_dirs(root: &Path) {
    let ago = SystemTime::now() - Duration::from_secs(60);
    File::open(root).unwrap().set_modified(ago).unwrap();
    for entry in fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            age_dirs(&entry.path());
        }
    }
}

#[test]
fn discovery_lists_again_only_when_a_directory_changed() {
    let node = Node::new();
    let a = node.container("a").join("0.log");
    append(&a, "");
    let id_dir = node.docker_dir();
    append(&id_dir.join(format!("{ID}-json.log")), "");
    age_dirs(node.tmp.path());
    let mut tailer = from_end(&node);
    assert_eq!(tailer.follower.walks, 1);
    assert!(tailer.poll().is_empty());
    assert_eq!(
        tailer.follower.walks, 1,
        "a still tree is stat'ed, not listed"
    );
    // Appends change no directory: read all the same.
    append(&a, cri(&["appended"]));
    assert_eq!(texts(&tailer.poll()), ["appended"]);
    assert_eq!(tailer.follower.walks, 1);

    // A new container: its pod directory changed.
    append(&node.container("b").join("0.log"), cri(&[SHM]));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), [SHM]);
    assert_eq!(lines[0].origin, pod("b"));
    assert_eq!(tailer.follower.walks, 2);
    // Just changed: listed again until it has been still for a while.
    tailer.poll();
    assert_eq!(tailer.follower.walks, 3);
    age_dirs(node.tmp.path());
    tailer.poll();
    tailer.poll();
    assert_eq!(tailer.follower.walks, 4);

    // Rotation renames in the container's directory.
    fs::rename(&a, node.container("a").join("0.log.20261123-101503")).unwrap();
    append(&a, cri(&["after rotation"]));
    assert_eq!(texts(&tailer.poll()), ["after rotation"]);
    assert_eq!(tailer.follower.walks, 5);

    // Docker: a container directory appears under a still `containers`.
    age_dirs(node.tmp.path());
    tailer.poll();
    let walks = tailer.follower.walks;
    tailer.poll();
    assert_eq!(tailer.follower.walks, walks);
    let other = "ab".repeat(32);
    let other_dir = node.docker().join("containers").join(&other);
    fs::create_dir(&other_dir).unwrap();
    append(
        &other_dir.join(format!("{other}-json.log")),
        docker_line(
            "Error while creating shared memory segment /dev/shm/nccl-x (size 9)\n",
            &ts(10, 15, 2),
        ),
    );
    let lines = tailer.poll();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].origin, ContainerRef::by_id(&other, None));
}

#[test]
fn a_root_that_is_missing_is_looked_for_again() {
    let node = Node::new();
    fs::remove_dir_all(node.pods()).unwrap();
    age_dirs(node.tmp.path());
    let mut tailer = from_end(&node);
    tailer.poll();
    let walks = tailer.follower.walks;
    tailer.poll();
    assert!(
        tailer.follower.walks > walks,
        "a missing root is never trusted to stay missing"
    );
    append(&node.container("late").join("0.log"), cri(&[SHM]));
    assert_eq!(texts(&tailer.poll()), [SHM]);
}

//! The roots: symlinks below them never followed, a symlinked root allowed, missing roots.

use std::os::unix::fs::symlink;

use super::*;

#[test]
fn symlinks_under_the_roots_are_never_followed() {
    let node = Node::new();
    let real = node.container("pytorch");
    append(&real.join("0.log"), cri(&["real"]));
    let outside = node.outside();
    let outside_ctr = outside.join("ns_pod_uid/ctr");
    fs::create_dir_all(&outside_ctr).unwrap();
    append(&outside_ctr.join("0.log"), cri(&["SECRET outside"]));
    append(&outside.join("secret.log"), cri(&["SECRET file"]));
    // A pod dir pointing outside and inside the root.
    symlink(
        outside.join("ns_pod_uid"),
        node.pods().join("evil_out_uid1"),
    )
    .unwrap();
    symlink(node.pods().join(POD), node.pods().join("evil_in_uid2")).unwrap();
    // A container dir pointing outside and inside.
    symlink(&outside_ctr, node.pods().join(POD).join("linked-out")).unwrap();
    symlink(&real, node.pods().join(POD).join("linked-in")).unwrap();
    // Log files pointing outside and inside.
    symlink(outside.join("secret.log"), real.join("1.log")).unwrap();
    symlink(real.join("0.log"), real.join("2.log")).unwrap();
    symlink(
        outside.join("secret.log"),
        real.join("0.log.20261123-101502"),
    )
    .unwrap();
    // Docker: the id dir and the log file.
    let id2 = "a".repeat(64);
    symlink(&outside_ctr, node.docker().join("containers").join(&id2)).unwrap();
    let dir = node.docker_dir();
    symlink(
        outside.join("secret.log"),
        dir.join(format!("{ID}-json.log")),
    )
    .unwrap();

    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["real"]);
    assert_eq!(lines[0].origin, pod("pytorch"));
    assert_eq!(tailer.stats().errors, 0);
    assert_eq!(tailer.stats().files, 1);

    let mut tailer = from_end(&node);
    append(&outside.join("secret.log"), cri(&["SECRET later"]));
    append(&outside_ctr.join("0.log"), cri(&["SECRET later"]));
    append(&real.join("0.log"), cri(&["real later"]));
    assert_eq!(texts(&tailer.poll()), ["real later"]);
}

/// Someone with write access to the log directory hard-links a host file into it: no symlink
/// to refuse, but the file has two names, which a runtime's log never has.
#[test]
fn a_hard_linked_file_is_not_read_as_a_log() {
    let node = Node::new();
    let real = node.container("pytorch");
    append(&real.join("0.log"), cri(&["real"]));
    let outside = node.outside();
    fs::create_dir_all(&outside).unwrap();
    append(&outside.join("shadow"), cri(&["SECRET host file"]));
    fs::hard_link(outside.join("shadow"), real.join("1.log")).unwrap();
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["real"]);
    assert_eq!(tailer.stats().errors, 1, "counted");
}

#[test]
fn a_symlinked_docker_containers_dir_is_ignored() {
    let node = Node::new();
    let outside = node.outside().join("containers").join(ID);
    fs::create_dir_all(&outside).unwrap();
    append(
        &outside.join(format!("{ID}-json.log")),
        docker_line("SECRET\n", &ts(10, 0, 0)),
    );
    fs::remove_dir(node.docker().join("containers")).unwrap();
    symlink(
        node.outside().join("containers"),
        node.docker().join("containers"),
    )
    .unwrap();
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.stats().errors, 0);
}

#[test]
fn a_symlinked_root_is_the_admins_choice() {
    let node = Node::new();
    append(&node.container("pytorch").join("0.log"), cri(&["via link"]));
    let link = node.tmp.path().join("pods-link");
    symlink(node.pods(), &link).unwrap();
    let settings = LogSettings {
        pod_log_root: Some(link),
        ..LogSettings::default()
    };
    let mut tailer = eager(LogTailer::since(settings, SystemTime::UNIX_EPOCH));
    assert_eq!(texts(&tailer.poll()), ["via link"]);
}

#[test]
fn missing_roots_mean_no_logs_and_no_errors() {
    let node = Node::new();
    let settings = LogSettings {
        pod_log_root: Some(node.tmp.path().join("nope")),
        docker_root: Some(node.tmp.path().join("nope-either")),
        max_lines_per_sec: 0,
    };
    let mut tailer = eager(LogTailer::since(settings, SystemTime::UNIX_EPOCH));
    assert!(tailer.poll().is_empty());
    let mut tailer = eager(LogTailer::from_end(LogSettings::default()));
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.stats(), LogStats::default());
    // A docker root without containers/.
    fs::remove_dir(node.docker().join("containers")).unwrap();
    let mut tailer = from_end(&node);
    assert!(tailer.poll().is_empty());
    assert_eq!(tailer.stats().errors, 0);
}

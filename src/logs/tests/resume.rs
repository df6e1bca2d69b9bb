//! serve started again from its saved positions (`logs::resume`): every line once.

use super::*;

/// A checkpoint taken a second ago, so that files written now are "written since".
fn saved(tailer: &LogTailer) -> crate::logs::resume::LogCheckpoints {
    let mut c = tailer.checkpoints();
    c.at -= Duration::from_secs(1);
    c
}

#[test]
fn a_restart_reads_on_from_the_saved_position() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri(&["before start"]));
    let mut first = from_end(&node);
    append(&log, cri(&["told once"]));
    assert_eq!(texts(&first.poll()), ["told once"]);
    // A line not yet ended is not past the position: read whole after the restart.
    append(&log, "2026-11-23T10:15:02.000000000Z stdout F half a");
    assert!(first.poll().is_empty());
    let checkpoint = saved(&first);
    drop(first);
    append(&log, " line\n");
    append(&log, cri(&["while down"]));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    assert_eq!(texts(&second.poll()), ["half a line", "while down"]);
    append(&log, cri(&["after"]));
    assert_eq!(texts(&second.poll()), ["after"]);
    assert_eq!(second.resume_mismatches(), 0);
}

#[test]
fn a_rotation_while_down_is_read_on_and_the_new_file_whole() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, cri(&["old"]));
    let mut first = from_end(&node);
    append(&log, cri(&["told"]));
    assert_eq!(texts(&first.poll()), ["told"]);
    let checkpoint = saved(&first);
    drop(first);
    append(&log, cri(&["before rotation"]));
    fs::rename(&log, dir.join("0.log.20261123-101502")).unwrap();
    append(&log, cri(&["new file", SHM]));
    // A container started while down.
    append(&node.container("other").join("0.log"), cri(&["its first"]));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    let mut got = texts(&second.poll())
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    got.sort();
    let mut want = ["before rotation", "new file", SHM, "its first"].map(String::from);
    want.sort();
    assert_eq!(got, want);
    assert!(second.poll().is_empty());
}

#[test]
fn a_reused_inode_is_read_as_another_file_and_old_files_are_not_read_as_new() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, cri(&["first"]));
    let first = from_end(&node);
    let mut checkpoint = saved(&first);
    drop(first);
    // Another file's first line in the saved inode: its position is not trusted; written
    // since the checkpoint, it is another file, read whole.
    checkpoint.files[0].fingerprint ^= 1;
    append(&log, cri(&["after the checkpoint"]));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    assert_eq!(
        texts(&second.poll()),
        ["first", "after the checkpoint"],
        "another file: read whole"
    );
    assert_eq!(second.resume_mismatches(), 1);
    assert_eq!(second.stats().resume_mismatches, 1);
    append(&log, cri(&["later"]));
    assert_eq!(texts(&second.poll()), ["later"]);

    // A file unseen and not written since the checkpoint: from its end.
    let old = node.container("old").join("0.log");
    append(&old, cri(&["long ago"]));
    set_mtime(&old, SystemTime::now() - Duration::from_secs(3600));
    let checkpoint = saved(&second);
    drop(second);
    let mut third = eager(LogTailer::resume(node.settings(), checkpoint));
    assert!(third.poll().is_empty());
}

#[test]
fn a_file_rotated_and_compressed_while_down_is_read_on_past_its_offset() {
    let node = Node::new();
    let dir = node.container("pytorch");
    let log = dir.join("0.log");
    append(&log, cri(&["first"]));
    let mut first = from_end(&node);
    append(&log, cri(&["told"]));
    assert_eq!(texts(&first.poll()), ["told"]);
    let checkpoint = saved(&first);
    drop(first);
    // While down: more lines, a rotation, then kubelet compresses it and removes the plain one.
    append(&log, cri(&["unread before rotation"]));
    let whole = fs::read_to_string(&log).unwrap();
    fs::remove_file(&log).unwrap();
    gzip(&dir.join("0.log.20261123-101502.gz"), &whole);
    append(&log, cri(&["new file"]));
    // A rotation there before the checkpoint, compressed while down: history.
    gzip(
        &dir.join("0.log.20261123-090000.gz"),
        &cri_at(&ts(9, 0, 0), &["old"]),
    );
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    assert_eq!(
        texts(&second.poll()),
        ["unread before rotation", "new file"]
    );
}

#[test]
fn a_docker_log_rotated_while_down_is_read_on() {
    let node = Node::new();
    let dir = node.docker_dir();
    let log = dir.join(format!("{ID}-json.log"));
    append(&log, docker_line("first\n", &ts(10, 0, 0)));
    let mut first = from_end(&node);
    append(&log, docker_line("told\n", &ts(10, 0, 1)));
    assert_eq!(texts(&first.poll()), ["told"]);
    let checkpoint = saved(&first);
    drop(first);
    append(&log, docker_line("while down\n", &ts(10, 0, 2)));
    fs::rename(&log, dir.join(format!("{ID}-json.log.1"))).unwrap();
    append(&log, docker_line("after rotation\n", &ts(10, 0, 3)));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    assert_eq!(texts(&second.poll()), ["while down", "after rotation"]);
}

#[test]
fn a_line_whose_parts_were_being_joined_is_read_again_whole() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri(&["first"]));
    let mut first = from_end(&node);
    let at = ts(10, 15, 3);
    append(
        &log,
        format!("{at} stderr P RuntimeError: unable to allocate \n"),
    );
    assert!(first.poll().is_empty());
    let checkpoint = saved(&first);
    drop(first);
    append(&log, format!("{at} stderr F shared memory(shm)\n"));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    assert_eq!(
        texts(&second.poll()),
        ["RuntimeError: unable to allocate shared memory(shm)"]
    );
}

#[test]
fn a_line_handed_on_while_parts_were_joined_is_not_read_again() {
    let node = Node::new();
    let log = node.container("pytorch").join("0.log");
    append(&log, cri(&["first"]));
    let mut first = from_end(&node);
    let at = ts(10, 15, 3);
    append(&log, format!("{at} stdout P a long progress line \n"));
    append(&log, cri(&[SHM]));
    assert_eq!(texts(&first.poll()), [SHM]);
    let checkpoint = saved(&first);
    drop(first);
    append(&log, format!("{at} stdout F ends here\n"));
    let mut second = eager(LogTailer::resume(node.settings(), checkpoint));
    // Told once; the joined line's head is lost (its rest read alone).
    assert_eq!(texts(&second.poll()), ["ends here"]);
}

//! What someone who can write into the log directories (or a workload into its own log) may
//! put there: FIFOs and devices named as logs, a line of 1 GiB, a gzip bomb.

use std::sync::mpsc;

use rustix::fs::{FileType, Mode, CWD};

use super::*;

/// Polls on another thread; None when it did not return within `within` (blocked).
fn poll_within(mut tailer: LogTailer, within: Duration) -> Option<(LogTailer, Vec<LogLine>)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let lines = tailer.poll();
        let _ = tx.send((tailer, lines));
    });
    rx.recv_timeout(within).ok()
}

#[test]
fn fifos_and_devices_named_as_logs_are_never_read_and_never_block() {
    let node = Node::new();
    let fifo = node.container("fifo").join("0.log");
    rustix::fs::mknodat(CWD, &fifo, FileType::Fifo, Mode::from(0o644), 0).unwrap();
    // /dev/zero's numbers: read, it would never end.
    let zero = node.docker_dir().join(format!("{ID}-json.log"));
    let device = rustix::fs::mknodat(
        CWD,
        &zero,
        FileType::CharacterDevice,
        Mode::from(0o644),
        rustix::fs::makedev(1, 5),
    );
    if device.is_err() {
        eprintln!("SKIPPED in part: mknod of a device needs CAP_MKNOD; the FIFO is tested");
    }
    let real = node.container("real").join("0.log");
    append(&real, cri(&[SHM]));
    let tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let (mut tailer, lines) =
        poll_within(tailer, Duration::from_secs(10)).expect("a poll that returns");
    assert_eq!(texts(&lines), [SHM]);
    assert_eq!(
        tailer.stats().files,
        1,
        "only the regular file is opened to be read"
    );
    // A writer on the FIFO changes nothing.
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    (&writer)
        .write_all(cri(&["from a fifo"]).as_bytes())
        .unwrap();
    append(&real, cri(&["after"]));
    assert_eq!(texts(&tailer.poll()), ["after"]);
}

#[test]
fn a_line_of_one_gib_is_cut_at_max_line_and_the_next_line_is_read() {
    let node = Node::new();
    let log = node.container("huge").join("0.log");
    append(&log, "");
    // serve's follow: the line is written after the tailer started, and read 4 MiB a poll.
    let mut tailer = from_end(&node);
    assert!(tailer.poll().is_empty());
    // A sparse file: 1 GiB of NUL bytes after the CRI head, no disk written.
    append(&log, format!("{} stdout F ", ts(10, 15, 2)));
    let f = File::options().write(true).open(&log).unwrap();
    let head = f.metadata().unwrap().len();
    f.set_len(head + (1 << 30)).unwrap();
    append(&log, "\n");
    append(&log, cri(&[SHM]));
    let mut lines = Vec::new();
    for _ in 0..400 {
        lines.extend(tailer.poll());
        if lines.iter().any(|l| l.text == SHM) {
            break;
        }
    }
    assert_eq!(
        lines.len(),
        2,
        "the huge line, then the next; read {}",
        tailer.stats().bytes
    );
    assert!(lines[0].is_truncated());
    assert_eq!(lines[0].text.len(), MAX_LINE + TRUNCATED_MARK.len());
    assert_eq!(lines[1].text, SHM);
}

#[test]
fn check_reads_the_newest_256_mib_of_a_larger_log_and_says_what_it_skipped() {
    let node = Node::new();
    let log = node.container("long").join("0.log");
    append(&log, cri(&["oldest: not read"]));
    // 300 MiB of one sparse line (no disk written), then the lines that matter.
    append(&log, format!("{} stdout F ", ts(10, 15, 2)));
    let f = File::options().write(true).open(&log).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + (300 << 20)).unwrap();
    append(&log, "\n");
    append(&log, cri(&["middle", SHM]));
    let size = std::fs::metadata(&log).unwrap().len();
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let lines = tailer.poll();
    // Begun inside the sparse line: its tail is dropped, not taken for a line.
    assert_eq!(texts(&lines), ["middle", SHM], "the last line is read");
    assert_eq!(tailer.unread_bytes(), size - (256 << 20));
    let read = tailer.stats().bytes;
    assert!(read <= (256 << 20) + 1, "{read}");
}

#[test]
fn a_gzip_bomb_is_read_no_further_than_its_trailer_says() {
    let node = Node::new();
    let dir = node.container("bomb");
    // One member of 1 MiB of lines, repeated: 2 GiB decompressed from a file of a few MiB.
    let mut member = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    member
        .write_all(cri(&[&"b".repeat(1000)]).repeat(1 << 10).as_bytes())
        .unwrap();
    let member = member.finish().unwrap();
    let gz = dir.join("0.log.20261126-031500.gz");
    let mut file = File::create(&gz).unwrap();
    for _ in 0..2048 {
        file.write_all(&member).unwrap();
    }
    drop(file);
    append(&dir.join("0.log"), cri(&[SHM]));
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let lines = tailer.poll_matching(|t| t.ends_with(SHM.as_bytes()));
    // Its trailer says 1 MiB (its last member's): that much is read of it, and the newer
    // live file after it.
    assert_eq!(texts(&lines), [SHM]);
    let read = tailer.stats().bytes;
    assert!(read <= 2 << 20, "{read}");
    assert_eq!(tailer.unread_bytes(), 0);
}

#[test]
fn rotations_older_than_the_newest_256_mib_are_not_read() {
    let node = Node::new();
    let dir = node.container("rotated");
    // Oldest first: a gzipped rotation, a 300 MiB plain one (sparse but for its lines), live.
    gzip(&dir.join("0.log.20261126-031500.gz"), &cri(&["in the gz"]));
    let plain = dir.join("0.log.20261126-041500");
    append(&plain, cri(&["old plain"]));
    let f = File::options().write(true).open(&plain).unwrap();
    f.set_len(f.metadata().unwrap().len() + (300 << 20))
        .unwrap();
    append(&plain, "\n");
    append(&plain, cri(&["newest of the rotated"]));
    append(&dir.join("0.log"), cri(&[SHM]));
    let mut tailer = eager(LogTailer::since(node.settings(), SystemTime::UNIX_EPOCH));
    let lines = tailer.poll();
    assert_eq!(texts(&lines), ["newest of the rotated", SHM]);
    assert!(
        tailer.unread_bytes() > 44 << 20,
        "{}",
        tailer.unread_bytes()
    );
}

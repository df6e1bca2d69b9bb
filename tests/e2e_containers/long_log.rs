//! `check --since` over one container's 296 MiB CRI log, whose last line is its death: the
//! catch-up reads the log's newest 256 MiB, so the last line is told, and what it did not read
//! is said on stderr. No root needed: the log is a file in a temporary pod log root.

use crate::common;

use std::io::Write;

const MIB: u64 = 1 << 20;

fn death(n: u32, at: &str) -> String {
    format!("{at} stderr F RuntimeError: unable to write to file </torch_{n}_1_0>: No space left on device (28)\n")
}

/// Writes the log: filler lines, with deaths at 148 MiB, at 255 MiB and as the last line.
fn write_log(path: &std::path::Path, at: &str) -> u64 {
    let filler = format!(
        "{at} stdout F step 1234 loss 0.4321 lr 0.0001 {}\n",
        "x".repeat(60)
    );
    let block = filler.repeat((MIB as usize) / filler.len());
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut written = 0u64;
    for (n, end) in [(1, 148 * MIB), (2, 255 * MIB), (3, 296 * MIB - 200)] {
        while written + block.len() as u64 <= end {
            f.write_all(block.as_bytes()).unwrap();
            written += block.len() as u64;
        }
        let line = death(n, at);
        f.write_all(line.as_bytes()).unwrap();
        written += line.len() as u64;
    }
    f.flush().unwrap();
    written
}

#[test]
fn check_tells_the_death_on_the_last_line_of_a_296_mib_log() {
    let (root, dir) = common::trainer_log_dir();
    let log = dir.join("0.log");
    let at = common::time_ago(std::time::Duration::from_secs(300));
    let size = write_log(&log, &at);
    assert!(size > 290 * MIB);

    let out = common::run_check(&[
        "--json",
        "--kube",
        "off",
        "--pod-log-root",
        &root.path().to_string_lossy(),
        "--docker-root",
        "off",
        "--kmsg",
        "off",
        "--since",
        "1h",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let told: Vec<&str> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["evidence"].as_str())
        .collect();
    for n in 1..=3 {
        let file = format!("</torch_{n}_1_0>");
        assert!(
            told.iter().any(|e| e.contains(&file)),
            "{file} not told: {told:#?}"
        );
    }
    // Said, with the file and how much of it was not read: 296 - 256 MiB.
    let unread = (size - 256 * MIB) as f64 / MIB as f64;
    let said = stderr.lines().find(|l| l.contains(&*log.to_string_lossy()));
    let said = said.unwrap_or_else(|| panic!("the skip is not said: {stderr}"));
    assert!(
        said.contains(&format!("{unread:.1} MiB")) && said.contains("not read"),
        "{said}"
    );
}

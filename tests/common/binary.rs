//! The agent's binary run once: `shmlink check` and its JSON, and the peak memory of a run.

use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

pub fn shmlink_bin() -> &'static str {
    // The machine's own logs are no test's business: its kernel log holds other tests'
    // crashes. Nor is its /var/lib/shmlink: a `serve` run on the machine within the hour left
    // its failures there, which every `check` reads back. A test that reads a source or a
    // store names it on the command line (options beat these).
    static QUIET: OnceLock<()> = OnceLock::new();
    QUIET.get_or_init(|| {
        for var in [
            "SHMLINK_KMSG",
            "SHMLINK_POD_LOG_ROOT",
            "SHMLINK_DOCKER_ROOT",
        ] {
            std::env::set_var(var, "off");
        }
        std::env::set_var("SHMLINK_STATE_DIR", "none");
    });
    env!("CARGO_BIN_EXE_shmlink")
}
/// `shmlink check --no-gpu ARGS`.
pub fn run_check(args: &[&str]) -> Output {
    Command::new(shmlink_bin())
        .arg("check")
        .arg("--no-gpu")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running shmlink check")
}

/// A command's stdout and its peak RSS in MiB (wait4's rusage: the kernel's high-water mark,
/// which no sampling misses). It starts from the test process's own peak at the spawn (exec
/// keeps the old memory's high-water mark), so a test that measures keeps its own heap small.
// Reaped by wait4 below, for its rusage, which Child::wait does not give.
#[allow(clippy::zombie_processes)]
pub fn output_and_peak_rss(command: &mut Command) -> (Vec<u8>, f64) {
    let child = command.stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
    // SAFETY: plain out-parameters; the child is ours and not waited for elsewhere.
    let usage = unsafe {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        usage
    };
    (out, usage.ru_maxrss as f64 / 1024.0)
}

/// A running process's peak RSS so far in MiB (VmHWM).
pub fn peak_rss_of(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The `shm` entry of a `check --json` report for one container.
pub fn shm_entry(report: &Value, container_id: &str) -> Option<Value> {
    report["shm"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == container_id)
        .cloned()
}

/// `check --json`: the report, whatever the findings (other tests' containers may be full).
pub fn run_check_json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = run_check(&all);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "check failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

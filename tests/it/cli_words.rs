//! Issue 37's small list, through the binary (no root): Docker's sizes, host names for
//! `--listen`, an error that says its cause once, and the words of `check` over a node whose
//! failures come from files (CRI logs and a kernel log in /dev/kmsg's format).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

fn shmlink() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shmlink"));
    for var in [
        "SHMLINK_KMSG",
        "SHMLINK_POD_LOG_ROOT",
        "SHMLINK_DOCKER_ROOT",
    ] {
        c.env(var, "off");
    }
    c.env("SHMLINK_STATE_DIR", "none");
    c.stdin(Stdio::null());
    c
}

#[test]
fn min_shm_takes_dockers_8gb() {
    let out = shmlink()
        .args(["preflight", "--no-gpu", "--json", "--min-shm", "8GB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect(&stderr);
    assert_eq!(
        report["need"]["bytes"],
        8u64 << 30,
        "8GB is 8 GiB, as docker takes it"
    );
}

/// `--listen localhost:PORT` binds the loopback; a port in use is one line saying its cause once.
#[test]
fn listen_takes_localhost_and_a_taken_port_is_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = shmlink()
        .args(["serve", "--no-gpu", "--kube", "off", "--death-trace", "off"])
        // The host's /var/lib/shmlink is no test's: a store there is read by every `check`.
        .args(["--state-dir", "none"])
        .args(["--listen", &format!("localhost:{port}")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("shmlink: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        line.starts_with(&format!("shmlink: listening on 127.0.0.1:{port}: ")),
        "{line}"
    );
    assert_eq!(line.matches("Address already in use").count(), 1, "{line}");

    let out = shmlink()
        .args(["serve", "--listen", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no port"));
}

/// The boot-time clock's offset in the time namespace `check` runs in below: a day, so records
/// placed minutes before now are never before the boot (a record's time is microseconds since
/// boot; on a machine booted 23 minutes ago one 50 minutes old would saturate at the boot).
const BOOT_OFFSET_SECS: &str = "86400";

/// `cmd` run in a new time namespace whose CLOCK_BOOTTIME is BOOT_OFFSET_SECS ahead of the
/// host's (the realtime clock is not offset): the boot `check` puts kernel records after is a
/// day back. Root needs no user namespace, and keeps its capabilities over the host's /proc.
fn in_time_namespace(cmd: Command) -> Command {
    let mut c = Command::new("unshare");
    if !rustix::process::geteuid().is_root() {
        c.arg("--user");
    }
    c.args(["--time", "--boottime", BOOT_OFFSET_SECS, "--"]);
    c.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::null());
    c
}

/// Microseconds since boot now, as a process in `in_time_namespace` reads them. Asked inside
/// such a namespace, since offsets are from the host's clock, not this process's (a test run
/// in a time namespace of its own).
fn boot_clock_usec_in_time_namespace() -> u64 {
    let mut cat = Command::new("cat");
    cat.arg("/proc/uptime");
    let out = in_time_namespace(cat)
        .output()
        .expect("unshare (util-linux) runs");
    assert!(
        out.status.success(),
        "a time namespace (Linux 5.6+, CONFIG_TIME_NS) is needed to place kernel records \
         before a young boot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uptime: f64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("/proc/uptime's first field");
    (uptime * 1e6) as u64
}

/// A host of one process and no container (a cgroup v2 root holding PID 1, in the host's
/// namespaces): what the scan sees is the test's, not whatever else runs on the machine (a
/// container a user may not look into would make `check` blind, exit 2).
fn fake_host(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::symlink;
    let host = dir.join("host");
    let ns = host.join("proc/1/ns");
    std::fs::create_dir_all(&ns).unwrap();
    symlink("mnt:[4026531840]", ns.join("mnt")).unwrap();
    symlink("ipc:[4026531839]", ns.join("ipc")).unwrap();
    let cgroup = host.join("cgroup");
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), "1\n").unwrap();
    host
}

/// A CRI log line at `ago` before now.
fn cri_line(ago: Duration, text: &str) -> String {
    let at = k8s_openapi::jiff::Timestamp::try_from(SystemTime::now() - ago).unwrap();
    format!("{at} stderr F {text}\n")
}

/// `check` over three deaths of one container, one of another, and host processes' crashes in
/// the kernel log: grouped with counts, relative times, the workload's first.
#[test]
fn check_groups_failures_and_says_how_long_ago() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let logs = dir.join("logs");
    let worker = logs.join("ml_train-0_0b6c1f2e-1111-4222-8333-944455556666/worker");
    std::fs::create_dir_all(&worker).unwrap();
    let line = "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is \
                possible that workers are out of shared memory.";
    let mut log = String::new();
    for minutes in [40, 25, 12] {
        log.push_str(&cri_line(Duration::from_secs(minutes * 60), line));
    }
    std::fs::write(worker.join("0.log"), log).unwrap();
    let host = fake_host(dir);
    // The kernel's records are placed on the boot-time clock `check` will read, a day ahead of
    // the host's, so a record 50 minutes old is after the boot however young the machine is.
    let now_usec = boot_clock_usec_in_time_namespace();
    let mut kmsg = String::new();
    for (seq, minutes) in [50u64, 45, 2].iter().enumerate() {
        let usec = now_usec
            .checked_sub(minutes * 60_000_000)
            .expect("the namespace's boot is a day back");
        kmsg.push_str(&format!(
            "6,{seq},{usec},-;python[{}]: segfault at 10 ip 00007f3a2b4c5d6e sp 00007ffd1e2f3a40 \
             error 4 in libnccl.so.2[7f3a2b000000+1e00000]\n",
            30000 + seq
        ));
    }
    std::fs::write(dir.join("kmsg"), &kmsg).unwrap();
    let out = in_time_namespace(shmlink())
        .args([
            "check",
            "--no-gpu",
            "--kube",
            "off",
            "--since",
            "1h",
            "--state-dir",
            "none",
        ])
        .arg("--pod-log-root")
        .arg(&logs)
        .arg("--proc-root")
        .arg(host.join("proc"))
        .arg("--cgroup-root")
        .arg(host.join("cgroup"))
        .arg("--kmsg")
        .arg(dir.join("kmsg"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = text
        .find("  3x shm_allocation_failed  ml/train-0/worker  last 12 min ago, first 40 min ago\n")
        .unwrap_or_else(|| panic!("{text}"));
    let others = text
        .find("Kernel-log deaths of processes outside any known container:\n  3x gpu_job_crashed  last 2 min ago, first 50 min ago")
        .unwrap_or_else(|| panic!("{text}{}", String::from_utf8_lossy(&out.stderr)));
    assert!(own < others, "{text}");
    assert!(
        text.contains("could not allocate shared memory 12 min ago: "),
        "{text}"
    );
    assert!(!text.contains("CRITICAL"), "no failure told twice: {text}");
    let year = k8s_openapi::jiff::Timestamp::now().to_string()[..4].to_string();
    assert!(
        !text.contains(&format!("{year}-")),
        "no exact times in the table: {text}"
    );
}

/// `check --json` says what the fact tier named a failure from, and null for a row's match.
#[test]
fn check_json_says_the_facts_a_failure_was_named_from() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let dir = logs.join("ml_train-0_0b6c1f2e-1111-4222-8333-944455556666/worker");
    std::fs::create_dir_all(&dir).unwrap();
    let log = [
        cri_line(
            Duration::from_secs(600),
            "node-1:77:80 [3] transport/p2p.cc:1129 NCCL WARN Cuda failure 1 'invalid argument'",
        ),
        cri_line(
            Duration::from_secs(300),
            "RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on \
             device (28)",
        ),
    ]
    .concat();
    std::fs::write(dir.join("0.log"), log).unwrap();
    let out = shmlink()
        .args([
            "check", "--json", "--no-gpu", "--kube", "off", "--since", "1h",
        ])
        .args([
            "--state-dir",
            "none",
            "--kmsg",
            "off",
            "--docker-root",
            "off",
        ])
        .arg("--pod-log-root")
        .arg(&logs)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let failures = report["failures"].as_array().unwrap();
    let of = |kind: &str| {
        failures
            .iter()
            .find(|f| f["kind"] == kind)
            .unwrap_or_else(|| panic!("{kind}: {failures:#?}"))
    };
    let p2p = of("gpu_p2p_failed");
    let facts = "CUDA error 1 (cudaErrorInvalidValue) in NCCL's transport/p2p.cc, device 3 of the \
                 process";
    assert_eq!(p2p["named_from"], facts);
    assert!(p2p["message"]
        .as_str()
        .unwrap()
        .ends_with(&format!("Named from: {facts}.")));
    let row = of("shm_allocation_failed");
    assert!(row.as_object().unwrap().contains_key("named_from"));
    assert_eq!(row["named_from"], serde_json::Value::Null);
}

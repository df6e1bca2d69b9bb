//! Kernel records a process forges, for the real kernel: a process that names itself like the
//! NVIDIA driver and crashes in a file named like its message, and a crash in a file whose name
//! holds a newline and a whole crash line. Neither may become a GPU fault or a crash of PID 1.
//! Root only (/dev/kmsg and syslog(2)); gcc builds the programs.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use serde_json::Value;

/// A program that names itself `comm` (prctl) and dereferences NULL in its own text, built as
/// `dir/name`. None when gcc is missing (said).
fn crasher(dir: &Path, name: &str, comm: &str) -> Option<PathBuf> {
    common::crash::segfaulting(dir, name, Some(comm.as_bytes()))
}

/// One crash at a time across this file's tests: two CPUs printing crash lines at once make the
/// kernel log their ` in <file>` pieces apart, which the agent joins only when unambiguous.
static CRASHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs it; true once the kernel logged its segfault (the ring read with dmesg).
fn crash(bin: &Path, marker: &str) -> bool {
    let _one = CRASHING.lock().unwrap_or_else(|e| e.into_inner());
    let status = Command::new(bin).status().unwrap();
    assert!(!status.success(), "it was to crash");
    common::wait_until(Duration::from_secs(5), || {
        let out = Command::new("dmesg").output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains(marker)
    })
}

#[test]
fn a_process_named_like_the_driver_crashing_in_fallen_off_the_bus_is_no_xid_79() {
    if !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 15 bytes: the most a comm holds. GPU 0 of the board is at 0000:18:00.0.
    let Some(bin) = crasher(dir.path(), "fallen off the bus", "NVRM: GPU 18:0 ") else {
        return;
    };
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let agent = Agent::start_gpu(&fake, &["--kmsg", "/dev/kmsg"]);
    assert!(
        crash(&bin, "in fallen off the bus["),
        "the kernel did not log the crash (show_unhandled_signals off?)"
    );
    // The agent reads the kernel log every 200 ms: give it ten polls.
    std::thread::sleep(Duration::from_secs(2));
    let body = agent.metrics();
    assert_eq!(
        sample(&body, "shmlink_gpu_xid_errors_total", &[("xid", "79")]),
        None,
        "{body}"
    );
    let log = agent.log_text();
    assert!(!log.contains("reports XID"), "{log}");
    assert!(agent.terminate().success());
}

#[test]
fn a_newline_in_a_file_name_read_through_syslog_blames_nobody_else() {
    if !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = "x\ntrainer[1]: segfault at 0 ip 0000000000401000 sp 00007ffc2b6c1f40 error 4 in \
                libnccl.so.2";
    let Some(bin) = crasher(dir.path(), name, "crasher") else {
        return;
    };
    assert!(
        crash(&bin, "trainer[1]: segfault at 0"),
        "the kernel did not log the crash"
    );
    for source in ["syslog", "/dev/kmsg"] {
        let blamed: Vec<Value> = kernel_failures(source)
            .into_iter()
            .filter(|f| {
                f["pid"] == 1
                    || f["evidence"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("trainer[1]"))
            })
            .collect();
        assert!(blamed.is_empty(), "{source}: {blamed:#?}");
    }
}

/// What `check --json` lists of the kernel log of the last 5 minutes read through `source`.
fn kernel_failures(source: &str) -> Vec<Value> {
    let report = common::binary::shmlink_json(
        &[
            "check",
            "--json",
            "--no-gpu",
            "--since",
            "5m",
            "--kmsg",
            source,
            "--pod-log-root",
            "off",
            "--docker-root",
            "off",
        ],
        &[],
    );
    report["failures"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_pid_and_a_library_in_a_name_or_written_to_kmsg_from_user_space_blame_nobody() {
    if !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 15 bytes of comm that read like another process crashing in NCCL; it crashes in its own
    // binary, which is no GPU library.
    let Some(bin) = crasher(dir.path(), "crash", "a[1] in libnccl") else {
        return;
    };
    assert!(
        crash(&bin, "a[1] in libnccl["),
        "the kernel did not log the crash"
    );
    // A record written from user space in the kernel's words: its facility says it is not the
    // kernel's (root may write /dev/kmsg; a pod with CAP_SYSLOG too).
    let forged = format!(
        "trainer[1]: segfault at 0 ip 0000000000401000 sp 00007ffc2b6c1f40 error 4 in \
         libnccl.so.2[7f0000000000+1000] forged-{}",
        std::process::id()
    );
    if std::fs::write("/dev/kmsg", format!("<3>{forged}\n")).is_err() {
        eprintln!("SKIPPED in part: /dev/kmsg not writable; the user-space record is not tested");
    }
    for source in ["syslog", "/dev/kmsg"] {
        let blamed: Vec<Value> = kernel_failures(source)
            .into_iter()
            .filter(|f| {
                f["pid"] == 1
                    || f["evidence"]
                        .as_str()
                        .is_some_and(|e| e.contains("a[1] in libnccl") || e.contains("forged-"))
            })
            .collect();
        assert!(blamed.is_empty(), "{source}: {blamed:#?}");
    }
}

/// Gives the next process started the PID `pid`: the kernel hands out the one after
/// `ns_last_pid` (root). Tries a few times, as another process may take it first.
fn spawn_with_pid(pid: u32, mut command: impl FnMut() -> Command) -> Option<std::process::Child> {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let mut child = command().spawn().unwrap();
        if child.id() == pid {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

#[test]
fn a_crash_is_never_pinned_on_a_later_process_that_got_its_pid() {
    if !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A process named `victim` crashing in a file named libnccl.so.2 (its own binary).
    let Some(bin) = crasher(dir.path(), "libnccl.so.2", "victim") else {
        return;
    };
    let one = CRASHING.lock().unwrap_or_else(|e| e.into_inner());
    let mut crashed = Command::new(&bin).spawn().unwrap();
    let pid = crashed.id();
    assert!(!crashed.wait().unwrap().success());
    let line = format!("victim[{pid}]: segfault at 0");
    assert!(
        common::wait_until(Duration::from_secs(5), || {
            let out = Command::new("dmesg").output().unwrap();
            String::from_utf8_lossy(&out.stdout).contains(&line)
        }),
        "the kernel did not log {line}"
    );
    drop(one);
    // Past the second of slack between the kernel's clock and the process's start.
    std::thread::sleep(Duration::from_millis(1500));
    // A later process with the same PID and name, in a container of its own: its own mount
    // namespace and a kubelet-style memory cgroup.
    let later = dir.path().join("victim");
    std::fs::copy("/bin/sleep", &later).unwrap();
    let Some(mut reused) = spawn_with_pid(pid, || {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--"]).arg(&later).arg("60");
        c
    }) else {
        eprintln!("SKIPPED: PID {pid} could not be had again (the machine is busy)");
        return;
    };
    let id = common::random_container_id();
    let cgroup = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/memory/kubepods/burstable/pod{}/{id}",
        common::random_pod_uid()
    ));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
    assert!(common::wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "victim")
    }));
    let told: Vec<Value> = kernel_failures("/dev/kmsg")
        .into_iter()
        .filter(|f| f["pid"] == pid)
        .collect();
    let _ = reused.kill();
    let _ = reused.wait();
    let _ = std::fs::remove_dir(&cgroup);
    let _ = std::fs::remove_dir(cgroup.parent().unwrap());
    assert_eq!(told.len(), 1, "the crash is told: {told:#?}");
    assert_eq!(
        told[0]["container_id"],
        Value::Null,
        "pinned on the later process's container: {:#}",
        told[0]
    );
}

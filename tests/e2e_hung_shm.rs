//! A /dev/shm that never answers, for real: a FUSE file system whose server never replies
//! (not even to INIT) mounted at a real runc container's /dev/shm, in the container's mount
//! namespace, as a pod allowed to mount FUSE could. statfs of it waits forever. `check` must
//! still return, `serve` must still scan, be ready, and stop on SIGTERM; the container is told
//! unmeasured, and its neighbour measured as ever.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::agent::{sample, Agent};
use common::{Container, ContainerSpec};
use serde_json::Value;

/// Mounts a FUSE file system nobody serves at /dev/shm in the mount namespace of `pid`, held
/// by a `busybox sleep` that keeps /dev/fuse open; killing it aborts the connection (and every
/// call stuck in it returns).
fn hang_dev_shm(pid: i32) -> Holder {
    let ns = std::ffi::CString::new(format!("/proc/{pid}/ns/mnt")).unwrap();
    let mut cmd = Command::new("/bin/busybox");
    cmd.args(["sleep", "3600"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Opened on the host (the container's /dev has no fuse node), kept across exec:
            // the sleep holds the connection.
            let fuse = libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR);
            if fuse < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut opts = *b"fd=000000,rootmode=40000,user_id=0,group_id=0\0";
            let digits = format_fd(fuse);
            opts[3..9].copy_from_slice(&digits);
            if libc::mount(
                c"hung".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Holder(
        cmd.spawn()
            .expect("mounting a FUSE file system at the container's /dev/shm"),
    )
}

/// The FUSE connection's holder: killed on drop, whatever the test did, so every call stuck
/// in the mount returns.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fd` as six decimal digits (leading zeros), without allocating.
fn format_fd(fd: i32) -> [u8; 6] {
    let mut out = [b'0'; 6];
    let mut n = fd as u32;
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out
}

#[test]
fn a_dev_shm_that_never_answers_costs_a_deadline_not_the_agent() {
    if !common::e2e_available() {
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        assert_ne!(
            std::env::var("SHMLINK_E2E").as_deref(),
            Ok("require"),
            "/dev/fuse is missing"
        );
        eprintln!("\n## SKIPPED: no /dev/fuse\n");
        return;
    }
    let hung = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        ..ContainerSpec::default()
    });
    let fine = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        ..ContainerSpec::default()
    });
    let _holder = hang_dev_shm(hung.pid);
    std::thread::sleep(Duration::from_millis(200));

    // check: returns, says the hung one is unmeasured and measures the other.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_shmlink"))
        .args([
            "check",
            "--json",
            "--no-gpu",
            "--kmsg",
            "off",
            "--pod-log-root",
            "off",
        ])
        .args(["--docker-root", "off"])
        .output()
        .unwrap();
    let took = started.elapsed();
    println!("check returned in {took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let entry = common::shm_entry(&report, &hung.id).expect("the hung container is listed");
    assert!(
        entry["error"]
            .as_str()
            .is_some_and(|e| e.contains("did not answer statfs within 2 s")),
        "{entry:#}"
    );
    let other = common::shm_entry(&report, &fine.id).expect("the other container");
    assert_eq!(other["size_bytes"], 64u64 << 20, "{other:#}");

    // serve: ready, scanning, and it stops.
    let agent = Agent::start(&[], &[]);
    agent.wait_ready();
    let first = agent.wait_for_metrics("scans go on", |b| {
        sample(
            b,
            "shmlink_scan_duration_seconds_count",
            &[("collector", "shm")],
        )
        .is_some_and(|n| n >= 3.0)
    });
    assert_eq!(
        sample(
            &first,
            "shmlink_shm_size_bytes",
            &[("container_id", fine.id.as_str())]
        ),
        Some((64u64 << 20) as f64),
        "{first}"
    );
    let log = agent.log_text();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("shmlink::shm") && l.contains("did not answer statfs"))
            .count(),
        1,
        "said once, not asked again: {log}"
    );
    let stopping = Instant::now();
    assert!(agent.terminate().success());
    println!("serve stopped {:?} after SIGTERM", stopping.elapsed());
}

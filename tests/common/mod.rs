//! The end-to-end harness: real OCI containers started with runc, a busybox rootfs, and a
//! kubelet-style cgroup path, so the agent finds them exactly as it would on a node (`runc`);
//! the agent's binary run once (`binary`). This file: whether that can be done here, random
//! IDs, waiting.
//!
//! Needs root, `runc` and a static busybox (`apt-get install runc busybox-static`; the test
//! script installs them). Without them a test says SKIPPED on stderr and returns, unless
//! `SHMLINK_E2E=require` (set by the test script as root, and so in CI), where it fails.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod agent;
pub mod binary;
pub mod containerd;
pub mod crash;
pub mod docker;
pub mod dying;
pub mod fake_cuda;
pub mod fake_nvml;
pub mod fuse;
pub mod host;
pub mod kube_api;
pub mod link_days;
pub mod memcg;
pub mod oom;
pub mod pod_resources;
pub mod prom;
pub mod promtext;
pub mod rng;
pub mod runc;

// The harness's names where the tests look for them; each test binary uses a few.
#[allow(unused_imports)]
pub use binary::{
    output_and_peak_rss, peak_rss_of, run_check, run_check_json, shm_entry, shmlink_bin,
};
#[allow(unused_imports)]
pub use runc::{
    cgroup_mount, dev_shm_symlink_to, ro_bind, write_then_sleep, Container, ContainerSpec,
    HostTmpfs, Shm,
};

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A statically linked busybox: the whole rootfs of a test container.
pub(crate) const BUSYBOX: &str = "/bin/busybox";
/// Whether the kernel log can be read here; says so when it cannot (and fails instead under
/// `SHMLINK_E2E=require`).
pub fn kmsg_readable() -> bool {
    if Path::new("/dev/kmsg").exists() && std::fs::File::open("/dev/kmsg").is_ok() {
        return true;
    }
    if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("the kernel log /dev/kmsg cannot be read here");
    }
    eprintln!("SKIPPED: /dev/kmsg cannot be read; no kernel log facts tested");
    false
}

/// Whether real containers can be made here. Says why not, once per test, when they cannot.
pub fn e2e_available() -> bool {
    static WHY_NOT: OnceLock<Option<String>> = OnceLock::new();
    let why_not = WHY_NOT.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return Some("not root".into());
        }
        if !on_path("runc") {
            return Some("runc is not installed (apt-get install runc)".into());
        }
        if !is_static_busybox(Path::new(BUSYBOX)) {
            return Some(format!(
                "{BUSYBOX} is not a static busybox (apt-get install busybox-static)"
            ));
        }
        None
    });
    match why_not {
        None => {
            host::for_this_test();
            true
        }
        Some(why) => {
            let test = std::thread::current()
                .name()
                .unwrap_or("an end-to-end test")
                .to_string();
            if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
                panic!("{test} needs real containers, but {why}");
            }
            eprintln!("SKIPPED {test}: needs real containers, but {why}");
            false
        }
    }
}

/// The path of `tool` (from Debian's `package`). Missing: a failure under
/// `SHMLINK_E2E=require`, else SKIPPED on stderr and None.
pub fn tool(tool: &str, package: &str) -> Option<PathBuf> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if found.is_none() {
        let test = std::thread::current()
            .name()
            .unwrap_or("a test")
            .to_string();
        if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
            panic!("{test} needs {tool} (apt-get install {package})");
        }
        eprintln!("SKIPPED {test}: needs {tool} (apt-get install {package})");
    }
    found
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_static_busybox(path: &Path) -> bool {
    // A dynamically linked busybox would need the host's libc inside the rootfs.
    Command::new("ldd").arg(path).output().is_ok_and(|o| {
        !o.status.success() || String::from_utf8_lossy(&o.stdout).contains("not a dynamic")
    }) && path.exists()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A pod UID in the API server's form (a v4 UUID).
pub fn random_pod_uid() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// A container ID as containerd and Docker make them: 64 hex digits.
pub fn random_container_id() -> String {
    random_hex(32)
}

/// Asserts that `text` holds every one of `parts`, naming the first it does not.
#[track_caller]
pub fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Container `trainer` of Pod ml/trainer-0's log directory as kubelet lays it out
/// (`<namespace>_<pod>_<uid>/<container>`) under a fresh log root, made; the root and it.
pub fn trainer_log_dir() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root
        .path()
        .join("ml_trainer-0_0f6c8a52-3b1e-4f0e-9d6a-2c4b8e1f7a90")
        .join("trainer");
    std::fs::create_dir_all(&dir).unwrap();
    (root, dir)
}

/// The moment `ago` before now, in whole seconds, as a log line's RFC 3339 time.
pub fn time_ago(ago: Duration) -> String {
    let at = (std::time::SystemTime::now() - ago)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    k8s_openapi::jiff::Timestamp::from_second(at.as_secs() as i64)
        .unwrap()
        .to_string()
}

/// A loopback address with a port nobody listens on (yet).
pub fn free_local_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a loopback port")
}

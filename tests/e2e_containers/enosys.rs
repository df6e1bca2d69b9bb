//! Kernels before 5.6 (RHEL 8, Ubuntu 20.04, Amazon Linux 2) have no openat2, and before 4.11
//! no statx. A seccomp filter built here makes both answer ENOSYS, so this machine stands in
//! for them: `check --json` must give the same readings as on the normal path, field by field,
//! the symlink attack must still be refused, and preflight must measure its own /dev/shm. A
//! second filter makes statfs answer EPERM: "could not look" must be an error, never "no
//! /dev/shm".

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use common::agent::{sample, Agent};
use common::{cgroup_mount, ro_bind, Container, ContainerSpec, HostTmpfs, Shm};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The fields compared between the two paths.
const FIELDS: [&str; 8] = [
    "mounted",
    "fs_type",
    "size_bytes",
    "used_bytes",
    "available_bytes",
    "memory_limit_bytes",
    "host_ipc",
    "status",
];

const WRAP_C: &str = r#"
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* x86_64 system call numbers. */
#define NR_OPENAT2 437
#define NR_STATX 332
#define NR_STATFS 137
#define NR_FSTATFS 138

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s enosys|eperm-statfs COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    unsigned a, b, err;
    if (strcmp(argv[1], "enosys") == 0) {
        a = NR_OPENAT2; b = NR_STATX; err = ENOSYS;
    } else if (strcmp(argv[1], "eperm-statfs") == 0) {
        a = NR_STATFS; b = NR_FSTATFS; err = EPERM;
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, a, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, b, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { perror("PR_SET_NO_NEW_PRIVS"); return 3; }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) { perror("PR_SET_SECCOMP"); return 3; }
    /* The filter must bite, or a test under it would prove nothing. */
    errno = 0;
    if (syscall(a, -1, 0, 0, 0, 0) != -1 || errno != (int)err) {
        fprintf(stderr, "the seccomp filter does not answer syscall %u with errno %u\n", a, err);
        return 3;
    }
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    return 127;
}
"#;

/// The wrapper, built once per test process; None (SKIPPED, or a failure under
/// `SHMLINK_E2E=require`) off x86_64 or without gcc.
fn wrapper() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<(tempfile::TempDir, PathBuf)>> = OnceLock::new();
    if !cfg!(target_arch = "x86_64") {
        let test = std::thread::current().name().unwrap_or("").to_string();
        if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
            panic!("{test}: the seccomp wrapper's system call numbers are x86_64's");
        }
        eprintln!("SKIPPED {test}: the seccomp wrapper's system call numbers are x86_64's");
        return None;
    }
    let gcc = common::tool("gcc", "gcc")?;
    BUILT
        .get_or_init(|| {
            let dir = tempfile::Builder::new()
                .prefix("shmlink-e2e-seccomp-")
                .tempdir()
                .unwrap();
            std::fs::write(dir.path().join("wrap.c"), WRAP_C).unwrap();
            let out = Command::new(gcc)
                .current_dir(dir.path())
                .args(["-O2", "-Wall", "-o", "seccomp-wrap", "wrap.c"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "gcc: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = dir.path().join("seccomp-wrap");
            Some((dir, path))
        })
        .as_ref()
        .map(|(_, p)| p.as_path())
}

/// `shmlink check --no-gpu --json`, under the wrapper in `mode` or not at all.
fn check(mode: Option<&str>) -> (Output, Value) {
    check_with(mode, &[])
}

fn check_with(mode: Option<&str>, extra: &[&str]) -> (Output, Value) {
    let mut cmd = match mode {
        Some(mode) => {
            let mut c = Command::new(wrapper().unwrap());
            c.arg(mode).arg(common::shmlink_bin());
            c
        }
        None => Command::new(common::shmlink_bin()),
    };
    let out = cmd
        .args(["check", "--no-gpu", "--json"])
        .args(extra)
        .env("SHMLINK_LOG", "shmlink=info")
        .stdin(Stdio::null())
        .output()
        .expect("running shmlink check");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json (mode {mode:?}, exit {:?}) printed no JSON ({e}):\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

fn entry(report: &Value, c: &Container) -> Value {
    common::shm_entry(report, &c.id)
        .unwrap_or_else(|| panic!("container {} not in report:\n{report:#}", c.id))
}

/// The rows of the comparison that differ: (scenario, field, normal, fallback).
fn differences(
    scenarios: &[(&str, &Container)],
    normal: &Value,
    fallback: &Value,
) -> Vec<(String, &'static str, Value, Value)> {
    let mut diff = Vec::new();
    for (name, c) in scenarios {
        let (a, b) = (entry(normal, c), entry(fallback, c));
        for field in FIELDS {
            if a[field] != b[field] {
                diff.push((name.to_string(), field, a[field].clone(), b[field].clone()));
            }
        }
    }
    diff
}

#[test]
fn without_openat2_and_statx_check_gives_the_same_readings_field_by_field() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    let runtime_default = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(20),
        ..ContainerSpec::default()
    });
    let volume = HostTmpfs::new(256 * MIB);
    let empty_dir = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(30),
        shm: Shm::Bind(volume.path.clone()),
        // Headroom well above the tmpfs's free space, so the numbers do not move between runs.
        memory_limit: Some(1024 * MIB as i64),
        ..ContainerSpec::default()
    });
    let host_ipc = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(0),
        shm: Shm::HostIpc,
        ..ContainerSpec::default()
    });
    let no_shm = Container::start(ContainerSpec {
        args: common::write_then_sleep(0),
        shm: Shm::None,
        ..ContainerSpec::default()
    });
    for c in [&runtime_default, &empty_dir, &host_ipc, &no_shm] {
        c.wait_ready();
    }
    let scenarios = [
        ("runtime default 64 MiB", &runtime_default),
        ("emptyDir 256 MiB bind", &empty_dir),
        ("host IPC", &host_ipc),
        ("no /dev/shm", &no_shm),
    ];
    // The host's /dev/shm (host IPC) is the machine's: other work may change its use between
    // two runs, so the pair is taken again (at most 3 times) until it agrees.
    let mut last = None;
    for _ in 0..3 {
        let (_, normal) = check(None);
        let (out, fallback) = check(Some("enosys"));
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            // A container's /dev/shm is always walked a component at a time (no openat2 to
            // fall back from): only statx's absence is told.
            stderr.contains("this kernel has no statx"),
            "the fallback was not taken: {stderr}"
        );
        let diff = differences(&scenarios, &normal, &fallback);
        last = Some((normal, fallback, diff));
        if last.as_ref().unwrap().2.is_empty() {
            break;
        }
    }
    let (normal, fallback, diff) = last.unwrap();
    println!(
        "{:<24} {:<20} {:<22} {:<22}",
        "scenario", "field", "openat2+statx", "ENOSYS walk"
    );
    for (name, c) in &scenarios {
        let (a, b) = (entry(&normal, c), entry(&fallback, c));
        for field in FIELDS {
            let same = if a[field] == b[field] {
                ""
            } else {
                "  DIFFERS"
            };
            println!(
                "{name:<24} {field:<20} {:<22} {:<22}{same}",
                a[field].to_string(),
                b[field].to_string()
            );
        }
    }
    assert!(diff.is_empty(), "the two paths differ: {diff:?}");
    // And the readings are the right ones, not merely equal.
    let e = entry(&fallback, &runtime_default);
    assert_eq!(e["mounted"], true, "{e}");
    assert_eq!(e["size_bytes"], 64 * MIB);
    assert!(
        (20 * MIB..21 * MIB).contains(&e["used_bytes"].as_u64().unwrap()),
        "{e}"
    );
    let e = entry(&fallback, &empty_dir);
    assert_eq!(e["size_bytes"], 256 * MIB, "{e}");
    assert_eq!(e["memory_limit_bytes"], 1024 * MIB, "{e}");
    let e = entry(&fallback, &host_ipc);
    assert_eq!(
        (e["mounted"].clone(), e["host_ipc"].clone()),
        (true.into(), true.into()),
        "{e}"
    );
    let e = entry(&fallback, &no_shm);
    assert_eq!(e["mounted"], false, "{e}");
    for report in [&normal, &fallback] {
        for (_, c) in &scenarios {
            assert_eq!(entry(report, c)["error"], Value::Null);
        }
    }
}

#[test]
fn the_symlink_attack_is_refused_on_both_paths() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    // A host tmpfs of a size nothing else has: following the link would report 7 MiB.
    let host_dir = HostTmpfs::new(7 * MIB);
    let target = host_dir.path.display().to_string();
    let c = common::dev_shm_symlink_to(&target);
    for mode in [None, Some("enosys")] {
        let (_, report) = check(mode);
        let e = entry(&report, &c);
        assert_eq!(e["mounted"], false, "{mode:?}: {e}");
        assert_eq!(e["size_bytes"], Value::Null, "{mode:?}: {e}");
        assert_eq!(e["used_bytes"], Value::Null, "{mode:?}: {e}");
        assert_eq!(e["error"], Value::Null, "{mode:?}: {e}");
    }
}

#[test]
fn docker_records_are_read_and_symlinked_ones_refused_on_both_paths() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    let docker = tempfile::tempdir().unwrap();
    let containers = docker.path().join("containers");
    let record = |id: &str, name: &str| {
        serde_json::json!({"ID": id, "Name": name, "State": {"Running": true},
                           "Config": {"Image": "busybox:1.36"}})
        .to_string()
    };
    // A real record, and one whose config.v2.json is a symlink to a record elsewhere.
    let named = Container::start(ContainerSpec::default());
    std::fs::create_dir_all(containers.join(&named.id)).unwrap();
    std::fs::write(
        containers.join(&named.id).join("config.v2.json"),
        record(&named.id, "/named"),
    )
    .unwrap();
    let linked = Container::start(ContainerSpec::default());
    let elsewhere = docker.path().join("elsewhere.json");
    std::fs::write(&elsewhere, record(&linked.id, "/followed")).unwrap();
    std::fs::create_dir_all(containers.join(&linked.id)).unwrap();
    std::os::unix::fs::symlink(
        &elsewhere,
        containers.join(&linked.id).join("config.v2.json"),
    )
    .unwrap();
    let root = docker.path().to_str().unwrap();
    for mode in [None, Some("enosys")] {
        let (out, report) = check_with(mode, &["--docker-root", root]);
        let e = entry(&report, &named);
        assert_eq!(e["container"], "named", "{mode:?}: {e}");
        assert_eq!(e["image"], "busybox:1.36", "{mode:?}: {e}");
        let e = entry(&report, &linked);
        assert_eq!(
            e["container"],
            Value::Null,
            "{mode:?}: followed a symlink: {e}"
        );
        if mode.is_some() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("this kernel has no openat2"), "{stderr}");
        }
    }
}

#[test]
fn an_unmeasurable_dev_shm_is_an_error_not_no_dev_shm() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(1),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    // statfs answering EPERM: the agent cannot look at any /dev/shm.
    let (out, report) = check(Some("eperm-statfs"));
    let e = entry(&report, &c);
    assert_eq!(e["mounted"], Value::Null, "unknown, not false: {e}");
    assert_eq!(e["size_bytes"], Value::Null, "{e}");
    let error = e["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {e}"));
    assert!(error.contains("not permitted"), "{error}");
    // Not "all healthy": a finding, and exit 1.
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let findings = report["findings"].as_array().unwrap();
    assert!(
        findings.iter().any(|f| f["kind"] == "shm_unmeasured"
            && f["message"].as_str().unwrap().contains(&c.id[..12])),
        "{findings:#?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("statvfs /dev/shm"), "logged: {stderr}");

    // serve: counted as a scan error, and no `mounted` series rather than a 0.
    let wrap = wrapper().unwrap().display().to_string();
    let agent = Agent::start_under(
        &[&wrap, "eperm-statfs"],
        &["--no-gpu", "--kube", "off"],
        &[],
    );
    agent.wait_ready();
    let id = [("container_id", c.id.as_str())];
    let body = agent.wait_for_metrics("the container's series and a shm scan error", |m| {
        sample(m, "shmlink_shm_host_ipc", &id).is_some()
            && sample(m, "shmlink_scan_errors_total", &[("collector", "shm")])
                .is_some_and(|n| n >= 1.0)
    });
    assert_eq!(sample(&body, "shmlink_shm_mounted", &id), None, "{body}");
    assert_eq!(sample(&body, "shmlink_shm_size_bytes", &id), None, "{body}");
}

/// The mounts a glibc binary from the host needs in the busybox rootfs (as preflight.rs's),
/// plus the wrapper at /wrap.
fn preflight_mounts() -> Vec<Value> {
    let bin_dir = Path::new(common::shmlink_bin()).parent().unwrap();
    vec![
        ro_bind("/usr/lib", "/usr/lib"),
        ro_bind("/usr/lib", "/lib"),
        ro_bind("/usr/lib64", "/lib64"),
        ro_bind(bin_dir, "/shmlink"),
        ro_bind(wrapper().unwrap().parent().unwrap(), "/wrap"),
        cgroup_mount(),
    ]
}

#[test]
fn preflight_measures_its_own_dev_shm_without_statx() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    for (shm, want_state, want_size) in [
        (Shm::RuntimeDefault, "mounted", Some(64 * MIB)),
        (Shm::None, "absent", None),
    ] {
        let c = Container::start(ContainerSpec {
            pod_uid: Some(common::random_pod_uid()),
            args: common::write_then_sleep(0),
            shm,
            extra_mounts: preflight_mounts(),
            ..ContainerSpec::default()
        });
        c.wait_ready();
        let run = |wrap: bool| {
            let mut cmd = vec![];
            if wrap {
                cmd.extend(["/wrap/seccomp-wrap", "enosys"]);
            }
            cmd.extend(["/shmlink/shmlink", "preflight", "--no-gpu", "--json"]);
            let out = c.exec(&cmd);
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "no JSON ({e}): {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        };
        let (normal, fallback) = (run(false), run(true));
        assert_eq!(fallback["shm"]["state"], want_state, "{fallback:#}");
        assert_eq!(fallback["shm"]["size_bytes"].as_u64(), want_size);
        for field in ["state", "fs_type", "size_bytes", "used_bytes", "free_bytes"] {
            assert_eq!(normal["shm"][field], fallback["shm"][field], "{field}");
        }
        assert_eq!(normal["verdict"], fallback["verdict"]);
    }
}

/// Under strace, without openat2: a container's /dev/shm is never asked of openat2 (each
/// component is looked up alone, its mount's type checked first), every step beneath a container
/// root is an `openat(fd, "dev"|"shm", ...O_NOFOLLOW...)`; no path goes
/// through /proc/PID/root for the kernel to resolve against the agent's root.
#[test]
fn the_walk_is_decided_once_and_never_follows() {
    if !common::e2e_available() || wrapper().is_none() {
        return;
    }
    let Some(strace) = common::tool("strace", "strace") else {
        return;
    };
    let a = Container::start(ContainerSpec {
        args: common::write_then_sleep(0),
        ..ContainerSpec::default()
    });
    let b = Container::start(ContainerSpec {
        args: common::write_then_sleep(0),
        shm: Shm::HostIpc,
        ..ContainerSpec::default()
    });
    a.wait_ready();
    b.wait_ready();
    let trace = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(strace)
        .args(["-f", "-qq", "-e", "trace=open,openat,openat2", "-o"])
        .arg(trace.path())
        .arg(wrapper().unwrap())
        .args([
            "enosys",
            common::shmlink_bin(),
            "check",
            "--json",
            "--no-gpu",
        ])
        .output()
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    let calls = std::fs::read_to_string(trace.path()).unwrap();
    let tried = calls
        .lines()
        .filter(|l| l.contains("openat2(") && l.contains("\"dev/shm\""))
        .count();
    assert_eq!(
        tried, 0,
        "openat2 asked for a container's dev/shm:\n{calls}"
    );
    let steps: Vec<&str> = calls
        .lines()
        .filter(|l| l.contains("openat(") && (l.contains(", \"dev\",") || l.contains(", \"shm\",")))
        .collect();
    assert!(steps.len() >= 4, "two containers, two steps each:\n{calls}");
    for step in &steps {
        assert!(step.contains("O_NOFOLLOW"), "{step}");
    }
    for line in calls.lines() {
        assert!(
            !line.contains("/root/dev"),
            "through a container root: {line}"
        );
    }
}

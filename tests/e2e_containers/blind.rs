//! Loud when blind: a scan that could not see never says "all healthy". `check` exits 2 and
//! says why when it may not look into the containers that run (a real runc container whose
//! /dev/shm is full, `check` run as nobody), when `--proc-root` holds no process, when
//! `--cgroup-root` holds no hierarchy; a partly blind scan says how many it could not read;
//! NVML's state is in the text and the JSON; `serve` is not ready while blind, exports
//! `shmlink_blind{reason}`, and is ready again once the cause goes away.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::agent::{get, sample, Agent};
use common::{Container, ContainerSpec};
use serde_json::Value;

const MIB: f64 = 1048576.0;

/// `shmlink check ARGS` (with `--no-gpu` unless NVML is the point), run by `wrapper` if any.
fn check(bin: &Path, wrapper: &[&str], args: &[&str]) -> Output {
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    command
        .arg("check")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running shmlink check")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The binary where an unprivileged user can run it: `target/` may sit under a directory
/// only root may traverse, so a hard link (else a copy) in a world-readable temp dir.
fn runnable_by_anyone() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("shmlink-blind-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("shmlink");
    let source = common::shmlink_bin();
    if std::fs::hard_link(source, &bin).is_err() {
        std::fs::copy(source, &bin).unwrap();
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, bin)
}

/// A runtime-default (64 MiB) /dev/shm filled to the last byte.
fn full_shm_container() -> Container {
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "dd if=/dev/zero of=/dev/shm/fill bs=1M 2>/dev/null; touch /tmp/ready; exec sleep 3600"
                .into(),
        ],
        ..ContainerSpec::default()
    });
    c.wait_ready();
    c
}

fn entry<'a>(report: &'a Value, id: &str) -> Option<&'a Value> {
    report["shm"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["container_id"] == id)
}

#[test]
fn check_as_nobody_beside_a_full_shm_container_exits_2_and_says_why() {
    if !common::e2e_available() || common::tool("setpriv", "util-linux").is_none() {
        return;
    }
    let c = full_shm_container();
    let (_dir, bin) = runnable_by_anyone();

    // As root it is seen, and it is full: the setup is real.
    let out = check(&bin, &[], &["--json", "--no-gpu"]);
    let report = json_of(&out);
    let seen = entry(&report, &c.id).expect("root measures the container");
    assert_eq!(seen["status"], "critical", "{seen}");
    assert_eq!(seen["used_bytes"].as_f64(), Some(64.0 * MIB));
    assert_eq!(out.status.code(), Some(1));

    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let out = check(&bin, &nobody, &["--no-gpu"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("blind (containers_unreadable)"), "{said}");
    assert!(said.contains("CAP_SYS_PTRACE"), "{said}");
    assert!(said.contains("No containers measured."), "{said}");
    assert!(!said.contains("all healthy"), "{said}");
    // One warning for all the denied containers, not one per container.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("Permission denied").count(), 1, "{stderr}");

    let out = check(&bin, &nobody, &["--json", "--no-gpu"]);
    assert_eq!(out.status.code(), Some(2));
    let report = json_of(&out);
    assert_eq!(
        report["blind"],
        serde_json::json!(["containers_unreadable"])
    );
    assert!(report["sight"]["unreadable"].as_u64().unwrap() >= 1);
    assert_eq!(report["sight"]["measured"], 0);
    assert!(entry(&report, &c.id).is_none());
    assert!(String::from_utf8_lossy(&out.stderr).contains("blind (containers_unreadable)"));
}

/// A process in a mount namespace of its own, holding every capability, in a memory cgroup
/// of the test's own: a container an agent without CAP_SYS_PTRACE may not look into.
struct PrivilegedProcess {
    child: Child,
    cgroup: PathBuf,
}

impl PrivilegedProcess {
    fn start() -> PrivilegedProcess {
        let root = Path::new("/sys/fs/cgroup");
        let hierarchy = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else {
            root.join("memory")
        };
        let cgroup = hierarchy.join(format!("shmlink-e2e-blind-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        let child = Command::new("unshare")
            .args(["-m", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
        // unshare has exec'ed sleep once its mount namespace differs from ours.
        let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        assert!(common::wait_until(Duration::from_secs(10), || {
            std::fs::read_link(format!("/proc/{}/ns/mnt", child.id())).is_ok_and(|ns| ns != ours)
        }));
        PrivilegedProcess { child, cgroup }
    }
}

impl Drop for PrivilegedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn a_partly_blind_check_says_how_many_it_could_not_read() {
    if !common::e2e_available()
        || common::tool("setpriv", "util-linux").is_none()
        || common::tool("unshare", "util-linux").is_none()
    {
        return;
    }
    let c = full_shm_container();
    let _hidden = PrivilegedProcess::start();
    // Root with the container's own capabilities: it may look into the container, not into
    // the process that holds them all.
    let caps = [
        "setpriv",
        "--bounding-set",
        "-all,+kill,+chown,+dac_override,+fowner",
        "--inh-caps",
        "-all",
        "--no-new-privs",
        "--",
    ];
    let bin = Path::new(common::shmlink_bin());
    let out = check(bin, &caps, &["--json", "--no-gpu"]);
    let report = json_of(&out);
    assert_eq!(
        report["blind"],
        serde_json::json!(["some_containers_unreadable"]),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(report["sight"]["unreadable"].as_u64().unwrap() >= 1);
    assert!(report["sight"]["measured"].as_u64().unwrap() >= 1);
    assert_eq!(entry(&report, &c.id).unwrap()["status"], "critical");

    let out = check(bin, &caps, &["--no-gpu"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        said.contains("partly blind (some_containers_unreadable)"),
        "{said}"
    );
    assert!(said.contains("could not be looked into"), "{said}");
}

#[test]
fn a_proc_root_without_processes_is_blind() {
    let empty = tempfile::tempdir().unwrap();
    let bin = Path::new(common::shmlink_bin());
    for proc_root in [Path::new("/nonexistent/prc"), empty.path()] {
        let root = proc_root.to_str().unwrap();
        let out = check(bin, &[], &["--no-gpu", "--proc-root", root]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(
            said.contains(&format!("blind (no_processes): {root} lists no process")),
            "{said}"
        );
        assert!(said.contains("check --proc-root"), "{said}");
        assert!(!said.contains("all healthy"), "{said}");

        let out = check(bin, &[], &["--json", "--no-gpu", "--proc-root", root]);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(json_of(&out)["blind"], serde_json::json!(["no_processes"]));
    }
}

#[test]
fn a_cgroup_root_without_a_hierarchy_is_blind() {
    let empty = tempfile::tempdir().unwrap();
    let root = empty.path().to_str().unwrap();
    let bin = Path::new(common::shmlink_bin());
    let out = check(bin, &[], &["--no-gpu", "--cgroup-root", root]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "blind (no_cgroups): no memory cgroup hierarchy under {root}"
        )),
        "{said}"
    );
    assert!(!said.contains("all healthy"), "{said}");
    let out = check(bin, &[], &["--json", "--no-gpu", "--cgroup-root", root]);
    assert_eq!(out.status.code(), Some(2));
    let report = json_of(&out);
    assert_eq!(report["blind"], serde_json::json!(["no_cgroups"]));
    assert_eq!(report["sight"]["cgroup_hierarchy"], false);
}

#[test]
fn nvml_that_does_not_load_says_where_from_and_why() {
    let bin = Path::new(common::shmlink_bin());
    let lib = "/nonexistent/x.so";
    let out = check(bin, &[], &["--json", "--nvml-lib", lib]);
    let nvml = &json_of(&out)["nvml"];
    assert_eq!(nvml["loaded"], false);
    assert_eq!(nvml["library"], lib);
    assert_eq!(nvml["disabled"], false);
    let error = nvml["error"]
        .as_str()
        .expect("the reason NVML did not load");
    assert!(error.contains(lib), "{error}");

    let said = text(&check(bin, &[], &["--nvml-lib", lib]));
    assert!(
        said.contains(&format!(
            "GPUs: none (NVML did not load from {lib}: {error})"
        )),
        "{said}"
    );

    let out = check(bin, &[], &["--json", "--no-gpu"]);
    let nvml = &json_of(&out)["nvml"];
    assert_eq!(
        (&nvml["loaded"], &nvml["disabled"], &nvml["error"]),
        (&Value::Bool(false), &Value::Bool(true), &Value::Null),
        "--no-gpu is no error"
    );
    assert!(
        text(&check(bin, &[], &["--no-gpu"])).contains("GPUs: none (--no-gpu: NVML not loaded)")
    );
}

/// /readyz's status and body.
fn readyz(agent: &Agent) -> (u16, String) {
    get(agent.addr, "/readyz").expect("/readyz answers")
}

/// Waits until the agent answers HTTP at all (ready or not).
fn wait_listening(agent: &Agent) {
    assert!(
        common::wait_until(Duration::from_secs(20), || get(agent.addr, "/readyz")
            .is_some()),
        "serve never listened; its log:\n{}",
        agent.log_text()
    );
}

#[test]
fn serve_is_not_ready_while_blind_and_ready_once_it_can_see() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    std::fs::create_dir(&proc_root).unwrap();
    let agent = Agent::start(
        &["--no-gpu", "--proc-root", proc_root.to_str().unwrap()],
        &[],
    );
    wait_listening(&agent);
    let body = agent.wait_for_metrics("the blind gauge", |b| {
        sample(b, "shmlink_blind", &[("reason", "no_processes")]) == Some(1.0)
    });
    assert_eq!(body.matches("shmlink_blind{").count(), 1, "{body}");
    let (status, why) = readyz(&agent);
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("blind (no_processes)"), "{why}");
    assert!(agent.log_text().contains("blind (no_processes)"));

    // A process appears under the proc root: the next scan sees, and the agent is ready.
    std::fs::create_dir(proc_root.join("1")).unwrap();
    agent.wait_ready();
    let body = agent.metrics();
    assert!(!body.contains("shmlink_blind{"), "{body}");
    assert!(agent
        .log_text()
        .contains("no longer blind: no_processes ended"));
    assert!(agent.terminate().success());
}

#[test]
fn serve_without_a_cgroup_hierarchy_is_not_ready_until_one_appears() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let agent = Agent::start(&["--no-gpu", "--cgroup-root", root], &[]);
    wait_listening(&agent);
    agent.wait_for_metrics("the blind gauge", |b| {
        sample(b, "shmlink_blind", &[("reason", "no_cgroups")]) == Some(1.0)
    });
    let (status, why) = readyz(&agent);
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("blind (no_cgroups)"), "{why}");

    std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    agent.wait_ready();
    assert!(!agent.metrics().contains("shmlink_blind{"));
    assert!(agent.terminate().success());
}

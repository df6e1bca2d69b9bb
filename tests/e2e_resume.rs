//! Restarts (issue 38): `serve` killed with SIGKILL after saving its checkpoint
//! (`SHMLINK_CHECKPOINT_FILE`, provisional until the state store), a real runc container's
//! DataLoader dying while it is down, `serve` started again from the checkpoint: the death is
//! told once, marked found late; a second restart tells nothing again. The same on plain Docker
//! (its json-file log and its record of a SIGBUS exit) and for the kernel log (/dev/kmsg).

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::agent::{sample, Agent};
use common::{ro_bind, Container, ContainerSpec};

const BUS_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be caused \
                        by insufficient shared memory (shm).";
const FOUND_LATE: &str = "Found when the agent started again: it happened while it was down";

fn serve(root: &Path, checkpoint: &Path) -> Agent {
    let agent = Agent::start(
        &["--no-gpu", "--pod-log-root", root.to_str().unwrap()],
        &[("SHMLINK_CHECKPOINT_FILE", checkpoint.as_os_str())],
    );
    agent.wait_ready();
    agent
}

/// trainer-0's deaths counted.
fn failures(agent: &Agent) -> f64 {
    sample(
        &agent.metrics(),
        "shmlink_workload_failures_total",
        &[("pod", "trainer-0"), ("kind", "shm_allocation_failed")],
    )
    .unwrap_or(0.0)
}

/// The checkpoint's saved offset of `log`, if it holds one.
fn saved_offset(checkpoint: &Path, log: &Path) -> Option<u64> {
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(checkpoint).ok()?).ok()?;
    c["logs"]["files"]
        .as_array()?
        .iter()
        .find(|f| f["path"] == log.to_str().unwrap())?["offset"]
        .as_u64()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[test]
fn a_death_while_serve_was_down_is_told_once_found_late() {
    if !common::e2e_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let uid = common::random_pod_uid();
    let dir = tmp.path().join(format!("ml_trainer-0_{uid}/trainer"));
    std::fs::create_dir_all(&dir).unwrap();
    let flags = tmp.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    let checkpoint = tmp.path().join("checkpoint.json");
    let log = dir.join("0.log");

    let first = serve(tmp.path(), &checkpoint);
    // The worker logs, then waits for the test's word to die (given while serve is down).
    let script = "echo 'epoch 1: loss 0.42'; while [ ! -e /flags/die ]; do sleep 0.1; done; \
                  echo 'Traceback (most recent call last):'; echo \"$BUS_LINE\"; exit 1";
    let _trainer = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        args: vec![
            "sh".into(),
            "-c".into(),
            format!("BUS_LINE='{BUS_LINE}'; {script}"),
        ],
        extra_mounts: vec![ro_bind(&flags, "/flags")],
        cri_log: Some(log.clone()),
        ..ContainerSpec::default()
    });
    // serve read the first line and saved its position past it.
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            let written = std::fs::metadata(&log).map_or(0, |m| m.len());
            written > 0 && saved_offset(&checkpoint, &log) == Some(written)
        }),
        "no checkpoint past the first line: {:?}",
        std::fs::read_to_string(&checkpoint)
    );
    let first_log = first.log_text();
    drop(first); // SIGKILL

    std::fs::write(flags.join("die"), "").unwrap();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("Unexpected bus error"))
        }),
        "the worker never died"
    );

    let second = serve(tmp.path(), &checkpoint);
    let body = second.wait_for_metrics("the death told after the restart", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-0"), ("kind", "shm_allocation_failed")],
        ) == Some(1.0)
    });
    let told = second.log_text();
    assert!(told.contains(FOUND_LATE), "{told}");
    assert!(told.contains("Unexpected bus error"), "{told}");
    // A death after the restart (another Pod's) is told at once, and not as found late.
    let other = tmp
        .path()
        .join(format!("ml_trainer-1_{}/trainer", common::random_pod_uid()));
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(
        other.join("0.log"),
        format!(
            "{} stderr F {BUS_LINE}\n",
            k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        ),
    )
    .unwrap();
    second.wait_for_metrics("the new death told", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-1"), ("kind", "shm_allocation_failed")],
        ) == Some(1.0)
    });
    assert_eq!(failures(&second), 1.0);
    assert_eq!(second.log_text().matches(FOUND_LATE).count(), 1);
    for l in body
        .lines()
        .filter(|l| l.starts_with("shmlink_workload_failures_total"))
    {
        println!("after the restart: {l}");
    }
    // Its position saved (past both files), then killed again.
    let saved_at = modified(&checkpoint);
    assert!(
        common::wait_until(Duration::from_secs(10), || modified(&checkpoint) > saved_at),
        "no checkpoint after the new death"
    );
    drop(second);

    let third = serve(tmp.path(), &checkpoint);
    // Three checkpoint intervals: anything re-read would have been told by then.
    std::thread::sleep(Duration::from_secs(6));
    let body = third.metrics();
    assert!(
        !body.contains("shmlink_workload_failures_total{"),
        "{}",
        third.log_text()
    );
    assert!(!third.log_text().contains("Unexpected bus error"));
    assert!(!first_log.contains(FOUND_LATE));
}

/// The issue's own trial, on plain Docker: `serve` down while a container prints the
/// DataLoader bus-error line and another dies of SIGBUS; both told once after the restart, from
/// the json-file log and Docker's record, found late; a second restart tells nothing.
#[test]
fn on_docker_deaths_while_serve_was_down_are_told_once_found_late() {
    if !common::e2e_available() {
        return;
    }
    let Some(d) = common::docker::Dockerd::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let flags = tmp.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    let checkpoint = tmp.path().join("checkpoint.json");
    let root = d.data_root();
    let start = || {
        let agent = Agent::start(
            &["--no-gpu", "--docker-root", root.to_str().unwrap()],
            &[("SHMLINK_CHECKPOINT_FILE", checkpoint.as_os_str())],
        );
        agent.wait_ready();
        agent
    };
    let first = start();
    let mount = format!("{}:/flags:ro", flags.display());
    let wait = "while [ ! -e /flags/die ]; do sleep 0.1; done";
    let loader = d.run(&[
        "--name",
        "loader",
        "-v",
        &mount,
        common::docker::IMAGE,
        "sh",
        "-c",
        &format!("echo 'epoch 1'; {wait}; echo '{BUS_LINE}'; exit 1"),
    ]);
    let bus = d.run(&[
        "--name",
        "bus",
        "-v",
        &mount,
        common::docker::IMAGE,
        "sh",
        "-c",
        &format!("{wait}; sh -c 'kill -BUS $$'; exit $?"),
    ]);
    let log = root.join(format!("containers/{loader}/{loader}-json.log"));
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            let written = std::fs::metadata(&log).map_or(0, |m| m.len());
            written > 0 && saved_offset(&checkpoint, &log) == Some(written)
        }),
        "no checkpoint past the first line: {:?}",
        std::fs::read_to_string(&checkpoint)
    );
    drop(first); // SIGKILL
    std::fs::write(flags.join("die"), "").unwrap();
    assert_eq!(d.wait(&loader), 1);
    assert_eq!(d.wait(&bus), 135);

    let second = start();
    let counted = |agent: &Agent, id: &str| {
        let body = agent.metrics();
        body.lines()
            .filter(|l| l.starts_with("shmlink_workload_failures_total{"))
            .filter(|l| l.contains(&format!("container_id=\"{id}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            counted(&second, &loader) == 1.0 && counted(&second, &bus) == 1.0
        }),
        "{}\n{}",
        second.metrics(),
        second.log_text()
    );
    let told = second.log_text();
    assert_eq!(told.matches(FOUND_LATE).count(), 2, "{told}");
    let saved_at = modified(&checkpoint);
    assert!(
        common::wait_until(Duration::from_secs(10), || modified(&checkpoint) > saved_at),
        "no checkpoint after telling"
    );
    drop(second);

    let third = start();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(counted(&third, &loader), 0.0, "{}", third.log_text());
    assert_eq!(counted(&third, &bus), 0.0, "{}", third.log_text());
}

/// The kernel's account across a restart, from the real /dev/kmsg: a process crashing in
/// libnccl.so.2 while `serve` is down is told after it starts again (after the saved position
/// in this boot), found late; a second restart does not tell it again.
#[test]
fn a_crash_the_kernel_logged_while_serve_was_down_is_told_once_found_late() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let nccl = tempfile::tempdir().unwrap();
    if !common::crash::build_crashing_nccl(nccl.path()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let checkpoint = tmp.path().join("checkpoint.json");
    let start = || {
        let agent = Agent::start(
            &["--no-gpu", "--kmsg", "/dev/kmsg"],
            &[("SHMLINK_CHECKPOINT_FILE", checkpoint.as_os_str())],
        );
        agent.wait_ready();
        agent
    };
    let first = start();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            std::fs::read(&checkpoint)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .is_some_and(|c| c["kmsg"]["boot_id"].is_string())
        }),
        "no kernel log position saved: {:?}",
        std::fs::read_to_string(&checkpoint)
    );
    drop(first); // SIGKILL

    // Named for this run: its comm tells its crash from any other the kernel logs meanwhile.
    let comm = format!("resume{}", std::process::id() % 100_000);
    std::fs::copy(nccl.path().join("crash"), nccl.path().join(&comm)).unwrap();
    let worker = Container::start(ContainerSpec {
        args: vec!["sh".into(), "-c".into(), format!("exec /nccl/{comm}")],
        extra_mounts: vec![ro_bind(nccl.path(), "/nccl")],
        ..ContainerSpec::default()
    });
    assert!(
        worker.wait_exited(Duration::from_secs(20)),
        "it never crashed"
    );
    let ours = format!("process {comm} (host PID ");

    let second = start();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            second
                .log_text()
                .lines()
                .any(|l| l.contains(&ours) && l.contains(FOUND_LATE))
        }),
        "the crash of {ours} not told found late: {}",
        second.log_text()
    );
    let told = second.log_text();
    assert_eq!(
        told.lines().filter(|l| l.contains(&ours)).count(),
        1,
        "{told}"
    );
    let saved_at = modified(&checkpoint);
    assert!(
        common::wait_until(Duration::from_secs(10), || modified(&checkpoint) > saved_at),
        "no checkpoint after telling"
    );
    drop(second);

    let third = start();
    std::thread::sleep(Duration::from_secs(6));
    assert!(!third.log_text().contains(&ours), "{}", third.log_text());
}

//! The state store end to end: `serve --state-dir` follows a real runc container whose CRI log
//! says PyTorch's DataLoader bus error; after SIGTERM, `shmlink history --json` lists the
//! failure, and `/api/v1/failures` on a second serve of the same store gives the same JSON;
//! `check --since` tells it once, from the log and the store, and from the store once the log
//! is gone.

mod common;

use std::process::Command;

use common::agent::{sample, Agent};
use common::{Container, ContainerSpec};
use serde_json::Value;

const BUS_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be caused \
                        by insufficient shared memory (shm).";

fn history(state: &str, args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(common::shmlink_bin())
        .args(["history", "--state-dir", state])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

#[test]
fn a_death_told_by_serve_is_in_history_and_over_http_after_a_restart() {
    if !common::e2e_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state_dir = tmp.path().join("state");
    let state = state_dir.to_str().unwrap();
    let uid = common::random_pod_uid();
    let id = common::random_container_id();
    let dir = tmp.path().join(format!("ml_trainer-0_{uid}/trainer"));
    std::fs::create_dir_all(&dir).unwrap();
    let root = tmp.path().to_str().unwrap();
    let agent = Agent::start(
        &[
            "--no-gpu",
            "--pod-log-root",
            root,
            "--state-dir",
            state,
            "--node-name",
            "node-s",
        ],
        &[],
    );
    agent.wait_ready();
    let script = format!("sleep 1; echo '{BUS_LINE}'; sleep 60");
    let log = dir.join("0.log");
    let _trainer = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec!["sh".into(), "-c".into(), script],
        cri_log: Some(log.clone()),
        ..ContainerSpec::default()
    });
    let body = agent.wait_for_metrics("the failure counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-0")],
        ) == Some(1.0)
    });
    assert_eq!(sample(&body, "shmlink_state_up", &[]), Some(1.0), "{body}");
    assert!(agent.terminate().success());

    let (code, listed, stderr) = history(state, &["--json", "--since", "1h"]);
    assert_eq!(code, 0, "{stderr}");
    let failures = listed["failures"].as_array().expect("failures");
    let ours: Vec<&Value> = failures
        .iter()
        .filter(|f| f["pod_uid"] == uid.as_str())
        .collect();
    assert_eq!(ours.len(), 1, "{listed:#}");
    assert_eq!(ours[0]["evidence"], BUS_LINE);
    assert_eq!(ours[0]["namespace"], "ml");
    assert_eq!(ours[0]["found_late"], false);
    assert!(listed["findings"].is_array());
    let (_, other_ns, _) = history(state, &["--json", "--namespace", "infer"]);
    assert_eq!(other_ns["failures"], Value::Array(vec![]));

    // Serve again on the same store (nothing new to tell): the endpoint gives the same JSON.
    let agent = Agent::start(
        &["--no-gpu", "--state-dir", state, "--node-name", "node-s"],
        &[],
    );
    agent.wait_ready();
    let (status, text) = common::agent::get(agent.addr, "/api/v1/failures?since=1h").unwrap();
    assert_eq!(status, 200, "{text}");
    let served: Value = serde_json::from_str(&text).unwrap();
    let (_, listed_now, _) = history(state, &["--json", "--since", "1h"]);
    assert_eq!(served, listed_now);
    let (status, _) = common::agent::get(agent.addr, "/api/v1/failures?since=never").unwrap();
    assert_eq!(status, 400);
    assert!(agent.terminate().success());

    let table = Command::new(common::shmlink_bin())
        .args(["history", "--state-dir", state])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    println!("{table}");
    assert!(table.contains("ml/trainer-0/trainer"), "{table}");

    // check reads the log again and the store: the death once. With the log gone (rotated
    // away), the store alone still has it; without the store, nothing.
    let ours_in_check = |state: &str| {
        let out = Command::new(common::shmlink_bin())
            .args([
                "check",
                "--json",
                "--no-gpu",
                "--since",
                "1h",
                "--state-dir",
                state,
            ])
            .args(["--pod-log-root", root])
            .output()
            .unwrap();
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let failures = json["failures"].as_array().cloned().unwrap_or_default();
        failures
            .into_iter()
            .filter(|f| f["pod_uid"] == uid.as_str() && f["evidence"] == BUS_LINE)
            .count()
    };
    assert_eq!(ours_in_check("none"), 1, "read from the log alone");
    assert_eq!(
        ours_in_check(state),
        1,
        "read from the log and the store: once"
    );
    std::fs::remove_file(&log).unwrap();
    assert_eq!(ours_in_check(state), 1, "the log gone: from the store");
    assert_eq!(
        ours_in_check("none"),
        0,
        "the log gone, no store: nothing to say"
    );

    // No store: exit 2 and why.
    let (code, _, stderr) = history(tmp.path().join("nothing").to_str().unwrap(), &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no history to read"), "{stderr}");
}

//! The state store end to end: `serve --state-dir` follows a real runc container whose CRI log
//! says PyTorch's DataLoader bus error; after SIGTERM, `shmlink history --json` lists the
//! failure, and `/api/v1/failures` on a second serve of the same store gives the same JSON;
//! `check --since` tells it once, from the log and the store, and from the store once the log
//! is gone.

use crate::common;

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

/// A day of stored failures, one every 10 minutes (the newest 5 minutes ago), three Pods in two
/// namespaces, written through the store as serve writes them: `/api/v1/failures` and
/// `shmlink history --json` give the same answers for each window and filter, and the table
/// lists them. The failures carry their own times (the clock the test controls); serve's "now"
/// is the machine's.
#[test]
fn a_day_of_history_is_the_same_over_http_and_from_the_cli() {
    use shmlink::model::FindingKind;
    use shmlink::state::{Identity, Options, StateMetrics, Store};
    use std::time::{Duration, SystemTime};

    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let identity = Identity {
        node: "node-day".into(),
        boot_id: shmlink::state::boot_id(std::path::Path::new("/proc")),
    };
    let store = Store::open(
        &state,
        &identity,
        Options::default(),
        &StateMetrics::default(),
    )
    .unwrap();
    let tx = store.sender();
    let now = SystemTime::now();
    for i in 0..144u64 {
        let (ns, pod) = [("ml", "train-0"), ("ml", "train-1"), ("infer", "vllm-0")][i as usize % 3];
        let mut f = shmlink::fixtures::failure(FindingKind::ShmAllocationFailed, ns, pod, "u");
        let at = now - Duration::from_secs(300 + i * 600);
        f.at = at.into();
        tx.failure(&f, i % 10 == 0);
    }
    assert!(tx.flush(Duration::from_secs(10)));
    drop(tx);
    drop(store);

    let state_arg = state.to_str().unwrap();
    let agent = Agent::start(
        &[
            "--no-gpu",
            "--state-dir",
            state_arg,
            "--node-name",
            "node-day",
        ],
        &[],
    );
    agent.wait_ready();
    let cases: [(&str, &[&str], usize); 5] = [
        ("since=1h", &["--since", "1h"], 6),
        ("since=24h", &["--since", "24h"], 144),
        (
            "since=24h&namespace=ml",
            &["--since", "24h", "--namespace", "ml"],
            96,
        ),
        (
            "since=24h&pod=vllm-0",
            &["--since", "24h", "--pod", "vllm-0"],
            48,
        ),
        (
            "since=3h&namespace=ml&pod=train-1",
            &["--since", "3h", "--namespace", "ml", "--pod", "train-1"],
            6,
        ),
    ];
    for (query, args, want) in cases {
        let (status, text) = common::agent::get(agent.addr, &format!("/api/v1/failures?{query}"))
            .unwrap_or_else(|| panic!("{query}: no whole answer; {}", agent.log_text()));
        assert_eq!(status, 200, "{query}: {text}");
        let served: Value = serde_json::from_str(&text).unwrap();
        let mut cli_args = vec!["--json"];
        cli_args.extend_from_slice(args);
        let (code, listed, stderr) = history(state_arg, &cli_args);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(served, listed, "{query}: the endpoint and the CLI differ");
        let failures = served["failures"].as_array().unwrap();
        assert_eq!(failures.len(), want, "{query}");
        let times: Vec<&str> = failures.iter().map(|f| f["at"].as_str().unwrap()).collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "{query}: oldest first"
        );
        if query == "since=24h" {
            let late = failures.iter().filter(|f| f["found_late"] == true).count();
            assert_eq!(late, 15, "found_late as stored: every tenth");
        }
    }
    assert!(agent.terminate().success());
    let table = Command::new(common::shmlink_bin())
        .args(["history", "--state-dir", state_arg, "--since", "1h"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    println!("{table}");
    assert_eq!(
        table.matches("/trainer  shm_allocation_failed").count(),
        6,
        "{table}"
    );
}

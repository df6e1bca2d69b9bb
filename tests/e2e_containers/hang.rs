//! Hangs, end to end: two real runc containers in Pods, listed by the fake NVML (the 8-GPU
//! NVSwitch board), one on GPUs 5 and 7, one on GPUs 0 and 1. While both wait in a collective,
//! GPU 7's link 3 goes down; then each prints PyTorch's watchdog line (its `ran for` reaching
//! back to before the drop) to its CRI log. The GpuCollectiveTimeout Event of the first names
//! GPU 7 as the culprit, the other says its links were clean: look at the ranks. `history` and
//! `check` (reading serve's store, after the containers are gone) tell the same. Run with
//! --nocapture to see the notes.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent::{on_gpus, sample, Agent};
use common::binary::shmlink_json as shmlink;
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

/// The board with `culprit` on GPUs 5 and 7, `clean` on GPUs 0 and 1, GPU 7's link 3 `up`.
fn board(culprit: Option<i32>, clean: Option<i32>, up: bool) -> Value {
    let mut config = fake_nvml::preset("nvswitch-8");
    for (pid, gpus) in [(culprit, [5, 7]), (clean, [0, 1])] {
        if let Some(pid) = pid {
            for g in gpus {
                config["gpus"][g]["processes"] = json!([{"pid": pid, "used_memory": 1u64 << 30}]);
            }
        }
    }
    config["gpus"][7]["links"][3]["active"] = json!(up);
    config
}

/// PyTorch 2.x's watchdog line for a collective that ran `ran_for_ms`.
fn watchdog_line(rank: u32, ran_for_ms: u128) -> String {
    format!(
        "[rank{rank}]:[E1124 10:10:00.000000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID \
         0(default_pg) Rank {rank}] Watchdog caught collective operation timeout: \
         WorkNCCL(SeqNum=4812, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, \
         Timeout(ms)={ran_for_ms}) ran for {ran_for_ms} milliseconds before timing out."
    )
}

/// A job that waits in "its collective" until `/go/line` exists, prints it, then aborts
/// (exit 134, as PyTorch's watchdog ends the process).
fn job(uid: &str, id: &str, go: &Path, log: PathBuf) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(uid.to_string()),
        id: Some(id.to_string()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "while [ ! -e /go/line ]; do sleep 0.05; done; cat /go/line; \
             echo 'terminate called after throwing an instance of c10::DistBackendError'; \
             sleep 60"
                .into(),
        ],
        extra_mounts: vec![common::ro_bind(go, "/go")],
        cri_log: Some(log),
        ..ContainerSpec::default()
    })
}

/// The hangs told of `pod` in a report's `failures`.
fn hangs_of(report: &Value, pod: &str) -> Vec<Value> {
    report["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == "gpu_collective_timeout" && f["pod"] == pod)
        .cloned()
        .collect()
}

fn event(api: &FakeApi, pod: &str) -> Value {
    let mut found = Vec::new();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            found = api
                .events_about(pod)
                .into_iter()
                .filter(|e| e["reason"] == "GpuCollectiveTimeout")
                .collect();
            !found.is_empty()
        }),
        "no GpuCollectiveTimeout Event about {pod}; the server holds: {:#?}",
        api.events()
    );
    assert_eq!(found.len(), 1, "one hang, one Event: {found:#?}");
    found.remove(0)
}

#[test]
fn a_hangs_event_names_the_gpu_whose_link_dropped_in_its_window_or_says_the_links_were_clean() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let (a_uid, a_id) = (common::random_pod_uid(), common::random_container_id());
    let (b_uid, b_id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(
        NODE,
        "ml",
        "hang-culprit-0",
        &a_uid,
        &[("trainer", &a_id)],
    ));
    api.apply_pod(pod(
        NODE,
        "ml",
        "hang-clean-0",
        &b_uid,
        &[("trainer", &b_id)],
    ));
    let logs = tempfile::tempdir().unwrap();
    let log_of = |name: &str, uid: &str| {
        let dir = logs.path().join(format!("ml_{name}_{uid}/trainer"));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("0.log")
    };
    let (a_log, b_log) = (
        log_of("hang-culprit-0", &a_uid),
        log_of("hang-clean-0", &b_uid),
    );
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap();
    let fake = FakeNvml::new(&board(None, None, true));
    let kubeconfig = api.kubeconfig_path();
    let log_root = logs.path().to_str().unwrap();
    let agent = Agent::start_gpu_kube(
        &kubeconfig,
        &fake,
        NODE,
        &["--pod-log-root", log_root, "--state-dir", state_dir],
    );
    let (a_go, b_go) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = job(&a_uid, &a_id, a_go.path(), a_log);
    let b = job(&b_uid, &b_id, b_go.path(), b_log);
    fake.write(&board(Some(a.pid), Some(b.pid), true));
    agent.wait_for_metrics("both jobs on their GPUs", |m| {
        on_gpus(m, &a_id, &["5", "7"]) && on_gpus(m, &b_id, &["0", "1"])
    });
    // Both enter the collective now; half a second in, GPU 7's link 3 drops.
    let entered = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    fake.write(&board(Some(a.pid), Some(b.pid), false));
    agent.wait_for_metrics("GPU 7's link 3 down", |m| {
        sample(m, "shmlink_nvlink_up", &[("gpu", "7"), ("link", "3")]) == Some(0.0)
    });
    std::thread::sleep(Duration::from_millis(300));
    // The watchdogs give up; what they ran for reaches back to when both entered.
    let ran_for = entered.elapsed().as_millis();
    for (go, rank) in [(a_go.path(), 0), (b_go.path(), 4)] {
        std::fs::write(go.join("line.tmp"), watchdog_line(rank, ran_for)).unwrap();
        std::fs::rename(go.join("line.tmp"), go.join("line")).unwrap();
    }

    let culprit = event(&api, "hang-culprit-0");
    let note = culprit["note"].as_str().unwrap();
    println!("culprit: {note}");
    common::assert_contains_all(
        note,
        &[
            "PyTorch's NCCL watchdog ended ml/hang-culprit-0/trainer at ",
            "ALLREDUCE (SeqNum 4812, rank 0, process group 0 (default_pg))",
            "its container was using GPUs 5 and 7",
            "GPU 7's links went down 0 s into the hang (GPU 7 link 3 to an NVSwitch at ",
            "the culprit, the hardware and not the job",
            "`nvidia-smi -r -i 7`",
        ],
    );
    assert!(!note.contains("-r -i 5"), "{note}");
    let clean = event(&api, "hang-clean-0");
    let note = clean["note"].as_str().unwrap();
    println!("clean: {note}");
    common::assert_contains_all(
        note,
        &[
            "its container was using GPUs 0 and 1",
            "Every link of its GPUs (36 NVLinks) was clean over the hang's window (",
            "Look at the ranks",
        ],
    );
    assert!(!note.contains("culprit"), "{note}");
    assert!(note.len() <= 1024, "{note}");

    // The store has both; then the jobs abort and are gone.
    let history_args = ["history", "--state-dir", state_dir, "--json"];
    let mut history = Value::Null;
    assert!(common::wait_until(Duration::from_secs(10), || {
        history = shmlink(&history_args, &[]);
        hangs_of(&history, "hang-culprit-0").len() == 1
            && hangs_of(&history, "hang-clean-0").len() == 1
    }));
    fake.write(&board(None, None, false));
    drop((a, b));
    agent.wait_for_metrics("the jobs gone", |m| {
        sample(
            m,
            "shmlink_gpu_container_info",
            &[("container_id", &a_id), ("gpu", "7")],
        )
        .is_none()
            && sample(
                m,
                "shmlink_gpu_container_info",
                &[("container_id", &b_id), ("gpu", "0")],
            )
            .is_none()
    });
    drop(agent);

    // check, reading the logs back and serve's store: one hang each, as serve told it.
    let args = [
        "--kube",
        "off",
        "--state-dir",
        state_dir,
        "--pod-log-root",
        log_root,
        "--kmsg",
        "off",
        "--since",
        "10m",
    ];
    let report = fake.check_json(&args);
    for pod in ["hang-culprit-0", "hang-clean-0"] {
        let (told, stored) = (hangs_of(&report, pod), hangs_of(&history, pod));
        assert_eq!(told.len(), 1, "one hang, one failure: {told:#?}");
        assert_eq!(told[0]["message"], stored[0]["message"]);
        assert_eq!(told[0]["hang"], stored[0]["hang"]);
        assert!(told[0]["named_from"]
            .as_str()
            .unwrap()
            .starts_with("PyTorch's NCCL watchdog: ALLREDUCE SeqNum=4812"));
    }
    let hang = &hangs_of(&report, "hang-culprit-0")[0]["hang"];
    assert_eq!(hang["links"]["verdict"], "culprit", "{hang:#}");
    assert_eq!(hang["links"]["gpus"], json!([7]));
    assert_eq!(hang["links"]["watched"], "whole");
    assert_eq!(hang["links"]["events"][0]["went"], "down");
    let hang = &hangs_of(&report, "hang-clean-0")[0]["hang"];
    assert_eq!(hang["links"]["verdict"], "clean", "{hang:#}");
}

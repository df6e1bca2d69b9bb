//! Held states across a restart, end to end: the real `shmlink serve --state-dir` with the fake
//! NVML (GPU 7's NVLinks all down, XID 48 on GPU 7, replay errors on a link of GPU 0) and the
//! in-process API server. Killed (SIGKILL) and started again in the same boot, the failing pairs
//! keep their since-time (GPU 0's too: its error window goes on) and `GpuFault` stays True with
//! its lastTransitionTime (the fake NVML, like the real one, does not
//! deliver again the XIDs of before it was loaded), and `check` on the same store tells the same
//! held XID in GPU 7's verdict. Started in another boot (a new
//! `<proc-root>/sys/kernel/random/boot_id`), neither is taken up. Needs neither root nor
//! containers.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{kubelet_node, FakeApi};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-r";

fn wait_condition(api: &FakeApi, agent: &Agent, type_: &str, ok: impl Fn(&Value) -> bool) -> Value {
    api.wait_node_condition(NODE, type_, "as wanted", || agent.log_text(), ok)
}

/// A proc root that names this boot (and holds a process, or the agent is blind), and an empty
/// cgroup v2 root.
fn host(dir: &Path, boot_id: &str) -> (PathBuf, PathBuf) {
    let proc_root = dir.join("proc");
    std::fs::create_dir_all(proc_root.join("1")).unwrap();
    std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    std::fs::write(
        proc_root.join("sys/kernel/random/boot_id"),
        format!("{boot_id}\n"),
    )
    .unwrap();
    let cgroup_root = dir.join("cgroup");
    std::fs::create_dir_all(&cgroup_root).unwrap();
    std::fs::write(cgroup_root.join("cgroup.controllers"), "memory pids\n").unwrap();
    (proc_root, cgroup_root)
}

fn start(api: &FakeApi, fake: &FakeNvml, proc_root: &Path, cgroup: &Path, state: &Path) -> Agent {
    Agent::start_gpu_kube(
        &api.kubeconfig_path(),
        fake,
        NODE,
        &[
            "--proc-root",
            proc_root.to_str().unwrap(),
            "--cgroup-root",
            cgroup.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )
}

/// GPU `gpu`'s verdict in `check --json` run on the same host and state store.
fn check_verdict(
    fake: &FakeNvml,
    proc_root: &Path,
    cgroup: &Path,
    state: &Path,
    gpu: u32,
) -> Value {
    let report = fake.check_json(&[
        "--kube",
        "off",
        "--proc-root",
        proc_root.to_str().unwrap(),
        "--cgroup-root",
        cgroup.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    report["gpu_verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["gpu"] == gpu)
        .cloned()
        .unwrap_or_else(|| panic!("no verdict of GPU {gpu}: {report:#}"))
}

/// The since-time of pair `gpu`-`peer`, once it fails.
fn since_of(agent: &Agent, gpu: &str, peer: &str) -> f64 {
    let mut out = None;
    agent.wait_for_metrics("the pair failing", |b| {
        out = sample(
            b,
            "shmlink_gpu_pair_failing_since_seconds",
            &[("gpu", gpu), ("peer_gpu", peer)],
        );
        out.is_some()
    });
    out.unwrap()
}

/// The since-times of GPU 7's pairs, once all seven are there.
fn since_of_gpu7(agent: &Agent) -> Vec<f64> {
    let mut out = Vec::new();
    agent.wait_for_metrics("GPU 7's pairs failing since", |b| {
        out = (0..7)
            .filter_map(|g| {
                sample(
                    b,
                    "shmlink_gpu_pair_failing_since_seconds",
                    &[("gpu", &g.to_string()), ("peer_gpu", "7")],
                )
            })
            .collect();
        out.len() == 7
    });
    out
}

fn fault_held(c: &Value) -> bool {
    c["status"] == "True" && c["reason"] == "Xid48"
}

#[test]
fn a_restart_keeps_down_since_and_held_xids_and_another_boot_does_not() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    for link in nvml["gpus"][7]["links"].as_array_mut().unwrap() {
        link["active"] = json!(false);
    }
    let fake = FakeNvml::new(&nvml);
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let (proc_root, cgroup) = host(tmp.path(), "7b1c3a52-0d55-4f0e-9a4e-3a1f00000001");

    let agent = start(&api, &fake, &proc_root, &cgroup, &state);
    nvml["gpus"][7]["xids"] = json!([48]);
    fake.write(&nvml);
    let fault = wait_condition(&api, &agent, "GpuFault", fault_held);
    assert!(
        fault["message"]
            .as_str()
            .unwrap()
            .contains("XID 48 (Double Bit ECC Error) on GPU 7"),
        "{fault:#}"
    );
    let link = wait_condition(&api, &agent, "GpuLinkDegraded", |c| c["status"] == "True");
    let since = since_of_gpu7(&agent);
    // Replay errors on a switch link of GPU 0: its pairs degraded for the next 60 s.
    nvml["gpus"][0]["links"][0]["errors"]["replay"] = json!(5);
    fake.write(&nvml);
    let errors_since = since_of(&agent, "0", "1");
    assert!(since.iter().all(|&s| s == since[0]), "{since:?}");
    // Long enough that a since-time begun afresh would differ, and the store has committed.
    std::thread::sleep(Duration::from_millis(2_500));
    drop(agent); // SIGKILL

    let patches_before = api.node_status_patches().len();
    let agent = start(&api, &fake, &proc_root, &cgroup, &state);
    assert_eq!(
        since_of_gpu7(&agent),
        since,
        "down since before the restart"
    );
    assert_eq!(
        since_of(&agent, "0", "1"),
        errors_since,
        "degraded by errors seen before the restart, since then"
    );
    let log = agent.log_text();
    assert!(log.contains("keep their since-times"), "{log}");
    // Some scans later: still held, no transition, and nothing wrote it False meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let after = api.node_condition(NODE, "GpuFault");
    assert!(fault_held(&after), "{after:#}\nlog:\n{}", agent.log_text());
    assert_eq!(after["lastTransitionTime"], fault["lastTransitionTime"]);
    assert_eq!(
        api.node_condition(NODE, "GpuLinkDegraded")["lastTransitionTime"],
        link["lastTransitionTime"]
    );
    for p in &api.node_status_patches()[patches_before..] {
        for c in p.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(c["status"], "True", "a flap at restart: {:#}", p.body);
        }
    }
    // What this run holds is saved too: a second kill changes nothing.
    std::thread::sleep(Duration::from_millis(1_500));
    drop(agent);
    let agent = start(&api, &fake, &proc_root, &cgroup, &state);
    assert_eq!(since_of_gpu7(&agent), since);
    wait_condition(&api, &agent, "GpuFault", fault_held);
    // `check`, Kubernetes off, takes up what serve holds: GPU 7's verdict is serve's.
    let verdict = check_verdict(&fake, &proc_root, &cgroup, &state, 7);
    assert_eq!(verdict["held_xids"][0]["xid"], 48, "{verdict:#}");
    assert_eq!(verdict["out"], json!({"xid": 48}), "{verdict:#}");
    drop(agent);

    // Another boot: the links are down again, but since this boot; the XID is forgotten.
    let (proc_root, _) = host(tmp.path(), "7b1c3a52-0d55-4f0e-9a4e-3a1f00000002");
    let agent = start(&api, &fake, &proc_root, &cgroup, &state);
    let fresh = since_of_gpu7(&agent);
    assert!(fresh[0] > since[0], "{fresh:?} after {since:?}");
    let cleared = wait_condition(&api, &agent, "GpuFault", |c| c["status"] == "False");
    assert_eq!(cleared["reason"], "NoGpuFault");
    assert!(agent.log_text().contains("another boot"));
    assert!(agent.terminate().success());
}

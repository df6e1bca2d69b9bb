//! A job's link deltas, end to end: a real runc container in a Pod's cgroup, listed by the fake
//! NVML on GPUs 5 and 7 of the 8-GPU NVSwitch board, runs while GPU 7's link 3 recovers twice
//! and goes down and up; then it crashes in a test-built `libnccl.so.2` and the real kernel
//! logs it. The GpuJobCrashed Event's note says what that link did while the job ran (and that
//! the rest stayed clean), and the failure's JSON carries it (`gpu_links`) in `history` and in
//! `check`, which read serve's store. Run with --nocapture to see the note.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::agent::{on_gpus, sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::Container;
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

/// The healthy NVSwitch board, `pid` on GPUs 5 and 7, GPU 7's link 3 at `recovery` and `up`.
fn board(pid: Option<i32>, recovery: u64, up: bool) -> Value {
    let mut config = fake_nvml::preset("nvswitch-8");
    if let Some(pid) = pid {
        for g in [5, 7] {
            config["gpus"][g]["processes"] = json!([{"pid": pid, "used_memory": 1u64 << 30}]);
        }
    }
    let link = &mut config["gpus"][7]["links"][3];
    link["active"] = json!(up);
    link["errors"]["recovery"] = json!(recovery);
    config
}

/// Writes `config` and waits until a scan has read GPU 7's link 3 as it says (up or down, and
/// its recovery count).
fn link_now(agent: &Agent, fake: &FakeNvml, config: &Value, up: bool) {
    fake.write(config);
    let want = if up { 1.0 } else { 0.0 };
    let recovery = config["gpus"][7]["links"][3]["errors"]["recovery"]
        .as_f64()
        .unwrap();
    agent.wait_for_metrics("GPU 7's link 3 read", |b| {
        let link = [("gpu", "7"), ("link", "3")];
        sample(b, "shmlink_nvlink_up", &link) == Some(want)
            && sample(
                b,
                "shmlink_nvlink_errors_total",
                &[("gpu", "7"), ("link", "3"), ("type", "recovery")],
            ) == Some(recovery)
    });
}

/// The crash's failure in `report`'s `failures`, with its `gpu_links`.
fn crash_in(report: &Value, id: &str) -> Option<Value> {
    report["failures"]
        .as_array()?
        .iter()
        .filter(|f| f["kind"] == "gpu_job_crashed" && f["container_id"] == id)
        .find(|f| !f["gpu_links"].is_null())
        .cloned()
}

fn assert_links(failure: &Value) {
    let links = &failure["gpu_links"];
    assert_eq!(
        links["watched"], 36,
        "GPUs 5 and 7, 18 links each: {links:#}"
    );
    assert_eq!(links["unread"], 0, "{links:#}");
    assert_eq!(
        links["since_start"], true,
        "serve ran before the job: {links:#}"
    );
    let changed = links["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{links:#}");
    let c = &changed[0];
    assert_eq!(
        (&c["gpu"], &c["link"], &c["peer"]),
        (&json!(7), &json!(3), &json!("switch"))
    );
    assert_eq!(
        (&c["recovery"], &c["replay"], &c["went_down"], &c["came_up"]),
        (&json!(2), &json!(0), &json!(1), &json!(1)),
        "{c:#}"
    );
}

/// `serve` with the fake NVML and the fake API server, its store in `state_dir`.
fn serve(fake: &FakeNvml, api: &FakeApi, state_dir: &str) -> Agent {
    Agent::start_gpu_kube(
        &api.kubeconfig_path(),
        fake,
        NODE,
        &["--kmsg", "/dev/kmsg", "--state-dir", state_dir],
    )
}

fn seen_on_5_and_7(agent: &Agent, id: &str) {
    agent.wait_for_metrics("the job on GPUs 5 and 7", |b| on_gpus(b, id, &["5", "7"]));
}

/// The GpuJobCrashed Events about the Pod, once there is one.
fn crash_events(api: &FakeApi) -> Vec<Value> {
    api.wait_events(
        Some("allreduce-0"),
        "GpuJobCrashed",
        Duration::from_secs(20),
    )
}

/// A job's world: serve's store, the fake API server with the job's Pod, the worker's
/// container ID, the fake NVML, serve, and the worker (waiting for its go), which serve has seen
/// on GPUs 5 and 7.
struct Job(
    tempfile::TempDir,
    FakeApi,
    String,
    FakeNvml,
    Agent,
    Container,
);

fn job_seen_on_5_and_7(nccl: &Path) -> Job {
    let state = tempfile::tempdir().unwrap();
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(NODE, "ml", "allreduce-0", &uid, &[("worker", &id)]));
    let fake = FakeNvml::new(&board(None, 0, true));
    let agent = serve(&fake, &api, state.path().to_str().unwrap());
    let worker = common::crash::crashing_when_told(Some(&uid), &id, nccl);
    fake.write(&board(Some(worker.pid), 0, true));
    seen_on_5_and_7(&agent, &id);
    Job(state, api, id, fake, agent, worker)
}

#[test]
fn a_crashed_jobs_event_says_what_its_links_did_while_it_ran() {
    let nccl = tempfile::tempdir().unwrap();
    if !common::crash::nccl_crash_possible(nccl.path()) {
        return;
    }
    let Job(state, api, id, fake, agent, worker) = job_seen_on_5_and_7(nccl.path());
    let state_dir = state.path().to_str().unwrap();
    // While it runs: link 3 of GPU 7 recovers twice and drops, then comes back.
    link_now(&agent, &fake, &board(Some(worker.pid), 2, false), false);
    link_now(&agent, &fake, &board(Some(worker.pid), 2, true), true);
    std::fs::write(nccl.path().join("go"), "").unwrap();

    let found = crash_events(&api);
    let note = found[0]["note"].as_str().unwrap();
    println!("Event note ({} bytes): {note}", note.len());
    common::assert_contains_all(
        note,
        &[
            "crashed in libnccl.so.2",
            "Its GPUs' 36 NVLinks while it ran (since ",
            ", before it started, to ",
            "): GPU 7 link 3 (to an NVSwitch) recovery +2, down 1x, up 1x; the rest clean.",
        ],
    );
    assert!(note.len() <= 1024, "{note}");

    // The stored failure carries it (history), and check, reading serve's store, says the same.
    let mut history = Value::Null;
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            history =
                common::binary::shmlink_json(&["history", "--state-dir", state_dir, "--json"], &[]);
            crash_in(&history, &id).is_some()
        }),
        "the stored failure has no gpu_links: {history:#}"
    );
    assert_links(&crash_in(&history, &id).unwrap());
    drop(agent);
    let report = fake.check_json(&[
        "--kube",
        "off",
        "--state-dir",
        state_dir,
        "--kmsg",
        "/dev/kmsg",
        "--since",
        "10m",
    ]);
    let told = crash_in(&report, &id).unwrap_or_else(|| {
        panic!(
            "check's failures have no gpu_links: {:#}",
            report["failures"]
        )
    });
    assert_links(&told);
    // One crash, one failure: check's own account (the process gone, so unplaced) and serve's
    // stored one (placed) are the same.
    let accounts = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == told["kind"] && f["pid"] == told["pid"])
        .count();
    assert_eq!(accounts, 1, "{:#}", report["failures"]);
}

/// A job that started before serve restarted keeps its baseline: the recoveries before the
/// restart, while serve was down (counted at its first scan) and after it are all the job's.
#[test]
fn a_job_keeps_its_baseline_across_a_restart_of_serve() {
    let nccl = tempfile::tempdir().unwrap();
    if !common::crash::nccl_crash_possible(nccl.path()) {
        return;
    }
    let Job(state, api, id, fake, first, worker) = job_seen_on_5_and_7(nccl.path());
    let state_dir = state.path().to_str().unwrap();
    link_now(&first, &fake, &board(Some(worker.pid), 1, true), true);
    assert!(first.terminate().success());
    fake.write(&board(Some(worker.pid), 2, true));
    let second = serve(&fake, &api, state_dir);
    seen_on_5_and_7(&second, &id);
    link_now(&second, &fake, &board(Some(worker.pid), 3, true), true);
    std::fs::write(nccl.path().join("go"), "").unwrap();
    let found = crash_events(&api);
    let note = found[0]["note"].as_str().unwrap();
    println!("Event note after a restart: {note}");
    assert!(
        note.contains(", before it started, to ")
            && note.contains("GPU 7 link 3 (to an NVSwitch) recovery +3; the rest clean."),
        "{note}"
    );
}

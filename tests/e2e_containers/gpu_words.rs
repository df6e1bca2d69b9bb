//! GPU failures in the job's own words, end to end: a real runc container in a Pod, listed by
//! the fake NVML on GPUs 5 and 7 of the 8-GPU NVSwitch board, prints PyTorch's watchdog line for
//! CUDA 214 to its CRI log after GPU 7 reported XID 48 (double-bit ECC). The Event on its Pod
//! names GPU 7 as the bad one, not GPU 5, and says what to do. Run with --nocapture to see it.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::{on_gpus, sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

/// As PyTorch 2.x's ProcessGroupNCCL watchdog prints it (pytorch/pytorch#113128).
const ECC_LINE: &str = "[rank1]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 \
                        (default_pg) Rank 1] Process group watchdog thread terminated with \
                        exception: CUDA error: uncorrectable ECC error encountered";

/// The board with `pid` on GPUs 5 and 7 and GPU 7's XID history `xids`.
fn board(pid: Option<i32>, xids: &[u64]) -> Value {
    let mut config = fake_nvml::preset("nvswitch-8");
    if let Some(pid) = pid {
        for g in [5, 7] {
            config["gpus"][g]["processes"] = json!([{"pid": pid, "used_memory": 1u64 << 30}]);
        }
    }
    config["gpus"][7]["xids"] = json!(xids);
    config
}

#[test]
fn an_uncorrectable_ecc_error_in_the_jobs_words_names_the_gpu_with_the_ecc_xid() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(NODE, "ml", "trainer-0", &uid, &[("trainer", &id)]));
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join(format!("ml_trainer-0_{uid}/trainer"));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = FakeNvml::new(&board(None, &[]));
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_gpu_kube(
        &kubeconfig,
        &fake,
        NODE,
        &["--pod-log-root", logs.path().to_str().unwrap()],
    );

    // The job waits for its go, then says what PyTorch's watchdog says, and goes on.
    let go = tempfile::tempdir().unwrap();
    let log = dir.join("0.log");
    let job = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec![
            "sh".into(),
            "-c".into(),
            format!("while [ ! -e /go/now ]; do sleep 0.05; done; echo '{ECC_LINE}'; sleep 60"),
        ],
        extra_mounts: vec![common::ro_bind(go.path(), "/go")],
        cri_log: Some(log.clone()),
        ..ContainerSpec::default()
    });
    // GPU 7 reports XID 48 while the job runs on GPUs 5 and 7.
    fake.write(&board(Some(job.pid), &[48]));
    agent.wait_for_metrics("the job on GPUs 5 and 7 and XID 48 on GPU 7", |b| {
        sample(
            b,
            "shmlink_gpu_xid_errors_total",
            &[("gpu", "7"), ("xid", "48")],
        ) == Some(1.0)
            && on_gpus(b, &id, &["5", "7"])
    });
    std::fs::write(go.path().join("now"), "").unwrap();
    let said = Instant::now();

    let found = api.wait_events(
        Some("trainer-0"),
        "GpuEccUncorrectable",
        Duration::from_secs(20),
    );
    let note = found[0]["note"].as_str().unwrap();
    println!("{} ms after the line: {note}", said.elapsed().as_millis());
    assert_eq!(found[0]["type"], "Warning");
    common::assert_contains_all(
        note,
        &[
            "CUDA in ml/trainer-0/trainer met an uncorrectable ECC error at ",
            "uncorrectable ECC error encountered",
            "its container was using GPUs 5 and 7",
            "The bad one: GPU 7 (GPU 7: XID 48, Double Bit ECC Error)",
            "`nvidia-smi -r -i 7`",
        ],
    );
    assert!(!note.contains("-r -i 5"), "{note}");
    agent.wait_for_metrics("the failure counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-0"), ("kind", "gpu_ecc_uncorrectable")],
        ) == Some(1.0)
    });
}

//! IPC that fails for another reason than a full /dev/shm, end to end: two real runc containers
//! of one Pod, each with the runtime's own /dev/shm (no shared emptyDir), where one process makes
//! a `multiprocessing.shared_memory` block and its partner in the other container attaches to it
//! by name, as a DataLoader or an inference server's client would. Python says the block is not
//! there; `serve` names it on the Pod as `ShmNotShared`, with the fix that shares one /dev/shm,
//! not a larger one. Run with --nocapture to see the Event.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::{sample, Agent};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec};
use serde_json::json;

const NODE: &str = "gpu-node-7";
const PYTHON: &str = "/usr/bin/python3";

/// Makes a block, tells its name through a directory both containers see, and keeps it.
const MAKER: &str = r#"
import time
from multiprocessing import shared_memory
block = shared_memory.SharedMemory(create=True, size=1 << 20)
with open("/exchange/name.tmp", "w") as f:
    f.write(block.name)
import os
os.rename("/exchange/name.tmp", "/exchange/name")
time.sleep(120)
"#;

/// Waits for the name, then attaches to the block in its own /dev/shm.
const PARTNER: &str = r#"
import os, time
from multiprocessing import shared_memory
while not os.path.exists("/exchange/name"):
    time.sleep(0.05)
name = open("/exchange/name").read()
shared_memory.SharedMemory(name=name)
"#;

fn python(uid: &str, id: &str, script: &str, exchange: &Path, log: Option<&Path>) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(uid.to_string()),
        id: Some(id.to_string()),
        args: vec![PYTHON.into(), "-c".into(), script.into()],
        extra_mounts: [
            common::runc::host_libraries(),
            vec![
                json!({"destination": "/exchange", "type": "bind", "source": exchange,
                        "options": ["rbind", "rw"]}),
            ],
        ]
        .concat(),
        cri_log: log.map(Path::to_path_buf),
        ..ContainerSpec::default()
    })
}

#[test]
fn a_segment_in_another_containers_dev_shm_is_told_as_not_shared() {
    if !common::e2e_available() {
        return;
    }
    if !Path::new(PYTHON).exists() {
        assert_ne!(
            std::env::var("SHMLINK_E2E").as_deref(),
            Ok("require"),
            "{PYTHON} is missing (apt-get install python3)"
        );
        eprintln!("\n## SKIPPED: {PYTHON} is missing (apt-get install python3)\n");
        return;
    }
    let api = FakeApi::start();
    let uid = common::random_pod_uid();
    let (maker_id, partner_id) = (common::random_container_id(), common::random_container_id());
    api.apply_pod(pod(
        NODE,
        "ml",
        "infer-0",
        &uid,
        &[("server", &maker_id), ("client", &partner_id)],
    ));
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join(format!("ml_infer-0_{uid}/client"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(
        &kubeconfig,
        NODE,
        &["--pod-log-root", logs.path().to_str().unwrap()],
    );
    agent.wait_ready();

    let exchange = tempfile::tempdir().unwrap();
    let _maker = python(&uid, &maker_id, MAKER, exchange.path(), None);
    let log = dir.join("0.log");
    let partner = python(&uid, &partner_id, PARTNER, exchange.path(), Some(&log));
    assert!(
        partner.wait_exited(Duration::from_secs(60)),
        "{}",
        partner.console()
    );
    let mut text = String::new();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("No such file or directory: '/psm_")
        }),
        "Python did not say it: {text}"
    );
    let written = Instant::now();
    let found = api.wait_events(Some("infer-0"), "ShmNotShared", Duration::from_secs(10));
    println!(
        "{} ms after the line: {}",
        written.elapsed().as_millis(),
        found[0]["note"].as_str().unwrap_or("")
    );
    let note = found[0]["note"].as_str().unwrap();
    common::assert_contains_all(note, &[
        "container ml/infer-0/client could not open a shared-memory segment another process made",
        "FileNotFoundError: [Errno 2] No such file or directory: '/psm_",
        "this is not /dev/shm running out",
        "mount the same emptyDir (medium: Memory) at /dev/shm in every container of the Pod",
    ]);
    assert_eq!(found.len(), 1);
    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "infer-0"), ("kind", "shm_not_shared")]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(
        !api.events_about("infer-0")
            .iter()
            .any(|e| e["reason"] == "ShmAllocationFailed"),
        "not a full /dev/shm"
    );
}

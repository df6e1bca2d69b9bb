//! The forged XID (issue 51): a Pod with NET_ADMIN in its own network namespace, on a node with
//! `net.netfilter.nf_log_all_netns=1`, puts `NVRM: Xid (0000:18:00): 48, ` in a netfilter LOG
//! prefix; the kernel prints its record (`<prefix>IN=eth0 OUT= MAC=... SRC=...`) at its own
//! facility. Before, one packet later `GpuFault` was True, the node taint set and a NoExecute
//! DeviceTaintRule took GPU 0 out. Here the real `shmlink serve` reads such records (and the
//! driver's whole shape in an nft prefix, and a process's write to /dev/kmsg) from a file in
//! /dev/kmsg's format, with the fake NVML's 8-GPU board and the in-process API server: they are
//! counted as unconfirmed and nothing is acted on; a driver XID NVML confirms still takes the
//! GPU out. Needs neither root nor containers (nor real netfilter: the record is as the kernel
//! formats it).

use crate::common;

use std::io::Write;
use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::FakeApi;
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

fn our_taint(api: &FakeApi) -> bool {
    api.node(NODE)["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == "shmlink.io/gpu-fault")
}

fn wait(what: &str, agent: &Agent, api: &FakeApi, mut done: impl FnMut() -> bool) {
    assert!(
        common::wait_until(Duration::from_secs(30), &mut done),
        "{what} did not happen; the Node: {:#}\nrules: {:#}\nlog:\n{}",
        api.node(NODE),
        Value::Array(api.rules()),
        agent.log_text()
    );
}

fn count(agent: &Agent, family: &str, gpu: &str, xid: &str) -> Option<f64> {
    sample(&agent.metrics(), family, &[("gpu", gpu), ("xid", xid)])
}

#[test]
fn a_forged_xid_evicts_no_one_and_a_confirmed_one_still_takes_its_gpu_out() {
    let api = FakeApi::with_dra_rules(NODE);
    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let agent = Agent::start_gpu_kube(
        &api.kubeconfig_path(),
        &fake,
        NODE,
        &[
            "--kmsg",
            kmsg.to_str().unwrap(),
            "--taint-on-gpu-fault",
            "--gpu-device-taint",
            "NoExecute",
            "--gpu-fault-hold",
            "1h",
        ],
    );
    wait("GpuFault False", &agent, &api, || {
        api.node_condition(NODE, "GpuFault")["status"] == "False"
    });
    agent.wait_for_metrics("the kernel log open", |b| {
        sample(b, "shmlink_kmsg_up", &[]) == Some(1.0)
    });
    // "00000000:18:00.0" as NVML spells GPU 0; the kernel prints "0000:18:00".
    let pci = |gpu: usize| {
        let id = nvml["gpus"][gpu]["pci_bus_id"]
            .as_str()
            .unwrap()
            .to_lowercase();
        id[4..].trim_end_matches(".0").to_string()
    };
    let (gpu0, gpu1) = (pci(0), pci(1));
    let path = format!(
        "{}/tests/fixtures/kmsg/forged-xid.kmsg",
        env!("CARGO_MANIFEST_DIR")
    );
    let forged = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .take(3)
        .map(|l| l.replace("0000:18:00", &gpu0))
        .collect::<Vec<_>>()
        .join("\n");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .unwrap();
    // The three lookalikes on GPU 0, and the driver's own shape on GPU 1 with no word of NVML.
    writeln!(
        f,
        "{forged}\n4,7100,9900000000,-;NVRM: Xid (PCI:{gpu1}): 48, pid=4242, name=python3, An \
         uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at \
         partition 1, subpartition 0."
    )
    .unwrap();
    wait("the lines counted as unconfirmed", &agent, &api, || {
        count(&agent, "shmlink_gpu_xid_unconfirmed_total", "0", "48") == Some(3.0)
            && count(&agent, "shmlink_gpu_xid_unconfirmed_total", "1", "48") == Some(1.0)
    });
    // Several scans later still: nothing acted on.
    let s0 = agent.scans("gpu");
    wait("five more scans", &agent, &api, || {
        agent.scans("gpu") >= s0 + 5.0
    });
    let fault = api.node_condition(NODE, "GpuFault");
    assert_eq!(fault["status"], "False", "{fault:#}");
    assert_eq!(fault["reason"], "NoGpuFault", "{fault:#}");
    assert!(!our_taint(&api), "{:#}", api.node(NODE));
    assert!(api.rules().is_empty(), "{:#}", Value::Array(api.rules()));
    assert_eq!(
        count(&agent, "shmlink_gpu_xid_errors_total", "0", "48"),
        None
    );
    assert_eq!(
        count(&agent, "shmlink_gpu_xid_errors_total", "1", "48"),
        None
    );
    assert!(
        !api.events().iter().any(|e| e["reason"] == "GpuXid"),
        "a GpuXid Event for a forged XID"
    );
    let log = agent.log_text();
    assert!(log.contains("netfilter LOG record"), "{log}");
    assert!(log.contains("NVML does not confirm it"), "{log}");

    // The driver's XID 48 on GPU 0, which NVML delivers too: one XID, and GPU 0 out.
    nvml["gpus"][0]["xids"] = json!([48]);
    fake.write(&nvml);
    writeln!(
        f,
        "4,7101,9900000100,-;NVRM: Xid (PCI:{gpu0}): 48, pid=4242, name=python3, An \
         uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at \
         partition 1, subpartition 0."
    )
    .unwrap();
    wait("GpuFault True (Xid48)", &agent, &api, || {
        let c = api.node_condition(NODE, "GpuFault");
        c["status"] == "True" && c["reason"] == "Xid48"
    });
    wait("the node taint", &agent, &api, || our_taint(&api));
    wait("GPU 0's rule", &agent, &api, || {
        api.rules()
            .iter()
            .any(|r| r["metadata"]["name"] == "shmlink-gpu-node-7-gpu-0")
    });
    assert_eq!(api.rules().len(), 1, "{:#}", Value::Array(api.rules()));
    assert_eq!(
        count(&agent, "shmlink_gpu_xid_errors_total", "0", "48"),
        Some(1.0),
        "one XID, told by both"
    );
    assert!(agent.terminate().success());
}

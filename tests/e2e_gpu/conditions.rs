//! The Node's GPU conditions end to end: the real `shmlink serve` with the fake NVML library
//! (its config replaced atomically to inject faults) and the in-process API server, through the
//! real `kube` client. Needs neither root nor containers. Prints the Node's conditions as the
//! server last held them in the link-down and XID 79 cases (run with --nocapture).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{kubelet_node, pod, FakeApi};
use common::pod_resources::{gpu_pod, FakePodResources};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";

/// Waits until the condition satisfies `ok`; panics with the Node and the agent's log.
fn wait_condition(
    api: &FakeApi,
    agent: &Agent,
    type_: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    api.wait_node_condition(NODE, type_, what, || agent.log_text(), ok)
}

/// The first `n` links of `gpu` inactive.
fn links_down(nvml: &mut Value, gpu: usize, n: usize) {
    for link in nvml["gpus"][gpu]["links"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .take(n)
    {
        link["active"] = json!(false);
    }
}

fn is(status: &'static str, reason: &'static str) -> impl Fn(&Value) -> bool {
    move |c| c["status"] == status && c["reason"] == reason
}

fn print_conditions(case: &str, api: &FakeApi) {
    eprintln!(
        "NODE CONDITIONS ({case}), as the API server last held them:\n{:#}",
        Value::Array(api.node_conditions(NODE))
    );
}

/// Waits for `n` more scans: what a storm would have written in by then, it has.
fn wait_scans(agent: &Agent, n: u32) {
    let s0 = agent.scans("gpu");
    assert!(
        common::wait_until(Duration::from_secs(30), || agent.scans("gpu")
            >= s0 + f64::from(n)),
        "no {n} scans; log:\n{}",
        agent.log_text()
    );
}

fn start(api: &FakeApi, fake: &FakeNvml, extra: &[&str]) -> Agent {
    Agent::start_gpu_kube(&api.kubeconfig_path(), fake, NODE, extra)
}

/// A proc root whose driver lists `bus_ids`, and an empty cgroup v2 tree (no containers).
fn host_fixture(dir: &Path, bus_ids: &[&str]) -> (PathBuf, PathBuf) {
    let proc_root = dir.join("proc");
    for id in bus_ids {
        std::fs::create_dir_all(proc_root.join("driver/nvidia/gpus").join(id)).unwrap();
    }
    // A process, or the agent is blind (no_processes) and never ready.
    std::fs::create_dir_all(proc_root.join("1")).unwrap();
    let cgroup_root = dir.join("cgroup");
    std::fs::create_dir_all(&cgroup_root).unwrap();
    std::fs::write(
        cgroup_root.join("cgroup.controllers"),
        "cpu io memory pids\n",
    )
    .unwrap();
    (proc_root, cgroup_root)
}

#[test]
fn links_down_make_gpu_link_degraded_true_until_they_recover_with_no_write_storm() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let kubelet: Vec<Value> = api.node_conditions(NODE);
    let mut nvml = fake_nvml::preset("nvlink-mesh-4");
    let fake = FakeNvml::new(&nvml);
    let agent = start(&api, &fake, &[]);

    let link = wait_condition(&api, &agent, "GpuLinkDegraded", "False", |c| {
        is("False", "GpuPairsHealthy")(c)
    });
    assert_eq!(link["message"], "All 6 GPU pairs are ok.");
    let fault = api.node_condition(NODE, "GpuFault");
    assert_eq!(fault["status"], "False");
    assert_eq!(fault["reason"], "NoGpuFault");
    assert_eq!(
        api.node_conditions(NODE)[..4],
        kubelet[..],
        "kubelet's conditions untouched"
    );

    // Ten scans that find the same: no further write.
    let writes = api.node_status_patches().len();
    wait_scans(&agent, 10);
    assert_eq!(api.node_status_patches().len(), writes, "no write storm");
    assert_eq!(writes, 1);

    // GPU 0's four links to GPU 1 go down.
    links_down(&mut nvml, 0, 4);
    fake.write(&nvml);
    let link = wait_condition(&api, &agent, "GpuLinkDegraded", "True", |c| {
        c["status"] == "True"
    });
    assert_eq!(link["reason"], "GpuPairsDown");
    let message = link["message"].as_str().unwrap();
    assert!(
        message.starts_with("GPU pairs down: GPU 0 <-> GPU 1 (links 0, 1, 2, 3 of GPU 0)."),
        "{message}"
    );
    assert!(message.contains("drain the node"), "{message}");
    assert_eq!(api.node_condition(NODE, "GpuFault")["status"], "False");
    assert_eq!(
        api.node_condition(NODE, "GpuFault")["lastTransitionTime"],
        fault["lastTransitionTime"]
    );
    wait_scans(&agent, 10);
    print_conditions("link down", &api);
    assert_eq!(
        api.node_status_patches().len(),
        2,
        "one write for the change"
    );

    // Back up.
    for link in nvml["gpus"][0]["links"].as_array_mut().unwrap() {
        link["active"] = json!(true);
    }
    fake.write(&nvml);
    wait_condition(&api, &agent, "GpuLinkDegraded", "False again", |c| {
        c["status"] == "False"
    });
    assert_eq!(
        api.node_conditions(NODE)[..4],
        kubelet[..],
        "kubelet's conditions untouched"
    );
    assert_eq!(api.node_conditions(NODE).len(), 6);
    let body = agent.metrics();
    assert_eq!(
        sample(&body, "shmlink_node_condition_writes_total", &[]),
        Some(3.0)
    );
    assert_eq!(
        sample(&body, "shmlink_gpu_devices", &[]),
        Some(0.0),
        "this host lists none"
    );
    assert!(agent.terminate().success());
}

#[test]
fn xid_13_stays_an_event_on_its_pod_79_and_48_are_faults_and_a_restart_clears_them() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    // The kubelet says trainer-0 holds GPU 1.
    let uuid1 = nvml["gpus"][1]["uuid"].as_str().unwrap().to_string();
    let kubelet = FakePodResources::start();
    kubelet.set(vec![gpu_pod("ml", "trainer-0", "trainer", &[&uuid1])]);
    let uid = common::random_pod_uid();
    api.apply_pod(pod(NODE, "ml", "trainer-0", &uid, &[]));
    let socket = kubelet.socket();
    let agent = start(
        &api,
        &fake,
        &["--pod-resources-socket", socket.to_str().unwrap()],
    );
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));

    // XID 13 (the application's): an Event on the Pod holding GPU 1, no fault.
    nvml["gpus"][1]["xids"] = json!([13]);
    fake.write(&nvml);
    let mut on_pod = Vec::new();
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            on_pod = api
                .events()
                .into_iter()
                .filter(|e| e["reason"] == "GpuXid" && e["regarding"]["kind"] == "Pod")
                .collect();
            !on_pod.is_empty()
        }),
        "no GpuXid Event on the Pod; events: {:#?}",
        api.events()
    );
    assert_eq!(on_pod[0]["regarding"]["name"], "trainer-0");
    let note = on_pod[0]["note"].as_str().unwrap();
    assert!(
        note.contains("XID 13 on GPU 1") && note.contains("restart the application"),
        "{note}"
    );
    agent.wait_for_metrics("XID 13 counted", |b| {
        sample(
            b,
            "shmlink_gpu_xid_errors_total",
            &[("gpu", "1"), ("xid", "13")],
        ) == Some(1.0)
    });
    wait_scans(&agent, 3);
    assert_eq!(
        api.node_condition(NODE, "GpuFault")["status"],
        "False",
        "XID 13 is no GPU fault"
    );

    // XID 79 on GPU 2: reboot.
    nvml["gpus"][2]["xids"] = json!([79]);
    fake.write(&nvml);
    let fault = wait_condition(
        &api,
        &agent,
        "GpuFault",
        "True (Xid79)",
        is("True", "Xid79"),
    );
    assert_eq!(
        fault["message"],
        "XID 79 (GPU has fallen off the bus) on GPU 2: drain and reboot the node."
    );
    print_conditions("XID 79", &api);
    let since = fault["lastTransitionTime"].clone();

    // XID 48 on GPU 3: told too; the reboot stays the reason.
    nvml["gpus"][3]["xids"] = json!([48]);
    fake.write(&nvml);
    let fault = wait_condition(&api, &agent, "GpuFault", "told XID 48", |c| {
        c["message"].as_str().unwrap_or("").contains("XID 48")
    });
    assert_eq!(fault["reason"], "Xid79");
    assert!(fault["message"]
        .as_str()
        .unwrap()
        .contains("XID 48 (Double Bit ECC Error) on GPU 3: drain the node and reset the GPU"));
    assert_eq!(
        fault["lastTransitionTime"], since,
        "still True: no transition"
    );

    // XID 79 again on GPU 2: escalated.
    nvml["gpus"][2]["xids"] = json!([79, 79]);
    fake.write(&nvml);
    let fault = wait_condition(&api, &agent, "GpuFault", "escalated", |c| {
        c["message"].as_str().unwrap_or("").contains("seen 2 times")
    });
    assert!(
        fault["message"]
            .as_str()
            .unwrap()
            .starts_with("XID 79 (GPU has fallen off the bus) seen 2 times on GPU 2 within 1h"),
        "{}",
        fault["message"]
    );
    // The counter stays one per GPU and XID.
    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_xid_errors_total",
            &[("gpu", "2"), ("xid", "79")]
        ),
        Some(2.0)
    );
    assert!(agent.terminate().success());

    // The node reboots (or the driver reloads): NVML's XID history starts over, and so does
    // the agent's. The fault clears, with a new transition time.
    let agent = start(
        &api,
        &fake,
        &["--pod-resources-socket", socket.to_str().unwrap()],
    );
    let fault = wait_condition(&api, &agent, "GpuFault", "False after restart", |c| {
        c["status"] == "False"
    });
    assert_eq!(fault["reason"], "NoGpuFault");
    assert_ne!(fault["lastTransitionTime"], Value::Null);
    assert!(agent.terminate().success());
}

#[test]
fn nvml_asking_for_a_gpu_reset_is_a_fault_while_it_asks() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("b200-8");
    let fake = FakeNvml::new(&nvml);
    let agent = start(&api, &fake, &[]);
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));
    nvml["gpus"][6]["recovery_action"] = json!("gpu_reset");
    fake.write(&nvml);
    let fault = wait_condition(
        &api,
        &agent,
        "GpuFault",
        "True (reset)",
        is("True", "RecoveryActionGpuReset"),
    );
    let message = fault["message"].as_str().unwrap();
    assert!(
        message.starts_with("NVML's recovery action for GPU 6 (00000000:D1:00.0) is gpu_reset"),
        "{message}"
    );
    assert!(message.contains("nvidia-smi -r -i 6"), "{message}");
    // A reset request alone degrades no pair.
    assert_eq!(
        api.node_condition(NODE, "GpuLinkDegraded")["status"],
        "False"
    );
    // Reset done: NVML says none again, and the fault ends without a hold.
    nvml["gpus"][6]["recovery_action"] = json!("none");
    fake.write(&nvml);
    wait_condition(
        &api,
        &agent,
        "GpuFault",
        "False again",
        is("False", "NoGpuFault"),
    );
    assert!(agent.terminate().success());
}

#[test]
fn a_lost_gpu_is_a_fault_naming_it() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    let agent = start(&api, &fake, &[]);
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));
    nvml["gpus"][5]["lost"] = json!(true);
    fake.write(&nvml);
    let fault = wait_condition(
        &api,
        &agent,
        "GpuFault",
        "True (lost)",
        is("True", "GpuLost"),
    );
    let message = fault["message"].as_str().unwrap();
    assert!(
        message.starts_with("GPU 5 (00000000:AB:00.0) is lost"),
        "{message}"
    );
    assert!(message.contains("nvidia-smi -r -i 5"), "{message}");
    // Its pairs are down too.
    let link = api.node_condition(NODE, "GpuLinkDegraded");
    assert_eq!(link["status"], "True", "{link:#}");
    assert!(agent.terminate().success());
}

#[test]
fn nvml_missing_where_the_driver_lists_gpus_is_a_node_event_and_unknown_conditions() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let dir = tempfile::tempdir().unwrap();
    let (proc_root, cgroup_root) = host_fixture(dir.path(), &["0000:18:00.0", "0000:2a:00.0"]);
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start(
        &[
            "--kube",
            "on",
            "--node-name",
            NODE,
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--proc-root",
            proc_root.to_str().unwrap(),
            "--cgroup-root",
            cgroup_root.to_str().unwrap(),
            "--pod-resources-socket",
            "/nonexistent/kubelet.sock",
        ],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    agent.wait_ready();
    let body = agent.metrics();
    assert_eq!(sample(&body, "shmlink_gpu_devices", &[]), Some(2.0));
    assert_eq!(sample(&body, "shmlink_nvml_up", &[]), Some(0.0));
    let fault = wait_condition(&api, &agent, "GpuFault", "Unknown", |c| {
        c["status"] == "Unknown"
    });
    assert_eq!(fault["reason"], "NvmlUnavailable");
    assert_eq!(
        api.node_condition(NODE, "GpuLinkDegraded")["status"],
        "Unknown"
    );
    let mut events = Vec::new();
    assert!(common::wait_until(Duration::from_secs(30), || {
        events = api
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "NvmlUnavailable")
            .collect();
        !events.is_empty()
    }));
    assert_eq!(events[0]["regarding"]["kind"], "Node");
    assert_eq!(events[0]["regarding"]["name"], NODE);
    assert!(events[0]["note"]
        .as_str()
        .unwrap()
        .contains("lists NVIDIA GPUs but NVML does not load"));
    assert!(agent.terminate().success());
}

#[test]
fn a_gpu_the_driver_lists_and_nvml_does_not_see_is_a_fault_an_event_and_counted() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    let dir = tempfile::tempdir().unwrap();
    let mut listed: Vec<String> = nvml["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci_bus_id"].as_str().unwrap()[4..].to_ascii_lowercase())
        .collect();
    listed.push("0000:cc:00.0".into());
    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
    let (proc_root, cgroup_root) = host_fixture(dir.path(), &listed);
    let agent = start(
        &api,
        &fake,
        &[
            "--proc-root",
            proc_root.to_str().unwrap(),
            "--cgroup-root",
            cgroup_root.to_str().unwrap(),
        ],
    );
    let body = agent.metrics();
    assert_eq!(sample(&body, "shmlink_gpu_devices", &[]), Some(9.0));
    let fault = wait_condition(&api, &agent, "GpuFault", "True (not in NVML)", |c| {
        is("True", "GpuNotInNvml")(c)
    });
    assert!(
        fault["message"]
            .as_str()
            .unwrap()
            .contains("lists 9 NVIDIA GPUs but NVML sees 8: 0000:cc:00.0 is missing"),
        "{}",
        fault["message"]
    );
    assert!(common::wait_until(Duration::from_secs(30), || api
        .events()
        .iter()
        .any(
            |e| e["reason"] == "GpuNotInNvml" && e["regarding"]["kind"] == "Node"
        )));
    assert!(agent.terminate().success());
}

#[test]
fn the_taint_follows_gpu_fault_when_asked_for() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    // A short hold, so the fault ends while the test watches.
    let agent = start(
        &api,
        &fake,
        &["--taint-on-gpu-fault", "--gpu-fault-hold", "3s"],
    );
    let taints = || api.node(NODE)["spec"]["taints"].clone();
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));
    assert_eq!(
        taints(),
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    );

    nvml["gpus"][4]["xids"] = json!([48]);
    fake.write(&nvml);
    wait_condition(&api, &agent, "GpuFault", "True", is("True", "Xid48"));
    assert!(
        common::wait_until(Duration::from_secs(30), || taints()
            == json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                      {"key": "shmlink.io/gpu-fault", "effect": "NoSchedule"}])),
        "{:#}",
        taints()
    );
    // The hold runs out: False, and only our taint goes.
    wait_condition(&api, &agent, "GpuFault", "False after the hold", |c| {
        c["status"] == "False"
    });
    assert!(
        common::wait_until(Duration::from_secs(30), || taints()
            == json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])),
        "{:#}",
        taints()
    );
    assert!(agent.terminate().success());
}

#[test]
fn an_api_server_down_during_a_transition_gets_the_latest_state_when_back() {
    let mut api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvlink-mesh-4");
    let fake = FakeNvml::new(&nvml);
    let agent = start(&api, &fake, &[]);
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));

    api.stop();
    links_down(&mut nvml, 2, 4);
    fake.write(&nvml);
    agent.wait_for_metrics("failed writes", |b| {
        sample(b, "shmlink_node_condition_write_errors_total", &[]).is_some_and(|n| n >= 1.0)
    });
    // A second change while still away: the later state is the one that must arrive.
    nvml["gpus"][1]["xids"] = json!([95]);
    fake.write(&nvml);
    agent.wait_for_metrics("XID 95 counted", |b| {
        sample(
            b,
            "shmlink_gpu_xid_errors_total",
            &[("gpu", "1"), ("xid", "95")],
        ) == Some(1.0)
    });
    let writes_before = api.node_status_patches().len();
    api.resume();
    let fault = wait_condition(
        &api,
        &agent,
        "GpuFault",
        "True (Xid95)",
        is("True", "Xid95"),
    );
    assert!(fault["message"]
        .as_str()
        .unwrap()
        .contains("XID 95 (Uncontained memory error) on GPU 1"));
    let link = api.node_condition(NODE, "GpuLinkDegraded");
    assert_eq!(link["status"], "True", "{link:#}");
    wait_scans(&agent, 5);
    assert_eq!(
        api.node_status_patches().len() - writes_before,
        1,
        "the latest state in one write; nothing piled up"
    );
    assert_eq!(api.node_conditions(NODE).len(), 6);
    assert!(agent.terminate().success());
}

/// The XIDs the kernel log tells count with NVML's, once. XID 79 in the kernel log (its `Xid`
/// line and its "fallen off the bus" line) counts once NVML finds the GPU lost, never while
/// NVML still reaches it; NVML's own event for it later does not make it two. An XID only the
/// kernel saw counts too. The kernel records come from a test file in /dev/kmsg's format, not
/// from user-space writes to /dev/kmsg.
#[test]
fn kernel_log_xids_are_one_count_with_nvmls() {
    use std::io::Write;
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml);
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let agent = start(&api, &fake, &["--kmsg", kmsg.to_str().unwrap()]);
    wait_condition(&api, &agent, "GpuFault", "False", is("False", "NoGpuFault"));
    // The watcher opens the kernel log at its end on its own thread: records written before
    // that are history to it.
    agent.wait_for_metrics("the kernel log open", |b| {
        sample(b, "shmlink_kmsg_up", &[]) == Some(1.0)
    });
    // "00000000:BB:00.0" as NVML spells it; the kernel prints "0000:bb:00".
    let kernel_pci = |gpu: usize| {
        let id = nvml["gpus"][gpu]["pci_bus_id"]
            .as_str()
            .unwrap()
            .to_lowercase();
        id[4..].trim_end_matches(".0").to_string()
    };
    let (pci2, pci3) = (kernel_pci(2), kernel_pci(3));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .unwrap();
    write!(
        f,
        "4,101,5000000000,-;NVRM: Xid (PCI:{pci2}): 79, pid=4242, name=python3, GPU has fallen off the bus.\n\
         3,102,5000000100,-;NVRM: GPU {pci2}.0: GPU has fallen off the bus.\n\
         4,103,5000000200,-;NVRM: Xid (PCI:{pci3}): 13, pid=4243, name=python3, Graphics SM Warp Exception\n"
    )
    .unwrap();
    let xids = |b: &str, gpu: &str, xid: &str| {
        sample(
            b,
            "shmlink_gpu_xid_errors_total",
            &[("gpu", gpu), ("xid", xid)],
        )
    };
    // NVML still reaches GPU 2: the XID 13 counts, the XID 79 does not.
    let mut body = String::new();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            body = agent.metrics();
            xids(&body, "3", "13") == Some(1.0)
                && agent.log_text().contains("but NVML still reaches it")
        }),
        "the kernel's XIDs were not judged; the agent's log:\n{}",
        agent.log_text()
    );
    assert_eq!(xids(&body, "2", "79"), None, "{body}");

    // GPU 2 falls off the bus for real: NVML finds it lost, and the kernel's XID 79 counts.
    nvml["gpus"][2]["lost"] = json!(true);
    fake.write(&nvml);
    write!(
        f,
        "4,104,6000000000,-;NVRM: Xid (PCI:{pci2}): 79, pid=4242, name=python3, GPU has fallen off the bus.\n\
         3,105,6000000100,-;NVRM: GPU {pci2}.0: GPU has fallen off the bus.\n"
    )
    .unwrap();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            body = agent.metrics();
            xids(&body, "2", "79") == Some(1.0)
        }),
        "the kernel's XID 79 was not counted; the agent's log:\n{}",
        agent.log_text()
    );
    assert!(
        agent
            .log_text()
            .contains("the kernel log reports XID 79 on GPU 2"),
        "{body}"
    );
    let fault = wait_condition(&api, &agent, "GpuFault", "True for GPU 2", |c| {
        c["status"] == "True"
    });
    assert!(
        fault["message"].as_str().unwrap().contains("GPU 2"),
        "{fault}"
    );

    // Reset, NVML reaches it again and delivers the same XID 79: still one.
    nvml["gpus"][2]["lost"] = json!(false);
    nvml["gpus"][2]["xids"] = json!([79]);
    fake.write(&nvml);
    std::thread::sleep(Duration::from_secs(2)); // several scans and event waits
    assert_eq!(
        xids(&agent.metrics(), "2", "79"),
        Some(1.0),
        "one XID, two sources"
    );
    // A second one, told by both, is two (NVML's count; the kernel's waits for NVML's word).
    writeln!(
        f,
        "4,106,9000000000,-;NVRM: Xid (PCI:{pci2}): 79, pid=4242, name=python3, GPU has fallen off the bus."
    )
    .unwrap();
    nvml["gpus"][2]["xids"] = json!([79, 79]);
    fake.write(&nvml);
    agent.wait_for_metrics("the second XID 79", |b| xids(b, "2", "79") == Some(2.0));
}

/// The field's case on an NVLink5 board: failed link recoveries on GPU 4's link 9 and symbol
/// errors growing fast on GPU 2's link 3. Every pair with either fails, GPU 0's among them; the
/// condition names GPUs 2 and 4 with their links, and no healthy GPU for a reset.
#[test]
fn two_faulty_gpus_are_named_with_their_links_and_no_healthy_gpu_is_reset() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("b200-8");
    let fake = FakeNvml::new(&nvml);
    let agent = start(&api, &fake, &[]);
    wait_condition(&api, &agent, "GpuLinkDegraded", "False", |c| {
        c["status"] == "False"
    });
    nvml["gpus"][4]["links"][9]["nvlink5"] = json!({"recovery_failed": 3, "recovery_events": 3});
    nvml["gpus"][2]["links"][3]["nvlink5"] = json!({"symbol_errors": 50000});
    fake.write(&nvml);
    let link = wait_condition(&api, &agent, "GpuLinkDegraded", "True, both", |c| {
        c["status"] == "True"
            && c["message"]
                .as_str()
                .is_some_and(|m| m.contains("GPU 2 and GPU 4"))
    });
    let message = link["message"].as_str().unwrap();
    println!("{message}");
    common::assert_contains_all(message, &[
        "GPU 2 and GPU 4 fail with every other GPU (GPU 2: NVLink symbol errors on GPU 2 link 3",
        "GPU 4: NVLink failed link recoveries on GPU 4 link 9",
        "reset GPU 2 and GPU 4 (`nvidia-smi -r -i 2`, `nvidia-smi -r -i 4`)",
    ]);
    for healthy in [0, 1, 3, 5, 6, 7] {
        assert!(
            !message.contains(&format!("-r -i {healthy}")),
            "GPU {healthy} named for a reset: {message}"
        );
    }
    assert!(agent.terminate().success());
}

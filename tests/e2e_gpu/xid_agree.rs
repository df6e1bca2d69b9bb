//! `check --since` and `serve` on one kernel log (issue 52): the real `shmlink serve` with the
//! fake NVML's 8-GPU board and the in-process API server reads from a file in /dev/kmsg's format
//! driver XID lines (a non-fatal XID on GPU 1; a fatal XID 48 on GPU 2, whose NVML recovery action
//! asks for a reset: NVML's word; an XID 79 on 0000:29:00, a GPU NVML does not list) and an AMD-Vi
//! IO page fault naming GPU 4; then `shmlink check --since` reads the same file. Both count the
//! same XIDs (`xids[]` of check, `shmlink_gpu_xid_errors_total` of serve, the unlisted GPU by its
//! address), tell the IOMMU fault on GPU 4, and make the same verdict of GPU 2 (serve's `GpuFault`
//! telling XID 48 held; check's `gpu_verdicts`). The same log holds an NVLink training failure
//! on GPU 0 (XID 74 naming link 3, which NVML reads inactive: its word) and NVSwitch SXIDs: a
//! fatal one on 0000:05:00.0 (every GPU's links 0-4 go to it), a non-fatal one, a fatal one on a
//! switch no GPU links to, and one a process wrote; both count the same SXIDs
//! (`shmlink_nvswitch_sxid_errors_total`, `sxids[]`) and tell the same GPUs
//! `gpu_nvlink_training_failed` and `gpu_nvswitch_fatal` (serve's Events, check's findings and
//! `gpu_verdicts`). Needs neither root nor containers.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{kubelet_node, FakeApi};
use serde_json::{json, Value};

const NODE: &str = "gpu-node-x";

/// Microseconds since boot a second ago, as the kernel stamps a record written now.
fn usec_now() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = uptime.split(' ').next().unwrap().parse().unwrap();
    ((secs - 1.0) * 1e6) as u64
}

#[test]
fn check_and_serve_count_one_kernel_logs_xids_into_the_same_gpu_verdicts() {
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let mut nvml = fake_nvml::preset("nvswitch-8");
    nvml["gpus"][2]["recovery_action"] = json!("gpu_reset");
    nvml["gpus"][0]["links"][3]["active"] = json!(false);
    let fake = FakeNvml::new(&nvml);
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let kmsg_arg = kmsg.to_str().unwrap();
    let agent = Agent::start_gpu_kube(&api.kubeconfig_path(), &fake, NODE, &["--kmsg", kmsg_arg]);
    agent.wait_for_metrics("the kernel log open", |b| {
        sample(b, "shmlink_kmsg_up", &[]) == Some(1.0)
    });
    let at = usec_now();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .unwrap();
    writeln!(
        f,
        "4,8001,{at},-;NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python3, Graphics SM \
         Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n\
         4,8002,{at},-;NVRM: Xid (PCI:0000:3a:00): 48, pid=4242, name=python3, An \
         uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at \
         partition 1, subpartition 0.\n\
         4,8003,{at},-;NVRM: Xid (PCI:0000:29:00): 79, pid=<unknown>, name=<unknown>, GPU has \
         fallen off the bus.\n\
         3,8004,{at},-;AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:9a:00.0 domain=0x0000 \
         address=0xfd000000 flags=0x0020]\n\
         4,8005,{at},-;NVRM: Xid (PCI:0000:18:00): 74, pid='<unknown>', name=<unknown>, NVLink: \
         failed to train link 3 to remote PCI:0000:05:00\n\
         3,8006,{at},-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 36 \
         sourcetrack TCEN0 crumbstore ECC DBE Error (First)\n\
         3,8007,{at},-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Severity 1 Engine \
         instance 36 Sub-engine instance 00\n\
         3,8008,{at},-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, Link 32 \
         egress non-posted PRIV error (First)\n\
         3,8009,{at},-;nvidia-nvswitch9: SXid (PCI:0000:0c:00.0): 24007, Fatal, Link 01 \
         sourcetrack TCEN0 crumbstore ECC DBE Error (First)\n\
         11,8010,{at},-;nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 24007, Fatal, written by a \
         process"
    )
    .unwrap();
    drop(f);
    let series = [
        ("1", "13"),
        ("2", "48"),
        ("0000:29:00.0", "79"),
        ("0", "74"),
    ];
    let body = agent.wait_for_metrics("serve counts the four", |b| {
        series.iter().all(|(gpu, xid)| {
            sample(
                b,
                "shmlink_gpu_xid_errors_total",
                &[("gpu", gpu), ("xid", xid)],
            ) == Some(1.0)
        })
    });
    let by_serve: BTreeSet<(String, u64, u64)> = series
        .iter()
        .map(|(gpu, xid)| (gpu.to_string(), xid.parse().unwrap(), 1))
        .collect();
    assert!(
        !body.contains("shmlink_gpu_xid_unconfirmed_total{"),
        "nothing unconfirmed: {body}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let fault = loop {
        let c = api.node_condition(NODE, "GpuFault");
        let told = c["message"].as_str().unwrap_or("").contains("XID 48");
        if told || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // NVML's recovery action names the reason (it goes first), the held XID is told with it.
    assert_eq!(fault["reason"], "RecoveryActionGpuReset", "{fault:#}");
    assert!(
        fault["message"]
            .as_str()
            .unwrap()
            .contains("XID 48 (Double Bit ECC Error) on GPU 2"),
        "{fault:#}\n{}",
        agent.log_text()
    );

    // The IOMMU fault naming GPU 4 (9a:00): its Event.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let event = loop {
        let found = api
            .events()
            .into_iter()
            .find(|e| e["reason"] == "GpuIommuFault");
        if found.is_some() || std::time::Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let event = event.unwrap_or_else(|| panic!("no GpuIommuFault Event: {}", agent.log_text()));
    assert!(
        event["note"]
            .as_str()
            .unwrap_or_default()
            .contains("The IOMMU blocked 1 DMA of GPU 4"),
        "{event:#}"
    );
    // Its counter, which GpuIommuFault pages on.
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "shmlink_gpu_iommu_faults_total", &[("gpu", "4")]),
        Some(1.0),
        "{metrics}"
    );

    // The SXIDs, by switch and SXID; the process's line is none.
    let sxid_series = [
        ("0000:05:00.0", "24007"),
        ("0000:08:00.0", "12028"),
        ("0000:0c:00.0", "24007"),
    ];
    for (switch, sxid) in sxid_series {
        let labels = [("switch", switch), ("sxid", sxid)];
        let n = sample(&metrics, "shmlink_nvswitch_sxid_errors_total", &labels);
        assert_eq!(n, Some(1.0), "{switch} {sxid}: {metrics}");
    }
    assert!(!metrics.contains("switch=\"0000:06:00.0\""), "{metrics}");
    let by_serve_sxids: BTreeSet<(String, u64, u64)> = sxid_series
        .iter()
        .map(|(w, x)| (w.to_string(), x.parse().unwrap(), 1))
        .collect();
    // The training failure on GPU 0 and the fatal SXID on the switch every GPU links to: their
    // Events, one per GPU and fact.
    let told = |reason: &str, want: usize| -> BTreeSet<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notes: BTreeSet<String> = (api.events().into_iter())
                .filter(|e| e["reason"] == reason)
                .filter_map(|e| e["note"].as_str().map(str::to_string))
                .collect();
            if notes.len() >= want || std::time::Instant::now() > deadline {
                return notes;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let training = told("GpuNvlinkTrainingFailed", 1);
    assert_eq!(training.len(), 1, "{training:#?}\n{}", agent.log_text());
    assert!(
        training
            .iter()
            .all(|n| n.contains("NVLink 3 of GPU 0 failed to train")),
        "{training:#?}"
    );
    let switch_fatal = told("GpuNvswitchFatal", 8);
    let serve_fatal_gpus: BTreeSet<u32> = (0..8)
        .filter(|g| {
            let said = format!("The NVSwitch 0000:05:00.0 (SXID 24007) that NVLinks of GPU {g} go");
            switch_fatal.iter().any(|n| n.contains(&said))
        })
        .collect();
    assert_eq!(serve_fatal_gpus, (0..8).collect(), "{switch_fatal:#?}");
    assert_eq!(switch_fatal.len(), 8, "only the switch the GPUs link to");

    let report = fake.check_json(&[
        "--kube",
        "off",
        "--since",
        "10m",
        "--state-dir",
        "none",
        "--kmsg",
        kmsg_arg,
    ]);
    let by_check: BTreeSet<(String, u64, u64)> = report["xids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let gpu = match x["gpu"].as_u64() {
                Some(g) => g.to_string(),
                None => x["pci_bus_id"].as_str().unwrap().to_string(),
            };
            (
                gpu,
                x["xid"].as_u64().unwrap(),
                x["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(by_check, by_serve, "check and serve count other XIDs");
    let unlisted = report["xids"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["xid"] == 79)
        .cloned()
        .unwrap();
    assert_eq!(
        unlisted,
        json!({"gpu": null, "pci_bus_id": "0000:29:00.0", "xid": 79, "count": 1})
    );
    let gpu2 = report["gpu_verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["gpu"] == 2)
        .cloned()
        .unwrap();
    assert_eq!(gpu2["held_xids"][0]["xid"], 48, "{gpu2:#}");
    assert_eq!(gpu2["recovery_action"], "gpu_reset", "{gpu2:#}");
    let iommu: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "gpu_iommu_fault")
        .collect();
    assert_eq!(iommu.len(), 1, "{iommu:#?}");
    assert_eq!(iommu[0]["subject"], "GPU 4");
    let gpu1 = &report["gpu_verdicts"][1];
    assert_eq!(gpu1["held_xids"], json!([]), "XID 13 is the application's");
    // The same SXIDs, and the same GPUs told the kernel log's NVLink facts.
    let by_check_sxids: BTreeSet<(String, u64, u64)> = (report["sxids"].as_array().unwrap())
        .iter()
        .map(|x| {
            let fatal = x["switch"] != "0000:08:00.0";
            assert_eq!(x["fatal"], fatal, "{x}");
            let switch = x["switch"].as_str().unwrap().to_string();
            (
                switch,
                x["sxid"].as_u64().unwrap(),
                x["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(by_check_sxids, by_serve_sxids);
    let subjects = |kind: &str| -> BTreeSet<String> {
        (report["findings"].as_array().unwrap().iter())
            .filter(|f| f["kind"] == kind)
            .map(|f| f["subject"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        subjects("gpu_nvlink_training_failed"),
        ["GPU 0".to_string()].into()
    );
    let check_fatal_gpus: BTreeSet<String> = serve_fatal_gpus
        .iter()
        .map(|g| format!("GPU {g}"))
        .collect();
    assert_eq!(subjects("gpu_nvswitch_fatal"), check_fatal_gpus);
    let gpu0 = &report["gpu_verdicts"][0];
    assert_eq!(
        gpu0["nvlink_training"],
        json!({"links": [3], "count": 1}),
        "{gpu0:#}"
    );
    assert_eq!(gpu0["held_xids"][0]["xid"], 74, "{gpu0:#}");
    assert_eq!(
        gpu0["nvswitch_fatal"],
        json!([{"switch": "0000:05:00.0", "sxids": [24007]}]),
        "{gpu0:#}"
    );
    assert!(agent.terminate().success());
}

//! `shmlink probe`, end to end: the real binary loads the fake libcuda (workspace member
//! `fake-cuda`) by path, as it would a driver's, runs the copies in its worker process, and
//! judges them with the fake NVML's view of an 8-GPU NVSwitch board and an 8-GPU PCIe board.
//! CUDA numbers the devices in another order than NVML; the answers are in NVML's indices.
//! Run with --nocapture to see each table.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::fake_cuda::{self, FakeCuda};
use common::fake_nvml::{self, FakeNvml};
use serde_json::{json, Value};

/// CUDA's order on these boards: reversed from NVML's.
const REVERSED: [usize; 8] = [7, 6, 5, 4, 3, 2, 1, 0];

fn probe(nvml: &FakeNvml, cuda: &FakeCuda, extra: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_shmlink"))
        .arg("probe")
        .arg("--nvml-lib")
        .arg(fake_nvml::lib())
        .arg("--cuda-lib")
        .arg(fake_cuda::lib())
        // 8 MiB a pair keeps the debug build's copies short; the logic is the same at 64 MiB.
        .args(["--bytes", "8Mi", "--probe-timeout", "2s"])
        .args(extra)
        .env("FAKE_NVML_CONFIG", &nvml.config)
        .env("FAKE_CUDA_CONFIG", cuda.config())
        .env("FAKE_CUDA_STATS", cuda.stats())
        .env("FAKE_CUDA_INITS", cuda.inits_file())
        .output()
        .unwrap();
    (out, started.elapsed())
}

fn run(
    case: &str,
    preset: &str,
    cuda_config: impl FnOnce(&Value) -> Value,
) -> (Value, i32, FakeCuda) {
    let nvml_config = fake_nvml::preset(preset);
    let nvml = FakeNvml::new(&nvml_config);
    let cuda = FakeCuda::new(&cuda_config(&nvml_config));
    let (table, took) = probe(&nvml, &cuda, &[]);
    let inits = cuda.inits();
    println!(
        "== {case} ({preset}), {took:?}:\n{}{}",
        String::from_utf8_lossy(&table.stdout),
        String::from_utf8_lossy(&table.stderr)
    );
    let (out, _) = probe(&nvml, &cuda, &["--json"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), table.status.code());
    // Nothing left behind: no memory, no peer mapping, no context.
    let held = cuda.held().expect("the fake wrote what it holds");
    assert_eq!(
        held,
        json!({"allocations": 0, "peers_enabled": 0, "contexts_retained": 0}),
        "{case}"
    );
    assert_eq!(
        cuda.inits(),
        2 * inits,
        "{case}: the JSON run starts the driver as often"
    );
    (report, out.status.code().unwrap_or(-1), cuda)
}

fn pair(report: &Value, from: u64, to: u64) -> &Value {
    report["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["from_gpu"] == from && p["to_gpu"] == to)
        .unwrap_or_else(|| panic!("no pair {from} -> {to}: {report:#}"))
}

fn not_ok(report: &Value) -> Vec<(u64, u64, String)> {
    report["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["status"] != "ok")
        .map(|p| {
            (
                p["from_gpu"].as_u64().unwrap(),
                p["to_gpu"].as_u64().unwrap(),
                p["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_healthy_board_is_ok_in_nvmls_numbers_whatever_cudas_order() {
    let (report, code, cuda) = run("healthy", "nvswitch-8", |n| {
        fake_cuda::config(n, &REVERSED, 300.0)
    });
    let cuda_inits = cuda.inits();
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["pairs"].as_array().unwrap().len(), 56);
    let p = pair(&report, 0, 7);
    assert_eq!(p["peer_access"], true);
    assert_eq!(p["verified"], true);
    assert!((p["gbps"].as_f64().unwrap() - 300.0).abs() < 1.0, "{p}");
    // 18 NVLink4 links of 25 GB/s each way.
    assert_eq!(p["expected_gbps"], 450.0);
    assert_eq!(
        cuda_inits, 2,
        "the driver started once for each of the two runs"
    );
}

#[test]
fn gpu_7_refusing_peer_access_where_nvml_says_nvlink_fails_every_pair_with_it_and_is_named() {
    let (report, code, _) = run("GPU 7 refuses peer access", "nvswitch-8", |n| {
        let mut c = fake_cuda::config(n, &REVERSED, 300.0);
        for g in 0..7 {
            fake_cuda::fault(&mut c, n, g, 7, json!({"peer_access": false}));
            fake_cuda::fault(&mut c, n, 7, g, json!({"peer_access": false}));
        }
        c
    });
    assert_eq!(code, 1);
    let bad = not_ok(&report);
    assert_eq!(bad.len(), 14, "{bad:?}");
    assert!(bad
        .iter()
        .all(|(a, b, s)| (*a == 7 || *b == 7) && s == "failed"));
    assert_eq!(report["culprits"], json!([7]));
    let reason = pair(&report, 5, 7)["reason"].as_str().unwrap();
    assert!(
        reason.contains("peer access GPU 5 -> GPU 7 refused although NVML reports NVLink P2P"),
        "{reason}"
    );
}

#[test]
fn one_direction_corrupting_and_one_pair_at_a_tenth_are_told_apart() {
    let (report, code, _) = run("2 -> 3 corrupts, 4 -> 6 slow", "nvswitch-8", |n| {
        let mut c = fake_cuda::config(n, &REVERSED, 300.0);
        fake_cuda::fault(&mut c, n, 2, 3, json!({"corrupt": true}));
        fake_cuda::fault(&mut c, n, 4, 6, json!({"gbps": 30.0}));
        c
    });
    assert_eq!(code, 1);
    assert_eq!(
        not_ok(&report),
        vec![(2, 3, "failed".to_string()), (4, 6, "degraded".to_string())]
    );
    let corrupt = pair(&report, 2, 3);
    assert_eq!(corrupt["verified"], false);
    assert!(corrupt["reason"]
        .as_str()
        .unwrap()
        .starts_with("copies GPU 2 -> GPU 3 corrupted: the first wrong byte at offset "));
    assert_eq!(pair(&report, 3, 2)["status"], "ok", "the other direction");
    let slow = pair(&report, 4, 6);
    assert!(
        slow["reason"]
            .as_str()
            .unwrap()
            .contains("ran at 30.0 GB/s, under half of the 450.0 GB/s its path carries"),
        "{slow}"
    );
    assert_eq!(report["culprits"], json!([]));
}

#[test]
fn a_hang_and_a_crash_answer_within_the_deadline_naming_their_pairs() {
    let started = Instant::now();
    let (report, code, cuda) = run("4 -> 5 hangs, 5 -> 6 crashes", "nvswitch-8", |n| {
        let mut c = fake_cuda::config(n, &REVERSED, 300.0);
        fake_cuda::fault(&mut c, n, 4, 5, json!({"hang": true}));
        fake_cuda::fault(&mut c, n, 5, 6, json!({"crash": true}));
        c
    });
    assert_eq!(code, 1);
    assert_eq!(
        not_ok(&report),
        vec![(4, 5, "failed".to_string()), (5, 6, "failed".to_string())]
    );
    assert!(pair(&report, 4, 5)["reason"]
        .as_str()
        .unwrap()
        .contains("the copy GPU 4 -> GPU 5 did not finish within 2 s"));
    assert!(pair(&report, 5, 6)["reason"]
        .as_str()
        .unwrap()
        .contains("copying GPU 5 -> GPU 6 crashed the probe (killed by signal 6)"));
    // Each run: the first worker, one after the hang, one after the crash.
    assert_eq!(cuda.inits(), 2 * 3);
    // Two probes (table and JSON), each waiting out one hang of 2 s.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn on_a_pcie_board_a_pair_at_a_tenth_is_slow_among_its_like() {
    let (report, code, _) = run("PCIe, 1 -> 2 slow", "pcie-8", |n| {
        let mut c = fake_cuda::config(n, &REVERSED, 25.0);
        fake_cuda::fault(&mut c, n, 1, 2, json!({"gbps": 2.5}));
        c
    });
    assert_eq!(code, 1);
    assert_eq!(not_ok(&report), vec![(1, 2, "degraded".to_string())]);
    assert!(pair(&report, 1, 2)["reason"]
        .as_str()
        .unwrap()
        .contains("under half of what like pairs on this board copy (25.0 GB/s)"));
}

#[test]
fn without_libcuda_the_probe_says_so_and_exits_2() {
    let nvml = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let out = Command::new(env!("CARGO_BIN_EXE_shmlink"))
        .args([
            "probe",
            "--cuda-lib",
            "/nonexistent/libcuda.so.1",
            "--nvml-lib",
        ])
        .arg(fake_nvml::lib())
        .env("FAKE_NVML_CONFIG", &nvml.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the probe could not run: loading /nonexistent/libcuda.so.1"),
        "{err}"
    );
}

/// `serve --p2p-probe-interval`: GPU 7 refuses peer access. The probe runs on the GPUs without
/// a process (a process of this test sits on GPU 3, so GPU 3 is not probed); its results make
/// GPU 7's pairs degraded, so `GpuLinkDegraded` names GPU 7, and the metrics show each
/// direction.
#[test]
fn serve_probes_idle_gpus_and_feeds_gpu_link_degraded() {
    use common::agent::{sample, Agent};
    use common::kube_api::{kubelet_node, FakeApi};
    const NODE: &str = "gpu-node-7";
    let mut nvml_config = fake_nvml::preset("nvswitch-8");
    nvml_config["gpus"][3]["processes"] =
        json!([{"pid": std::process::id(), "used_memory": 1u64 << 30}]);
    let nvml = FakeNvml::new(&nvml_config);
    let mut c = fake_cuda::config(&nvml_config, &REVERSED, 300.0);
    for g in 0..7 {
        fake_cuda::fault(&mut c, &nvml_config, g, 7, json!({"peer_access": false}));
        fake_cuda::fault(&mut c, &nvml_config, 7, g, json!({"peer_access": false}));
    }
    let cuda = FakeCuda::new(&c);
    let api = FakeApi::start();
    api.apply_node(kubelet_node(NODE));
    let (nvml_lib, cuda_lib, kubeconfig) =
        (fake_nvml::lib(), fake_cuda::lib(), api.kubeconfig_path());
    let agent = Agent::start(
        &[
            "--kube",
            "on",
            "--node-name",
            NODE,
            "--pod-resources-socket",
            "/nonexistent/kubelet.sock",
            "--nvml-lib",
            nvml_lib.to_str().unwrap(),
            "--cuda-lib",
            cuda_lib.to_str().unwrap(),
            "--p2p-probe-interval",
            "500ms",
            "--bytes",
            "8Mi",
        ],
        &[
            ("FAKE_NVML_CONFIG", nvml.config.as_os_str()),
            ("FAKE_CUDA_CONFIG", cuda.config().as_os_str()),
            ("KUBECONFIG", kubeconfig.as_os_str()),
        ],
    );
    agent.wait_ready();
    let body = agent.wait_for_metrics("the probe's results", |b| {
        sample(
            b,
            "shmlink_gpu_pair_probe_ok",
            &[("gpu", "7"), ("peer_gpu", "0")],
        ) == Some(0.0)
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pair_probe_ok",
            &[("gpu", "0"), ("peer_gpu", "1")]
        ),
        Some(1.0)
    );
    let gbps = sample(
        &body,
        "shmlink_gpu_pair_probe_bandwidth_bytes_per_second",
        &[("gpu", "0"), ("peer_gpu", "1")],
    )
    .unwrap();
    assert!((gbps - 300e9).abs() < 1e9, "{gbps}");
    // GPU 3 has a process: not probed either way.
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("shmlink_gpu_pair_probe_ok{") && l.contains("\"3\"")),
        "{body}"
    );
    let mut link = Value::Null;
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            link = api.node(NODE)["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "GpuLinkDegraded")
                .cloned()
                .unwrap_or(Value::Null);
            link["status"] == "True"
        }),
        "{link:#}"
    );
    let message = link["message"].as_str().unwrap();
    println!("{message}");
    assert!(
        message.contains("probe: peer access GPU") && message.contains("-r -i 7"),
        "{message}"
    );
    for healthy in 0..7 {
        assert!(!message.contains(&format!("-r -i {healthy}`")), "{message}");
    }
    assert!(agent.terminate().success());
}

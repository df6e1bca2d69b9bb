//! GPU link health end to end: the shmlink binary loads the fake NVML library through
//! `--nvml-lib`, so nvml-wrapper and the raw calls run for real; the tests inject the failure
//! modes a real node shows by rewriting the fake's config, while `serve` runs where it matters.
//! No root needed: the shm side scans whatever this machine has.

use crate::common;

use std::process::{Command, Output, Stdio};

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use serde_json::{json, Value};

const PRESETS: [&str; 4] = ["pcie-8", "nvlink-mesh-4", "nvswitch-8", "b200-8"];

fn check(fake: &FakeNvml, lib: &std::path::Path) -> Output {
    Command::new(common::shmlink_bin())
        .args(["check", "--json", "--nvml-lib"])
        .arg(lib)
        // The machine's own logs and kernel log (other tests crash processes in a libnccl) are
        // no GPU test's business.
        .args([
            "--kmsg",
            "off",
            "--pod-log-root",
            "off",
            "--docker-root",
            "off",
        ])
        .envs(fake.env())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn check_json(fake: &FakeNvml) -> (Option<i32>, Value) {
    let out = check(fake, &fake_nvml::lib());
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

fn gpu_findings(report: &Value) -> Vec<Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            let kind = f["kind"].as_str().unwrap_or("");
            kind.starts_with("gpu_") || kind == "nvml_unavailable"
        })
        .cloned()
        .collect()
}

fn pairs(report: &Value) -> &Vec<Value> {
    report["gpu_pairs"].as_array().expect("gpu_pairs")
}

/// The preset with its last GPU broken the way each kind of board shows it: on NVLink boards
/// the GPU's links go inactive, on PCIe its P2P with every peer fails.
fn with_last_gpu_broken(mut config: Value) -> (Value, u64) {
    let n = config["gpus"].as_array().unwrap().len();
    let last = n - 1;
    let links = config["gpus"][last]["links"].as_array_mut().unwrap();
    if links.is_empty() {
        let p2p: Vec<Value> = (0..last)
            .flat_map(|peer| {
                ["read", "write"].map(|cap| {
                    json!({"gpu": peer, "peer_gpu": last, "capability": cap, "status": "not_supported"})
                })
            })
            .collect();
        config["p2p"].as_array_mut().unwrap().extend(p2p);
    } else {
        for link in links {
            link["active"] = json!(false);
        }
    }
    (config, last as u64)
}

#[test]
fn every_preset_is_healthy_as_shipped() {
    for preset in PRESETS {
        let config = fake_nvml::preset(preset);
        let fake = FakeNvml::new(&config);
        let (_, report) = check_json(&fake);
        let n = config["gpus"].as_array().unwrap().len();
        assert_eq!(report["gpus"].as_array().unwrap().len(), n, "{preset}");
        assert_eq!(
            pairs(&report).len(),
            n * (n - 1) / 2,
            "{preset}: one entry per unordered pair"
        );
        for p in pairs(&report) {
            assert!(p["gpu"].as_u64() < p["peer_gpu"].as_u64(), "{p}");
            assert_eq!(p["status"], "ok", "{preset}: {p}");
        }
        assert_eq!(gpu_findings(&report), Vec::<Value>::new(), "{preset}");
    }
}

#[test]
fn a_broken_gpu_fails_every_pair_it_is_in_and_is_named_once() {
    for preset in PRESETS {
        let (config, broken) = with_last_gpu_broken(fake_nvml::preset(preset));
        let fake = FakeNvml::new(&config);
        let (code, report) = check_json(&fake);
        assert_eq!(code, Some(1), "{preset}: a critical finding exits 1");
        for p in pairs(&report) {
            let involved = p["gpu"] == broken || p["peer_gpu"] == broken;
            if involved {
                assert!(
                    p["status"] == "degraded" || p["status"] == "down",
                    "{preset}: {p}"
                );
                assert!(
                    !p["reasons"].as_array().unwrap().is_empty(),
                    "{preset}: {p}"
                );
            } else {
                assert_eq!(p["status"], "ok", "{preset}: {p}");
            }
        }
        let findings = gpu_findings(&report);
        assert_eq!(
            findings.len(),
            1,
            "{preset}: one finding, not one per pair: {findings:#?}"
        );
        assert_eq!(findings[0]["subject"], format!("GPU {broken}"), "{preset}");
        assert_eq!(findings[0]["severity"], "critical", "{preset}");
    }
}

#[test]
fn the_nvswitch_board_reports_every_link_and_its_switch_peer() {
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let (_, report) = check_json(&fake);
    for gpu in report["gpus"].as_array().unwrap() {
        let links = gpu["links"].as_array().unwrap();
        assert_eq!(links.len(), 18, "{gpu}");
        for l in links {
            assert_eq!(l["peer"], "switch", "the raw remote-device-type call: {l}");
            assert_eq!(l["active"], true);
        }
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));
    }
}

#[test]
fn check_prints_the_pair_matrix_with_the_reasons_under_it() {
    let (config, _) = with_last_gpu_broken(fake_nvml::preset("nvswitch-8"));
    let fake = FakeNvml::new(&config);
    let out = Command::new(common::shmlink_bin())
        .args(["check", "--nvml-lib"])
        .arg(fake_nvml::lib())
        .envs(fake.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("GPU pair health"), "{text}");
    assert!(text.contains("DOWN"), "{text}");
    assert!(
        text.contains("GPU6 <-> GPU7"),
        "the reasons name the pair: {text}"
    );
    assert!(!text.contains('\x1b'), "no colour when not on a terminal");
}

#[test]
fn nvlink_errors_that_grow_then_stop_degrade_the_pairs_for_the_window_only() {
    let mut config = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&config);
    let (agent, _) = serve_with_a_2s_window(&fake);

    // A replay error on one of GPU 2's switch links: every pair of GPU 2 crosses it.
    config["gpus"][2]["links"][3]["errors"]["replay"] = json!(5);
    let errors = [("gpu", "2"), ("link", "3"), ("type", "replay")];
    degraded_for_the_window_only(agent, &fake, &config, (&errors, 5.0), "GPU 2");
}

fn pair_02_healthy(body: &str) -> Option<f64> {
    sample(
        body,
        "shmlink_gpu_pair_healthy",
        &[("gpu", "0"), ("peer_gpu", "2")],
    )
}

/// `serve` on `fake` with a 2 s NVLink error window, once pair 0-2 is healthy; and that scrape.
fn serve_with_a_2s_window(fake: &FakeNvml) -> (Agent, String) {
    let agent = Agent::start_gpu(fake, &["--nvlink-error-window", "2s"]);
    let body = agent.wait_for_metrics("pair 0-2 healthy", |b| pair_02_healthy(b) == Some(1.0));
    (agent, body)
}

/// Writes `config`, a fault on GPU 2's link 3 (every pair of GPU 2 crosses it): pair 0-2
/// degraded with the error counter `errors` at its value, the pairs without `faulty` (0-1)
/// healthy; then, the counter no longer growing, pair 0-2 healthy again once the growth has
/// left the 2 s window; serve stops cleanly.
fn degraded_for_the_window_only(
    agent: Agent,
    fake: &FakeNvml,
    config: &Value,
    errors: (&[(&str, &str)], f64),
    faulty: &str,
) {
    fake.write(config);
    let body = agent.wait_for_metrics("pair 0-2 degraded", |b| pair_02_healthy(b) == Some(0.0));
    assert_eq!(
        sample(&body, "shmlink_nvlink_errors_total", errors.0),
        Some(errors.1)
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pair_healthy",
            &[("gpu", "0"), ("peer_gpu", "1")]
        ),
        Some(1.0),
        "pairs without {faulty} stay healthy"
    );
    agent.wait_for_metrics("pair 0-2 healthy again", |b| {
        pair_02_healthy(b) == Some(1.0)
    });
    assert!(agent.terminate().success());
}

#[test]
fn a_link_that_goes_down_and_comes_back() {
    let mut config = fake_nvml::preset("nvlink-mesh-4");
    let fake = FakeNvml::new(&config);
    let agent = Agent::start_gpu(&fake, &[]);
    // The first link of GPU 0 whose far end is a GPU.
    let (link, peer) = config["gpus"][0]["links"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .find_map(|(i, l)| {
            let bus = l["remote_pci_bus_id"].as_str()?;
            let peer = config["gpus"]
                .as_array()?
                .iter()
                .position(|g| g["pci_bus_id"].as_str() == Some(bus))?;
            Some((i, peer))
        })
        .expect("the mesh preset links GPU 0 to a peer");
    let (link_s, peer_s) = (link.to_string(), peer.to_string());
    let pair = [("gpu", "0"), ("peer_gpu", peer_s.as_str())];
    let up = [("gpu", "0"), ("link", link_s.as_str())];
    let body = agent.wait_for_metrics("link up", |b| {
        sample(b, "shmlink_nvlink_up", &up) == Some(1.0)
    });
    assert_eq!(sample(&body, "shmlink_gpu_pair_healthy", &pair), Some(1.0));

    config["gpus"][0]["links"][link]["active"] = json!(false);
    fake.write(&config);
    let body = agent.wait_for_metrics("link down", |b| {
        sample(b, "shmlink_nvlink_up", &up) == Some(0.0)
    });
    assert_eq!(sample(&body, "shmlink_gpu_pair_healthy", &pair), Some(0.0));

    config["gpus"][0]["links"][link]["active"] = json!(true);
    fake.write(&config);
    agent.wait_for_metrics("the pair healthy again", |b| {
        sample(b, "shmlink_nvlink_up", &up) == Some(1.0)
            && sample(b, "shmlink_gpu_pair_healthy", &pair) == Some(1.0)
    });
}

#[test]
fn an_xid_is_counted_per_gpu_and_xid() {
    let mut config = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&config);
    let agent = Agent::start_gpu(&fake, &[]);
    config["gpus"][3]["xids"] = json!([79]);
    fake.write(&config);
    let xid = [("gpu", "3"), ("xid", "79")];
    agent.wait_for_metrics("XID 79 on GPU 3", |b| {
        sample(b, "shmlink_gpu_xid_errors_total", &xid) == Some(1.0)
    });
}

#[test]
fn a_gpu_lost_mid_run_is_reported_and_serve_goes_on_with_the_others() {
    let mut config = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&config);
    let mut agent = Agent::start_gpu(&fake, &[]);
    config["gpus"][5]["lost"] = json!(true);
    fake.write(&config);
    let body = agent.wait_for_metrics("GPU 5 lost", |b| {
        sample(b, "shmlink_gpu_lost", &[("gpu", "5")]) == Some(1.0)
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pair_healthy",
            &[("gpu", "4"), ("peer_gpu", "5")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pair_healthy",
            &[("gpu", "4"), ("peer_gpu", "6")]
        ),
        Some(1.0),
        "the other GPUs are still sampled"
    );
    assert_eq!(sample(&body, "shmlink_nvml_up", &[]), Some(1.0));
    // Still scanning: the last-scan timestamp moves on.
    let t0 = sample(&body, "shmlink_last_scan_timestamp_seconds", &[]).unwrap();
    agent.wait_for_metrics("another scan", |b| {
        sample(b, "shmlink_last_scan_timestamp_seconds", &[]).is_some_and(|t| t > t0)
    });
    assert!(agent.is_running());
}

#[test]
fn a_library_missing_optional_symbols_still_samples() {
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let out = check(&fake, &fake_nvml::legacy_lib());
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for g in gpus {
        assert_eq!(g["links"].as_array().unwrap().len(), 18, "{g}");
        for l in g["links"].as_array().unwrap() {
            assert_ne!(
                l["peer"], "switch",
                "no remote-device-type symbol, so no switch: {l}"
            );
        }
    }
    assert_eq!(pairs(&report).len(), 28);
}

#[test]
fn no_library_at_all_runs_shm_only() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    let out = Command::new(common::shmlink_bin())
        .args(["check", "--json", "--nvml-lib"])
        .arg(&missing)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["gpus"], json!([]));
    assert_eq!(report["gpu_pairs"], json!([]));

    let agent = Agent::start(&["--nvml-lib", missing.to_str().unwrap()], &[]);
    agent.wait_ready();
    let body = agent.metrics();
    assert_eq!(sample(&body, "shmlink_nvml_up", &[]), Some(0.0));
    assert!(
        !body.contains("shmlink_gpu_info{"),
        "no GPU series without NVML"
    );
}

#[test]
fn no_library_on_a_machine_with_an_nvidia_gpu_is_a_finding() {
    // A proc root whose driver lists a GPU; an empty cgroup v2 tree so the shm side finds nothing.
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("driver/nvidia/gpus/0000:18:00.0")).unwrap();
    // A process, or the scan is blind (no_processes) and exits 2.
    std::fs::create_dir_all(proc_root.join("1")).unwrap();
    let cgroup_root = dir.path().join("cgroup");
    std::fs::create_dir_all(&cgroup_root).unwrap();
    std::fs::write(
        cgroup_root.join("cgroup.controllers"),
        "cpu io memory pids\n",
    )
    .unwrap();
    let out = Command::new(common::shmlink_bin())
        .args([
            "check",
            "--json",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ])
        .arg("--proc-root")
        .arg(&proc_root)
        .arg("--cgroup-root")
        .arg(&cgroup_root)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = gpu_findings(&report);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0]["kind"], "nvml_unavailable");
}

#[test]
fn b200_recovery_failures_on_one_link_degrade_that_gpus_pairs_and_reach_the_metrics() {
    let mut config = fake_nvml::preset("b200-8");
    config["gpus"][5]["links"][9]["nvlink5"] = json!({"symbol_errors": 12, "symbol_ber": 3e-11});
    let fake = FakeNvml::new(&config);
    let (agent, body) = serve_with_a_2s_window(&fake);
    let link = |gpu: &'static str, link: &'static str, k: &'static str, v: &'static str| {
        [("gpu", gpu), ("link", link), ("peer", "switch"), (k, v)]
    };
    assert_eq!(
        sample(
            &body,
            "shmlink_nvlink_ber",
            &link("5", "9", "kind", "symbol")
        ),
        Some(3e-11)
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_nvlink_errors_total",
            &link("5", "9", "type", "symbol")
        ),
        Some(12.0)
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_nvlink_errors_total",
            &link("5", "9", "type", "replay")
        ),
        None,
        "no DL counters on NVLink5"
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_recovery_action",
            &[("gpu", "3"), ("action", "none")]
        ),
        Some(1.0)
    );
    // The BER over 1e-12 already degrades GPU 5's pairs (a warning), nothing else.
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pair_healthy",
            &[("gpu", "4"), ("peer_gpu", "5")]
        ),
        Some(0.0)
    );

    // A failed link recovery on one of GPU 2's switch links: every pair of GPU 2 crosses it.
    config["gpus"][2]["links"][3]["nvlink5"] = json!({"recovery_failed": 1, "recovery_events": 1});
    let errors = link("2", "3", "type", "recovery_failed");
    degraded_for_the_window_only(agent, &fake, &config, (&errors, 1.0), "GPU 2 or 5");
}

#[test]
fn b200_recovery_actions_and_fabric_health_in_check_json() {
    let mut config = fake_nvml::preset("b200-8");
    config["gpus"][1]["recovery_action"] = json!("gpu_reset");
    config["gpus"][3]["recovery_action"] = json!("drain_p2p");
    config["gpus"][5]["fabric"] = json!({"state": "in_progress"});
    config["gpus"][6]["fabric"] = json!({"state": "completed", "route_unhealthy": true});
    let fake = FakeNvml::new(&config);
    let (code, report) = check_json(&fake);
    assert_eq!(code, Some(1));
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus[0]["recovery_action"], "none");
    assert_eq!(gpus[1]["recovery_action"], "gpu_reset");
    assert_eq!(
        gpus[5]["fabric"],
        json!({"state": "in_progress", "status": "success", "degraded_bandwidth": false, "route_unhealthy": false, "cluster_uuid": null, "clique_id": null})
    );
    assert_eq!(gpus[6]["fabric"]["route_unhealthy"], true);
    let errors = &gpus[0]["links"][0]["errors"];
    assert_eq!(
        errors,
        &json!({"recovery_successful": 0, "recovery_failed": 0, "recovery_events": 0,
                "symbol": 0, "effective": 0, "effective_ber": 0.0, "symbol_ber": 0.0})
    );
    let kinds: Vec<(String, String, String)> = gpu_findings(&report)
        .iter()
        .filter(|f| f["kind"] == "gpu_recovery_action" || f["kind"] == "gpu_fabric_unhealthy")
        .map(|f| {
            (
                f["kind"].as_str().unwrap().into(),
                f["subject"].as_str().unwrap().into(),
                f["severity"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = |k: &str, s: &str| (k.to_string(), s.to_string(), "critical".to_string());
    assert_eq!(
        kinds,
        vec![
            want("gpu_recovery_action", "GPU 1"),
            want("gpu_recovery_action", "GPU 3"),
            want("gpu_fabric_unhealthy", "GPU 5"),
            want("gpu_fabric_unhealthy", "GPU 6"),
        ]
    );
    // drain_p2p and the fabric problems on this NVSwitch board degrade those GPUs' pairs; a
    // reset request alone does not (it is the GpuFault condition's).
    for p in pairs(&report) {
        let bad = [3, 5, 6]
            .iter()
            .any(|g| p["gpu"] == *g || p["peer_gpu"] == *g);
        assert_eq!(p["status"], if bad { "degraded" } else { "ok" }, "{p}");
    }
}

#[test]
fn an_old_driver_without_the_new_calls_behaves_as_before() {
    // A Hopper board on today's library: the new fields answer NOT_SUPPORTED.
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let (code, report) = check_json(&fake);
    // Other tests' containers may be on this machine (shm findings): the GPUs have none.
    assert!(matches!(code, Some(0 | 1)), "{code:?}");
    assert_eq!(gpu_findings(&report), Vec::<Value>::new());
    for g in report["gpus"].as_array().unwrap() {
        assert!(
            g.get("recovery_action").is_none() && g.get("fabric").is_none(),
            "{g}"
        );
        let errors = g["links"][0]["errors"].as_object().unwrap();
        let keys: Vec<&str> = errors.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["crc_data", "crc_flit", "ecc_data", "recovery", "replay"]
        );
    }
    // The B200 config on a library without field values or fabric info: no counters at all,
    // no finding, no error on stderr.
    let fake = FakeNvml::new(&fake_nvml::preset("b200-8"));
    let out = check(&fake, &fake_nvml::legacy_lib());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "{report}");
    for g in report["gpus"].as_array().unwrap() {
        assert!(
            g.get("recovery_action").is_none() && g.get("fabric").is_none(),
            "{g}"
        );
        assert!(g["links"][0]["errors"].is_null(), "{g}");
    }
    assert_eq!(gpu_findings(&report), Vec::<Value>::new());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("WARN") && !stderr.contains("ERROR"),
        "{stderr}"
    );
}

//! `shmlink probe`, end to end: the real binary loads the fake libcuda (workspace member
//! `fake-cuda`) by path, as it would a driver's, runs the copies in its worker process, and
//! judges them with the fake NVML's view of an 8-GPU NVSwitch board and an 8-GPU PCIe board.
//! CUDA numbers the devices in another order than NVML; the answers are in NVML's indices.
//! Run with --nocapture to see each table.

use crate::common;

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
            link = api.node_condition(NODE, "GpuLinkDegraded");
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

/// `shmlink probe` with `args` only (no defaults of [`probe`]), and its environment.
fn probe_cmd(nvml: &FakeNvml, cuda: &FakeCuda, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shmlink"));
    cmd.arg("probe")
        .arg("--nvml-lib")
        .arg(fake_nvml::lib())
        .arg("--cuda-lib")
        .arg(fake_cuda::lib())
        .args(args)
        .env("FAKE_NVML_CONFIG", &nvml.config)
        .env("FAKE_CUDA_CONFIG", cuda.config())
        .env("FAKE_CUDA_INITS", cuda.inits_file())
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE");
    cmd
}

/// Runs the probe with `args`, which it must refuse: exit 2, nothing on stdout. Its stderr.
fn refused(nvml: &FakeNvml, cuda: &FakeCuda, args: &[&str]) -> String {
    let out = probe_cmd(nvml, cuda, args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    println!(
        "probe {}: exit {:?}\n{err}",
        args.join(" "),
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}");
    err
}

/// A typo in `--gpus`, one GPU, a size out of range: exit 2 with the reason, and the driver
/// never started (the fake counts every start of the worker's driver).
#[test]
fn bad_input_is_exit_2_with_the_reason_before_any_gpu_is_touched() {
    let nvml_config = fake_nvml::preset("nvswitch-8");
    let nvml = FakeNvml::new(&nvml_config);
    let cuda = FakeCuda::new(&fake_cuda::config(&nvml_config, &REVERSED, 300.0));
    let all = "GPUs 0, 1, 2, 3, 4, 5, 6, 7";
    let range = "the sized copy must be from 4 KiB to 4 GiB (e.g. 64Mi, the default)";
    let cases: [(&[&str], String); 6] = [
        (
            &["--gpus", "0,9"],
            format!("shmlink: --gpus 0,9: no GPU 9 here; NVML lists {all}\n"),
        ),
        (
            &["--gpus", "0"],
            format!("shmlink: --gpus 0: a pair needs two GPUs; NVML lists {all}\n"),
        ),
        (
            &["--gpus", "2,5,2"],
            "shmlink: --gpus 2,5,2: GPU 2 is named twice\n".into(),
        ),
        (
            &["--bytes", "0"],
            format!("error: invalid value '0' for '--bytes <SIZE>': {range}\n"),
        ),
        (
            &["--bytes", "100Gi"],
            format!("error: invalid value '100Gi' for '--bytes <SIZE>': {range}\n"),
        ),
        (
            &["--bytes", "100Gi", "--json"],
            format!("error: invalid value '100Gi' for '--bytes <SIZE>': {range}\n"),
        ),
    ];
    for (args, want) in cases {
        let err = refused(&nvml, &cuda, args);
        assert!(err.contains(&want), "{args:?}: {err}");
        assert_eq!(cuda.inits(), 0, "{args:?}: the driver was started");
    }
    // The same bounds hold where the probe runs from serve and preflight.
    for command in ["serve", "preflight"] {
        let out = Command::new(env!("CARGO_BIN_EXE_shmlink"))
            .args([command, "--bytes", "0"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains(&format!("invalid value '0' for '--bytes <SIZE>': {range}")),
            "{command}"
        );
    }
    // Good input does start it.
    let out = probe_cmd(&nvml, &cuda, &["--gpus", "0,1", "--bytes", "4Ki"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(cuda.inits(), 1);
}

/// NVML lists eight GPUs but CUDA sees one of those asked: no pair, exit 2 saying what CUDA
/// lists, not "0 pairs probed" and exit 0.
#[test]
fn cuda_seeing_fewer_than_two_of_the_gpus_is_exit_2() {
    let nvml_config = fake_nvml::preset("nvswitch-8");
    let nvml = FakeNvml::new(&nvml_config);
    let cuda = FakeCuda::new(&fake_cuda::config(&nvml_config, &[0, 5], 300.0));
    let err = refused(&nvml, &cuda, &["--gpus", "0,1,2"]);
    assert!(
        err.contains(&format!(
            "shmlink: no pair to probe: CUDA lists 2 device(s) ({}, {}), and fewer than two of \
             them are GPUs 0, 1, 2 as NVML lists them",
            fake_cuda::bus(&nvml_config, 0).replace("00000000:", "0000:"),
            fake_cuda::bus(&nvml_config, 5).replace("00000000:", "0000:"),
        )),
        "{err}"
    );
}

/// A config the fake libcuda cannot parse is said, and the probe says the driver did not start.
#[test]
fn a_malformed_fake_config_is_exit_2_with_the_parse_error() {
    let nvml = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let cuda = FakeCuda::new(&json!({}));
    std::fs::write(cuda.config(), "{\"devices\": [\n  \"0000:18:00.0\",,\n]}\n").unwrap();
    let err = refused(&nvml, &cuda, &["--bytes", "8Mi"]);
    assert!(
        err.contains(
            "shmlink: the probe could not run: the driver did not start: cuInit failed: CUDA \
             error 3 (initialization error); it printed: fake-cuda: FAKE_CUDA_CONFIG="
        ),
        "{err}"
    );
    assert!(err.contains("at line 2 column"), "{err}");
    assert!(err.contains(&cuda.config().display().to_string()), "{err}");
}

/// A pty: the master (read here) and the terminal's path (the child's stdout or stderr).
fn pty() -> (std::fs::File, std::path::PathBuf) {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let path = std::path::PathBuf::from(name.to_str().unwrap());
    (std::fs::File::from(master), path)
}

/// Runs `cmd` with stdout and stderr on one terminal: each line it wrote with when it came,
/// and when the process ended.
fn on_terminal(mut cmd: Command) -> (Vec<(Instant, String)>, Instant, i32) {
    use std::io::{BufRead, BufReader};
    let (master, path) = pty();
    let open = || std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    cmd.stdout(open())
        .stderr(open())
        .stdin(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    // The child's copies of the terminal are its own now: the read below ends when it exits.
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(master).lines() {
            // EIO once the last writer closed the terminal.
            let Ok(line) = line else { break };
            lines.push((Instant::now(), line.trim_end_matches('\r').to_string()));
        }
        lines
    });
    let status = child.wait().unwrap();
    let ended = Instant::now();
    (reader.join().unwrap(), ended, status.code().unwrap_or(-1))
}

/// GPU 1 -> GPU 2 hangs: on a terminal each pair's line comes as it ends, the hung one is said
/// to be waiting before its deadline, with NO_COLOR not one escape; without it, colours.
#[test]
fn on_a_terminal_progress_comes_as_pairs_end_and_a_hang_is_said_while_it_waits() {
    let nvml_config = fake_nvml::preset("nvswitch-8");
    let nvml = FakeNvml::new(&nvml_config);
    let mut c = fake_cuda::config(&nvml_config, &REVERSED, 300.0);
    fake_cuda::fault(&mut c, &nvml_config, 1, 2, json!({"hang": true}));
    let cuda = FakeCuda::new(&c);
    let args = [
        "--gpus",
        "0,1,2,3",
        "--bytes",
        "8Mi",
        "--probe-timeout",
        "2s",
    ];
    let mut cmd = probe_cmd(&nvml, &cuda, &args);
    cmd.env("NO_COLOR", "1").env("TERM", "xterm");
    let (lines, ended, code) = on_terminal(cmd);
    for (at, l) in &lines {
        println!(
            "{:>6.2} s before the end | {l}",
            (ended - *at).as_secs_f64()
        );
    }
    assert_eq!(code, 1);
    let at = |needle: &str| {
        lines
            .iter()
            .find(|(_, l)| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}"))
            .0
    };
    let progress: Vec<&String> = lines
        .iter()
        .map(|(_, l)| l)
        .filter(|l| l.starts_with('['))
        .collect();
    assert_eq!(progress.len(), 12, "{progress:#?}");
    assert!(progress[0].starts_with("[ 1/12] GPU "), "{}", progress[0]);
    assert!(progress
        .iter()
        .any(|l| l.starts_with("[") && l.contains("  ok  300.0 GB/s  (")));
    let waiting = at("GPU 1 -> GPU 2 still copying after 1 s (deadline 2 s)");
    let hung = at("] GPU 1 -> GPU 2  FAILED  (");
    assert!(waiting < hung);
    // The first pair was told before the hang was waited out, not with the table.
    assert!(ended - at("[ 1/12]") > Duration::from_secs(1));
    assert!(at("FROM  TO  STATUS") > hung);
    let hung_row = lines
        .iter()
        .find(|(_, l)| l.starts_with("1     2   FAILED"))
        .unwrap();
    assert!(
        hung_row
            .1
            .starts_with("1     2   FAILED    yes   peer  -         -  "),
        "peer access granted, the copy never finished: {}",
        hung_row.1
    );
    assert!(lines.iter().any(|(_, l)| l.starts_with("PEER      yes: ")));
    assert!(
        lines.iter().all(|(_, l)| !l.contains('\x1b')),
        "NO_COLOR: no escape"
    );

    // Without NO_COLOR, the same terminal gets colours.
    let mut cmd = probe_cmd(&nvml, &cuda, &args);
    cmd.env("TERM", "xterm");
    let (lines, _, code) = on_terminal(cmd);
    assert_eq!(code, 1);
    let all: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    let text = all.join("\n");
    assert!(text.contains("  \x1b[32mok\x1b[0m  300.0 GB/s"), "{text}");
    assert!(text.contains("\x1b[31mFAILED\x1b[0m"), "{text}");
    assert!(
        all.contains(&"0     1   \x1b[32mok\x1b[0m        yes   peer  yes       300.0       450.0"),
        "the table in colour: {text}"
    );
    // And `--color never` on a terminal, none.
    let mut cmd = probe_cmd(&nvml, &cuda, &[&args[..], &["--color", "never"]].concat());
    cmd.env("TERM", "xterm");
    let (lines, _, _) = on_terminal(cmd);
    assert!(lines.iter().all(|(_, l)| !l.contains('\x1b')));
    assert!(lines.iter().any(|(_, l)| l.starts_with("[12/12]")));
}

/// Not on a terminal no progress unless asked; with `--json` it stays on stderr. A hung pair
/// keeps the peer access it was granted; a refused pair's copy is told as the host's.
#[test]
fn json_tells_peer_access_and_path_as_they_were_and_progress_stays_on_stderr() {
    let nvml_config = fake_nvml::preset("nvswitch-8");
    let nvml = FakeNvml::new(&nvml_config);
    let mut c = fake_cuda::config(&nvml_config, &REVERSED, 300.0);
    fake_cuda::fault(&mut c, &nvml_config, 1, 2, json!({"hang": true}));
    fake_cuda::fault(&mut c, &nvml_config, 2, 0, json!({"peer_access": false}));
    let cuda = FakeCuda::new(&c);
    let args = ["--gpus", "0,1,2", "--bytes", "8Mi", "--probe-timeout", "2s"];
    let quiet = probe_cmd(&nvml, &cuda, &[&args[..], &["--json"]].concat())
        .output()
        .unwrap();
    assert!(quiet.stderr.is_empty(), "{quiet:?}");
    let out = probe_cmd(
        &nvml,
        &cuda,
        &[&args[..], &["--json", "--progress", "always"]].concat(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with('[')).count(),
        6,
        "{err}"
    );
    assert!(err.contains("GPU 1 -> GPU 2 still copying after 1 s (deadline 2 s)"));
    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON alone");
    let hung = pair(&report, 1, 2);
    assert_eq!(
        (
            &hung["peer_access"],
            &hung["peer"],
            &hung["path"],
            &hung["compared"],
            &hung["verified"],
            &hung["gbps"]
        ),
        (
            &json!(true),
            &json!("granted"),
            &json!("peer"),
            &json!(false),
            &json!(false),
            &Value::Null
        ),
        "{hung}"
    );
    let refused = pair(&report, 2, 0);
    assert_eq!(refused["status"], "failed");
    assert_eq!(
        (&refused["peer_access"], &refused["peer"], &refused["path"]),
        (&json!(false), &json!("refused"), &json!("host")),
        "{refused}"
    );
    // The table: the refused pair's bytes matched, but at the host's speed, not the pair's.
    let table = probe_cmd(&nvml, &cuda, &args).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    println!("{table}");
    let row = table.lines().find(|l| l.starts_with("2     0 ")).unwrap();
    assert!(
        row.starts_with("2     0   FAILED    no    host  yes       300.0 host  450.0     peer access GPU 2 -> GPU 0 refused"),
        "{row}"
    );
    assert!(!table.contains('\x1b'), "not a terminal: no colour");
}

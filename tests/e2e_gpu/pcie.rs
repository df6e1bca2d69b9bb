//! The PCIe path under the GPUs, end to end: `serve` with Kubernetes off on an 8-GPU PCIe board
//! (the fake NVML's `pcie-8`, two GPUs per switch) over a sysfs tree laid out as the kernel
//! lays it out (`--sys-root`). A link of a lower generation says nothing while the GPU idles and
//! is a finding once it is busy; one narrower than its lanes allow is a finding at any load, once
//! for the GPU; AER errors counted on a switch port above a GPU are one; ACS
//! redirecting P2P on a switch port is one, naming the GPUs it lies between; each is logged as
//! it begins and as it ends. `check --json` tells the same from one scan.

use crate::common;

use std::time::Duration;

use common::agent::{sample, Agent};
use common::fake_nvml::{self, FakeNvml};
use serde_json::{json, Value};
use shmlink::fixtures::sysfs::{Bridge, SysTree};

/// Switch k: its root port, upstream port, and the downstream port of each of its two GPUs.
const SWITCHES: [(&str, &str, [&str; 2], [&str; 2]); 4] = [
    (
        "0000:16:00.0",
        "0000:17:00.0",
        ["0000:18:00.0", "0000:18:01.0"],
        ["0000:19:00.0", "0000:1a:00.0"],
    ),
    (
        "0000:38:00.0",
        "0000:39:00.0",
        ["0000:3a:00.0", "0000:3a:01.0"],
        ["0000:3b:00.0", "0000:3c:00.0"],
    ),
    (
        "0000:96:00.0",
        "0000:97:00.0",
        ["0000:98:00.0", "0000:98:01.0"],
        ["0000:99:00.0", "0000:9a:00.0"],
    ),
    (
        "0000:b8:00.0",
        "0000:b9:00.0",
        ["0000:ba:00.0", "0000:ba:01.0"],
        ["0000:bb:00.0", "0000:bc:00.0"],
    ),
];

fn tree(root: &std::path::Path) -> SysTree {
    let tree = SysTree::new(root);
    for (rp, usp, dsps, gpus) in SWITCHES {
        for (dsp, gpu) in dsps.into_iter().zip(gpus) {
            tree.gpu_under(
                gpu,
                &[
                    Bridge::root_port(rp),
                    Bridge::port(usp, None),
                    Bridge::port(dsp, Some(0x0000)),
                ],
            );
            tree.aer(gpu, 0, 0, 0);
            tree.aer(dsp, 0, 0, 0);
        }
    }
    tree
}

/// pcie-8 with every link at Gen5 x16 and idle, GPU 3's at Gen3 (a generation idle links drop
/// to), GPU 6's trained to x8 of its x16 lanes.
fn board(gpu3_busy: bool) -> Value {
    let mut config = fake_nvml::preset("pcie-8");
    for (g, gpu) in config["gpus"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let (gen, width) = match g {
            3 => (3, 16),
            6 => (5, 8),
            _ => (5, 16),
        };
        gpu["pcie_link"] = json!({"gen": gen, "max_gen": 5, "width": width, "max_width": 16});
        let busy = if g == 3 && gpu3_busy { 97 } else { 0 };
        gpu["utilization"] = json!({"gpu": busy, "memory": 0});
    }
    config
}

fn wait_log(agent: &Agent, what: &str, needle: &str) -> String {
    let mut log = String::new();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            log = agent.log_text();
            log.contains(needle)
        }),
        "{what}: {needle:?} never logged:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains(needle))
        .unwrap()
        .to_string();
    println!("{line}");
    line
}

#[test]
fn a_narrow_link_at_any_load_a_slow_one_while_busy_aer_errors_and_acs_are_each_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let sys = tree(dir.path());
    let fake = FakeNvml::new(&board(false));
    let agent = Agent::start_gpu(&fake, &["--sys-root", dir.path().to_str().unwrap()]);
    // Idle: GPU 3's link at Gen3 x8 says nothing, for scans on end.
    let body = agent.wait_for_metrics("the PCIe families", |b| {
        sample(b, "shmlink_gpu_pcie_link_generation", &[("gpu", "3")]) == Some(3.0)
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pcie_acs_redirect",
            &[("gpu", "0"), ("device", "0000:18:00.0")]
        ),
        Some(0.0),
        "{body}"
    );
    // x8 of x16 lanes is told at any load, once for the GPU (not per pair).
    let line = wait_log(&agent, "narrow", "finding began: The PCIe link of GPU 6");
    assert!(
        line.contains(
            "runs at Gen5 x8, below the Gen5 x16 it and its slot allow. Only 8 of its 16"
        ) && line.contains("kind=\"gpu_pcie_degraded\""),
        "{line}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log_text();
    assert_eq!(
        log.matches("finding began: The PCIe link").count(),
        1,
        "GPU 3 idle says nothing, GPU 6 once:\n{log}"
    );

    // Busy: the link is judged.
    fake.write(&board(true));
    let line = wait_log(&agent, "busy", "finding began: The PCIe link of GPU 3");
    assert!(
        line.contains("runs at Gen3 x16 while the GPU is busy (97% utilized), below the Gen5 x16")
            && line.contains("kind=\"gpu_pcie_degraded\""),
        "{line}"
    );

    // A switch port above GPU 5 counts errors.
    sys.aer("0000:98:01.0", 12, 0, 0);
    let line = wait_log(
        &agent,
        "AER",
        "finding began: PCIe AER errors on the path of GPU 5",
    );
    assert!(
        line.contains("+12 correctable at 0000:98:01.0 (the bridge above it)"),
        "{line}"
    );

    // ACS redirect on GPU 0's downstream port: between GPUs 0 and 1.
    sys.acs("0000:18:00.0", 0x001d);
    let line = wait_log(&agent, "ACS", "finding began: ACS redirects");
    assert!(
        line.contains("0000:18:00.0 (ACSCtl 0x001d, between GPUs 0, 1)")
            && line.contains("kind=\"pcie_acs_enabled\""),
        "{line}"
    );
    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_gpu_pcie_aer_errors_total",
            &[
                ("gpu", "5"),
                ("device", "0000:98:01.0"),
                ("severity", "correctable")
            ]
        ),
        Some(12.0),
        "{body}"
    );

    // One scan of `check` tells the link and ACS (AER growth needs two).
    let report = fake.check_json(&["--sys-root", dir.path().to_str().unwrap()]);
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    for k in ["gpu_pcie_degraded", "pcie_acs_enabled", "gpu_pair_degraded"] {
        assert!(kinds.contains(&k), "{k} not in {kinds:?}");
    }
    assert!(!kinds.contains(&"gpu_pcie_errors"), "{kinds:?}");
    let gpu0 = &report["gpus"][0];
    assert_eq!(gpu0["pcie_path"][1]["acs"]["control"], 0x001d, "{gpu0:#}");

    // Idle again, ACS off: those findings end.
    fake.write(&board(false));
    sys.acs("0000:18:00.0", 0x0000);
    wait_log(&agent, "idle", "finding ended: The PCIe link of GPU 3");
    wait_log(&agent, "ACS off", "finding ended: ACS redirects");
    let log = agent.log_text();
    assert!(
        !log.contains("finding ended: The PCIe link of GPU 6"),
        "a narrow link stays told while idle:\n{log}"
    );
}

/// Issue 36, item 6: a FIFO and a symlink to /dev/zero at a GPU's AER files, a FIFO at its
/// switch port's config space. `check` finishes at once (a FIFO hung it, /dev/zero read 2 GiB),
/// logs each bad file once, and says nothing of AER there.
#[test]
fn a_fifo_and_dev_zero_at_aer_files_are_refused_logged_once_and_check_ends_on_time() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let devices = dir.path().join("bus/pci/devices");
    let (gpu, port) = (
        devices.join(SWITCHES[0].3[0]),
        devices.join(SWITCHES[0].2[0]),
    );
    let fifo = |path: &std::path::Path| {
        std::fs::remove_file(path).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    };
    fifo(&gpu.join("aer_dev_fatal"));
    fifo(&port.join("config"));
    std::fs::remove_file(gpu.join("aer_dev_nonfatal")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", gpu.join("aer_dev_nonfatal")).unwrap();
    let fake = FakeNvml::new(&board(false));
    let lib = fake_nvml::lib();
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(common::shmlink_bin())
        .args(["check", "--json", "--nvml-lib"])
        .arg(&lib)
        .arg("--sys-root")
        .arg(dir.path())
        .env(fake.env()[0].0, fake.env()[0].1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it writes: a report past the pipe's buffer would block check, not the files.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let ended = common::wait_until(Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = child.kill();
    }
    child.wait().unwrap();
    let out = (stdout.join().unwrap(), stderr.join().unwrap());
    let took = started.elapsed();
    assert!(ended, "check still ran after {took:?}");
    println!("check took {} ms", took.as_millis());
    assert!(took < Duration::from_secs(10), "{took:?}");
    let report: Value = serde_json::from_slice(&out.0)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.1)));
    let gpu0 = &report["gpus"][0];
    assert_eq!(gpu0["pcie_path"][0]["aer"], Value::Null, "{gpu0:#}");
    let log = String::from_utf8_lossy(&out.1);
    // The AER read stops at its first bad file (nonfatal): the fatal FIFO is never opened.
    assert!(!log.contains("aer_dev_fatal"), "{log}");
    for bad in ["aer_dev_nonfatal", "config"] {
        let told = log
            .lines()
            .filter(|l| l.contains("sysfs file not read") && l.contains(bad))
            .count();
        assert_eq!(told, 1, "{bad}: {log}");
    }
}

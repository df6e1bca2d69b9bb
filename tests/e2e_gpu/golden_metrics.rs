//! The whole of `/metrics` for one fixed fake node, compared with `tests/golden/metrics.txt`
//! (as node_exporter's end-to-end test compares its output with `e2e-output.txt`): any change to
//! a series' name, labels, type, HELP text or value shows in review as a diff of that file.
//! `SHMLINK_UPDATE_GOLDEN=1 cargo test --test e2e_gpu golden_metrics::` rewrites it.
//!
//! The node is fake and fixed: a /proc and a cgroup v2 tree written here (a pod container whose
//! /dev/shm is a 64 MiB tmpfs holding 16 MiB, under a pod memory limit that binds; a Docker
//! container without /dev/shm), the fake NVML library with `tests/golden/nvml.json`, and the
//! pod log, Docker log and kernel log of `tests/golden/` appended once `serve` follows them.
//! Needs root, for the tmpfs.

use crate::common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::agent::{sample, Agent};
use common::fake_nvml::FakeNvml;

const HOST_MNT: u64 = 4026531840;
const HOST_IPC: u64 = 4026531839;
const MIB: u64 = 1 << 20;

const POD_UID: &str = "0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d";
const POD_SLICE: &str = "kubepods.slice/kubepods-burstable.slice/\
                         kubepods-burstable-pod0b6c1a2e_7f3d_4c1b_9a2e_5d6f7a8b9c0d.slice";
const POD_CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
/// The pod container's process; the kernel log's segfault names it.
const POD_PID: i32 = 4242;
const DOCKER_CID: &str = "9c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d";
const DOCKER_PID: i32 = 5150;

/// Families whose values depend on time, not on the node; their values become `<varies>`.
const VARYING: [&str; 4] = [
    // How long each scan took (buckets, sum) and how many ran before the scrape (count).
    "shmlink_scan_duration_seconds",
    // The wall clock.
    "shmlink_last_scan_timestamp_seconds",
    // When the pair judge first saw each failing pair fail (the agent's first scans).
    "shmlink_gpu_pair_failing_since_seconds",
    // When each failure happened: a kernel record's time is the machine's boot time plus its
    // stamp (a time in a label would be masked by `mask_times`).
    "shmlink_workload_failure_last_info",
];

/// Each RFC 3339 UTC time (`2026-01-15T10:00:05.0001Z`) in `line` as `<time>`.
fn mask_times(line: &str) -> String {
    let b = line.as_bytes();
    let starts_time = |i: usize| {
        let shape = b"dddd-dd-ddTdd:dd:dd";
        b.len() >= i + shape.len()
            && shape.iter().zip(&b[i..]).all(|(s, c)| match s {
                b'd' => c.is_ascii_digit(),
                s => s == c,
            })
    };
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < b.len() {
        if starts_time(i) {
            let z = line[i..].find('Z').filter(|&z| {
                line[i + 19..i + z]
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.')
            });
            if let Some(z) = z {
                out.push_str("<time>");
                i += z + 1;
                continue;
            }
        }
        let ch = line[i..].chars().next().unwrap();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Root, for the tmpfs; else SKIPPED on stderr, or a failure under `SHMLINK_E2E=require`.
fn can_mount() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let why = "needs root to mount a tmpfs";
    if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("the golden /metrics test {why}");
    }
    eprintln!("SKIPPED the golden /metrics test: {why}");
    false
}

/// A tmpfs of `size` mounted at `at`, lazily unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: u64) -> Tmpfs {
        rustix::mount::mount(
            "tmpfs",
            at,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            std::ffi::CString::new(format!("size={size},mode=1777"))
                .unwrap()
                .as_c_str(),
        )
        .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", at.display()));
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// The fake node's roots, in a TempDir.
struct Node {
    // Unmounted before the directory is removed (fields drop in order).
    _shm: Tmpfs,
    dir: tempfile::TempDir,
}

impl Node {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn arg(&self, rel: &str) -> String {
        self.path(rel).to_str().unwrap().to_string()
    }

    fn build(nvml: &serde_json::Value) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let at = |rel: &str| dir.path().join(rel);
        let write = |rel: &str, text: &str| {
            let path = at(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        };

        // /proc: PID 1 in the host's namespaces, and one process per container with a root.
        let process = |pid: i32, mnt: u64, ipc: u64, cgroup: &str| {
            let proc = at(&format!("proc/{pid}"));
            fs::create_dir_all(proc.join("ns")).unwrap();
            symlink(format!("mnt:[{mnt}]"), proc.join("ns/mnt")).unwrap();
            symlink(format!("ipc:[{ipc}]"), proc.join("ns/ipc")).unwrap();
            let root = at(&format!("roots/{pid}"));
            fs::create_dir_all(root.join("dev")).unwrap();
            symlink(&root, proc.join("root")).unwrap();
            fs::write(proc.join("mountinfo"), "").unwrap();
            fs::write(proc.join("cgroup"), format!("0::/{cgroup}\n")).unwrap();
            root
        };
        process(1, HOST_MNT, HOST_IPC, "init.scope");
        let pod_scope = format!("{POD_SLICE}/cri-containerd-{POD_CID}.scope");
        let pod_root = process(POD_PID, HOST_MNT + 10, HOST_IPC + 10, &pod_scope);
        // `docker run --ipc=none`: no /dev/shm at all.
        let docker_scope = format!("system.slice/docker-{DOCKER_CID}.scope");
        process(DOCKER_PID, HOST_MNT + 20, HOST_IPC + 20, &docker_scope);
        for gpu in nvml["gpus"].as_array().unwrap() {
            // The driver lists "0000:18:00.0" where NVML says "00000000:18:00.0".
            let bus = gpu["pci_bus_id"].as_str().unwrap().to_lowercase();
            fs::create_dir_all(at(&format!("proc/driver/nvidia/gpus/{}", &bus[4..]))).unwrap();
        }

        // The pod container's /dev/shm: 16 MiB written in a 64 MiB tmpfs.
        fs::create_dir(pod_root.join("dev/shm")).unwrap();
        let shm = Tmpfs::mount(&pod_root.join("dev/shm"), 64 * MIB);
        // The mounts the pod container sees: this machine's, the tmpfs among them at /dev/shm
        // (the scan looks in a root only on a mount its mountinfo shows as local, and measures
        // a /dev/shm its mountinfo shows as tmpfs).
        let at_shm = format!(" {} ", pod_root.join("dev/shm").display());
        let mounts: String = fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .map(|l| format!("{}\n", l.replacen(&at_shm, " /dev/shm ", 1)))
            .collect();
        fs::write(at(&format!("proc/{POD_PID}/mountinfo")), &mounts).unwrap();
        let host_mounts = fs::read("/proc/self/mountinfo").unwrap();
        fs::write(at(&format!("proc/{DOCKER_PID}/mountinfo")), host_mounts).unwrap();
        fs::write(
            pod_root.join("dev/shm/batch"),
            vec![0u8; (16 * MIB) as usize],
        )
        .unwrap();

        // cgroup v2: the pod slice's 512 MiB limit, 480 MiB used, bounds the container's 1 GiB.
        write("cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
        let cgroup = |rel: &str, pids: &str, max: &str, current: u64| {
            write(&format!("cgroup/{rel}/cgroup.procs"), pids);
            write(&format!("cgroup/{rel}/memory.max"), max);
            write(
                &format!("cgroup/{rel}/memory.current"),
                &format!("{current}\n"),
            );
            write(
                &format!("cgroup/{rel}/memory.stat"),
                &format!(
                    "anon {}\nfile {}\nshmem {}\n",
                    current / 2,
                    current / 2,
                    16 * MIB
                ),
            );
        };
        cgroup("init.scope", "1\n", "max\n", 8 * MIB);
        cgroup("kubepods.slice", "", "max\n", 480 * MIB);
        cgroup(
            "kubepods.slice/kubepods-burstable.slice",
            "",
            "max\n",
            480 * MIB,
        );
        cgroup(POD_SLICE, "", &format!("{}\n", 512 * MIB), 480 * MIB);
        cgroup(
            &pod_scope,
            &format!("{POD_PID}\n"),
            &format!("{}\n", 1024 * MIB),
            470 * MIB,
        );
        cgroup("system.slice", "", "max\n", 200 * MIB);
        cgroup(
            &docker_scope,
            &format!("{DOCKER_PID}\n"),
            "max\n",
            100 * MIB,
        );

        // The logs exist, empty, before serve starts: it follows them from their end.
        write(&format!("pods/ml_trainer-0_{POD_UID}/trainer/0.log"), "");
        write(
            &format!("docker/containers/{DOCKER_CID}/config.v2.json"),
            &serde_json::json!({
                "ID": DOCKER_CID, "Name": "/asr-dev", "State": {"Running": true},
                "Config": {"Image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
            })
            .to_string(),
        );
        write(
            &format!("docker/containers/{DOCKER_CID}/{DOCKER_CID}-json.log"),
            "",
        );
        write("kmsg", "");
        Node { _shm: shm, dir }
    }

    /// What the workload and the kernel say, appended to the logs serve follows.
    fn tell(&self) {
        for (fixture, to) in [
            (
                "pod.log",
                format!("pods/ml_trainer-0_{POD_UID}/trainer/0.log"),
            ),
            (
                "docker-json.log",
                format!("docker/containers/{DOCKER_CID}/{DOCKER_CID}-json.log"),
            ),
            ("kmsg", "kmsg".to_string()),
        ] {
            let text = fs::read(golden_dir().join(fixture)).unwrap();
            fs::OpenOptions::new()
                .append(true)
                .open(self.path(&to))
                .unwrap()
                .write_all(&text)
                .unwrap();
        }
    }
}

fn lines_of(fixture: &str) -> f64 {
    fs::read_to_string(golden_dir().join(fixture))
        .unwrap()
        .lines()
        .count() as f64
}

/// The scrape made comparable: values of the [`VARYING`] families become `<varies>`, and the
/// series of each family are sorted by their labels (prometheus-client writes a `Family`'s
/// series in hash-map order, which differs run to run and means nothing to Prometheus); a
/// histogram's lines of one label set keep their order.
fn normalise(body: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    // The current family's series: (labels without `le`, original position, line).
    let mut series: Vec<(String, usize, String)> = Vec::new();
    let flush = |series: &mut Vec<(String, usize, String)>, out: &mut Vec<String>| {
        series.sort();
        out.extend(series.drain(..).map(|(_, _, line)| line));
    };
    for (i, line) in body.lines().enumerate() {
        if line.starts_with('#') {
            flush(&mut series, &mut out);
            out.push(line.to_string());
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let varies = VARYING.iter().any(|family| name.starts_with(family));
        let line = match line.rsplit_once(' ') {
            Some((series, _)) if varies => {
                format!("{} <varies>", cut_message(&mask_times(series)))
            }
            _ => line.to_string(),
        };
        // The machine's kernel release, whatever machine runs the test.
        let line = mask_label(&line, "kernel");
        let labels = line[name_end..]
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
            .map_or("", |(set, _)| set)
            .split(',')
            .filter(|kv| !kv.starts_with("le="))
            .collect::<Vec<_>>()
            .join(",");
        series.push((labels, i, line));
    }
    flush(&mut series, &mut out);
    out.join("\n") + "\n"
}

/// A `message` label cut to its first 150 characters: the agent cuts the message to a byte
/// bound before the test masks its time, and a time's fraction has as many digits as it needs,
/// so the last few characters depend on the clock.
fn cut_message(series: &str) -> String {
    let key = "message=\"";
    let Some(start) = series.find(key).map(|i| i + key.len()) else {
        return series.to_string();
    };
    let Some(len) = series[start..].rfind('"') else {
        return series.to_string();
    };
    let text: String = series[start..start + len].chars().take(150).collect();
    format!("{}{text}…{}", &series[..start], &series[start + len..])
}

/// The value of `label` in a series line as `<varies>`.
fn mask_label(line: &str, label: &str) -> String {
    let key = format!(",{label}=\"");
    let Some(start) = line.find(&key).map(|i| i + key.len()) else {
        return line.to_string();
    };
    let Some(len) = line[start..].find('"') else {
        return line.to_string();
    };
    format!("{}<varies>{}", &line[..start], &line[start + len..])
}

/// A unified-ish diff: the differing lines, with their line numbers in each file.
fn diff(golden: &str, actual: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), actual.lines().collect());
    // Longest common subsequence, from the ends.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out, mut shown) = (0, 0, String::new(), 0);
    let mut in_hunk = false;
    while (i < a.len() || j < b.len()) && shown < 60 {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            (i, j, in_hunk) = (i + 1, j + 1, false);
            continue;
        }
        if !in_hunk {
            out += &format!("@@ golden line {}, scrape line {} @@\n", i + 1, j + 1);
            in_hunk = true;
        }
        if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out += &format!("-{}\n", a[i]);
            i += 1;
        } else {
            out += &format!("+{}\n", b[j]);
            j += 1;
        }
        shown += 1;
    }
    if i < a.len() || j < b.len() {
        out += "... (more differences)\n";
    }
    out
}

/// Waits for `scans` more scans to finish (the last-scan timestamp moves each time).
fn wait_scans(agent: &Agent, scans: usize) {
    for _ in 0..scans {
        let last = |b: &str| sample(b, "shmlink_last_scan_timestamp_seconds", &[]);
        let t0 = last(&agent.metrics());
        agent.wait_for_metrics("another scan", |b| last(b) > t0);
    }
}

#[test]
fn metrics_of_the_fixed_node_match_the_golden_file() {
    if !can_mount() {
        return;
    }
    let nvml: serde_json::Value =
        serde_json::from_slice(&fs::read(golden_dir().join("nvml.json")).unwrap()).unwrap();
    let node = Node::build(&nvml);
    let fake = FakeNvml::new(&nvml);
    let agent = Agent::start_gpu(
        &fake,
        &[
            "--node-name",
            "golden-node",
            "--proc-root",
            &node.arg("proc"),
            "--cgroup-root",
            &node.arg("cgroup"),
            "--pod-log-root",
            &node.arg("pods"),
            "--docker-root",
            &node.arg("docker"),
            "--kmsg",
            &node.arg("kmsg"),
            // The fixed node is files: no tracepoint of its deaths to open.
            "--death-trace",
            "off",
        ],
    );
    // The watcher reports once it has looked at every source (from their ends); what is
    // appended after that is news to it.
    agent.wait_for_metrics("the failure watcher's first look", |b| {
        sample(b, "shmlink_kmsg_up", &[]) == Some(1.0)
    });
    node.tell();
    let lines = lines_of("pod.log") + lines_of("docker-json.log");
    let records = lines_of("kmsg");
    agent.wait_for_metrics("every log line and kernel record read", |b| {
        sample(b, "shmlink_log_lines_total", &[]) == Some(lines)
            && sample(b, "shmlink_kmsg_records_total", &[]) == Some(records)
    });
    // What was read reaches the snapshot at the next scan; two to be sure.
    wait_scans(&agent, 2);
    let scrape = normalise(&agent.metrics());
    // The same a few scans later: the golden file holds a settled state, not a race.
    wait_scans(&agent, 3);
    let again = normalise(&agent.metrics());
    assert!(
        scrape == again,
        "/metrics changed between scans with nothing new to read:\n{}",
        diff(&scrape, &again)
    );

    let golden_path = golden_dir().join("metrics.txt");
    if std::env::var_os("SHMLINK_UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        fs::write(&golden_path, &scrape).unwrap();
        eprintln!("wrote {}", golden_path.display());
        return;
    }
    let golden = fs::read_to_string(&golden_path).unwrap_or_default();
    assert!(
        golden == scrape,
        "/metrics differs from tests/golden/metrics.txt (- golden, + scrape); if the change is \
         meant, run SHMLINK_UPDATE_GOLDEN=1 cargo test --test e2e_gpu golden_metrics:: and commit \
         the file:\n{}",
        diff(&golden, &scrape)
    );
}

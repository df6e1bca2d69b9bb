//! Pods made by a real containerd through CRI, as kubelet makes them (tests/common/containerd.rs),
//! and `check` over them: the sandbox's /dev/shm shared by a Pod's containers and outliving
//! them, the shm cases (runtime default, a memory emptyDir, host IPC), a SIGBUS death, an OOM
//! kill, PyTorch's two-line DataLoader death, leftover segments. The in-process API server
//! plays kubelet's Pod records (names, GPUs asked for, the SIGBUS death's exit).
//!
//! One containerd for the file; the Pods are made in parallel, then one `check` reads them
//! all. Every case's problems are gathered and reported together. Needs root (SKIPPED
//! otherwise; a failure under `SHMLINK_E2E=require`).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::{Containerd, CtrSpec, Pod, PodSpec};
use common::kube_api::{finished_now, pod, restarted, FakeApi};
use common::HostTmpfs;
use serde_json::{json, Value};

const NODE: &str = "cri-node-1";
const NS: &str = "ml";
const MIB: u64 = 1 << 20;
const PYTHON: &str = "/usr/bin/python3";

/// A 100 MiB `multiprocessing.shared_memory` block filled on the 64 MiB /dev/shm: the first
/// page past 64 MiB is a SIGBUS; the block's file stays in the Pod's /dev/shm.
///
/// The block is taken off Python's resource tracker: the tracker is a process of its own that
/// unlinks the blocks of a process that died, and the dying process closes its pipe to it before
/// the kernel kills the rest of its PID namespace. So now and then the tracker emptied the
/// sandbox's /dev/shm before `check` looked (the project's CI failed on it once).
const SHM_BLOCK: &str = r#"
from multiprocessing import resource_tracker, shared_memory
block = shared_memory.SharedMemory(create=True, size=100 << 20)
resource_tracker.unregister(block._name, "shared_memory")
mib = b"\1" * (1 << 20)
for i in range(100):
    block.buf[i << 20:(i + 1) << 20] = mib
"#;

/// PyTorch's DataLoader death as it reaches the log: the worker's line (stderr), then the main
/// process's (16 microseconds apart in the field).
const WORKER_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be \
                           caused by insufficient shared memory (shm).";
const MAIN_LINE: &str =
    "RuntimeError: DataLoader worker (pid 3527) is killed by signal: Bus error.";

/// What a case made, for the one `check` and its assertions.
struct Made {
    pod: Pod,
    /// (container name, ID)
    containers: Vec<(String, String)>,
    /// The Pod as the API server records it.
    record: Value,
    /// Kept until the end: the emptyDir's tmpfs.
    _volume: Option<HostTmpfs>,
}

impl Made {
    fn id_of(&self, name: &str) -> &str {
        &self.containers.iter().find(|(n, _)| n == name).unwrap().1
    }
}

fn pod_spec(name: &str) -> PodSpec {
    PodSpec {
        name: name.into(),
        namespace: NS.into(),
        uid: common::random_pod_uid(),
        host_ipc: false,
    }
}

/// The Pod's record with its containers' IDs; `gpus`: each container asks for one.
fn record(made_pod: &Pod, containers: &[(String, String)], gpus: bool) -> Value {
    let pairs: Vec<(&str, &str)> = containers
        .iter()
        .map(|(n, id)| (n.as_str(), id.as_str()))
        .collect();
    let mut p = pod(
        NODE,
        &made_pod.spec.namespace,
        &made_pod.spec.name,
        &made_pod.spec.uid,
        &pairs,
    );
    if gpus {
        for c in p["spec"]["containers"].as_array_mut().unwrap() {
            c["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        }
    }
    p
}

fn start_all(c: &Containerd, spec: &PodSpec, ctrs: &[CtrSpec], gpus: bool) -> Made {
    let made_pod = c.run_pod(spec);
    let containers: Vec<(String, String)> = ctrs
        .iter()
        .map(|s| (s.name.clone(), c.start_container(&made_pod, s)))
        .collect();
    let record = record(&made_pod, &containers, gpus);
    Made {
        pod: made_pod,
        containers,
        record,
        _volume: None,
    }
}

fn wait_log(made: &Made, container: &str, text: &str) {
    let ok = common::wait_until(Duration::from_secs(60), || {
        made.pod.log_of(container).contains(text)
    });
    assert!(
        ok,
        "{container} never wrote {text:?}: {}",
        made.pod.log_of(container)
    );
}

/// Two containers on the sandbox's /dev/shm (the runtime's 64 MiB default); the Pod asks for
/// GPUs. The writer's 20 MiB file is counted in the reader's reading too.
fn shared(c: &Containerd) -> Made {
    let writer = CtrSpec::sh(
        "writer",
        "dd if=/dev/zero of=/dev/shm/blob bs=1M count=20 && echo written; sleep 3600",
    );
    let reader = CtrSpec::sh("reader", "sleep 3600");
    let made = start_all(c, &pod_spec("share-0"), &[writer, reader], true);
    wait_log(&made, "writer", "written");
    made
}

/// A memory emptyDir at /dev/shm: a 256 MiB host tmpfs mounted over it.
fn empty_dir(c: &Containerd) -> Made {
    let volume = HostTmpfs::new(256 * MIB);
    let mut ctr = CtrSpec::sh("trainer", "sleep 3600");
    ctr.mounts
        .push((volume.path.clone(), "/dev/shm".into(), false));
    let mut made = start_all(c, &pod_spec("emptydir-0"), &[ctr], false);
    assert!(c.wait_running(made.id_of("trainer"), Duration::from_secs(30)));
    made._volume = Some(volume);
    made
}

fn host_ipc(c: &Containerd) -> Made {
    let spec = PodSpec {
        host_ipc: true,
        ..pod_spec("hostipc-0")
    };
    let made = start_all(c, &spec, &[CtrSpec::sh("shared", "sleep 3600")], false);
    assert!(c.wait_running(made.id_of("shared"), Duration::from_secs(30)));
    made
}

/// A container that fills /dev/shm past its 64 MiB through a mapping and dies of SIGBUS (exit
/// 135), beside one that lives on; the API server records the death as kubelet would.
fn sigbus(c: &Containerd, api: &FakeApi) -> Made {
    let filler = CtrSpec {
        name: "filler".into(),
        command: vec![PYTHON.into(), "-c".into(), SHM_BLOCK.into()],
        ..CtrSpec::default()
    }
    .with_host_python();
    let mut made = start_all(c, &pod_spec("bus-0"), &[filler], false);
    let id = made.id_of("filler").to_string();
    let code = c.wait_exited(&id, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(135),
        "a SIGBUS death: {}",
        made.pod.log_of("filler")
    );
    let terminated = json!({"exitCode": 135, "reason": "Error",
        "containerID": format!("containerd://{id}"), "finishedAt": finished_now()});
    made.record = restarted(
        made.record.clone(),
        "filler",
        terminated,
        "not-yet-restarted",
    );
    api.apply_pod(made.record.clone());
    made
}

/// The workload's own memory past its 64 MiB limit: the kernel kills dd.
fn oom(c: &Containerd) -> Made {
    let mut ctr = CtrSpec::sh(
        "eater",
        "dd if=/dev/zero of=/dev/null bs=200M count=1; echo dd-ended-$?; sleep 3600",
    );
    ctr.memory_limit = Some((64 * MIB) as i64);
    let made = start_all(c, &pod_spec("oom-0"), &[ctr], false);
    wait_log(&made, "eater", "dd-ended-");
    made
}

fn dataloader(c: &Containerd) -> Made {
    let script = format!("echo '{WORKER_LINE}' >&2; echo '{MAIN_LINE}'; sleep 3600");
    let made = start_all(
        c,
        &pod_spec("loader-0"),
        &[CtrSpec::sh("loader", &script)],
        false,
    );
    wait_log(&made, "loader", "DataLoader worker");
    made
}

/// An earlier container of the Pod leaves an NCCL segment in the sandbox's /dev/shm; the next
/// one finds it when it starts.
fn leftovers(c: &Containerd) -> Made {
    let spec = pod_spec("left-0");
    let made_pod = c.run_pod(&spec);
    let first = CtrSpec::sh(
        "first",
        "dd if=/dev/zero of=/dev/shm/nccl-Xy12Ab bs=1M count=8 2>/dev/null",
    );
    let first_id = c.start_container(&made_pod, &first);
    assert_eq!(c.wait_exited(&first_id, Duration::from_secs(30)), Some(0));
    // Written more than the grace before the next one starts.
    std::thread::sleep(Duration::from_millis(2500));
    let second_id = c.start_container(&made_pod, &CtrSpec::sh("second", "sleep 3600"));
    assert!(c.wait_running(&second_id, Duration::from_secs(30)));
    let containers = vec![("second".to_string(), second_id)];
    let record = record(&made_pod, &containers, false);
    Made {
        pod: made_pod,
        containers,
        record,
        _volume: None,
    }
}

/// `check --json` over the Pods; `api`: with the API server's Pods, else Kubernetes off.
fn check(c: &Containerd, api: Option<&FakeApi>) -> Value {
    let mut cmd = std::process::Command::new(common::shmlink_bin());
    cmd.args(["check", "--json", "--no-gpu", "--node-name", NODE])
        .args(["--since", "10m", "--kmsg", "/dev/kmsg", "--pod-log-root"])
        .arg(c.pod_log_root());
    match api {
        Some(api) => cmd
            .args(["--kube", "on"])
            .env("KUBECONFIG", api.kubeconfig_path()),
        None => cmd.args(["--kube", "off"]),
    };
    let out = cmd.output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json ({}): {e}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn shm_of<'a>(report: &'a Value, id: &str) -> Option<&'a Value> {
    report["shm"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == id)
}

fn sandbox_of<'a>(report: &'a Value, made: &Made) -> Option<&'a Value> {
    report["sandbox_shm"]
        .as_array()?
        .iter()
        .find(|e| e["pod_uid"] == made.pod.spec.uid.as_str())
}

fn failures_of<'a>(report: &'a Value, made: &Made) -> Vec<&'a Value> {
    report["failures"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter(|f| f["pod"] == made.pod.spec.name.as_str())
                .collect()
        })
        .unwrap_or_default()
}

fn findings_of<'a>(report: &'a Value, made: &Made, kind: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter(|f| f["kind"] == kind && f.to_string().contains(&made.pod.spec.name))
                .collect()
        })
        .unwrap_or_default()
}

/// Gathers what went wrong, so one case's failure does not hide another's.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }
}

#[test]
fn pods_made_by_containerd_are_measured_and_their_deaths_told() {
    let started = Instant::now();
    let Some(c) = Containerd::start() else {
        return;
    };
    if !Path::new(PYTHON).exists() || !common::kmsg_readable() {
        assert!(
            std::env::var("SHMLINK_E2E").as_deref() != Ok("require"),
            "{PYTHON} is needed (apt-get install python3)"
        );
        eprintln!("SKIPPED: {PYTHON} or the kernel log is missing");
        return;
    }
    let api = FakeApi::start();
    let up = started.elapsed();
    let made = std::thread::scope(|s| {
        let cases: Vec<(&str, std::thread::ScopedJoinHandle<'_, Made>)> = vec![
            ("shared", s.spawn(|| shared(&c))),
            ("emptydir", s.spawn(|| empty_dir(&c))),
            ("hostipc", s.spawn(|| host_ipc(&c))),
            ("sigbus", s.spawn(|| sigbus(&c, &api))),
            ("oom", s.spawn(|| oom(&c))),
            ("dataloader", s.spawn(|| dataloader(&c))),
            ("leftovers", s.spawn(|| leftovers(&c))),
        ];
        cases
            .into_iter()
            .map(|(name, h)| {
                let made = h
                    .join()
                    .unwrap_or_else(|_| panic!("making the {name} case failed (above)"));
                (name, made)
            })
            .collect::<std::collections::HashMap<_, _>>()
    });
    for m in made.values() {
        if m.pod.spec.name != "bus-0" {
            api.apply_pod(m.record.clone());
        }
    }
    let made_in = started.elapsed();
    let report = check(&c, Some(&api));
    let mut p = Problems::default();
    let kube_off = check(&c, None);
    assert_named_by_log_path(&kube_off, &made["dataloader"], &made["oom"], &mut p);
    assert_shared(&report, &made["shared"], &mut p);
    assert_shm_cases(&report, &made["emptydir"], &made["hostipc"], &mut p);
    assert_sigbus(&report, &made["sigbus"], &mut p);
    assert_oom(&report, &made["oom"], &mut p);
    assert_dataloader(&report, &made["dataloader"], &mut p);
    assert_leftovers(&report, &made["leftovers"], &mut p);
    eprintln!(
        "containerd up in {:.1} s, Pods made in {:.1} s, checked in {:.1} s",
        up.as_secs_f64(),
        made_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(made);
    assert!(
        p.0.is_empty(),
        "{} problems:\n- {}\n\ncheck --json:\n{report:#}",
        p.0.len(),
        p.0.join("\n- ")
    );
}

fn assert_shared(report: &Value, made: &Made, p: &mut Problems) {
    for name in ["writer", "reader"] {
        let Some(r) = shm_of(report, made.id_of(name)) else {
            p.expect(false, || format!("share-0/{name} is not in shm[]"));
            continue;
        };
        p.expect(
            r["pod"] == "share-0" && r["namespace"] == NS && r["container"] == name,
            || {
                format!(
                    "share-0/{name} named {} {} {}",
                    r["namespace"], r["pod"], r["container"]
                )
            },
        );
        p.expect(r["size_bytes"] == 64 * MIB, || {
            format!(
                "share-0/{name}: the runtime's 64 MiB default, not {}",
                r["size_bytes"]
            )
        });
        p.expect(r["used_bytes"].as_u64() >= Some(20 * MIB), || {
            format!(
                "share-0/{name}: the writer's 20 MiB counted, not {}",
                r["used_bytes"]
            )
        });
    }
    let sandbox = sandbox_of(report, made);
    p.expect(
        sandbox.is_some_and(|s| {
            s["size_bytes"] == 64 * MIB
                && s["used_bytes"].as_u64() >= Some(20 * MIB)
                && s["container_id"] == made.pod.id.as_str()
        }),
        || format!("share-0's sandbox /dev/shm: {sandbox:?}"),
    );
    p.expect(shm_of(report, &made.pod.id).is_none(), || {
        "share-0's sandbox container is listed in shm[] as a container".into()
    });
    let default = findings_of(report, made, "shm_runtime_default");
    p.expect(!default.is_empty(), || {
        "share-0 asks for GPUs on the 64 MiB default: no shm_runtime_default".into()
    });
}

fn assert_shm_cases(report: &Value, empty_dir: &Made, host_ipc: &Made, p: &mut Problems) {
    let r = shm_of(report, empty_dir.id_of("trainer"));
    p.expect(
        r.is_some_and(|r| r["size_bytes"] == 256 * MIB && r["host_ipc"] == false),
        || format!("the emptyDir's 256 MiB: {r:?}"),
    );
    let r = shm_of(report, host_ipc.id_of("shared"));
    p.expect(r.is_some_and(|r| r["host_ipc"] == true), || {
        format!("host IPC: {r:?}")
    });
    p.expect(sandbox_of(report, host_ipc).is_none(), || {
        "a host-IPC Pod has no sandbox /dev/shm of its own".into()
    });
}

fn assert_sigbus(report: &Value, made: &Made, p: &mut Problems) {
    p.expect(shm_of(report, made.id_of("filler")).is_none(), || {
        "bus-0/filler is dead: no reading of its own to judge it with".into()
    });
    let sandbox = sandbox_of(report, made);
    p.expect(
        sandbox.is_some_and(|s| s["used_bytes"].as_u64() >= Some(60 * MIB)),
        || format!("bus-0's sandbox holds the dead filler's block: {sandbox:?}"),
    );
    let failures = failures_of(report, made);
    let bus: Vec<_> = failures
        .iter()
        .filter(|f| f["kind"] == "shm_bus_error" || f["kind"] == "workload_bus_error")
        .collect();
    p.expect(bus.len() == 1 && bus[0]["kind"] == "shm_bus_error", || {
        format!("bus-0: one shm_bus_error judged with the sandbox's /dev/shm: {failures:#?}")
    });
    if let Some(f) = bus.first() {
        println!("bus-0: {}", f["message"].as_str().unwrap_or(""));
        p.expect(
            f["container"] == "filler"
                && f["shm"]["size_bytes"] == 64 * MIB
                && f["shm"]["used_bytes"].as_u64() >= Some(60 * MIB),
            || format!("bus-0's failure: {f:#}"),
        );
    }
}

fn assert_oom(report: &Value, made: &Made, p: &mut Problems) {
    let failures = failures_of(report, made);
    let oom: Vec<_> = failures
        .iter()
        .filter(|f| f["kind"] == "workload_oom_killed")
        .collect();
    p.expect(
        oom.len() == 1 && oom[0]["container"] == "eater" && oom[0]["source"] == "kernel",
        || format!("oom-0: the kernel's OOM kill of dd, one workload_oom_killed: {failures:#?}"),
    );
}

fn assert_dataloader(report: &Value, made: &Made, p: &mut Problems) {
    let failures = failures_of(report, made);
    p.expect(
        failures.len() == 1 && failures[0]["container"] == "loader",
        || {
            format!(
                "loader-0: one death, one failure (the worker's line and the main process's): \
                 {failures:#?}"
            )
        },
    );
}

fn assert_leftovers(report: &Value, made: &Made, p: &mut Problems) {
    let found = findings_of(report, made, "shm_leftover_segments");
    p.expect(
        found.len() == 1
            && found[0]["message"]
                .as_str()
                .unwrap_or("")
                .contains("nccl-Xy12Ab"),
        || format!("left-0/second finds the first's segment: {found:#?}"),
    );
}

/// Kubernetes off: a log line's failure is named by the CRI log's path
/// (`<namespace>_<pod>_<uid>/<container>/0.log`, as containerd wrote it); the kernel's OOM
/// report is placed in its Pod by the cgroup's Pod UID (no names: nothing maps a container ID
/// to a log directory without the API server).
fn assert_named_by_log_path(report: &Value, loader: &Made, oom: &Made, p: &mut Problems) {
    let failures = failures_of(report, loader);
    p.expect(
        !failures.is_empty()
            && failures.iter().all(|f| {
                f["namespace"] == NS
                    && f["container"] == "loader"
                    && f["pod_uid"] == loader.pod.spec.uid.as_str()
            }),
        || format!("loader-0 without Kubernetes, named by its log's path: {failures:#?}"),
    );
    let uid = oom.pod.spec.uid.as_str();
    let placed: Vec<_> = report["failures"]
        .as_array()
        .map(|f| f.iter().filter(|f| f["pod_uid"] == uid).collect())
        .unwrap_or_default();
    p.expect(
        placed.len() == 1
            && placed[0]["kind"] == "workload_oom_killed"
            && placed[0]["container_id"] == oom.id_of("eater"),
        || format!("oom-0 without Kubernetes, placed by its cgroup: {placed:#?}"),
    );
}

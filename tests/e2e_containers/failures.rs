//! Why a workload died, end to end: real runc containers whose output a shim writes as
//! containerd writes CRI logs, a real kernel crash in a library named libnccl.so.2, a plain
//! Docker container's json-file log, and the Events at the in-process API server. Prints the
//! Events it saw and the delay from a line written to its Event (run with --nocapture).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::agent::{sample, Agent};
use common::kube_api::{pod, FakeApi};
use common::{ro_bind, Container, ContainerSpec};
use serde_json::Value;

const NODE: &str = "gpu-node-7";

/// What PyTorch 2.15 printed when its DataLoader outgrew a 64 MiB /dev/shm
/// (tests/fixtures/logs/torch-2.15.0-dataloader-64mib-shm.txt, scripts/replay/torch.sh).
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";

fn events_with(api: &FakeApi, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

fn wait_for_event(api: &FakeApi, reason: &str, within: Duration) -> Vec<Value> {
    api.wait_events(None, reason, within)
}

fn show(events: &[Value]) {
    for e in events {
        println!(
            "{} {} regarding {}/{}: {}",
            e["type"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            e["regarding"]["kind"].as_str().unwrap_or(""),
            e["regarding"]["name"].as_str().unwrap_or(""),
            e["note"].as_str().unwrap_or("")
        );
    }
}

fn cri_line(text: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{} stderr F {text}\n",
        now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )
}

#[test]
fn a_dataloader_dying_of_shm_is_one_event_series_on_its_pod_within_seconds() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let uid = common::random_pod_uid();
    let id = common::random_container_id();
    api.apply_pod(pod(NODE, "ml", "trainer-0", &uid, &[("trainer", &id)]));
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join(format!("ml_trainer-0_{uid}/trainer"));
    std::fs::create_dir_all(&dir).unwrap();

    let kubeconfig = api.kubeconfig_path();
    let root = logs.path().to_str().unwrap();
    let agent = Agent::start_kube(&kubeconfig, NODE, &["--pod-log-root", root]);
    agent.wait_ready();

    // The job fills its /dev/shm, then says what PyTorch says, and its container goes on.
    let script = format!(
        "sleep 1; dd if=/dev/zero of=/dev/shm/batch bs=1M count=60 2>/dev/null; \
         echo 'Traceback (most recent call last):'; echo '{TORCH_LINE}'; sleep 60"
    );
    let log = dir.join("0.log");
    let _trainer = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: vec!["sh".into(), "-c".into(), script],
        cri_log: Some(log.clone()),
        ..ContainerSpec::default()
    });
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("unable to allocate"))
        }),
        "the shim wrote no line"
    );
    let written = Instant::now();
    let events = wait_for_event(&api, "ShmAllocationFailed", Duration::from_secs(10));
    println!(
        "line written -> Event at the API server: {} ms",
        written.elapsed().as_millis()
    );
    show(&events);
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["name"], "trainer-0");
    assert_eq!(e["regarding"]["uid"], uid.as_str());
    let note = e["note"].as_str().unwrap();
    common::assert_contains_all(
        note,
        &[
            "container ml/trainer-0/trainer could not allocate shared memory at ",
            TORCH_LINE,
            "the container runtime's default 64 MiB tmpfs",
            "sizeLimit: 1Gi",
        ],
    );
    let body = agent.wait_for_metrics("the failure counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-0"), ("kind", "shm_allocation_failed")],
        ) == Some(1.0)
    });
    assert!(body.contains("shmlink_shm_used_peak_bytes{"), "{body}");
    let lines = sample(&body, "shmlink_log_lines_total", &[]).unwrap();
    assert!(lines >= 1.0, "{body}");
    assert!(sample(&body, "shmlink_log_bytes_total", &[]).unwrap() > lines);
    assert_eq!(
        sample(&body, "shmlink_scan_errors_total", &[("collector", "logs")]),
        Some(0.0)
    );
    assert_eq!(
        sample(&body, "shmlink_log_lines_dropped_total", &[]),
        Some(0.0)
    );

    // The restart fails the same way: the same Event's series, not a second Event.
    std::fs::write(dir.join("1.log"), cri_line(TORCH_LINE)).unwrap();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            events_with(&api, "ShmAllocationFailed")
                .first()
                .is_some_and(|e| e["series"]["count"] == 2)
        }),
        "no series update: {:#?}",
        api.events()
    );
    assert_eq!(events_with(&api, "ShmAllocationFailed").len(), 1);

    // `check` finds it afterwards in the log, with the container's /dev/shm as it is now.
    let report = common::run_check_json(&["--pod-log-root", root, "--since", "10m"]);
    let failures = report["failures"].as_array().unwrap();
    let ours: Vec<&Value> = failures
        .iter()
        .filter(|f| f["pod_uid"] == uid.as_str())
        .collect();
    assert_eq!(ours.len(), 2, "{failures:#?}");
    assert_eq!(ours[0]["kind"], "shm_allocation_failed");
    assert_eq!(ours[0]["container"], "trainer");
    assert_eq!(ours[0]["evidence"], TORCH_LINE);
    assert_eq!(ours[0]["shm"]["size_bytes"], 64 << 20);
    assert!(report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["kind"] == "shm_allocation_failed" && f["subject"] == "ml/trainer-0/trainer"));
}

/// A Pod `name` of one container `worker` at the API server, and the program that crashes in
/// libnccl.so.2 (None when gcc is missing; said).
struct CrashingJob {
    nccl: tempfile::TempDir,
    api: FakeApi,
    uid: String,
    id: String,
}

impl CrashingJob {
    fn new(name: &str) -> Option<CrashingJob> {
        let nccl = tempfile::tempdir().unwrap();
        if !common::crash::build_crashing_nccl(nccl.path()) {
            return None;
        }
        let api = FakeApi::start();
        let uid = common::random_pod_uid();
        let id = common::random_container_id();
        api.apply_pod(pod(NODE, "ml", name, &uid, &[("worker", &id)]));
        Some(CrashingJob { nccl, api, uid, id })
    }
}

/// The Pod's container: sleeps long enough for a scan to see its main process, which then
/// becomes the crashing program (exec keeps the PID).
fn crashing_worker(uid: &str, id: &str, nccl: &tempfile::TempDir) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(uid.to_string()),
        id: Some(id.to_string()),
        args: vec!["sh".into(), "-c".into(), "sleep 2; exec /nccl/crash".into()],
        extra_mounts: vec![ro_bind(nccl.path(), "/nccl")],
        ..ContainerSpec::default()
    })
}

#[test]
fn a_crash_in_libnccl_told_by_the_kernel_is_a_gpu_job_crashed_event_on_its_pod() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let Some(job) = CrashingJob::new("allreduce-0") else {
        return;
    };
    let CrashingJob { nccl, api, uid, id } = job;
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(&kubeconfig, NODE, &["--kmsg", "/dev/kmsg"]);
    agent.wait_ready();
    let _worker = crashing_worker(&uid, &id, &nccl);
    let events = wait_for_event(&api, "GpuJobCrashed", Duration::from_secs(20));
    show(&events);
    let e = &events[0];
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["name"], "allreduce-0");
    assert_eq!(e["regarding"]["uid"], uid.as_str());
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains("process crash (host PID ") && note.contains("crashed in libnccl.so.2"),
        "{note}"
    );
    assert!(note.contains("of ml/allreduce-0/worker"), "{note}");
    let body = agent.wait_for_metrics("the crash counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "allreduce-0"), ("kind", "gpu_job_crashed")],
        ) == Some(1.0)
    });
    assert_eq!(sample(&body, "shmlink_kmsg_up", &[]), Some(1.0), "{body}");
    assert!(sample(&body, "shmlink_kmsg_records_total", &[]).unwrap() >= 1.0);
}

#[test]
fn a_plain_docker_container_is_named_by_docker_and_its_json_log_read_by_check() {
    if !common::e2e_available() {
        return;
    }
    let id = common::random_container_id();
    let docker = tempfile::tempdir().unwrap();
    let cdir = docker.path().join("containers").join(&id);
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(
        cdir.join("config.v2.json"),
        serde_json::json!({
            "ID": id, "Name": "/asr", "State": {"Running": true},
            "Config": {"Image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "Cmd": ["python"]}
        })
        .to_string(),
    )
    .unwrap();
    let time = k8s_openapi::jiff::Timestamp::now().to_string();
    let entry = |text: &str| {
        serde_json::json!({"log": format!("{text}\n"), "stream": "stderr", "time": time})
            .to_string()
            + "\n"
    };
    std::fs::write(
        cdir.join(format!("{id}-json.log")),
        entry("step 0: 48 MiB") + &entry(TORCH_LINE),
    )
    .unwrap();
    let _asr = Container::start(ContainerSpec {
        id: Some(id.clone()),
        ..ContainerSpec::default()
    });
    let root = docker.path().to_str().unwrap();
    let report = common::run_check_json(&["--docker-root", root, "--since", "10m"]);
    let shm = common::shm_entry(&report, &id).expect("the container");
    assert_eq!(shm["container"], "asr");
    assert_eq!(
        shm["image"],
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    );
    let failure = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["container_id"] == id.as_str())
        .expect("its failure")
        .clone();
    assert_eq!(failure["container"], "asr");
    let message = failure["message"].as_str().unwrap();
    assert!(
        message.starts_with("container asr could not allocate shared memory at "),
        "{message}"
    );
    assert!(message.contains("docker run --shm-size=1g"), "{message}");
    // The tables say it too.
    let out = common::run_check(&["--docker-root", root, "--since", "10m"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("container asr could not allocate shared memory"),
        "{text}"
    );
}

#[test]
fn a_kernel_log_that_cannot_be_opened_is_a_metric_not_a_silence() {
    let logs = tempfile::tempdir().unwrap();
    let root = logs.path().to_str().unwrap();
    let agent = Agent::start(
        &["--kmsg", "/nonexistent/kmsg", "--pod-log-root", root],
        &[],
    );
    agent.wait_ready();
    let body = agent.wait_for_metrics("the watcher's first report", |b| {
        sample(b, "shmlink_kmsg_up", &[]).is_some()
    });
    assert_eq!(sample(&body, "shmlink_kmsg_up", &[]), Some(0.0), "{body}");
    assert_eq!(
        sample(&body, "shmlink_scan_errors_total", &[("collector", "kmsg")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "shmlink_scan_errors_total", &[("collector", "logs")]),
        Some(0.0),
        "an empty log root is no error"
    );
    assert!(agent.log_text().contains("not reading the kernel log"));

    // Off: no series at all.
    let off = Agent::start(&["--kmsg", "off", "--pod-log-root", root], &[]);
    off.wait_ready();
    let body = off.wait_for_metrics("the watcher's first report", |b| {
        sample(b, "shmlink_log_lines_total", &[]).is_some()
    });
    assert_eq!(sample(&body, "shmlink_kmsg_up", &[]), None, "{body}");
}

/// A cgroup v1 devices group that refuses /dev/kmsg (1:11), as a pod's that is not privileged
/// does; removed on drop. None (and why) where there is no v1 devices hierarchy.
struct NoKmsgDevice(std::path::PathBuf);

impl NoKmsgDevice {
    fn new() -> Result<NoKmsgDevice, String> {
        let root = Path::new("/sys/fs/cgroup/devices");
        if !root.join("devices.deny").exists() {
            return Err("no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices".into());
        }
        let dir = root.join(format!("shmlink-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("devices.deny"), "c 1:11 rwm").map_err(|e| e.to_string())?;
        Ok(NoKmsgDevice(dir))
    }

    /// `sh` moving itself into the group, then exec'ing `setpriv` with the bounding set `caps`.
    fn wrapper(&self, caps: &str) -> Vec<String> {
        let procs = self.0.join("cgroup.procs");
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {}; exec \"$@\"", procs.display()),
            "sh".into(),
            "setpriv".into(),
            "--bounding-set".into(),
            caps.into(),
            "--inh-caps".into(),
            "-all".into(),
            "--no-new-privs".into(),
            "--".into(),
        ]
    }
}

impl Drop for NoKmsgDevice {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// In a pod that is not privileged, the device cgroup refuses /dev/kmsg whatever the
/// capabilities; with CAP_SYSLOG the agent reads the same ring through syslog(2), and a real
/// crash in libnccl.so.2 still becomes its Event. Without CAP_SYSLOG it says so in a metric.
#[test]
fn where_the_device_cgroup_refuses_dev_kmsg_syslog_2_tells_the_crash() {
    if !common::e2e_available() {
        return;
    }
    let group = match NoKmsgDevice::new() {
        Ok(g) => g,
        Err(why) => {
            if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
                panic!("{why}");
            }
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    // The premise: inside the group, root with every capability cannot open /dev/kmsg.
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "echo $$ > {}; exec head -c 1 /dev/kmsg",
                group.0.join("cgroup.procs").display()
            ),
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the devices cgroup let /dev/kmsg open"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not permitted"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(job) = CrashingJob::new("allreduce-1") else {
        return;
    };
    let CrashingJob { nccl, api, uid, id } = job;
    let kubeconfig = api.kubeconfig_path();
    let args = [
        "--kube",
        "on",
        "--node-name",
        NODE,
        "--no-gpu",
        "--kmsg",
        "/dev/kmsg",
    ];
    let env = [("KUBECONFIG", kubeconfig.as_os_str())];
    let wrapper = group.wrapper("-all,+sys_ptrace,+dac_read_search,+syslog");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let agent = Agent::start_under(&wrapper, &args, &env);
    agent.wait_ready();
    let body = agent.wait_for_metrics("the kernel log open", |b| {
        sample(b, "shmlink_kmsg_up", &[]).is_some()
    });
    assert_eq!(
        sample(&body, "shmlink_kmsg_up", &[]),
        Some(1.0),
        "{}",
        agent.log_text()
    );
    assert!(
        agent.log_text().contains("through syslog(2)"),
        "{}",
        agent.log_text()
    );
    let _worker = crashing_worker(&uid, &id, &nccl);
    let events = wait_for_event(&api, "GpuJobCrashed", Duration::from_secs(20));
    show(&events);
    assert_eq!(events[0]["regarding"]["name"], "allreduce-1");
    assert_eq!(events[0]["regarding"]["uid"], uid.as_str());
    drop(agent);

    // Without CAP_SYSLOG: neither way is open, and the metric says so.
    let wrapper = group.wrapper("-all,+sys_ptrace,+dac_read_search");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let agent = Agent::start_under(&wrapper, &args, &env);
    agent.wait_ready();
    let body = agent.wait_for_metrics("the kernel log refused", |b| {
        sample(b, "shmlink_kmsg_up", &[]).is_some()
    });
    assert_eq!(sample(&body, "shmlink_kmsg_up", &[]), Some(0.0));
    let log = agent.log_text();
    assert!(
        log.contains("syslog(2)") && log.contains("CAP_SYSLOG"),
        "{log}"
    );
}

//! The way from a failure line to its Event, for Pods that die at their start: each Pod is
//! created at the in-process API server as its real runc container starts (as kubelet does),
//! its job prints PyTorch's /dev/shm line a moment later and exits. Every Pod's Event must come;
//! the delays from the line on disk to the Event at the API server are printed (p50, p99) for
//! BENCHMARKS.md, not asserted (run with --nocapture).

use crate::common;

use std::time::{Duration, Instant};

use common::agent::Agent;
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec};
use serde_json::Value;

const NODE: &str = "gpu-node-3";
const PODS: usize = 20;
/// Pods started together, as a Job's replicas or a node's restart would.
const AT_ONCE: usize = 4;
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";

struct Dying {
    name: String,
    log: std::path::PathBuf,
    _container: Container,
    written: Option<Instant>,
    evented: Option<Instant>,
}

fn event_for(events: &[Value], name: &str) -> bool {
    events
        .iter()
        .any(|e| e["reason"] == "ShmAllocationFailed" && e["regarding"]["name"] == name)
}

#[test]
fn pods_that_die_at_their_start_get_their_events_and_the_delays_are_printed() {
    if !common::e2e_available() {
        return;
    }
    let api = FakeApi::start();
    let logs = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig_path();
    let root = logs.path().to_str().unwrap();
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let agent = Agent::start_gpu_kube(
        &kubeconfig,
        &fake,
        NODE,
        &[
            "--pod-log-root",
            root,
            // The default scan period: a failure must not wait for a scan.
            "--interval",
            "5s",
        ],
    );

    let mut delays = Vec::new();
    for batch in 0..PODS / AT_ONCE {
        let mut dying: Vec<Dying> = (0..AT_ONCE)
            .map(|i| {
                let name = format!("job-{batch}-{i}");
                let uid = common::random_pod_uid();
                let id = common::random_container_id();
                let dir = logs.path().join(format!("ml_{name}_{uid}/worker"));
                std::fs::create_dir_all(&dir).unwrap();
                let mut p = pod(NODE, "ml", &name, &uid, &[("worker", &id)]);
                p["spec"]["containers"][0]["resources"] =
                    serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
                api.apply_pod(p);
                let log = dir.join("0.log");
                let container = Container::start(ContainerSpec {
                    pod_uid: Some(uid),
                    id: Some(id),
                    args: vec![
                        "sh".into(),
                        "-c".into(),
                        format!("sleep 1; echo '{TORCH_LINE}'; exit 1"),
                    ],
                    cri_log: Some(log.clone()),
                    ..ContainerSpec::default()
                });
                Dying {
                    name,
                    log,
                    _container: container,
                    written: None,
                    evented: None,
                }
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && dying.iter().any(|d| d.evented.is_none()) {
            let events = api.events();
            for d in &mut dying {
                if d.written.is_none()
                    && std::fs::read_to_string(&d.log).is_ok_and(|t| t.contains("unable to"))
                {
                    d.written = Some(Instant::now());
                }
                if d.evented.is_none() && event_for(&events, &d.name) {
                    d.evented = Some(Instant::now());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for d in &dying {
            let (Some(w), Some(e)) = (d.written, d.evented) else {
                panic!(
                    "{}: line written {:?}, Event {:?}; the server holds {:#?}\n{}",
                    d.name,
                    d.written,
                    d.evented,
                    api.events(),
                    agent.log_text()
                );
            };
            delays.push(e.saturating_duration_since(w));
        }
    }
    delays.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |q: f64| delays[((delays.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "line on disk -> Event at the API server, {} Pods ({AT_ONCE} at a time): p50 {:.0} ms, \
         p99 {:.0} ms, max {:.0} ms, min {:.0} ms",
        delays.len(),
        ms(p(0.5)),
        ms(p(0.99)),
        ms(delays[delays.len() - 1]),
        ms(delays[0])
    );
    assert_eq!(delays.len(), PODS);
}

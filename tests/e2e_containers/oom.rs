//! Deaths that print nothing, end to end: real runc containers in kubelet-style memory cgroups
//! that the real kernel OOM-kills, once for /dev/shm pages (a 1 GiB tmpfs emptyDir filled past
//! a 64 MiB memory limit) and once for the workload's own memory; `serve` reads the kernel's
//! report from /dev/kmsg and publishes one Event on each Pod, with what the memory was, at the
//! in-process API server. A healthy neighbour gets nothing. Run with --nocapture to see the
//! Events and their delays.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::{sample, Agent};
use common::kube_api::events::with_reason;
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec, HostTmpfs};
use serde_json::Value;

const NODE: &str = "gpu-node-7";
const MIB: u64 = 1 << 20;

#[test]
fn oom_kills_are_named_on_their_pods_with_what_the_memory_was() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    // One after the other: each agent would see the other's kills in the kernel log.
    scenario(Told::KernelLog);
    scenario(Told::MemoryCgroup);
}

/// How the agent learns of the kills.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Told {
    /// `--kmsg /dev/kmsg`: the kernel's report, the numbers at the kill.
    KernelLog,
    /// `--kmsg off`: the memory cgroups' counters, read each scan.
    MemoryCgroup,
}

fn scenario(told: Told) {
    println!("== {told:?}");
    let api = FakeApi::start();
    let (shm_uid, shm_id) = (common::random_pod_uid(), common::random_container_id());
    let (own_uid, own_id) = (common::random_pod_uid(), common::random_container_id());
    let (idle_uid, idle_id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(
        NODE,
        "ml",
        "loader-0",
        &shm_uid,
        &[("loader", &shm_id)],
    ));
    api.apply_pod(pod(
        NODE,
        "ml",
        "trainer-0",
        &own_uid,
        &[("trainer", &own_id)],
    ));
    api.apply_pod(pod(NODE, "ml", "idle-0", &idle_uid, &[("idle", &idle_id)]));
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(
        &kubeconfig,
        NODE,
        &[
            "--kmsg",
            match told {
                Told::KernelLog => "/dev/kmsg",
                Told::MemoryCgroup => "off",
            },
        ],
    );
    agent.wait_ready();

    let volume = HostTmpfs::new(1024 * MIB);
    let started = Instant::now();
    let _loader = common::oom::shm_past_the_limit(&shm_uid, &shm_id, &volume);
    let _trainer = common::oom::own_memory_past_the_limit(&own_uid, &own_id);
    let _idle = Container::start(ContainerSpec {
        pod_uid: Some(idle_uid.clone()),
        id: Some(idle_id.clone()),
        memory_limit: Some((64 * MIB) as i64),
        ..ContainerSpec::default()
    });

    let mut shm = Vec::new();
    let mut own = Vec::new();
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            shm = api.events_about("loader-0");
            own = api.events_about("trainer-0");
            !with_reason(&shm, "ShmOomKilled").is_empty()
                && !with_reason(&own, "WorkloadOomKilled").is_empty()
        }),
        "no Event on both Pods; the server holds: {:#?}",
        api.events()
    );
    println!(
        "Events within {:?} of the containers' start:",
        started.elapsed()
    );
    for e in shm.iter().chain(&own) {
        println!(
            "{} {} regarding Pod/{}: {}",
            e["type"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            e["regarding"]["name"].as_str().unwrap_or(""),
            e["note"].as_str().unwrap_or("")
        );
    }

    // Besides the kill, the scan may see the tmpfs pages left at the limit: /dev/shm full by
    // its memory bound, which is true.
    for e in &shm {
        assert!(
            ["ShmOomKilled", "ShmExhausted", "ShmNearlyFull"]
                .contains(&e["reason"].as_str().unwrap()),
            "{e:#}"
        );
    }
    let kill = with_reason(&shm, "ShmOomKilled");
    assert_eq!(kill.len(), 1, "one Event series: {shm:#?}");
    assert_eq!(kill[0]["regarding"]["uid"], shm_uid.as_str());
    let note = kill[0]["note"].as_str().unwrap();
    common::assert_contains_all(
        note,
        &[
            "container ml/loader-0/loader: the kernel OOM-killed ",
            "and /dev/shm was what filled it: /dev/shm held ",
            "of the 64.0 MiB memory limit",
            "raise the container's memory limit by the /dev/shm emptyDir's sizeLimit",
        ],
    );
    if told == Told::KernelLog {
        // The numbers at the kill: the cgroup at its limit.
        assert!(
            note.contains(", its memory cgroup at 64.0 MiB of 64.0 MiB,"),
            "{note}"
        );
    }
    let counted = note.contains("(Counted by the container's memory cgroup");
    assert_eq!(counted, told == Told::MemoryCgroup, "{note}");

    assert_eq!(own.len(), 1, "one Event series, no /dev/shm one: {own:#?}");
    assert_eq!(own[0]["reason"], "WorkloadOomKilled");
    assert_eq!(own[0]["regarding"]["uid"], own_uid.as_str());
    let note = own[0]["note"].as_str().unwrap();
    assert!(
        note.contains("Not /dev/shm: lower what the workload holds"),
        "{note}"
    );

    let body = agent.wait_for_metrics("both kills counted", |b| {
        sample(
            b,
            "shmlink_workload_failures_total",
            &[("pod", "loader-0"), ("kind", "shm_oom_killed")],
        )
        .is_some()
            && sample(
                b,
                "shmlink_workload_failures_total",
                &[("pod", "trainer-0"), ("kind", "workload_oom_killed")],
            )
            .is_some()
    });
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "idle-0")]
        ),
        None,
        "the healthy neighbour: {body}"
    );
    assert!(api.events_about("idle-0").is_empty());
    if told == Told::MemoryCgroup {
        return; // `check` reads the kernel log back; the counters have no time
    }

    // `check` reads the same report back, with the split.
    let out = std::process::Command::new(common::shmlink_bin())
        .args([
            "check",
            "--json",
            "--no-gpu",
            "--since",
            "5m",
            "--kmsg",
            "/dev/kmsg",
        ])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let failures = json["failures"].as_array().unwrap();
    let loader = failures
        .iter()
        .find(|f| f["container_id"] == shm_id.as_str())
        .unwrap_or_else(|| panic!("no failure of the loader in {failures:#?}"));
    assert_eq!(loader["kind"], "shm_oom_killed");
    assert_eq!(loader["source"], "kernel");
    assert_eq!(loader["memory"]["source"], "kernel_log");
    assert_eq!(loader["memory"]["limit_bytes"], 64 * MIB);
    let shm_bytes = loader["memory"]["shm_bytes"].as_u64().unwrap();
    assert!(shm_bytes >= 32 * MIB, "/dev/shm was most of it: {loader:#}");
    let trainer = failures
        .iter()
        .find(|f| f["container_id"] == own_id.as_str())
        .unwrap_or_else(|| panic!("no failure of the trainer in {failures:#?}"));
    assert_eq!(trainer["kind"], "workload_oom_killed");
    assert!(trainer["memory"]["anon_bytes"].as_u64().unwrap() >= 32 * MIB);
    assert_eq!(out.status.code(), Some(1), "failures are findings");
}

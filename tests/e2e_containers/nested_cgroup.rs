//! Issue 36, item 7: a cgroup made inside a Pod's container (as root here, as a container that
//! may write its cgroups could), named as the runtime names another container, holding a
//! process with a mount namespace of its own. `check` reads the container once, by its own ID,
//! and never as the container the nested cgroup names.

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Container, ContainerSpec};
use serde_json::Value;

/// The container's memory cgroup directory on the host (v1 or v2).
fn memory_dir(cgroup: &str) -> Option<PathBuf> {
    ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .map(|root| PathBuf::from(format!("{root}{cgroup}")))
        .find(|d| d.join("cgroup.procs").exists())
}

#[test]
fn a_runtime_named_cgroup_inside_a_container_is_neither_another_container_nor_a_second_reading() {
    if !common::e2e_available() {
        return;
    }
    let uid = common::random_pod_uid();
    let container = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        ..ContainerSpec::default()
    });
    let dir = memory_dir(&container.cgroup).expect("the container's memory cgroup");
    let victim = common::random_container_id();
    let nested = dir.join(format!("cri-containerd-{victim}.scope"));
    std::fs::create_dir(&nested).unwrap();
    // A process with a mount namespace of its own, so that the walk measures it apart.
    let mut other = Command::new("unshare")
        .args(["--mount", "--", "sleep", "60"])
        .spawn()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/comm", other.id()))
            .is_ok_and(|c| c.trim() == "sleep")
    }));
    std::fs::write(nested.join("cgroup.procs"), other.id().to_string()).unwrap();

    let report: Value = common::run_check_json(&["--kube", "off", "--pod-log-root", "off"]);
    let _ = other.kill();
    let _ = other.wait();
    let _ = std::fs::remove_dir(&nested);
    let ids: Vec<&str> = report["shm"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["container_id"].as_str())
        .collect();
    assert!(!ids.contains(&victim.as_str()), "{ids:?}");
    assert_eq!(
        ids.iter().filter(|i| **i == container.id).count(),
        1,
        "{ids:?}"
    );
}

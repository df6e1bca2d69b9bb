//! End to end against real runc containers in kubelet-style cgroups: `check --json` and
//! `/metrics` must show what the containers did to their /dev/shm.

use crate::common;

use common::{Container, ContainerSpec, HostTmpfs, Shm};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn check_entry(container: &Container) -> Value {
    let report = common::run_check_json(&[]);
    common::shm_entry(&report, &container.id)
        .unwrap_or_else(|| panic!("container {} not in report:\n{report:#}", container.id))
}

fn as_u64(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn the_runtime_default_64mib_shm_shows_what_was_written() {
    if !common::e2e_available() {
        return;
    }
    let pod = common::random_pod_uid();
    let c = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: common::write_then_sleep(20),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let e = check_entry(&c);
    assert_eq!(e["pod_uid"], pod.as_str());
    assert_eq!(e["mounted"], true);
    assert_eq!(e["fs_type"], "tmpfs");
    assert_eq!(e["host_ipc"], false);
    assert_eq!(as_u64(&e["size_bytes"]), 64 * MIB);
    let used = as_u64(&e["used_bytes"]);
    assert!((20 * MIB..21 * MIB).contains(&used), "used {used}");
    assert_eq!(as_u64(&e["available_bytes"]), 64 * MIB - used);
    assert_eq!(e["status"], "ok");
    assert_eq!(as_u64(&e["pid"]), c.pid as u64);
    assert_eq!(e["memory_limit_bytes"], Value::Null);
    // The 20 MiB are charged to the container's memory cgroup.
    assert!(as_u64(&e["memory_shmem_bytes"]) >= 20 * MIB, "{e}");
}

#[test]
fn a_memory_backed_emptydir_at_dev_shm_reports_its_own_size() {
    if !common::e2e_available() {
        return;
    }
    let volume = HostTmpfs::new(1024 * MIB);
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(100),
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let e = check_entry(&c);
    assert_eq!(as_u64(&e["size_bytes"]), 1024 * MIB);
    let used = as_u64(&e["used_bytes"]);
    assert!((100 * MIB..101 * MIB).contains(&used), "used {used}");
    assert_eq!(e["mounted"], true);
}

#[test]
fn a_host_ipc_container_sees_the_hosts_dev_shm() {
    if !common::e2e_available() {
        return;
    }
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(0),
        shm: Shm::HostIpc,
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let e = check_entry(&c);
    assert_eq!(e["host_ipc"], true);
    let host = rustix::fs::statvfs("/dev/shm").unwrap();
    assert_eq!(as_u64(&e["size_bytes"]), host.f_blocks * host.f_frsize);
}

#[test]
fn two_containers_of_one_pod_share_the_pods_dev_shm() {
    if !common::e2e_available() {
        return;
    }
    let pod = common::random_pod_uid();
    let volume = HostTmpfs::new(256 * MIB);
    let writer = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: common::write_then_sleep(30),
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    let reader = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: common::write_then_sleep(0),
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    writer.wait_ready();
    reader.wait_ready();
    let report = common::run_check_json(&[]);
    let w = common::shm_entry(&report, &writer.id).expect("writer reported");
    let r = common::shm_entry(&report, &reader.id).expect("reader reported");
    assert_eq!(w["pod_uid"], pod.as_str());
    assert_eq!(r["pod_uid"], pod.as_str());
    assert_ne!(
        w["container_id"], r["container_id"],
        "one entry per container"
    );
    for e in [&w, &r] {
        assert_eq!(as_u64(&e["size_bytes"]), 256 * MIB);
        let used = as_u64(&e["used_bytes"]);
        assert!((30 * MIB..31 * MIB).contains(&used), "used {used}");
    }
}

#[test]
fn memory_headroom_below_tmpfs_free_bounds_what_is_available() {
    if !common::e2e_available() {
        return;
    }
    let volume = HostTmpfs::new(1024 * MIB);
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(40),
        shm: Shm::Bind(volume.path.clone()),
        memory_limit: Some(96 * MIB as i64),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let e = check_entry(&c);
    assert_eq!(as_u64(&e["memory_limit_bytes"]), 96 * MIB);
    let used = as_u64(&e["used_bytes"]);
    let available = as_u64(&e["available_bytes"]);
    let tmpfs_free = 1024 * MIB - used;
    // headroom = 96 MiB - (40 MiB of shm + the shell's own pages)
    assert!(
        available < 56 * MIB,
        "available {available} must be below the memory headroom"
    );
    assert!(available > 30 * MIB, "available {available}");
    assert!(available < tmpfs_free);
}

#[test]
fn a_file_unlinked_while_held_open_still_counts() {
    if !common::e2e_available() {
        return;
    }
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: vec![
            "sh".into(),
            "-c".into(),
            // What PyTorch and NCCL do: create, open, unlink, keep using.
            "dd if=/dev/zero of=/dev/shm/torch_1 bs=1M count=16 2>/dev/null; exec 3</dev/shm/torch_1; \
             rm /dev/shm/torch_1; touch /tmp/ready; exec sleep 3600"
                .into(),
        ],
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let ls = c.exec(&["ls", "-A", "/dev/shm"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).trim().is_empty(),
        "du/ls see nothing"
    );
    let e = check_entry(&c);
    assert!(as_u64(&e["used_bytes"]) >= 16 * MIB, "{e}");
}

#[test]
fn a_symlink_at_dev_shm_to_a_host_path_is_not_followed() {
    if !common::e2e_available() {
        return;
    }
    // A host directory with a size nothing else has: if the agent followed the symlink it
    // would report 7 MiB.
    let host_dir = HostTmpfs::new(7 * MIB);
    let target = host_dir.path.display().to_string();
    let c = common::dev_shm_symlink_to(&target);
    let e = check_entry(&c);
    assert_eq!(e["mounted"], false, "{e}");
    assert_eq!(e["size_bytes"], Value::Null);
    assert_eq!(e["used_bytes"], Value::Null);
}

#[test]
fn a_container_without_dev_shm_is_reported_as_not_mounted() {
    if !common::e2e_available() {
        return;
    }
    let c = Container::start(ContainerSpec {
        args: common::write_then_sleep(0),
        shm: Shm::None,
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let e = check_entry(&c);
    assert_eq!(e["mounted"], false);
    assert_eq!(e["pod_uid"], Value::Null, "outside Kubernetes");
    assert_eq!(e["status"], "ok");
}

#[test]
fn a_full_dev_shm_is_critical_and_check_exits_1() {
    if !common::e2e_available() {
        return;
    }
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(62),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    let out = common::run_check(&["--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = common::shm_entry(&report, &c.id).unwrap();
    assert_eq!(e["status"], "critical");
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["subject"].as_str().unwrap_or("").contains(&c.id[..12]))
        .unwrap_or_else(|| panic!("no finding for {}: {report:#}", c.id));
    assert_eq!(finding["kind"], "shm_exhausted");
    assert_eq!(finding["severity"], "critical");
}

/// A crashed run's NCCL segment survives in the Pod's memory emptyDir; the restarted container
/// (a new container of the same Pod, the same volume) is told what it inherited. A container
/// that writes its own segments after it starts is told nothing.
#[test]
fn a_restarted_container_is_told_the_segments_it_inherited() {
    if !common::e2e_available() {
        return;
    }
    let pod = common::random_pod_uid();
    let volume = HostTmpfs::new(256 * MIB);
    let crashed = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "dd if=/dev/zero of=/dev/shm/nccl-Y7jXhK bs=1M count=9 2>/dev/null; \
             dd if=/dev/zero of=/dev/shm/psm_4a1b2c3d bs=1M count=1 2>/dev/null; exit 1"
                .into(),
        ],
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    assert!(
        crashed.wait_exited(std::time::Duration::from_secs(30)),
        "{}",
        crashed.console()
    );
    // Its files are older than the next container by more than the clocks' grain.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let restarted = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: common::write_then_sleep(2),
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    restarted.wait_ready();
    let own = HostTmpfs::new(64 * MIB);
    let fresh = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: common::write_then_sleep(4),
        shm: Shm::Bind(own.path.clone()),
        ..ContainerSpec::default()
    });
    fresh.wait_ready();
    // A /dev/shm the runtime made with the container holds nothing from before it, whatever a
    // file's time says (copied in with its time kept, or set back).
    let backdated = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "dd if=/dev/zero of=/dev/shm/nccl-backdated bs=1M count=3 2>/dev/null; \
             touch -d '2020-01-01 00:00:00' /dev/shm/nccl-backdated; \
             touch /tmp/ready; exec sleep 3600"
                .into(),
        ],
        ..ContainerSpec::default()
    });
    backdated.wait_ready();

    let report = common::run_check_json(&[]);
    let e = common::shm_entry(&report, &restarted.id).unwrap();
    let l = &e["leftovers"];
    assert_eq!(l["count"], 2, "{e:#}");
    assert_eq!(as_u64(&l["bytes"]), 10 * MIB, "{e:#}");
    assert_eq!(l["largest"][0][0], "nccl-Y7jXhK");
    assert_eq!(as_u64(&l["largest"][0][1]), 9 * MIB);
    let findings: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "shm_leftover_segments")
        .collect();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let message = findings[0]["message"].as_str().unwrap();
    common::assert_contains_all(
        message,
        &[
            "held 2 files written before it started",
            "nccl-Y7jXhK 9.0 MiB",
            "rm -f /dev/shm/nccl-*",
        ],
    );
    // The data the restarted container wrote itself is its own; the fresh one has nothing old.
    let f = common::shm_entry(&report, &fresh.id).unwrap();
    assert!(f.get("leftovers").is_none(), "{f:#}");
    let b = common::shm_entry(&report, &backdated.id).unwrap();
    assert_eq!(as_u64(&b["used_bytes"]), 3 * MIB, "{b:#}");
    assert!(b.get("leftovers").is_none(), "{b:#}");
}

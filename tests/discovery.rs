//! Discovery against fake /proc and cgroup trees in a TempDir: the same code as on a node,
//! with namespaces, cgroup layouts and failures chosen by the test. No root needed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use shmlink::host::HostPaths;
use shmlink::shm::ShmScanner;

const HOST_MNT: u64 = 4026531840;
const MIB: u64 = 1 << 20;

struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    /// A cgroup v2 host (systemd driver) whose PID 1 is in the host's namespaces.
    fn v2() -> FakeHost {
        let host = FakeHost {
            dir: tempfile::tempdir().unwrap(),
        };
        fs::create_dir_all(host.cgroup()).unwrap();
        fs::write(
            host.cgroup().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        )
        .unwrap();
        host.process(1, HOST_MNT, HOST_MNT + 1);
        host
    }

    fn proc(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    fn cgroup(&self) -> PathBuf {
        self.dir.path().join("cgroup")
    }

    fn paths(&self) -> HostPaths {
        HostPaths {
            proc_root: self.proc(),
            cgroup_root: self.cgroup(),
        }
    }

    /// /proc/PID with ns links and a root directory of its own.
    fn process(&self, pid: i32, mnt: u64, ipc: u64) -> PathBuf {
        let dir = self.proc().join(pid.to_string());
        fs::create_dir_all(dir.join("ns")).unwrap();
        symlink(format!("mnt:[{mnt}]"), dir.join("ns/mnt")).unwrap();
        symlink(format!("ipc:[{ipc}]"), dir.join("ns/ipc")).unwrap();
        let root = self.dir.path().join(format!("roots/{pid}"));
        fs::create_dir_all(root.join("dev")).unwrap();
        symlink(&root, dir.join("root")).unwrap();
        fs::write(dir.join("mountinfo"), "").unwrap();
        root
    }

    /// A cgroup with processes and (optionally) a memory limit and usage.
    fn cgroup_dir(&self, rel: &str, pids: &[i32], limit: Option<u64>, usage: u64) -> PathBuf {
        let dir = self.cgroup().join(rel.trim_start_matches('/'));
        fs::create_dir_all(&dir).unwrap();
        let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
        fs::write(
            dir.join("memory.max"),
            limit.map_or("max\n".into(), |l| format!("{l}\n")),
        )
        .unwrap();
        fs::write(dir.join("memory.current"), format!("{usage}\n")).unwrap();
        fs::write(
            dir.join("memory.stat"),
            format!("anon 1000\nfile 2000\nshmem {}\n", usage / 2),
        )
        .unwrap();
        dir
    }
}

const POD_SLICE: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b6c1a2e_7f3d_4c1b_9a2e_5d6f7a8b9c0d.slice";
const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

#[test]
fn a_systemd_driver_pod_container_on_cgroup_v2_is_found_with_its_ids_and_limits() {
    let host = FakeHost::v2();
    host.process(100, HOST_MNT + 10, HOST_MNT + 11);
    host.cgroup_dir("/kubepods.slice", &[], None, 0);
    host.cgroup_dir("/kubepods.slice/kubepods-burstable.slice", &[], None, 0);
    host.cgroup_dir(POD_SLICE, &[], Some(512 * MIB), 300 * MIB);
    host.cgroup_dir(
        &format!("{POD_SLICE}/cri-containerd-{CID}.scope"),
        &[100],
        Some(1024 * MIB),
        200 * MIB,
    );

    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    assert_eq!(scan.errors, 0);
    assert_eq!(scan.readings.len(), 1, "{:#?}", scan.readings);
    let r = &scan.readings[0];
    assert_eq!(r.container_id, CID);
    assert_eq!(
        r.pod_uid.as_deref(),
        Some("0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d")
    );
    assert_eq!(r.pid, 100);
    assert!(!r.host_ipc);
    // The pod's limit is lower than the container's, so it bounds both numbers.
    assert_eq!(r.memory_limit_bytes, Some(512 * MIB));
    assert_eq!(r.memory_shmem_bytes, Some(100 * MIB));
    // No /dev/shm in the fake root: reported as not mounted, not as an error.
    assert!(!r.mounted);
    assert_eq!(r.available_bytes, None);
}

#[test]
fn host_processes_and_vanished_processes_are_not_containers_nor_errors() {
    let host = FakeHost::v2();
    host.process(200, HOST_MNT, HOST_MNT + 1); // a host daemon
    host.cgroup_dir("/system.slice/sshd.service", &[200], None, 0);
    // Listed in cgroup.procs but already gone from /proc.
    host.cgroup_dir(
        "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/abc",
        &[999],
        None,
        0,
    );
    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    assert!(scan.readings.is_empty(), "{:#?}", scan.readings);
    assert_eq!(scan.errors, 0);
}

#[test]
fn one_entry_per_container_whatever_its_processes_and_nested_cgroups() {
    let host = FakeHost::v2();
    for pid in [300, 301, 302] {
        host.process(pid, HOST_MNT + 30, HOST_MNT + 31);
    }
    host.cgroup_dir("/docker/ctr-a", &[300, 301], None, 0);
    // systemd inside the container made a child cgroup: same mount namespace, same container.
    host.cgroup_dir("/docker/ctr-a/init.scope", &[302], None, 0);
    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    assert_eq!(scan.readings.len(), 1, "{:#?}", scan.readings);
    assert_eq!(scan.readings[0].container_id, "ctr-a");
    assert_eq!(scan.readings[0].pod_uid, None);
}

#[test]
fn a_container_nested_in_a_container_is_its_own_entry() {
    let host = FakeHost::v2();
    host.process(400, HOST_MNT + 40, HOST_MNT + 41);
    host.process(401, HOST_MNT + 50, HOST_MNT + 51);
    host.cgroup_dir("/kind-node", &[400], None, 0);
    host.cgroup_dir(
        "/kind-node/kubepods/pod22222222-3333-4444-5555-666666666666/inner",
        &[401],
        None,
        0,
    );
    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    let ids: Vec<&str> = scan
        .readings
        .iter()
        .map(|r| r.container_id.as_str())
        .collect();
    assert_eq!(ids, ["kind-node", "inner"]);
    assert_eq!(
        scan.readings[1].pod_uid.as_deref(),
        Some("22222222-3333-4444-5555-666666666666")
    );
}

#[test]
fn a_container_sharing_the_hosts_ipc_namespace_is_host_ipc() {
    let host = FakeHost::v2();
    host.process(500, HOST_MNT + 60, HOST_MNT + 1);
    host.cgroup_dir(
        "/kubepods/pod33333333-4444-5555-6666-777777777777/c1",
        &[500],
        None,
        0,
    );
    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    assert!(scan.readings[0].host_ipc);
}

#[test]
fn an_unreadable_namespace_link_is_an_error_counted_once_per_scan_not_a_panic() {
    let host = FakeHost::v2();
    let dir = host.proc().join("600");
    fs::create_dir_all(dir.join("ns")).unwrap();
    // Not a namespace link: reads as garbage.
    symlink("garbage", dir.join("ns/mnt")).unwrap();
    host.cgroup_dir("/odd/c", &[600], None, 0);
    let mut scanner = ShmScanner::new(&host.paths()).unwrap();
    let scan = scanner.scan();
    assert!(scan.readings.is_empty());
    assert_eq!(scan.errors, 1);
    assert_eq!(scanner.scan().errors, 1, "counted again on the next scan");
}

#[test]
fn a_process_whose_root_is_gone_mid_scan_drops_out_silently() {
    let host = FakeHost::v2();
    let root = host.process(700, HOST_MNT + 70, HOST_MNT + 71);
    host.cgroup_dir(
        "/kubepods/pod44444444-5555-6666-7777-888888888888/c1",
        &[700],
        None,
        0,
    );
    fs::remove_dir_all(&root).unwrap(); // /proc/700/root now dangles, as for an exited process
    let scan = ShmScanner::new(&host.paths()).unwrap().scan();
    assert!(scan.readings.is_empty(), "{:#?}", scan.readings);
    assert_eq!(scan.errors, 0);
}

#[test]
fn pid_1_unreadable_falls_back_to_the_agents_namespaces() {
    let host = FakeHost::v2();
    fs::remove_dir_all(host.proc().join("1")).unwrap();
    let scanner = ShmScanner::new(&host.paths()).unwrap();
    let own = fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_eq!(
        format!("mnt:[{}]", scanner.host_namespaces().mnt.0),
        own.to_str().unwrap()
    );
}

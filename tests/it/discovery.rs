//! Discovery against fake /proc and cgroup trees in a TempDir: the same code as on a node,
//! with namespaces, cgroup layouts and failures chosen by the test. No root needed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use shmlink::host::HostPaths;
use shmlink::model::Blind;
use shmlink::shm::ShmScanner;

const HOST_MNT: u64 = 4026531840;
const MIB: u64 = 1 << 20;

/// What cgroup v1 reads back for "no limit" (PAGE_COUNTER_MAX in bytes).
const V1_UNLIMITED: &str = "9223372036854771712\n";

struct FakeHost {
    dir: tempfile::TempDir,
    /// A cgroup v1 hybrid host: memory controller at `<root>/memory`, v2 at `<root>/unified`.
    v1: bool,
}

impl FakeHost {
    /// A cgroup v2 host (systemd driver) whose PID 1 is in the host's namespaces.
    fn v2() -> FakeHost {
        let host = FakeHost {
            dir: tempfile::tempdir().unwrap(),
            v1: false,
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
        // The mounts a process sees: this machine's own, which hold the fake root (the scan
        // looks in a root only on a mount its mountinfo shows as a local file system).
        let mounts = fs::read("/proc/self/mountinfo").unwrap();
        fs::write(dir.join("mountinfo"), mounts).unwrap();
        root
    }

    /// A cgroup v1 hybrid host, as Ubuntu 20.04 or RHEL 8 nodes boot: /sys/fs/cgroup is a tmpfs
    /// with a directory per v1 controller, and the v2 tree at `unified/` holds no controllers.
    fn v1_hybrid() -> FakeHost {
        let host = FakeHost {
            dir: tempfile::tempdir().unwrap(),
            v1: true,
        };
        let memory = host.cgroup().join("memory");
        fs::create_dir_all(&memory).unwrap();
        fs::write(memory.join("cgroup.procs"), "1\n").unwrap();
        fs::write(memory.join("memory.limit_in_bytes"), V1_UNLIMITED).unwrap();
        fs::write(memory.join("memory.usage_in_bytes"), "12884901888\n").unwrap();
        fs::create_dir_all(host.cgroup().join("unified")).unwrap();
        fs::write(host.cgroup().join("unified/cgroup.controllers"), "").unwrap();
        host.process(1, HOST_MNT, HOST_MNT + 1);
        host
    }

    /// The hierarchy the scanner walks: the v2 root, or the v1 memory controller's.
    fn memory_root(&self) -> PathBuf {
        if self.v1 {
            self.cgroup().join("memory")
        } else {
            self.cgroup()
        }
    }

    /// A cgroup with processes and (optionally) a memory limit and usage.
    fn cgroup_dir(&self, rel: &str, pids: &[i32], limit: Option<u64>, usage: u64) -> PathBuf {
        let dir = self.memory_root().join(rel.trim_start_matches('/'));
        fs::create_dir_all(&dir).unwrap();
        let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
        let limit = limit.map(|l| format!("{l}\n"));
        if self.v1 {
            let limit = limit.unwrap_or_else(|| V1_UNLIMITED.into());
            fs::write(dir.join("memory.limit_in_bytes"), limit).unwrap();
            fs::write(dir.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
            // v1 lists its own counters, then the hierarchical total_ ones.
            let shmem = usage / 2;
            fs::write(
                dir.join("memory.stat"),
                format!("cache 2000\nrss 1000\nshmem {shmem}\ntotal_cache 2000\ntotal_rss 1000\ntotal_shmem {shmem}\n"),
            )
            .unwrap();
        } else {
            fs::write(
                dir.join("memory.max"),
                limit.unwrap_or_else(|| "max\n".into()),
            )
            .unwrap();
            fs::write(dir.join("memory.current"), format!("{usage}\n")).unwrap();
            fs::write(
                dir.join("memory.stat"),
                format!("anon 1000\nfile 2000\nshmem {}\n", usage / 2),
            )
            .unwrap();
        }
        dir
    }

    /// The same cgroup in the hybrid host's `unified/` tree, which runc also joins: only
    /// processes, no memory files.
    fn unified_dir(&self, rel: &str, pids: &[i32]) {
        let dir = self
            .cgroup()
            .join("unified")
            .join(rel.trim_start_matches('/'));
        fs::create_dir_all(&dir).unwrap();
        let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
    }

    /// Overwrites a cgroup's cgroup.procs with raw content.
    fn procs_raw(&self, rel: &str, content: &str) {
        let dir = self.memory_root().join(rel.trim_start_matches('/'));
        fs::write(dir.join("cgroup.procs"), content).unwrap();
    }

    fn scan(&self) -> shmlink::shm::ShmScan {
        ShmScanner::new(&self.paths()).unwrap().scan()
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
    assert_eq!(r.mounted, Some(false));
    assert_eq!(r.error, None);
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

/// kubelet's pod cgroup holds its containers' cgroups and no process: its cgroup.procs is
/// not read (a directory there stands for one that cannot be read: read, it is an error).
/// A cgroup a container made and named like a pod's is read: the container chose the name, and
/// its processes may be there.
#[test]
fn a_pods_own_cgroup_procs_is_not_read_and_a_pod_named_cgroup_inside_a_container_is() {
    let host = FakeHost::v2();
    host.process(700, HOST_MNT + 70, HOST_MNT + 71);
    let pod = "/kubepods/burstable/pod44444444-5555-6666-7777-888888888888";
    host.cgroup_dir(pod, &[], None, 0);
    host.cgroup_dir(&format!("{pod}/{APP_ID}"), &[700], None, 0);
    let unreadable = |rel: &str| {
        let procs = host
            .memory_root()
            .join(rel.trim_start_matches('/'))
            .join("cgroup.procs");
        fs::remove_file(&procs).unwrap();
        fs::create_dir(&procs).unwrap();
    };
    unreadable(pod);
    let scan = host.scan();
    assert_eq!(ids(&scan), [APP_ID], "{:#?}", scan.readings);
    assert_eq!(scan.errors, 0, "the pod's own cgroup.procs was read");

    // Inside the container: a child named as a pod's, with a child of its own.
    let inside = format!("{pod}/{APP_ID}/pod99999999-aaaa-bbbb-cccc-dddddddddddd");
    host.cgroup_dir(&inside, &[], None, 0);
    host.cgroup_dir(&format!("{inside}/x"), &[], None, 0);
    unreadable(&inside);
    let scan = host.scan();
    assert_eq!(ids(&scan), [APP_ID], "{:#?}", scan.readings);
    assert_eq!(
        scan.errors, 1,
        "the pod-named cgroup inside the container was not read"
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

/// A new container that gets a gone container's mount namespace number and, for a FUSE, the
/// gone one's root mount ID (the kernel reuses both, lowest first) is checked afresh: the trust
/// found for the gone one's root is not its.
#[test]
fn a_reused_namespace_number_and_mount_id_do_not_carry_trust_to_a_new_container() {
    let host = FakeHost::v2();
    let mnt = HOST_MNT + 90;
    let gone = host.process(900, mnt, HOST_MNT + 91);
    let pod = "/kubepods/pod55555555-6666-7777-8888-999999999999";
    host.cgroup_dir(&format!("{pod}/gone"), &[900], None, 0);
    let mut scanner = ShmScanner::new(&host.paths()).unwrap();
    let first = scanner.scan();
    assert_eq!(first.readings.len(), 1, "{:#?}", first.readings);
    assert_eq!(first.readings[0].error, None, "{:#?}", first.readings);

    // The container goes; the next, in the same namespace number, has its root on the mount ID
    // the gone one's root had, and that mount is a FUSE by its mountinfo.
    fs::remove_dir_all(host.memory_root().join(&pod[1..]).join("gone")).unwrap();
    let root = host.process(901, mnt, HOST_MNT + 91);
    let root_mount = rustix::fs::statx(
        rustix::fs::CWD,
        &root,
        rustix::fs::AtFlags::empty(),
        rustix::fs::StatxFlags::MNT_ID,
    )
    .unwrap()
    .stx_mnt_id;
    let gone_mount = rustix::fs::statx(
        rustix::fs::CWD,
        &gone,
        rustix::fs::AtFlags::empty(),
        rustix::fs::StatxFlags::MNT_ID,
    )
    .unwrap()
    .stx_mnt_id;
    assert_eq!(root_mount, gone_mount, "both fake roots are on one mount");
    let mountinfo: String = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-").unwrap();
            if fields[0] == root_mount.to_string() {
                let mut f = fields.clone();
                f[sep + 1] = "fuse";
                f.join(" ") + "\n"
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(host.proc().join("901/mountinfo"), mountinfo).unwrap();
    host.cgroup_dir(&format!("{pod}/next"), &[901], None, 0);

    let second = scanner.scan();
    assert_eq!(ids(&second), ["next"]);
    let error = second.readings[0].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("the container's / is a fuse mount, not a local file system"),
        "{:#?}",
        second.readings
    );
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

// A pod's containers on a node: 64-hex IDs as containerd, CRI-O and Docker make them.
const PAUSE_ID: &str = "7b1e3d5f9a2c4e6b8d0f1a3c5e7b9d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1e3d";
const APP_ID: &str = "a41c0e9d7b5f3a1c8e6d4b2f0a9c7e5d3b1f8a6c4e2d0b9f7a5c3e1d8b6f4a2c";
const SIDECAR_ID: &str = "c2e4a6b8d0f1a3c5e7b9d1f3a5c7e9b0d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1";
const POD_UID_2: &str = "8e1f3a5c-7b9d-4e2f-a4c6-b8d0e2f4a6c8";

fn ids(scan: &shmlink::shm::ShmScan) -> Vec<&str> {
    scan.readings
        .iter()
        .map(|r| r.container_id.as_str())
        .collect()
}

/// `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice`
fn systemd_pod(qos: &str, uid: &str) -> String {
    let uid = uid.replace('-', "_");
    format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice")
}

#[test]
fn a_containerd_pod_on_a_v2_systemd_node_is_one_entry_per_container_including_its_sandbox() {
    let host = FakeHost::v2();
    // containerd and its shims live in the host's mount namespace.
    host.process(900, HOST_MNT, HOST_MNT + 1);
    host.cgroup_dir("/system.slice/containerd.service", &[900], None, 0);
    host.cgroup_dir("/init.scope", &[1], None, 0);
    // Each container of the pod has a mount namespace of its own; they share the pod's IPC.
    host.process(1000, HOST_MNT + 100, HOST_MNT + 101);
    for pid in [1010, 1011] {
        host.process(pid, HOST_MNT + 110, HOST_MNT + 101);
    }
    host.process(1020, HOST_MNT + 120, HOST_MNT + 101);
    host.cgroup_dir("/kubepods.slice", &[], Some(60 << 30), 20 << 30);
    host.cgroup_dir("/kubepods.slice/kubepods-burstable.slice", &[], None, 0);
    host.cgroup_dir("/kubepods.slice/kubepods-besteffort.slice", &[], None, 0);
    let pod = systemd_pod("burstable", "0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d");
    host.cgroup_dir(&pod, &[], Some(2048 * MIB), 1200 * MIB);
    let scope = |id: &str| format!("{pod}/cri-containerd-{id}.scope");
    host.cgroup_dir(&scope(PAUSE_ID), &[1000], None, MIB);
    host.cgroup_dir(&scope(APP_ID), &[1010, 1011], Some(1024 * MIB), 900 * MIB);
    host.cgroup_dir(&scope(SIDECAR_ID), &[1020], None, 100 * MIB);

    let scan = host.scan();
    assert_eq!(scan.errors, 0);
    let mut got = ids(&scan);
    got.sort_unstable();
    assert_eq!(got, [PAUSE_ID, APP_ID, SIDECAR_ID], "{:#?}", scan.readings);
    for r in &scan.readings {
        assert_eq!(
            r.pod_uid.as_deref(),
            Some("0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d")
        );
        assert!(r.cgroup.starts_with(&pod), "{}", r.cgroup);
    }
    let app = scan.readings.iter().find(|r| r.container_id == APP_ID);
    let app = app.unwrap();
    assert_eq!(app.pid, 1010);
    assert_eq!(app.memory_limit_bytes, Some(1024 * MIB));
    assert_eq!(app.memory_shmem_bytes, Some(450 * MIB));
    // No limit of its own: the pod's bounds it.
    let sidecar = scan.readings.iter().find(|r| r.container_id == SIDECAR_ID);
    assert_eq!(sidecar.unwrap().memory_limit_bytes, Some(2048 * MIB));
}

#[test]
fn a_cri_o_pod_on_v2_is_named_by_its_scopes_and_conmon_is_not_reported() {
    let host = FakeHost::v2();
    let pod = systemd_pod("besteffort", POD_UID_2);
    host.cgroup_dir("/kubepods.slice", &[], None, 0);
    host.cgroup_dir("/kubepods.slice/kubepods-besteffort.slice", &[], None, 0);
    host.cgroup_dir(&pod, &[], None, 0);
    // conmon watches each container from the host's mount namespace, in a sibling scope.
    host.process(2000, HOST_MNT, HOST_MNT + 1);
    host.process(2001, HOST_MNT, HOST_MNT + 1);
    host.cgroup_dir(
        &format!("{pod}/crio-conmon-{PAUSE_ID}.scope"),
        &[2001],
        None,
        0,
    );
    host.cgroup_dir(
        &format!("{pod}/crio-conmon-{APP_ID}.scope"),
        &[2000],
        None,
        0,
    );
    // crun on cgroup v2 leaves the scope empty and runs the processes in a `container` child.
    host.process(2010, HOST_MNT + 210, HOST_MNT + 211);
    host.process(2020, HOST_MNT + 220, HOST_MNT + 211);
    for (id, pid, limit) in [(PAUSE_ID, 2020, None), (APP_ID, 2010, Some(512 * MIB))] {
        let scope = format!("{pod}/crio-{id}.scope");
        host.cgroup_dir(&scope, &[], limit, 300 * MIB);
        host.cgroup_dir(&format!("{scope}/container"), &[pid], None, 300 * MIB);
    }

    let scan = host.scan();
    assert_eq!(scan.errors, 0);
    assert_eq!(scan.readings.len(), 2, "{:#?}", scan.readings);
    let app = scan.readings.iter().find(|r| r.pid == 2010).unwrap();
    assert_eq!(app.container_id, APP_ID);
    assert_eq!(app.pod_uid.as_deref(), Some(POD_UID_2));
    assert_eq!(app.cgroup, format!("{pod}/crio-{APP_ID}.scope/container"));
    // The limit is on the scope above the `container` child.
    assert_eq!(app.memory_limit_bytes, Some(512 * MIB));
    let pause = scan.readings.iter().find(|r| r.pid == 2020).unwrap();
    assert_eq!(pause.container_id, PAUSE_ID);
    assert!(!ids(&scan).iter().any(|id| id.contains("conmon")));
}

#[test]
fn a_burstable_pod_on_a_v1_hybrid_cgroupfs_node_is_read_from_the_memory_controller() {
    let host = FakeHost::v1_hybrid();
    let pod = "/kubepods/burstable/pod0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d";
    host.process(3000, HOST_MNT + 300, HOST_MNT + 301);
    host.process(3010, HOST_MNT + 310, HOST_MNT + 301);
    host.cgroup_dir("/kubepods", &[], Some(60 << 30), 20 << 30);
    host.cgroup_dir("/kubepods/burstable", &[], None, 10 << 30);
    host.cgroup_dir("/kubepods/besteffort", &[], None, 0);
    host.cgroup_dir(pod, &[], Some(1024 * MIB), 700 * MIB);
    host.cgroup_dir(&format!("{pod}/{PAUSE_ID}"), &[3000], None, MIB);
    host.cgroup_dir(&format!("{pod}/{APP_ID}"), &[3010], None, 600 * MIB);
    // runc joins the same path in unified/ too; walking it as well would count twice.
    host.unified_dir(&format!("{pod}/{PAUSE_ID}"), &[3000]);
    host.unified_dir(&format!("{pod}/{APP_ID}"), &[3010]);

    let scan = host.scan();
    assert_eq!(scan.errors, 0);
    assert_eq!(scan.readings.len(), 2, "{:#?}", scan.readings);
    let app = scan.readings.iter().find(|r| r.container_id == APP_ID);
    let app = app.unwrap();
    assert_eq!(
        app.pod_uid.as_deref(),
        Some("0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d")
    );
    assert_eq!(app.cgroup, format!("{pod}/{APP_ID}"));
    // v1's "unlimited" sentinel on the container: the pod's limit bounds it.
    assert_eq!(app.memory_limit_bytes, Some(1024 * MIB));
    assert_eq!(app.memory_shmem_bytes, Some(300 * MIB));
}

#[test]
fn a_container_whose_process_exited_between_listing_and_reading_is_skipped_silently() {
    let host = FakeHost::v2();
    let pod = systemd_pod("burstable", POD_UID_2);
    host.process(4010, HOST_MNT + 410, HOST_MNT + 411);
    host.cgroup_dir(&pod, &[], None, 0);
    // cgroup.procs still names 4099, but /proc/4099 is gone.
    host.cgroup_dir(
        &format!("{pod}/cri-containerd-{PAUSE_ID}.scope"),
        &[4099],
        None,
        0,
    );
    host.cgroup_dir(
        &format!("{pod}/cri-containerd-{APP_ID}.scope"),
        &[4010],
        None,
        0,
    );
    // The first listed process exited; the next one still answers for the container.
    host.process(4020, HOST_MNT + 420, HOST_MNT + 411);
    host.cgroup_dir(
        &format!("{pod}/cri-containerd-{SIDECAR_ID}.scope"),
        &[4098, 4020],
        None,
        0,
    );

    let scan = host.scan();
    assert_eq!(scan.errors, 0);
    let mut got = ids(&scan);
    got.sort_unstable();
    assert_eq!(got, [APP_ID, SIDECAR_ID]);
    let sidecar = scan.readings.iter().find(|r| r.container_id == SIDECAR_ID);
    assert_eq!(sidecar.unwrap().pid, 4020);
}

#[test]
fn garbage_in_cgroup_procs_is_skipped_and_an_unreadable_one_is_one_error() {
    let host = FakeHost::v2();
    let pod = systemd_pod("burstable", POD_UID_2);
    host.cgroup_dir(&pod, &[], None, 0);
    let scope = |id: &str| format!("{pod}/cri-containerd-{id}.scope");
    host.process(5010, HOST_MNT + 510, HOST_MNT + 511);
    host.process(5020, HOST_MNT + 520, HOST_MNT + 511);
    host.cgroup_dir(&scope(PAUSE_ID), &[], None, 0);
    host.procs_raw(&scope(PAUSE_ID), "not-a-pid\n\u{0}\u{0}\n-5\n99999999999\n");
    // Garbage before a real pid does not hide it.
    host.cgroup_dir(&scope(APP_ID), &[], None, 0);
    host.procs_raw(&scope(APP_ID), "x\n 5010 \n");
    host.cgroup_dir(&scope(SIDECAR_ID), &[5020], None, 0);
    // A directory where the file should be: EISDIR stands in for EACCES, which root never gets.
    let unreadable = host
        .memory_root()
        .join(scope(SIDECAR_ID).trim_start_matches('/'));
    fs::remove_file(unreadable.join("cgroup.procs")).unwrap();
    fs::create_dir(unreadable.join("cgroup.procs")).unwrap();

    let mut scanner = ShmScanner::new(&host.paths()).unwrap();
    let scan = scanner.scan();
    assert_eq!(ids(&scan), [APP_ID], "{:#?}", scan.readings);
    assert_eq!(scan.readings[0].pid, 5010);
    assert_eq!(scan.errors, 1);
    assert_eq!(
        scanner.scan().errors,
        1,
        "counted on each scan, never a panic"
    );
}

#[test]
fn a_container_in_a_cgroup_without_the_memory_controller_is_still_reported() {
    // cgroup v2: a parent that does not delegate `memory` leaves its children without
    // memory.max and memory.current; the container is there, only its limit is unknown.
    let host = FakeHost::v2();
    host.process(6010, HOST_MNT + 610, HOST_MNT + 611);
    host.cgroup_dir("/ci.slice", &[], None, 0);
    let dir = host.cgroup().join("ci.slice/runner-7");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("cgroup.procs"), "6010\n").unwrap();

    let scan = host.scan();
    assert_eq!(scan.errors, 0);
    assert_eq!(ids(&scan), ["runner-7"], "{:#?}", scan.readings);
    assert_eq!(scan.readings[0].memory_limit_bytes, None);
    assert_eq!(scan.readings[0].memory_shmem_bytes, None);
}

#[test]
fn unreadable_or_garbled_memory_cgroup_files_cost_that_figure_only() {
    let host = FakeHost::v2();
    let pod = systemd_pod("burstable", POD_UID_2);
    host.cgroup_dir(&pod, &[], Some(2048 * MIB), 100 * MIB);
    let scope = |id: &str| format!("{pod}/cri-containerd-{id}.scope");
    host.process(6010, HOST_MNT + 610, HOST_MNT + 611);
    host.process(6020, HOST_MNT + 620, HOST_MNT + 611);
    let app = host.cgroup_dir(&scope(APP_ID), &[6010], Some(1024 * MIB), 10 * MIB);
    let sidecar = host.cgroup_dir(&scope(SIDECAR_ID), &[6020], Some(512 * MIB), 10 * MIB);
    // The app's memory.max cannot be read (EISDIR stands in for EACCES); the sidecar's files
    // hold garbage.
    fs::remove_file(app.join("memory.max")).unwrap();
    fs::create_dir(app.join("memory.max")).unwrap();
    fs::write(sidecar.join("memory.max"), "lots\n").unwrap();
    fs::write(sidecar.join("memory.stat"), "\u{0}\u{0}shmem\nshmem x y\n").unwrap();

    let scan = host.scan();
    let mut got = ids(&scan);
    got.sort_unstable();
    assert_eq!(got, [APP_ID, SIDECAR_ID], "{:#?}", scan.readings);
    let reading = |id: &str| scan.readings.iter().find(|r| r.container_id == id).unwrap();
    // The unreadable limit is skipped: the pod's still bounds the container.
    assert_eq!(reading(APP_ID).memory_limit_bytes, Some(2048 * MIB));
    assert_eq!(reading(SIDECAR_ID).memory_limit_bytes, Some(2048 * MIB));
    assert_eq!(reading(SIDECAR_ID).memory_shmem_bytes, None);
    assert!(scan.errors >= 1, "the unreadable file is counted");
}

#[test]
fn sight_counts_what_was_measured_and_what_could_not_be_looked_into() {
    let host = FakeHost::v2();
    host.process(500, HOST_MNT + 50, HOST_MNT + 51);
    host.cgroup_dir(
        "/kubepods/pod55555555-6666-7777-8888-999999999999/c1",
        &[500],
        None,
        0,
    );
    let dir = host.proc().join("600");
    fs::create_dir_all(dir.join("ns")).unwrap();
    symlink("garbage", dir.join("ns/mnt")).unwrap();
    host.cgroup_dir("/odd/c", &[600], None, 0);
    let scan = host.scan();
    assert_eq!(scan.readings.len(), 1);
    assert_eq!((scan.sight.measured, scan.sight.unreadable), (1, 1));
    assert_eq!(scan.sight.blind(), vec![Blind::SomeContainersUnreadable]);

    // The readable one gone: nothing measured, so blind to all.
    fs::remove_dir_all(host.proc().join("500")).unwrap();
    let scan = host.scan();
    assert_eq!((scan.sight.measured, scan.sight.unreadable), (0, 1));
    assert_eq!(scan.sight.blind(), vec![Blind::ContainersUnreadable]);
}

#[test]
fn no_hierarchy_is_blind_until_one_appears() {
    let host = FakeHost::v2();
    fs::remove_file(host.cgroup().join("cgroup.controllers")).unwrap();
    let mut scanner = ShmScanner::new(&host.paths()).expect("no hierarchy is no error");
    let scan = scanner.scan();
    assert!(!scan.sight.cgroup_hierarchy);
    assert_eq!(scan.sight.blind(), vec![Blind::NoCgroups]);
    fs::write(host.cgroup().join("cgroup.controllers"), "memory\n").unwrap();
    let scan = scanner.scan();
    assert!(scan.sight.cgroup_hierarchy);
    assert_eq!(scan.sight.blind(), vec![]);
}

#[test]
fn a_proc_root_without_processes_is_blind() {
    let host = FakeHost::v2();
    assert_eq!(host.scan().sight.blind(), vec![]);
    fs::remove_dir_all(host.proc().join("1")).unwrap();
    let scan = host.scan();
    assert!(!scan.sight.processes);
    assert_eq!(scan.sight.blind(), vec![Blind::NoProcesses]);
}

/// A scanner that keeps a pod's listing from one scan to the next (its link count unchanged)
/// still sees a container that took a gone one's place: same count, another name.
#[test]
fn a_container_that_replaces_another_in_its_pod_is_found_by_the_next_scan() {
    let host = FakeHost::v2();
    let pod = "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555";
    host.cgroup_dir(pod, &[], None, 0);
    let id = |c: char| c.to_string().repeat(64);
    for (pid, c) in [(100, 'a'), (101, 'b')] {
        host.process(pid, HOST_MNT + pid as u64, HOST_MNT + 1000 + pid as u64);
        host.cgroup_dir(&format!("{pod}/{}", id(c)), &[pid], None, 0);
    }
    let mut scanner = ShmScanner::new(&host.paths()).unwrap();
    let ids = |scan: shmlink::shm::ShmScan| -> Vec<String> {
        let mut ids: Vec<String> = scan.readings.into_iter().map(|r| r.container_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(scanner.scan()), [id('a'), id('b')]);
    assert_eq!(
        ids(scanner.scan()),
        [id('a'), id('b')],
        "from the kept listing"
    );

    // b goes, c comes: the pod's link count is what it was.
    fs::remove_dir_all(host.memory_root().join(&pod[1..]).join(id('b'))).unwrap();
    host.process(102, HOST_MNT + 102, HOST_MNT + 1102);
    host.cgroup_dir(&format!("{pod}/{}", id('c')), &[102], None, 0);
    let scan = scanner.scan();
    assert_eq!(scan.errors, 0, "a gone cgroup is no error");
    assert_eq!(ids(scan), [id('a'), id('c')]);

    // One more: the count moves, listed again.
    host.process(103, HOST_MNT + 103, HOST_MNT + 1103);
    host.cgroup_dir(&format!("{pod}/{}", id('d')), &[103], None, 0);
    assert_eq!(ids(scanner.scan()), [id('a'), id('c'), id('d')]);
}

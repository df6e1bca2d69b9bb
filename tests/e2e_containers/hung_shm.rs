//! A /dev/shm that never answers, for real: a FUSE file system whose server answers INIT, then
//! reads every request and never answers (`common::fuse`), mounted in real runc containers'
//! mount namespaces (at /dev/shm, over a file in it, at /dev, or as a process's root by a
//! chroot), as a pod allowed to mount FUSE could. A call it read waits in the kernel
//! past SIGKILL, so the agent must never ask it anything: `check` exits on time, `serve` scans,
//! stays ready and is reaped within 10 s of SIGTERM, the peak sampler goes on, and the server
//! is sent no request at all.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::{get, sample, scans_in, Agent};
use common::fuse::HungFuse;
use common::{Container, ContainerSpec};
use serde_json::Value;

fn pod_container(args: &[&str]) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..ContainerSpec::default()
    })
}

/// `check --json`, which must exit within `within`; its report and how long it took. A child
/// that does not exit is left unwaited (it may be unkillable) and the test fails. Its output is
/// read while it runs: a host's worth of containers fills a pipe, and a writer blocked on a
/// full pipe is not a hung check.
fn check_within(within: Duration) -> (Value, Duration) {
    let started = Instant::now();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_shmlink"))
        .args(["check", "--json", "--no-gpu", "--kmsg", "off"])
        .args(["--pod-log-root", "off", "--docker-root", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let exited = common::wait_until(within, || child.try_wait().unwrap().is_some());
    let took = started.elapsed();
    assert!(exited, "check did not exit within {within:?}");
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let report = serde_json::from_slice(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&stderr)));
    (report, took)
}

/// `serve` scanning every second, once its shm collector has scanned three times; and that
/// scrape.
fn serve_three_scans() -> (Agent, String) {
    let agent = Agent::start(&["--interval", "1s"], &[]);
    agent.wait_ready();
    let metrics = agent.wait_for_metrics("scans go on", |b| {
        scans_in(b, "shm").is_some_and(|n| n >= 3.0)
    });
    (agent, metrics)
}

/// SIGTERM: serve reaped within 10 s, and neither it nor `check` asked `fuses` anything.
fn stop_never_having_asked(agent: Agent, fuses: &[HungFuse]) {
    let stopping = Instant::now();
    assert!(agent.terminate().success());
    let reaped = stopping.elapsed();
    println!("serve reaped {reaped:?} after SIGTERM");
    assert!(reaped < Duration::from_secs(10), "{reaped:?}");
    assert_never_asked(fuses);
}

/// Neither `check` nor `serve` sent the hung FUSE a request (each would have hung for good).
fn assert_never_asked(fuses: &[HungFuse]) {
    let ours = std::path::Path::new(env!("CARGO_BIN_EXE_shmlink"));
    for f in fuses {
        assert_eq!(
            f.requests_from(ours),
            Vec::<u32>::new(),
            "requests of {ours:?}"
        );
    }
}

#[test]
fn seventeen_hung_fuse_dev_shm_are_never_entered_and_the_rest_is_measured() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    // One more than the old limit of stuck workers (16), which stopped every measurement.
    let hung: Vec<Container> = (0..17).map(|_| pod_container(&[])).collect();
    let fine = pod_container(&[]);
    let fuses: Vec<HungFuse> = hung
        .iter()
        .map(|c| HungFuse::mount(c.pid, "/dev/shm"))
        .collect();

    let (report, took) = check_within(Duration::from_secs(10));
    println!("check with 17 hung FUSE /dev/shm exited in {took:?}");
    for c in &hung {
        let entry = common::shm_entry(&report, &c.id).expect("the hung container is listed");
        assert_eq!(entry["mounted"], true, "{entry:#}");
        assert_eq!(entry["fs_type"], "fuse", "{entry:#}");
        assert_eq!(entry["size_bytes"], Value::Null, "{entry:#}");
        assert!(
            entry["error"]
                .as_str()
                .is_some_and(|e| e.contains("is a fuse mount, not tmpfs: not measured")),
            "{entry:#}"
        );
    }
    let other = common::shm_entry(&report, &fine.id).expect("the other container");
    assert_eq!(other["size_bytes"], 64u64 << 20, "{other:#}");
    assert!(report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["kind"] == "shm_unmeasured"));

    let (agent, metrics) = serve_three_scans();
    assert_eq!(
        sample(
            &metrics,
            "shmlink_shm_size_bytes",
            &[("container_id", fine.id.as_str())]
        ),
        Some((64u64 << 20) as f64),
        "{metrics}"
    );
    assert_eq!(get(agent.addr, "/healthz").map(|(s, _)| s), Some(200));
    let log = agent.log_text();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("shmlink::shm:") && l.contains(&hung[0].id[..12]))
            .count(),
        1,
        "said once ({}): {log}",
        &hung[0].id[..12]
    );
    stop_never_having_asked(agent, &fuses);
}

#[test]
fn a_hung_fuse_over_a_file_in_a_young_containers_dev_shm_is_not_entered() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    let young = pod_container(&[
        "sh",
        "-c",
        "head -c 1048576 /dev/zero > /dev/shm/nccl-x && touch /tmp/ready && exec sleep 3600",
    ]);
    young.wait_ready();
    let fuse = HungFuse::mount_over_file(young.pid, "/dev/shm/nccl-x");

    let (report, took) = check_within(Duration::from_secs(10));
    println!("check with a hung FUSE over /dev/shm/nccl-x exited in {took:?}");
    let entry = common::shm_entry(&report, &young.id).expect("the young container");
    assert_eq!(entry["size_bytes"], 64u64 << 20, "{entry:#}");
    assert!(
        entry["used_bytes"].as_u64().unwrap() >= 1 << 20,
        "{entry:#}"
    );
    assert_eq!(entry["error"], Value::Null, "{entry:#}");

    let agent = Agent::start(&["--interval", "1s"], &[]);
    agent.wait_ready();
    assert_eq!(get(agent.addr, "/healthz").map(|(s, _)| s), Some(200));
    stop_never_having_asked(agent, &[fuse]);
}

#[test]
fn a_watched_dev_shm_swapped_for_a_hung_fuse_does_not_stop_the_peak_sampler() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    // Both young, so both are watched between scans from the start.
    let swapped = pod_container(&[]);
    let neighbour = pod_container(&[]);
    let agent = Agent::start(&["--interval", "5s"], &[]);
    agent.wait_ready();
    // The sampler has measured both (their tmpfs known) before the swap.
    std::thread::sleep(Duration::from_secs(1));
    let fuse = HungFuse::mount(swapped.pid, "/dev/shm");
    // A 48 MiB burst that lasts a second, between two scans.
    neighbour.sh("head -c 50331648 /dev/zero > /dev/shm/burst && sleep 1 && rm /dev/shm/burst");
    // Sampled between scans (a scan may see it too; the sampler must not be stuck either way).
    agent.wait_for_metrics("the burst's peak", |b| {
        sample(
            b,
            "shmlink_shm_used_peak_bytes",
            &[("container_id", neighbour.id.as_str())],
        )
        .is_some_and(|p| p >= (48u64 << 20) as f64)
    });
    stop_never_having_asked(agent, &[fuse]);
}

#[test]
fn a_hung_fuse_at_a_containers_dev_is_never_looked_in() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    // Looking `shm` up in this /dev would be a request the server reads and never answers.
    let hung = pod_container(&[]);
    let fine = pod_container(&[]);
    let fuse = HungFuse::mount(hung.pid, "/dev");

    let (report, took) = check_within(Duration::from_secs(10));
    println!("check with a hung FUSE at a container's /dev exited in {took:?}");
    let entry = common::shm_entry(&report, &hung.id).expect("the hung container is listed");
    assert_eq!(entry["size_bytes"], Value::Null, "{entry:#}");
    // Never healthy: told as unmeasured.
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "shm_unmeasured" && f.to_string().contains(&hung.id[..12])),
        "{:#}",
        report["findings"]
    );
    assert!(
        entry["error"].as_str().is_some_and(|e| e.contains(
            "the container's /dev is a fuse mount, not a local file system: /dev/shm not measured"
        )),
        "{entry:#}"
    );
    let other = common::shm_entry(&report, &fine.id).expect("the other container");
    assert_eq!(other["size_bytes"], 64u64 << 20, "{other:#}");

    let (agent, _) = serve_three_scans();
    assert_eq!(get(agent.addr, "/healthz").map(|(s, _)| s), Some(200));
    stop_never_having_asked(agent, &[fuse]);
}

/// A process forked from this test into its own container cgroup beside `of`'s (the memory
/// hierarchy), in `of`'s mount namespace, chrooted into `root` there; killed on drop.
struct Chrooted {
    pid: i32,
    id: String,
    cgroup: std::path::PathBuf,
}

impl Chrooted {
    fn start(of: &Container, root: &str) -> Chrooted {
        let id = common::random_container_id();
        let pod = std::path::Path::new(&of.cgroup).parent().unwrap();
        let cgroup = std::path::Path::new("/sys/fs/cgroup/memory")
            .join(pod.strip_prefix("/").unwrap())
            .join(&id);
        std::fs::create_dir(&cgroup).unwrap();
        let c = |s: String| std::ffi::CString::new(s).unwrap();
        let procs = c(cgroup.join("cgroup.procs").display().to_string());
        let ns = c(format!("/proc/{}/ns/mnt", of.pid));
        let root = c(root.to_string());
        // SAFETY: the child makes only async-signal-safe calls (open, write, setns, chroot,
        // pause, _exit) before it is killed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                let ok = fd >= 0
                    && libc::write(fd, c"0".as_ptr().cast(), 1) == 1
                    && libc::setns(libc::open(ns.as_ptr(), libc::O_RDONLY), libc::CLONE_NEWNS) == 0
                    && libc::chroot(root.as_ptr()) == 0;
                if !ok {
                    libc::_exit(1);
                }
                loop {
                    libc::pause();
                }
            }
        }
        let me = Chrooted { pid, id, cgroup };
        let rooted = common::wait_until(Duration::from_secs(5), || {
            std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r.as_os_str() == "/tmp")
        });
        assert!(rooted, "the child did not chroot");
        me
    }
}

impl Drop for Chrooted {
    fn drop(&mut self) {
        // SAFETY: kill and reap this test's own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn a_process_whose_root_is_a_hung_fuse_is_never_looked_in() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    let host = pod_container(&[]);
    // The lookup of `dev` in this root would be a request never answered. (The chroot's own
    // permission check is answered, and is this test's, not the agent's.)
    let fuse = HungFuse::mount_chrootable(host.pid, "/tmp");
    let chrooted = Chrooted::start(&host, "/tmp");

    let (report, took) = check_within(Duration::from_secs(10));
    println!("check with a process rooted in a hung FUSE exited in {took:?}");
    let entry = common::shm_entry(&report, &chrooted.id).expect("the chrooted process's container");
    assert_eq!(entry["size_bytes"], Value::Null, "{entry:#}");
    assert!(
        entry["error"].as_str().is_some_and(|e| e.contains(
            "the container's / is a fuse mount, not a local file system: /dev/shm not measured"
        )),
        "{entry:#}"
    );
    let other = common::shm_entry(&report, &host.id).expect("the container beside it");
    assert_eq!(other["size_bytes"], 64u64 << 20, "{other:#}");

    let (agent, _) = serve_three_scans();
    stop_never_having_asked(agent, &[fuse]);
    drop(chrooted);
}

/// The mount ID of what is mounted at /dev/shm in `pid`'s mount namespace (the topmost).
fn shm_mount_id(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    text.lines()
        .filter(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .next_back()
}

#[test]
fn a_dev_shm_its_container_swaps_for_a_hung_fuse_at_the_same_mount_id_is_never_asked() {
    if !common::e2e_available() || !common::fuse::available() {
        return;
    }
    // Young: watched between scans by the peak sampler too, which also keeps its tmpfs's ID.
    let c = pod_container(&[]);
    let agent = Agent::start(&["--interval", "200ms"], &[]);
    agent.wait_ready();
    let measured = |agent: &Agent| {
        agent.wait_for_metrics("its /dev/shm measured", |b| {
            sample(
                b,
                "shmlink_shm_size_bytes",
                &[("container_id", c.id.as_str())],
            )
            .is_some()
        });
        // A few more scans and samples: the mount is in every cache.
        let s0 = agent.scans("shm");
        assert!(common::wait_until(Duration::from_secs(10), || {
            agent.scans("shm") >= s0 + 3.0
        }));
    };
    measured(&agent);
    // Its /dev/shm unmounted and a FUSE mounted there at once: the kernel hands the freed ID
    // to the next mount. Another test's mount can take it first: then the tmpfs comes back,
    // is measured, and the swap is made again.
    let mut fuses = Vec::new();
    let mut reused = false;
    for _ in 0..3 {
        let before = shm_mount_id(c.pid).expect("a /dev/shm");
        fuses.push(HungFuse::replace(c.pid, "/dev/shm"));
        if shm_mount_id(c.pid) == Some(before) {
            reused = true;
            break;
        }
        drop(fuses.pop());
        common::fuse::mount_tmpfs(c.pid, "/dev/shm");
        measured(&agent);
    }
    assert!(reused, "the FUSE never got the tmpfs's mount ID");
    // Scans go on, and the container is no longer measured.
    let s0 = agent.scans("shm");
    agent.wait_for_metrics("scans go on without measuring the FUSE", |b| {
        scans_in(b, "shm").is_some_and(|n| n >= s0 + 5.0)
            && sample(
                b,
                "shmlink_shm_size_bytes",
                &[("container_id", c.id.as_str())],
            )
            .is_none()
    });
    stop_never_having_asked(agent, &fuses);
}

//! Containers that work against the agent: /dev/shm that is not a tmpfs, 10,000 mounts (stacked
//! on /dev/shm itself), names full of quotes, backslashes and newlines, processes that keep
//! moving to new mount namespaces. The agent must stay correct for every other container, keep
//! its exposition valid, and never open anything for writing.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::{sample, scans_in, Agent};
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec, Shm};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A container on the runtime default with `mib` MiB in its /dev/shm: the bystander whose
/// figures must stay right whatever its neighbours do.
fn bystander(mib: u64) -> Container {
    let c = Container::start(ContainerSpec {
        args: common::write_then_sleep(mib),
        ..ContainerSpec::default()
    });
    c.wait_ready();
    c
}

fn assert_bystander_right(report: &Value, c: &Container, mib: u64) {
    let e = common::shm_entry(report, &c.id)
        .unwrap_or_else(|| panic!("bystander missing:\n{report:#}"));
    assert_eq!(e["size_bytes"], 64 * MIB, "{e:#}");
    assert_eq!(e["used_bytes"], mib * MIB, "{e:#}");
}

/// Runs `f` on a thread that has joined the mount namespace of `pid` (the test process itself
/// stays where it is).
fn in_mount_namespace_of<T: Send + 'static>(pid: i32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // setns into a mount namespace needs a thread that shares no fs state.
        // SAFETY: CLONE_FS only: this thread stops sharing cwd and root with the others, which
        // nothing else on it relies on.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }
            .expect("unshare(CLONE_FS)");
        let ns = fs::File::open(format!("/proc/{pid}/ns/mnt")).expect("the container's mnt ns");
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&ns),
            Some(rustix::thread::LinkNameSpaceType::Mount),
        )
        .expect("setns");
        f()
    })
    .join()
    .expect("the namespace thread")
}

/// A container whose /dev/shm is a directory of the host's ext4 root file system, bind-mounted.
fn on_disk_dev_shm() -> (tempfile::TempDir, Container) {
    let dir = tempfile::Builder::new()
        .prefix("shmlink-e2e-disk-")
        .tempdir_in("/var/tmp")
        .unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
    let c = Container::start(ContainerSpec {
        shm: Shm::Bind(dir.path().to_path_buf()),
        ..ContainerSpec::default()
    });
    (dir, c)
}

#[test]
fn dev_shm_that_is_not_a_tmpfs_is_reported_as_what_it_is() {
    if !common::e2e_available() {
        return;
    }
    let keep = bystander(3);
    let (_dir, odd) = on_disk_dev_shm();
    let report = common::run_check_json(&[]);
    let e = common::shm_entry(&report, &odd.id).unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(e["mounted"], true, "{e:#}");
    assert_ne!(e["fs_type"], "tmpfs", "{e:#}");
    assert_bystander_right(&report, &keep, 3);
}

#[test]
fn ten_thousand_mounts_stacked_on_dev_shm_are_read_right_and_fast() {
    if !common::e2e_available() {
        return;
    }
    let keep = bystander(2);
    let c = Container::start(ContainerSpec::default());
    // 10,000 tmpfs mounts over one another at /dev/shm, the last of 1 MiB: what a process there
    // sees is the top one.
    let mounted = in_mount_namespace_of(c.pid, || {
        let mut n = 0;
        for i in 0..10_000u32 {
            let size = if i == 9_999 { "size=1m" } else { "size=2m" };
            let data = std::ffi::CString::new(size).unwrap();
            if rustix::mount::mount(
                "hostile",
                "/dev/shm",
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                Some(data.as_c_str()),
            )
            .is_ok()
            {
                n += 1;
            }
        }
        n
    });
    assert_eq!(mounted, 10_000);
    let lines = fs::read_to_string(format!("/proc/{}/mountinfo", c.pid))
        .unwrap()
        .lines()
        .count();
    assert!(lines > 10_000, "{lines}");

    let started = Instant::now();
    let report = common::run_check_json(&[]);
    let took = started.elapsed();
    eprintln!("check with a 10,000-mount container: {took:?} ({lines} mountinfo lines)");
    let e = common::shm_entry(&report, &c.id).unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(e["size_bytes"], MIB, "{e:#}");
    assert_bystander_right(&report, &keep, 2);
    // A debug build, a loaded machine: still nowhere near a scan interval.
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Quotes, backslashes and newlines in every name the agent puts in a label: the cgroup leaf
/// (a plain container's ID) and the Pod's namespace, name and container name from the API.
#[test]
fn names_with_quotes_backslashes_and_newlines_keep_the_exposition_valid() {
    if !common::e2e_available() {
        return;
    }
    let Some(promtool) = common::tool("promtool", "prometheus") else {
        return;
    };
    // A process in a mount namespace of its own, in a cgroup whose name is hostile.
    // (cgroupfs refuses a newline in a name; the Pod's names below carry newlines.)
    let weird_leaf = "we\"ird\\leaf name";
    let cg_dir = Path::new("/sys/fs/cgroup/memory/shmlink-e2e").join(weird_leaf);
    fs::create_dir_all(&cg_dir).unwrap();
    let mut loner = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    fs::write(cg_dir.join("cgroup.procs"), loner.id().to_string()).unwrap();

    // A Pod whose names the API server hands over unchecked.
    let api = FakeApi::start();
    let uid = common::random_pod_uid();
    let id = common::random_container_id();
    api.apply_pod(pod(
        "hostile-node",
        "ns\"q",
        "pod\\name\nx",
        &uid,
        &[("c\"\\\n", id.as_str())],
    ));
    let _c = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        ..ContainerSpec::default()
    });
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start(
        &["--kube", "on", "--node-name", "hostile-node", "--no-gpu"],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    agent.wait_ready();
    let body = agent.wait_for_metrics("the hostile names", |b| {
        b.contains("pod=\"pod\\\\name\\nx\"") && b.contains("we\\\"ird\\\\leaf name")
    });
    assert!(body.contains("namespace=\"ns\\\"q\""), "{body}");
    assert!(body.contains("container=\"c\\\"\\\\\\n\""), "{body}");

    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(check.stdin.as_mut().unwrap(), body.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // Exit 1 is a parse error. Exit 3 is lint only: promtool reads the Prometheus text format,
    // where an OpenMetrics counter's `_total` sample has no HELP line of its own name.
    let lint_only = said
        .lines()
        .all(|l| l.trim().is_empty() || l.ends_with("_total no help text"));
    assert!(
        out.status.success() || (out.status.code() == Some(3) && lint_only),
        "promtool check metrics: {:?}\n{said}",
        out.status
    );
    eprintln!(
        "promtool check metrics: {:?} {}",
        out.status.code(),
        said.trim()
    );

    assert!(agent.terminate().success());
    let _ = loner.kill();
    let _ = loner.wait();
    let _ = fs::remove_dir(&cg_dir);
}

/// Processes of one cgroup that keep leaving for new mount namespaces and exiting, scanned
/// every 200 ms: no errors counted, nothing reported wrong for the others.
#[test]
fn processes_that_change_mount_namespace_mid_scan_disturb_nothing() {
    if !common::e2e_available() {
        return;
    }
    let keep = bystander(4);
    let cg_dir = Path::new("/sys/fs/cgroup/memory/shmlink-e2e")
        .join(format!("flipper-{}", std::process::id()));
    fs::create_dir_all(&cg_dir).unwrap();
    let mut flipper = Command::new("sh")
        .args([
            "-c",
            "while :; do unshare -m true; unshare -m sleep 0.01; done",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    fs::write(cg_dir.join("cgroup.procs"), flipper.id().to_string()).unwrap();

    let agent = Agent::start(&["--no-gpu"], &[]);
    agent.wait_ready();
    let errors = |b: &str| sample(b, "shmlink_scan_errors_total", &[("collector", "shm")]);
    let started = Instant::now();
    let mut scrapes = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let body = agent.metrics();
        assert_eq!(
            sample(
                &body,
                "shmlink_shm_used_bytes",
                &[("container_id", &keep.id)]
            ),
            Some((4 * MIB) as f64),
            "{body}"
        );
        assert_eq!(errors(&body), Some(0.0), "{body}");
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(scrapes > 10);
    assert!(agent.terminate().success());
    let _ = flipper.kill();
    let _ = flipper.wait();
    // Children of the loop may still be exiting.
    common::wait_until(Duration::from_secs(5), || fs::remove_dir(&cg_dir).is_ok());
}

/// `check` under strace, among containers: every open is read-only, and every path into a
/// container's root is resolved beneath it (RESOLVE_IN_ROOT), never through a plain open.
#[test]
fn the_agent_opens_nothing_for_writing_and_nothing_through_a_container_root_unguarded() {
    if !common::e2e_available() {
        return;
    }
    let Some(strace) = common::tool("strace", "strace") else {
        return;
    };
    let _keep = bystander(1);
    let _other = Container::start(ContainerSpec {
        shm: Shm::HostIpc,
        ..ContainerSpec::default()
    });
    // serve's store, live: `check --since` reads it, and SQLite opens a live store's -wal and
    // -shm read-write to read it (WAL's shared index); it may create nothing there. The store
    // is the test's own, made by a `serve` that runs through the check (not the machine's
    // /var/lib/shmlink, which a test neither reads nor relies on).
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path();
    let serve = Agent::start(
        &["--no-gpu", "--state-dir", state_dir.to_str().unwrap()],
        &[],
    );
    serve.wait_ready();
    assert!(
        common::wait_until(Duration::from_secs(10), || state_dir
            .join("state.sqlite3-wal")
            .exists()),
        "serve's store is live (WAL): {:?}",
        fs::read_dir(state_dir).map(|d| d.count())
    );
    let listing = || {
        let mut names: Vec<_> = fs::read_dir(state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let trace = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(strace)
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=open,openat,openat2,creat,truncate,mkdir,unlink,rename,renameat2",
            "-o",
        ])
        .arg(trace.path())
        .args([
            common::shmlink_bin(),
            "check",
            "--json",
            "--no-gpu",
            "--state-dir",
        ])
        .arg(state_dir)
        .output()
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    let calls = fs::read_to_string(trace.path()).unwrap();
    assert!(
        calls.contains(&format!("\"{}/state.sqlite3\"", state_dir.display())),
        "check read serve's store:\n{calls}"
    );
    let (mut opens, mut guarded) = (0, 0);
    for line in calls.lines() {
        if line.contains("+++") || line.contains("---") {
            continue;
        }
        opens += 1;
        for bad in ["creat(", "truncate(", "mkdir(", "unlink(", "rename("] {
            assert!(!line.contains(bad), "{line}");
        }
        let live_store = ["state.sqlite3-wal\"", "state.sqlite3-shm\""]
            .iter()
            .any(|f| line.contains(&format!("\"{}/{f}", state_dir.display())));
        for bad in ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC"] {
            assert!(
                !line.contains(bad) || live_store && !line.contains("O_TRUNC"),
                "opened for writing: {line}"
            );
        }
        assert!(
            !through_a_container_root(line),
            "a path through a container root, resolved by the kernel against ours: {line}"
        );
        // A container's /dev/shm is walked a component at a time (`dev`, then `shm`, each
        // O_NOFOLLOW from a descriptor; asked of the kernel's caches first, openat2's
        // RESOLVE_CACHED); other paths beneath a root go through openat2.
        let step = (line.contains("openat(") || line.contains("openat2("))
            && !line.contains("AT_FDCWD")
            && (line.contains(", \"dev\",") || line.contains(", \"shm\","))
            && line.contains("O_NOFOLLOW");
        guarded +=
            usize::from(step || line.contains("openat2(") && line.contains("RESOLVE_IN_ROOT"));
    }
    assert_eq!(
        listing(),
        before,
        "check made or removed files in {}",
        state_dir.display()
    );
    assert!(opens > 10, "{calls}");
    assert!(
        guarded >= 2,
        "no guarded open beneath a container root:\n{calls}"
    );
}

/// A quoted path of the form `/proc/<pid>/root/...`.
fn through_a_container_root(line: &str) -> bool {
    line.split('"').skip(1).step_by(2).any(|path| {
        path.strip_prefix("/proc/")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(pid, rest)| {
                pid.bytes().all(|b| b.is_ascii_digit()) && rest.starts_with("root/")
            })
    })
}

/// A container whose /dev/shm is no tmpfs (so the scan reads its mountinfo for the type) and
/// which stacks 6,000 bind mounts on a 3.5 KB path: about 41 MiB of mountinfo, as any pod that
/// may create a user namespace can make. `check` reads it through a bounded buffer, stops at
/// 4 MiB, and its peak RSS stays small; the bystander's figures stay right.
#[test]
fn six_thousand_long_mounts_do_not_blow_checks_memory() {
    if !common::e2e_available() {
        return;
    }
    let keep = bystander(2);
    let (_dir, odd) = on_disk_dev_shm();
    let (_, baseline) = check_peak_rss();
    let serve_baseline = serve_peak_rss();
    let mounted = in_mount_namespace_of(odd.pid, || {
        // /tmp/aaaa.../aaaa... : 14 levels of 250 bytes.
        let mut long = std::path::PathBuf::from("/tmp");
        for _ in 0..14 {
            long.push("a".repeat(250));
        }
        fs::create_dir_all(&long).expect("the long path");
        let mut n = 0;
        for _ in 0..6000 {
            if rustix::mount::mount_bind(&long, &long).is_err() {
                break;
            }
            n += 1;
        }
        n
    });
    assert_eq!(mounted, 6000);
    // Counted through a small buffer: a child's peak RSS (wait4's) starts from its parent's at
    // the spawn, so a test that held the 40 MiB file would see it in check's figure.
    let size = fs::File::open(format!("/proc/{}/mountinfo", odd.pid))
        .and_then(|f| std::io::copy(&mut std::io::BufReader::new(f), &mut std::io::sink()))
        .unwrap_or(0) as usize;
    let (out, peak_mib) = check_peak_rss();
    let serve_peak = serve_peak_rss();
    eprintln!(
        "beside a container with {} MiB of mountinfo: check's peak RSS {peak_mib:.1} MiB \
         (without those mounts: {baseline:.1} MiB), serve's after three scans {serve_peak:.1} MiB \
         (without: {serve_baseline:.1} MiB)",
        size >> 20
    );
    assert!(
        serve_peak < serve_baseline + 8.0,
        "serve's peak RSS {serve_peak:.1} MiB, {serve_baseline:.1} without the mounts"
    );
    assert!(size > 30 << 20, "{size}");
    // The file is 40 MiB: read whole it cost at least as much again (115 MB before, when it was
    // read whole and kept). Streamed, the heap does not grow.
    assert!(
        peak_mib < baseline + 8.0,
        "peak RSS {peak_mib:.1} MiB, {baseline:.1} without the mounts"
    );
    let report: Value = serde_json::from_slice(&out).unwrap();
    assert_bystander_right(&report, &keep, 2);
    let e = common::shm_entry(&report, &odd.id).unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(e["mounted"], true, "{e:#}");
}

/// serve's peak RSS in MiB after three scans.
fn serve_peak_rss() -> f64 {
    let agent = Agent::start(&["--no-gpu"], &[]);
    agent.wait_ready();
    agent.wait_for_metrics("three scans", |b| {
        scans_in(b, "shm").is_some_and(|n| n >= 3.0)
    });
    let peak = common::peak_rss_of(agent.pid());
    assert!(agent.terminate().success());
    peak
}

/// `check --json`'s output and peak RSS in MiB.
fn check_peak_rss() -> (Vec<u8>, f64) {
    common::output_and_peak_rss(Command::new(common::shmlink_bin()).args([
        "check",
        "--json",
        "--no-gpu",
        "--kmsg",
        "off",
        "--pod-log-root",
        "off",
    ]))
}

//! `shmlink check` on a plain Docker host, against a real engine (tests/common/docker.rs):
//! what `docker run`'s /dev/shm options give a container, a failure line in a real json-file
//! log, and the deaths that print nothing, told from Docker's own record (`OOMKilled`, exit
//! 135) and, for the OOM kill, from the kernel's report: one failure each.

mod common;

use std::path::Path;

use common::docker::{Dockerd, IMAGE};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn check(d: &Dockerd, kmsg: &str) -> Value {
    let root = d.data_root();
    common::run_check_json(&[
        "--kube",
        "off",
        "--pod-log-root",
        "off",
        "--docker-root",
        &root.to_string_lossy(),
        "--kmsg",
        kmsg,
        "--since",
        "10m",
    ])
}

fn failures_of<'a>(report: &'a Value, name: &str) -> Vec<&'a Value> {
    report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["container"] == name)
        .collect()
}

#[test]
fn check_on_a_real_docker_engine() {
    let Some(d) = Dockerd::start() else { return };
    let python = Path::new("/usr/bin/python3").exists();
    if !python && std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("/usr/bin/python3 is missing (apt-get install python3): the SIGBUS case needs it");
    }

    let shm256 = d.run(&[
        "--name",
        "shm256",
        "--shm-size=256m",
        "--memory=256m",
        IMAGE,
        "sleep",
        "300",
    ]);
    let default = d.run(&["--name", "default", IMAGE, "sleep", "300"]);
    let host = d.run(&["--name", "hostipc", "--ipc=host", IMAGE, "sleep", "300"]);
    let owner = d.run(&["--name", "owner", "--ipc=shareable", IMAGE, "sleep", "300"]);
    let joiner = d.run(&[
        "--name",
        "joiner",
        "--ipc=container:owner",
        IMAGE,
        "sleep",
        "300",
    ]);
    // The joiner writes into the /dev/shm it shares with its owner.
    let out = d.docker(&[
        "exec",
        "joiner",
        "dd",
        "if=/dev/zero",
        "of=/dev/shm/shared",
        "bs=1M",
        "count=8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logger = d.run(&[
        "--name",
        "logger",
        IMAGE,
        "sh",
        "-c",
        "echo 'RuntimeError: unable to allocate shared memory(shm) for file </torch_13_1_0>: \
         No space left on device (28)'; sleep 300",
    ]);
    // The emptyDir mistake in Docker's words: /dev/shm larger than the memory limit.
    let oomk = d.run(&[
        "--name",
        "oomk",
        "--memory=64m",
        "--shm-size=1g",
        IMAGE,
        "dd",
        "if=/dev/zero",
        "of=/dev/shm/a",
        "bs=1M",
        "count=200",
    ]);
    assert_eq!(d.wait(&oomk), 137);
    assert_eq!(d.inspect(&oomk, "{{.State.OOMKilled}}"), "true");
    let bus = python.then(|| {
        // A 100 MiB shared_memory block on the default 64 MiB /dev/shm: a real SIGBUS.
        let id = d.run(&[
            "--name",
            "bus",
            "-v",
            "/usr:/usr:ro",
            "-v",
            "/lib:/lib:ro",
            "-v",
            "/lib64:/lib64:ro",
            IMAGE,
            "/usr/bin/python3",
            "-c",
            "from multiprocessing import shared_memory\n\
             b = shared_memory.SharedMemory(create=True, size=100 << 20)\n\
             b.buf[:] = b'\\1' * (100 << 20)\n",
        ]);
        assert_eq!(d.wait(&id), 135, "{}", d.log());
        id
    });
    // The json-file log has the line before check reads it.
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || {
            d.docker(&["logs", "logger"])
                .stdout
                .starts_with(b"RuntimeError")
        }
    ));

    let kernel = if common::kmsg_readable() {
        "/dev/kmsg"
    } else {
        "off"
    };
    let report = check(&d, kernel);
    let shm = |id: &str| {
        common::shm_entry(&report, id)
            .unwrap_or_else(|| panic!("no shm entry for {id}: {report:#}"))
    };

    // --shm-size and --memory as given; the default 64 MiB; the host's /dev/shm.
    let s = shm(&shm256);
    assert_eq!(s["container"], "shm256", "named by --name: {s:#}");
    assert_eq!(s["image"], IMAGE);
    assert_eq!(s["size_bytes"], 256 * MIB);
    assert_eq!(s["memory_limit_bytes"], 256 * MIB);
    assert_eq!(shm(&default)["size_bytes"], 64 * MIB);
    assert_eq!(shm(&default)["host_ipc"], false);
    assert_eq!(shm(&host)["host_ipc"], true);
    // --ipc=container:owner: one /dev/shm, seen the same from both.
    for id in [&owner, &joiner] {
        assert_eq!(shm(id)["size_bytes"], 64 * MIB);
        assert_eq!(shm(id)["used_bytes"], 8 * MIB, "{:#}", shm(id));
    }

    // A failure line in a real json-file log, named by --name.
    let line = failures_of(&report, "logger");
    assert_eq!(line.len(), 1, "{report:#}");
    assert_eq!(line[0]["kind"], "shm_allocation_failed");
    assert_eq!(line[0]["container_id"], logger.as_str());
    assert!(line[0]["message"]
        .as_str()
        .unwrap()
        .contains("docker run --shm-size"));

    // The OOM kill: with the kernel log, one failure with the kernel's numbers, although
    // Docker's record tells it too.
    let kill = failures_of(&report, "oomk");
    assert_eq!(kill.len(), 1, "one failure: {kill:#?}");
    if kernel == "/dev/kmsg" {
        assert_eq!(kill[0]["kind"], "shm_oom_killed", "{:#}", kill[0]);
        assert_eq!(kill[0]["source"], "kernel");
        assert_eq!(kill[0]["memory"]["source"], "kernel_log");
        assert_eq!(kill[0]["memory"]["limit_bytes"], 64 * MIB);
        let shm_bytes = kill[0]["memory"]["shm_bytes"].as_u64().unwrap();
        assert!(
            shm_bytes >= 48 * MIB,
            "/dev/shm was most of it: {:#}",
            kill[0]
        );
        assert!(kill[0]["message"]
            .as_str()
            .unwrap()
            .contains("give docker run --memory room for --shm-size"));
    }
    if let Some(bus) = &bus {
        let died = failures_of(&report, "bus");
        assert_eq!(died.len(), 1, "{report:#}");
        assert_eq!(died[0]["kind"], "workload_bus_error");
        assert_eq!(died[0]["source"], "docker");
        assert_eq!(died[0]["container_id"], bus.as_str());
        assert!(
            died[0]["message"]
                .as_str()
                .unwrap()
                .contains("exit status 135 (SIGBUS)"),
            "{:#}",
            died[0]
        );
    }
    // Nobody else died.
    for name in ["shm256", "default", "hostipc", "owner", "joiner"] {
        assert!(failures_of(&report, name).is_empty(), "{name}: {report:#}");
    }

    // Without the kernel log, Docker's record alone: an OOM kill, what filled it not known.
    let report = check(&d, "off");
    let kill = failures_of(&report, "oomk");
    assert_eq!(kill.len(), 1, "{report:#}");
    assert_eq!(kill[0]["kind"], "workload_oom_killed");
    assert_eq!(kill[0]["source"], "docker");
    assert_eq!(kill[0]["memory"]["source"], "docker");
    assert_eq!(kill[0]["memory"]["limit_bytes"], 64 * MIB);
    assert!(kill[0]["memory"]["shm_bytes"].is_null());
    let message = kill[0]["message"].as_str().unwrap();
    assert!(
        message.contains("what filled the memory is not known"),
        "{message}"
    );
}

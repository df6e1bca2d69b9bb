//! `shmlink check` and `serve` on a plain Docker host, against a real engine
//! (tests/common/docker.rs): what `docker run`'s /dev/shm options give a container, a failure
//! line in a real json-file log, the deaths that print nothing, told from Docker's own record
//! (`OOMKilled`, exit 135) and, for the OOM kill, from the kernel's report: one failure each,
//! named as Docker names it; and a container given GPUs on Docker's 64 MiB default.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::docker::{Dockerd, IMAGE};
use common::promtext::samples;
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
        let id = d.run_python(
            "bus",
            "from multiprocessing import shared_memory\n\
             b = shared_memory.SharedMemory(create=True, size=100 << 20)\n\
             b.buf[:] = b'\\1' * (100 << 20)\n",
        );
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
        // check reads Docker's record after the fact: /dev/shm was not read at the moment.
        assert_eq!(died[0]["kind"], "bus_error_unmeasured");
        assert_eq!(died[0]["source"], "docker");
        assert_eq!(died[0]["container_id"], bus.as_str());
        assert!(
            died[0]["message"]
                .as_str()
                .unwrap()
                .contains("died of a bus error (SIGBUS, exit status 135)"),
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

/// The `shm_runtime_default` findings of a `check --json` report, by their subject.
fn runtime_default_subjects(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "shm_runtime_default")
        .map(|f| format!("{} {}", f["subject"], f["message"]))
        .collect()
}

/// `shmlink_workload_failures_total` series naming `id`, as (container label, kind, value).
fn failure_series(metrics: &str, id: &str) -> Vec<(String, String, f64)> {
    samples(metrics)
        .filter(|s| s.name == "shmlink_workload_failures_total")
        .filter(|s| s.label("container_id") == Some(id))
        .map(|s| {
            let label = |k| s.label(k).unwrap_or_default().to_string();
            (label("container"), label("kind"), s.value)
        })
        .collect()
}

#[test]
fn serve_and_check_name_docker_containers_and_their_gpus() {
    let Some(d) = Dockerd::start() else { return };
    let root = d.data_root().to_string_lossy().to_string();
    // With the kernel log where it can be read: the OOM kill is then the kernel's report of a
    // cgroup, which must carry the Docker name all the same.
    let kernel = if common::kmsg_readable() {
        "/dev/kmsg"
    } else {
        "off"
    };
    let agent = Agent::start(&["--no-gpu", "--docker-root", &root, "--kmsg", kernel], &[]);
    // And from Docker's records alone (with the memory cgroups' OOM counters).
    let records_only = Agent::start(&["--no-gpu", "--docker-root", &root, "--kmsg", "off"], &[]);
    agent.wait_ready();
    records_only.wait_ready();

    // Given GPUs (no GPU needed: only the record says so) on the default, on 1 GiB, and none.
    let gpu_env = ["-e", "NVIDIA_VISIBLE_DEVICES=all"];
    let on_default = d.run(
        &[
            &["--name", "gpudefault"][..],
            &gpu_env,
            &[IMAGE, "sleep", "300"],
        ]
        .concat(),
    );
    let sized = d.run(
        &[
            &["--name", "gpubig", "--shm-size=1g"][..],
            &gpu_env,
            &[IMAGE, "sleep", "300"],
        ]
        .concat(),
    );
    let plain = d.run(&["--name", "nogpu", IMAGE, "sleep", "300"]);
    let voided = d.run(&[
        "--name",
        "gpuvoid",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=void",
        IMAGE,
        "sleep",
        "300",
    ]);

    // Deaths that print nothing, of containers that live about 1.5 s: a SIGBUS (a child shell
    // killed by it; the shell exits with its status) and an OOM kill (/dev/shm filled past
    // --memory).
    let bus = d.run(&[
        "--name",
        "shortbus",
        IMAGE,
        "sh",
        "-c",
        "sleep 1; sh -c 'kill -BUS $$'; exit $?",
    ]);
    let oom = d.run(&[
        "--name",
        "shortoom",
        "--memory=32m",
        "--memory-swap=32m",
        "--shm-size=256m",
        IMAGE,
        "sh",
        "-c",
        "sleep 1; dd if=/dev/zero of=/dev/shm/fill bs=1M count=200",
    ]);
    // PyTorch's two lines of one DataLoader death, microseconds apart: one failure.
    let loader = d.run(&[
        "--name",
        "twolines",
        IMAGE,
        "sh",
        "-c",
        "echo 'ERROR: Unexpected bus error encountered in worker. This might be caused by \
         insufficient shared memory (shm).' >&2; echo 'RuntimeError: DataLoader worker (pid \
         3527) is killed by signal: Bus error.' >&2; exit 1",
    ]);
    assert_eq!(d.wait(&loader), 1, "{}", d.log());
    assert_eq!(d.wait(&bus), 135, "{}", d.log());
    let bus_ended = Instant::now();
    assert_eq!(d.wait(&oom), 137);
    let oom_ended = Instant::now();
    assert_eq!(d.inspect(&oom, "{{.State.OOMKilled}}"), "true");

    // serve tells each from Docker's record within a couple of seconds, by its Docker name.
    for (id, name, ended, kinds) in [
        (
            &bus,
            "shortbus",
            bus_ended,
            &["bus_error_unmeasured", "shm_bus_error"][..],
        ),
        (
            &oom,
            "shortoom",
            oom_ended,
            &["workload_oom_killed", "shm_oom_killed"][..],
        ),
    ] {
        for agent in [&agent, &records_only] {
            let metrics = agent.wait_for_metrics_within(name, Duration::from_secs(10), |m| {
                !failure_series(m, id).is_empty()
            });
            let told_after = ended.elapsed();
            let series = failure_series(&metrics, id);
            assert_eq!(series.len(), 1, "one failure of {name}: {series:?}");
            let (container, kind, value) = &series[0];
            assert_eq!(container, name, "named by --name: {series:?}");
            assert!(kinds.contains(&kind.as_str()), "{name}: {kind}");
            assert_eq!(*value, 1.0);
            eprintln!("{name}: {kind} told by serve {told_after:?} after docker wait returned");
            assert!(
                told_after < Duration::from_secs(4),
                "{name}: {told_after:?}"
            );
        }
    }

    // serve's log: the GPU container on the default, and none of the others.
    let said_at_all = common::wait_until(Duration::from_secs(5), || {
        agent.log_text().contains("shm_runtime_default")
    });
    assert!(said_at_all, "{}", agent.log_text());
    let log = agent.log_text();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("shm_runtime_default") && l.contains("began"))
        .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(
        said[0].contains("gpudefault") && said[0].contains("--shm-size"),
        "{}",
        said[0]
    );

    // check says the same: the finding for the one container, and the deaths by name with the
    // kinds serve counted, from the same sources.
    let report = check(&d, kernel);
    let without_kernel = check(&d, "off");
    let found = runtime_default_subjects(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("gpudefault"), "{}", found[0]);
    assert!(
        found[0].contains("--ipc=host") && !found[0].contains("emptyDir"),
        "{}",
        found[0]
    );
    for id in [&on_default, &sized, &plain, &voided] {
        assert!(common::shm_entry(&report, id).is_some(), "{id}: {report:#}");
    }
    let metrics = agent.metrics();
    // The live containers' shm series carry their Docker names too.
    for (id, name) in [(&on_default, "gpudefault"), (&plain, "nogpu")] {
        let labels = [("container", name), ("container_id", id.as_str())];
        let size = common::agent::sample(&metrics, "shmlink_shm_size_bytes", &labels);
        assert_eq!(size, Some((64 * MIB) as f64), "{name}: {metrics}");
    }
    let records_metrics = records_only.metrics();
    for (pass, report, metrics) in [
        ("with the kernel log", &report, &metrics),
        ("records only", &without_kernel, &records_metrics),
    ] {
        let told = failures_of(report, "twolines");
        assert_eq!(told.len(), 1, "one death, one failure: {told:#?}");
        assert_eq!(told[0]["kind"], "shm_allocation_failed");
        let counted = failure_series(metrics, &loader);
        assert_eq!(counted.len(), 1, "{counted:?}");
        assert_eq!(counted[0].2, 1.0, "{counted:?}");
        for (id, name) in [(&bus, "shortbus"), (&oom, "shortoom")] {
            let told = failures_of(report, name);
            assert_eq!(told.len(), 1, "{report:#}");
            assert_eq!(told[0]["container_id"], id.as_str());
            let counted = failure_series(metrics, id);
            // Without the kernel log, check (arriving after the death) knows the memory split
            // only from what it measured, and a container that lived 1 s was never measured by
            // it; serve may have sampled its /dev/shm full. Where check did not know, it must say
            // so rather than blame /dev/shm; where it knew, both agree. (The state store of
            // issue 38 gives check what serve saw.)
            let unknown = told[0]["memory"]["shm_bytes"].is_null() && pass == "records only";
            if unknown && told[0]["kind"] != counted[0].1.as_str() {
                assert_eq!(told[0]["kind"], "workload_oom_killed", "{name}");
                assert!(
                    told[0]["message"]
                        .as_str()
                        .unwrap()
                        .contains("is not known"),
                    "{name}: {:#}",
                    told[0]
                );
            } else {
                assert_eq!(
                    told[0]["kind"],
                    counted[0].1.as_str(),
                    "{name} ({pass}): check told {:#}",
                    told[0]
                );
            }
        }
    }
}

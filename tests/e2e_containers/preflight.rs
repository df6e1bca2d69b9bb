//! `shmlink preflight` end to end: the binary runs INSIDE real runc containers (the host's
//! binary directory and shared libraries bound read-only into the busybox rootfs, the
//! container's own cgroups at /sys/fs/cgroup as Docker and containerd mount them), against the
//! container's own /dev/shm, memory limit and, through the fake NVML, GPUs.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::fake_nvml::{self, FakeNvml};
use common::{cgroup_mount, ro_bind, Container, ContainerSpec, HostTmpfs, Shm};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Where the host's target/<profile> directory (shmlink, libfake_nvml.so) appears.
const BIN_DIR: &str = "/shmlink";
const NVML_DIR: &str = "/nvml";

/// The mounts a glibc binary from the host needs in the busybox rootfs, plus the container's
/// cgroups and the build directory.
fn mounts(extra: &[(&Path, &str)]) -> Vec<Value> {
    let bin_dir = Path::new(common::shmlink_bin()).parent().unwrap();
    let mut m = vec![
        ro_bind("/usr/lib", "/usr/lib"),
        ro_bind("/usr/lib", "/lib"),
        ro_bind("/usr/lib64", "/lib64"),
        ro_bind(bin_dir, BIN_DIR),
        cgroup_mount(),
    ];
    m.extend(extra.iter().map(|(src, dst)| ro_bind(src, dst)));
    m
}

fn start(shm: Shm, memory_limit: Option<u64>, extra: &[(&Path, &str)]) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        shm,
        memory_limit: memory_limit.map(|l| l as i64),
        extra_mounts: mounts(extra),
        ..ContainerSpec::default()
    })
}

/// `env VARS... shmlink preflight ARGS...` in the container, timed.
fn preflight(c: &Container, env: &[&str], args: &[&str]) -> Output {
    let bin = format!("{BIN_DIR}/shmlink");
    let mut cmd = vec!["/bin/busybox", "env"];
    cmd.extend_from_slice(env);
    cmd.push(&bin);
    cmd.push("preflight");
    cmd.extend_from_slice(args);
    let started = std::time::Instant::now();
    let out = c.exec(&cmd);
    let took = started.elapsed();
    assert!(
        took.as_secs_f64() < 5.0,
        "preflight (with runc exec) took {took:?}"
    );
    out
}

fn show(what: &str, out: &Output) {
    println!(
        "---- {what}: exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What preflight printed, once its exit code is `code`.
fn said(out: &Output, code: i32) -> String {
    let t = text(out);
    assert_eq!(out.status.code(), Some(code), "{t}");
    t
}

#[test]
fn the_runtime_default_64mi_fails_a_1gi_need_with_the_docker_fix() {
    if !common::e2e_available() {
        return;
    }
    let c = start(Shm::RuntimeDefault, None, &[]);
    let out = preflight(&c, &[], &["--no-gpu", "--min-shm", "1Gi"]);
    show("runtime default /dev/shm, --min-shm 1Gi (Docker)", &out);
    let t = said(&out, 1);
    assert!(
        t.starts_with("shmlink preflight: NOT FIT (runs in Docker/other)"),
        "{t}"
    );
    assert!(t.contains("tmpfs 64.0 MiB"), "{t}");
    assert!(t.contains("FAIL shm_too_small"), "{t}");
    assert!(t.contains("docker run --shm-size=1g ..."), "{t}");
    assert!(t.contains("--ipc=host"), "{t}");
    assert!(
        !t.contains("sizeLimit"),
        "no Kubernetes YAML outside Kubernetes: {t}"
    );
    assert!(t.contains("private (ipc:["), "its own IPC namespace: {t}");

    let out = preflight(&c, &[], &["--no-gpu", "--min-shm", "1Gi", "--json"]);
    let r = json_of(&out);
    assert_eq!(r["verdict"], "not_fit");
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["shm"]["size_bytes"], 64 * MIB);
    assert_eq!(r["ipc"]["host"], false);
    assert_eq!(r["memory"]["visible"], true, "{r}");
    assert_eq!(r["memory"]["cgroup"], c.cgroup.as_str());
}

#[test]
fn kubernetes_gets_the_emptydir_yaml_with_the_computed_size_limit() {
    if !common::e2e_available() {
        return;
    }
    let c = start(Shm::RuntimeDefault, Some(GIB), &[]);
    let out = preflight(
        &c,
        &["KUBERNETES_SERVICE_HOST=10.96.0.1"],
        &["--no-gpu", "--min-shm", "1536Mi"],
    );
    show(
        "runtime default /dev/shm, 1 GiB memory limit, --min-shm 1536Mi (Kubernetes)",
        &out,
    );
    let t = said(&out, 1);
    assert!(t.contains("(runs in Kubernetes)"), "{t}");
    for want in [
        "medium: Memory",
        "sizeLimit: 1536Mi",
        "mountPath: /dev/shm",
        // 1 GiB today plus the 1.5 GiB of /dev/shm.
        "memory: 2560Mi",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    assert!(!t.contains("docker run"), "{t}");
}

#[test]
fn a_2gi_tmpfs_passes() {
    if !common::e2e_available() {
        return;
    }
    let volume = HostTmpfs::new(2 * GIB);
    let c = start(Shm::Bind(volume.path.clone()), None, &[]);
    let out = preflight(&c, &[], &["--no-gpu", "--min-shm", "1Gi"]);
    show("2 GiB emptyDir-like tmpfs, --min-shm 1Gi", &out);
    let t = said(&out, 0);
    assert!(t.starts_with("shmlink preflight: FIT"), "{t}");
    assert!(t.contains("tmpfs 2.0 GiB"), "{t}");
    assert!(!t.contains("Fix"), "{t}");
}

#[test]
fn the_sizing_helper_computes_workers_times_prefetch_times_batch() {
    if !common::e2e_available() {
        return;
    }
    let volume = HostTmpfs::new(2 * GIB);
    let c = start(Shm::Bind(volume.path.clone()), None, &[]);
    let args = [
        "--no-gpu",
        "--json",
        "--dataloader-workers",
        "4",
        "--batch-bytes",
        "64Mi",
    ];
    let out = preflight(&c, &[], &args);
    assert_eq!(out.status.code(), Some(0));
    let r = json_of(&out);
    assert_eq!(r["need"]["source"], "sizing");
    assert_eq!(r["need"]["prefetch_factor"], 2, "PyTorch's default");
    assert_eq!(r["need"]["dataloader_bytes"], 4 * 2 * 64 * MIB);
    assert_eq!(r["need"]["bytes"], 512 * MIB);
    assert!(r["need"].get("nccl_bytes").is_none(), "no GPUs, no NCCL");

    // 8 x 3 x 128Mi = 3 GiB: more than the 2 GiB tmpfs.
    let out = preflight(
        &c,
        &[],
        &[
            "--no-gpu",
            "--dataloader-workers",
            "8",
            "--prefetch-factor",
            "3",
            "--batch-bytes",
            "128Mi",
        ],
    );
    show(
        "sizing helper: 8 workers x 3 x 128Mi on a 2 GiB tmpfs",
        &out,
    );
    let t = said(&out, 1);
    assert!(
        t.contains("8 DataLoader workers x prefetch 3 x 128.0 MiB batches = 3.0 GiB"),
        "{t}"
    );
    assert!(t.contains("--shm-size=3g"), "{t}");

    // Bad sizes: one line, exit 2.
    let out = preflight(&c, &[], &["--no-gpu", "--min-shm", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--min-shm: \"lots\" is not a size"), "{err}");
}

#[test]
fn a_memory_limit_smaller_than_the_tmpfs_is_caught() {
    if !common::e2e_available() {
        return;
    }
    let volume = HostTmpfs::new(2 * GIB);
    let c = start(Shm::Bind(volume.path.clone()), Some(256 * MIB), &[]);
    let out = preflight(&c, &[], &["--no-gpu", "--min-shm", "1Gi"]);
    show("2 GiB tmpfs, 256 MiB memory limit, --min-shm 1Gi", &out);
    let t = said(&out, 1);
    assert!(t.contains("FAIL memory_too_small"), "{t}");
    assert!(
        !t.contains("shm_too_small"),
        "the tmpfs itself is big enough: {t}"
    );
    assert!(t.contains("limit 256.0 MiB"), "{t}");
    assert!(t.contains("--memory=1280m"), "{t}");
    let r = json_of(&preflight(
        &c,
        &[],
        &["--no-gpu", "--min-shm", "1Gi", "--json"],
    ));
    assert_eq!(r["memory"]["limit_bytes"], 256 * MIB);
    assert!(r["available_bytes"].as_u64().unwrap() <= 256 * MIB, "{r}");

    // Nothing asked: the illusion is still named, as a warning.
    let out = preflight(&c, &[], &["--no-gpu"]);
    let t = said(&out, 0);
    assert!(t.contains("WARN memory_below_shm_size"), "{t}");
}

/// The nvswitch-8 board with every NVLink of GPU 7 inactive.
fn gpu7_broken() -> Value {
    let mut config = fake_nvml::preset("nvswitch-8");
    for link in config["gpus"][7]["links"].as_array_mut().unwrap() {
        link["active"] = json!(false);
    }
    config
}

#[test]
fn the_gpu7_fault_fails_cuda_devices_6_7_naming_the_pair_and_passes_0_1() {
    if !common::e2e_available() {
        return;
    }
    let fake = FakeNvml::new(&gpu7_broken());
    let config_dir = fake.config.parent().unwrap();
    let c = start(Shm::RuntimeDefault, None, &[(config_dir, NVML_DIR)]);
    let lib = format!(
        "{BIN_DIR}/{}",
        fake_nvml::lib().file_name().unwrap().to_str().unwrap()
    );
    let config_env = format!("FAKE_NVML_CONFIG={NVML_DIR}/nvml.json");
    // 2 workers x 2 x 8Mi + NCCL's 2 x 9,637,888 for two GPUs: 50.4 MiB, within 64 MiB.
    let args = [
        "--nvml-lib",
        &lib,
        "--dataloader-workers",
        "2",
        "--batch-bytes",
        "8Mi",
    ];

    let out = preflight(&c, &[&config_env, "CUDA_VISIBLE_DEVICES=6,7"], &args);
    show(
        "fake NVML, GPU 7's links down, CUDA_VISIBLE_DEVICES=6,7 (Docker)",
        &out,
    );
    let t = said(&out, 1);
    assert!(
        t.contains("FAIL gpu_pair: GPU 7 (cuda:1 in this process): its pair with GPU 6 is down")
            && t.contains("; avoid GPU 7: CUDA_VISIBLE_DEVICES=6\n"),
        "{t}"
    );
    assert!(t.contains("Avoid GPU 7"), "{t}");
    assert!(t.contains("--gpus '\"device=0,1\"'"), "{t}");
    assert!(!t.contains("shm_too_small"), "{t}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let r = json_of(&preflight(
        &c,
        &[&config_env, "CUDA_VISIBLE_DEVICES=6,7"],
        &json_args,
    ));
    assert_eq!(r["need"]["nccl_bytes"], 2 * 9_637_888u64);
    assert_eq!(r["need"]["bytes"], 2 * 2 * 8 * MIB + 2 * 9_637_888);
    let pairs = r["gpus"]["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 1, "only the visible pair: {r}");
    assert_eq!(
        (&pairs[0]["gpu"], &pairs[0]["peer_gpu"], &pairs[0]["status"]),
        (&json!(6), &json!(7), &json!("down"))
    );
    assert_eq!(r["gpus"]["avoid"], json!([7]));

    let out = preflight(&c, &[&config_env, "CUDA_VISIBLE_DEVICES=0,1"], &args);
    show(
        "fake NVML, GPU 7's links down, CUDA_VISIBLE_DEVICES=0,1",
        &out,
    );
    let t = said(&out, 0);
    assert!(
        t.contains("0,1 (CUDA_VISIBLE_DEVICES): 1 of 1 pairs healthy"),
        "{t}"
    );

    // Kubernetes: the device plugin chose the GPU, so the fix is about the node.
    let out = preflight(
        &c,
        &[
            &config_env,
            "CUDA_VISIBLE_DEVICES=6,7",
            "KUBERNETES_SERVICE_HOST=10.96.0.1",
        ],
        &args,
    );
    let t = said(&out, 1);
    assert!(t.contains("kubectl cordon"), "{t}");

    // An --nvml-lib that does not load: it cannot tell.
    let out = preflight(
        &c,
        &[&config_env],
        &["--nvml-lib", "/shmlink/no-such-lib.so", "--min-shm", "1Mi"],
    );
    let t = said(&out, 2);
    assert!(t.contains("UNKNOWN nvml_unavailable"), "{t}");
}

#[test]
fn no_dev_shm_at_all_is_not_fit() {
    if !common::e2e_available() {
        return;
    }
    let c = start(Shm::None, None, &[]);
    let out = preflight(&c, &["KUBERNETES_SERVICE_HOST=10.96.0.1"], &["--no-gpu"]);
    let t = said(&out, 1);
    assert!(t.contains("FAIL shm_absent"), "{t}");
    assert!(t.contains("sizeLimit: 1Gi"), "{t}");
}

#[test]
fn host_ipc_is_recognised_and_a_private_namespace_is_not() {
    if !common::e2e_available() {
        return;
    }
    // The test's own IPC namespace stands for the host's: the kernel's initial one on a
    // machine, another where the tests themselves run in a container (then given as the hint).
    let own = std::fs::read_link("/proc/self/ns/ipc").unwrap();
    let own = own.to_str().unwrap();
    let inode = own
        .trim_start_matches("ipc:[")
        .trim_end_matches(']')
        .to_string();
    let hint: Vec<&str> = if inode == "4026531839" {
        vec![]
    } else {
        vec!["--host-ipc-ns", &inode]
    };
    let shared = start(Shm::HostIpc, None, &[]);
    let mut args = vec!["--no-gpu", "--json"];
    args.extend_from_slice(&hint);
    let r = json_of(&preflight(&shared, &[], &args));
    assert_eq!(r["ipc"]["host"], true, "{}", r["ipc"]);
    assert_eq!(r["ipc"]["namespace"].to_string(), inode);
    let private = start(Shm::RuntimeDefault, None, &[]);
    let r = json_of(&preflight(&private, &[], &args));
    assert_eq!(r["ipc"]["host"], false, "{}", r["ipc"]);

    // With host IPC, a need the host's /dev/shm cannot hold says to grow that one.
    let mut args = vec!["--no-gpu", "--min-shm", "64Ti"];
    args.extend_from_slice(&hint);
    let out = preflight(&shared, &[], &args);
    let t = said(&out, 1);
    assert!(t.contains("shares the host's IPC namespace"), "{t}");
}

#[test]
fn it_answers_within_a_second() {
    if !common::e2e_available() {
        return;
    }
    let fake = FakeNvml::new(&fake_nvml::preset("nvswitch-8"));
    let config_dir = fake.config.parent().unwrap();
    let c = start(Shm::RuntimeDefault, None, &[(config_dir, NVML_DIR)]);
    let lib = format!(
        "{BIN_DIR}/{}",
        fake_nvml::lib().file_name().unwrap().to_str().unwrap()
    );
    let config_env = format!("FAKE_NVML_CONFIG={NVML_DIR}/nvml.json");
    // runc exec's own cost, measured with a command that does nothing.
    let t = std::time::Instant::now();
    assert!(c.exec(&["/bin/busybox", "true"]).status.success());
    let baseline = t.elapsed();
    let t = std::time::Instant::now();
    let out = preflight(
        &c,
        &[&config_env],
        &["--nvml-lib", &lib, "--min-shm", "32Mi"],
    );
    let took = t.elapsed();
    let t = said(&out, 0);
    assert!(t.contains("28 of 28 pairs healthy"), "{t}");
    println!("preflight with 8 fake GPUs: {took:?} (runc exec alone: {baseline:?})");
    assert!(
        took.saturating_sub(baseline) < std::time::Duration::from_secs(1),
        "{took:?} against runc exec's {baseline:?}"
    );
}

/// `preflight --p2p` in a container that sees GPUs 5 and 7 (CUDA lists just those two, as in
/// a container): NVML says their NVLink P2P is fine, but GPU 7 refuses peer access. The probe
/// makes the pair fail, with the GPU to avoid in the fix.
#[test]
fn preflight_p2p_fails_gpus_5_and_7_when_7_refuses_peer_access() {
    use common::fake_cuda::{self, FakeCuda};
    if !common::e2e_available() {
        return;
    }
    let nvml_config = fake_nvml::preset("nvswitch-8");
    let fake = FakeNvml::new(&nvml_config);
    let mut c = fake_cuda::config(&nvml_config, &[5, 7], 300.0);
    fake_cuda::fault(&mut c, &nvml_config, 5, 7, json!({"peer_access": false}));
    fake_cuda::fault(&mut c, &nvml_config, 7, 5, json!({"peer_access": false}));
    let cuda = FakeCuda::new(&c);
    let config_dir = fake.config.parent().unwrap();
    let container = start(
        Shm::RuntimeDefault,
        None,
        &[(config_dir, NVML_DIR), (cuda.dir.path(), "/cuda")],
    );
    let lib =
        |p: std::path::PathBuf| format!("{BIN_DIR}/{}", p.file_name().unwrap().to_str().unwrap());
    let (nvml_lib, cuda_lib) = (lib(fake_nvml::lib()), lib(fake_cuda::lib()));
    let env = [
        format!("FAKE_NVML_CONFIG={NVML_DIR}/nvml.json"),
        "FAKE_CUDA_CONFIG=/cuda/cuda.json".to_string(),
        "CUDA_VISIBLE_DEVICES=5,7".to_string(),
    ];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let args = [
        "--nvml-lib",
        &nvml_lib,
        "--cuda-lib",
        &cuda_lib,
        "--min-shm",
        "1Mi",
    ];
    // Without --p2p NVML alone says the pair is fine.
    let out = preflight(&container, &env, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let mut p2p = args.to_vec();
    p2p.push("--p2p");
    let out = preflight(&container, &env, &p2p);
    show(
        "preflight --p2p, GPU 7 refusing peer access, CUDA_VISIBLE_DEVICES=5,7",
        &out,
    );
    let t = said(&out, 1);
    assert!(
        t.contains("FAIL gpu_pair: GPU 5 <-> GPU 7")
            && t.contains(
                "probe: peer access GPU 5 -> GPU 7 refused although NVML reports NVLink P2P"
            ),
        "{t}"
    );
    assert!(t.contains("Avoid GPU 7"), "{t}");
}

//! Micro-benchmarks of the pure parsers a scan runs per container, on the fixtures the unit
//! tests use (tests/fixtures). `cargo bench --bench parsers`, or `bench/run.sh parsers`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use shmlink::cgroup::memory::{parse_limit, parse_memory_stat};
use shmlink::cgroup::path::parse_cgroup_path;
use shmlink::procfs::mountinfo::find_mount;

macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!("../../tests/fixtures/", $path))
    };
}

const MOUNTINFO: [(&str, &str); 5] = [
    (
        "containerd-container",
        fixture!("mountinfo/containerd-container.mountinfo"),
    ),
    (
        "emptydir-memory",
        fixture!("mountinfo/emptydir-memory.mountinfo"),
    ),
    ("stacked-shm", fixture!("mountinfo/stacked-shm.mountinfo")),
    (
        "host-cgroup-v1",
        fixture!("mountinfo/host-cgroup-v1.mountinfo"),
    ),
    ("malformed", fixture!("mountinfo/malformed.mountinfo")),
];

fn mountinfo(c: &mut Criterion) {
    let mut group = c.benchmark_group("mountinfo/find_mount");
    for (name, text) in MOUNTINFO {
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), text, |b, text| {
            b.iter(|| find_mount(black_box(text), "/dev/shm"))
        });
    }
    // A container with many volumes: the container fixture's /dev/shm line, then 1,000 other
    // mounts after it. The search runs from the end (the last mount at a point is the top
    // one), so all 1,000 are skipped: the cost of a line that is not /dev/shm shows.
    let container = fixture!("mountinfo/containerd-container.mountinfo");
    let (shm, others): (Vec<&str>, Vec<&str>) =
        container.lines().partition(|l| l.contains(" /dev/shm "));
    let mut big = String::new();
    for line in shm {
        big.push_str(line);
        big.push('\n');
    }
    for i in 0..1000 {
        let line = others[i % others.len()];
        big.push_str(&line.replacen(' ', &format!("{i} "), 1));
        big.push('\n');
    }
    assert!(find_mount(&big, "/dev/shm").is_some());
    group.throughput(Throughput::Bytes(big.len() as u64));
    group.bench_with_input(
        BenchmarkId::from_parameter("1000-mounts"),
        &big,
        |b, text| b.iter(|| find_mount(black_box(text), "/dev/shm")),
    );
    group.finish();
}

const UID: &str = "0b6c5b2a-94f3-4c1b-9a53-1f5e2d8c7a10";
const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

fn cgroup_paths(c: &mut Criterion) {
    let u = UID.replace('-', "_");
    let paths = [
        (
            "cgroupfs-containerd",
            format!("/kubepods/burstable/pod{UID}/{CID}"),
        ),
        (
            "systemd-containerd",
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope"
            ),
        ),
        (
            "systemd-crio-nested",
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{CID}.scope/container"
            ),
        ),
        ("docker-cgroupfs", format!("/docker/{CID}")),
        ("qos-level", "/kubepods/burstable".to_string()),
    ];
    let mut group = c.benchmark_group("cgroup/parse_cgroup_path");
    for (name, path) in &paths {
        group.bench_with_input(BenchmarkId::from_parameter(name), path, |b, path| {
            b.iter(|| parse_cgroup_path(black_box(path)))
        });
    }
    group.finish();
}

fn memory_stat(c: &mut Criterion) {
    let files = [
        ("v2-container", fixture!("memcg/v2-container.memory.stat")),
        ("v1-leaf", fixture!("memcg/v1-leaf.memory.stat")),
        ("v1-pod", fixture!("memcg/v1-pod.memory.stat")),
        ("v1-root", fixture!("memcg/v1-root.memory.stat")),
    ];
    let mut group = c.benchmark_group("memcg/parse_memory_stat");
    for (name, text) in files {
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), text, |b, text| {
            b.iter(|| parse_memory_stat(black_box(text)))
        });
    }
    group.finish();
    c.bench_function("memcg/parse_limit/v1-unlimited", |b| {
        b.iter(|| parse_limit(black_box(fixture!("memcg/v1-unlimited.limit_in_bytes"))))
    });
}

criterion_group!(benches, mountinfo, cgroup_paths, memory_stat);
criterion_main!(benches);

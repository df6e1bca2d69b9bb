use super::*;
use crate::gpu::PairVerdict;
use crate::units::parse_size;

#[test]
fn the_nccl_segment_is_the_size_nccl_prints() {
    assert_eq!(NCCL_SHM_SEGMENT_BYTES, 9_637_888);
    assert_eq!(nccl_bytes(0), 0);
    assert_eq!(nccl_bytes(1), 0);
    assert_eq!(nccl_bytes(2), 2 * 9_637_888);
    assert_eq!(nccl_bytes(8), 56 * 9_637_888);
}

#[test]
fn the_sizing_helper_is_workers_times_prefetch_times_batch_plus_nccl() {
    let spec = NeedSpec::Sizing {
        workers: 8,
        prefetch_factor: 2,
        batch_bytes: 64 * MIB,
    };
    let one = need(spec, 1).unwrap();
    assert_eq!(one.bytes, GIB);
    assert_eq!(one.dataloader_bytes, Some(GIB));
    assert_eq!(one.nccl_bytes, None, "one GPU talks to no peer");
    assert!(one.enforced);
    let two = need(spec, 2).unwrap();
    assert_eq!(two.bytes, GIB + 2 * NCCL_SHM_SEGMENT_BYTES);
    assert_eq!(two.nccl_bytes, Some(19_275_776));
    assert_eq!(
        need(NeedSpec::MinShm(GIB), 8).unwrap().bytes,
        GIB,
        "--min-shm is taken as given"
    );
    let default = need(NeedSpec::Unspecified, 2).unwrap();
    assert_eq!(
        (default.source, default.bytes, default.enforced),
        (NeedSource::GpuDefault, GIB, false)
    );
    assert_eq!(need(NeedSpec::Unspecified, 0), None);
}

fn nvml(n: u32) -> Vec<NvmlGpu> {
    (0..n)
        .map(|i| NvmlGpu {
            index: i,
            uuid: format!("GPU-{i:08x}-aaaa-bbbb-cccc-{i:012}"),
            name: "NVIDIA H100".into(),
        })
        .collect()
}

fn indices(v: &[VisibleGpu]) -> Vec<(u32, u32)> {
    v.iter().map(|g| (g.index, g.cuda_ordinal)).collect()
}

#[test]
fn cuda_visible_devices_wins_and_numbers_the_gpus_from_zero() {
    let gpus = nvml(8);
    let (sel, src) = selector(Some("6,7"), Some("all"));
    assert_eq!(src, SelectorSource::CudaVisibleDevices);
    let (v, unmatched) = visible_gpus(&sel, src, &gpus);
    assert_eq!(indices(&v), vec![(6, 0), (7, 1)]);
    assert!(unmatched.is_empty());
    // UUIDs and unique prefixes, as CUDA takes them.
    let (sel, src) = selector(Some("GPU-00000003,GPU-00000001-aaaa"), None);
    let (v, _) = visible_gpus(&sel, src, &gpus);
    assert_eq!(indices(&v), vec![(3, 0), (1, 1)]);
    // CUDA stops at the first entry that names no GPU.
    let (sel, src) = selector(Some("1,9,2"), None);
    let (v, unmatched) = visible_gpus(&sel, src, &gpus);
    assert_eq!(indices(&v), vec![(1, 0)]);
    assert_eq!(unmatched, vec!["9", "2"]);
    // Empty: no GPU at all.
    let (sel, src) = selector(Some(""), Some("all"));
    assert_eq!(sel, GpuSelector::NoGpus);
    assert!(visible_gpus(&sel, src, &gpus).0.is_empty());
}

#[test]
fn nvidia_visible_devices_applies_when_cuda_visible_devices_is_unset() {
    let gpus = nvml(8);
    let (sel, src) = selector(None, Some("2,3"));
    assert_eq!(src, SelectorSource::NvidiaVisibleDevices);
    assert_eq!(
        indices(&visible_gpus(&sel, src, &gpus).0),
        vec![(2, 0), (3, 1)]
    );
    for none in ["void", "none", ""] {
        assert_eq!(selector(None, Some(none)).0, GpuSelector::NoGpus);
    }
    assert_eq!(selector(None, Some("all")).0, GpuSelector::All);
    // The runtime injected GPUs 6 and 7; NVML in the container numbers them 0 and 1.
    let (sel, src) = selector(None, Some("6,7"));
    let (v, unmatched) = visible_gpus(&sel, src, &nvml(2));
    assert_eq!(indices(&v), vec![(0, 0), (1, 1)]);
    assert!(unmatched.is_empty());
    let (sel, src) = selector(None, None);
    assert_eq!((sel, src), (GpuSelector::All, SelectorSource::Nvml));
}

fn pair(gpu: u32, peer_gpu: u32, status: PairStatus) -> PairVerdict {
    PairVerdict {
        gpu,
        peer_gpu,
        status,
        p2p: None,
        topology: None,
        links: Vec::new(),
        reasons: if status == PairStatus::Ok {
            Vec::new()
        } else {
            vec![format!("links of GPU {peer_gpu} are inactive")]
        },
    }
}

/// An 8-GPU board whose GPU 7 fails with every peer.
fn gpu7_broken() -> Vec<PairVerdict> {
    let mut pairs = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            let status = if b == 7 {
                PairStatus::Down
            } else {
                PairStatus::Ok
            };
            pairs.push(pair(a, b, status));
        }
    }
    pairs
}

#[test]
fn the_gpu_to_avoid_is_the_one_in_every_failing_pair() {
    assert_eq!(gpus_to_avoid(&gpu7_broken()), vec![7]);
    assert!(gpus_to_avoid(&[pair(0, 1, PairStatus::Ok)]).is_empty());
    // One bad pair alone: drop one end of it.
    assert_eq!(gpus_to_avoid(&[pair(2, 5, PairStatus::Degraded)]).len(), 1);
}

fn mounted(size: u64, used: u64) -> ShmObs {
    ShmObs {
        path: "/dev/shm".into(),
        state: ShmState::Mounted,
        fs_type: Some("tmpfs".into()),
        size_bytes: Some(size),
        used_bytes: Some(used),
        free_bytes: Some(size - used),
        error: None,
    }
}

fn memory(limit: Option<u64>, usage: u64) -> MemObs {
    MemObs {
        cgroup: Some("/kubepods/burstable/podX/abc".into()),
        version: Some(CgroupVersion::V1),
        visible: true,
        limit_bytes: limit,
        usage_bytes: Some(usage),
        headroom_bytes: limit.map(|l| l.saturating_sub(usage)),
        note: None,
    }
}

fn private_ipc() -> IpcObs {
    ipc_verdict(Some(4026532300), None)
}

fn gpus(visible: &[u32], all_pairs: &[PairVerdict], total: u32) -> GpuObs {
    let nv = nvml(total);
    let list = GpuSelector::List(visible.iter().map(|i| i.to_string()).collect());
    let (visible, unmatched) = visible_gpus(&list, SelectorSource::CudaVisibleDevices, &nv);
    let avoid = gpus_to_avoid(all_pairs);
    GpuObs {
        nvml: NvmlState::Loaded,
        explicit_lib: true,
        evidence: None,
        selected_by: SelectorSource::CudaVisibleDevices,
        pairs: visible_pairs(all_pairs, &visible),
        healthy: (0..total).filter(|g| !avoid.contains(g)).collect(),
        avoid,
        visible,
        unmatched,
    }
}

fn no_gpus() -> GpuObs {
    GpuObs {
        nvml: NvmlState::Disabled,
        explicit_lib: false,
        evidence: None,
        selected_by: SelectorSource::Nvml,
        visible: Vec::new(),
        unmatched: Vec::new(),
        pairs: Vec::new(),
        avoid: Vec::new(),
        healthy: Vec::new(),
    }
}

#[test]
fn the_runtime_default_fails_a_1gi_need_with_the_docker_fix() {
    let r = judge(
        RunsIn::Docker,
        mounted(64 * MIB, 0),
        memory(None, 10 * MIB),
        private_ipc(),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!((r.verdict, r.exit_code), (Verdict::NotFit, 1));
    assert_eq!(r.available_bytes, Some(64 * MIB));
    assert!(r.problems.iter().any(|p| p.kind == "shm_too_small"));
    let fix = r.fix.as_deref().unwrap();
    assert!(fix.contains("docker run --shm-size=1g ..."), "{fix}");
    assert!(fix.contains("--ipc=host"), "{fix}");
    assert!(
        !fix.contains("--memory"),
        "no memory limit, none to raise: {fix}"
    );
}

#[test]
fn kubernetes_gets_an_emptydir_with_the_sizelimit_and_a_memory_limit_with_room() {
    let r = judge(
        RunsIn::Kubernetes,
        mounted(64 * MIB, 0),
        memory(Some(16 * GIB), GIB),
        private_ipc(),
        no_gpus(),
        NeedSpec::Sizing {
            workers: 6,
            prefetch_factor: 2,
            batch_bytes: 128 * MIB,
        },
    );
    assert_eq!(r.verdict, Verdict::NotFit);
    let fix = r.fix.as_deref().unwrap();
    for want in [
        "medium: Memory",
        "sizeLimit: 1536Mi",
        "mountPath: /dev/shm",
        "memory: 17920Mi",
    ] {
        assert!(fix.contains(want), "{want}: {fix}");
    }
    let text = render_text(&r);
    assert!(
        text.starts_with("shmlink preflight: NOT FIT (runs in Kubernetes)"),
        "{text}"
    );
    assert!(text.contains("Fix (Kubernetes):"), "{text}");
}

#[test]
fn a_big_tmpfs_passes_and_prints_no_fix() {
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!((r.verdict, r.exit_code), (Verdict::Fit, 0));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.fix, None);
}

#[test]
fn a_memory_limit_below_the_tmpfs_is_what_fails_and_what_the_fix_raises() {
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(Some(256 * MIB), 16 * MIB),
        private_ipc(),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!(r.verdict, Verdict::NotFit);
    assert_eq!(r.available_bytes, Some(240 * MIB));
    let kinds: Vec<_> = r.problems.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, vec!["memory_too_small"]);
    let fix = r.fix.as_deref().unwrap();
    assert!(fix.contains("--memory=1280m"), "{fix}");
    // Without a need it is a warning: the tmpfs size is an illusion, but nothing asked for it.
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(Some(256 * MIB), 16 * MIB),
        private_ipc(),
        no_gpus(),
        NeedSpec::Unspecified,
    );
    assert_eq!(r.verdict, Verdict::Fit);
    assert_eq!(r.problems[0].kind, "memory_below_shm_size");
}

#[test]
fn gpus_without_a_need_warn_below_1gi_but_pass() {
    let pairs = vec![pair(0, 1, PairStatus::Ok)];
    let r = judge(
        RunsIn::Kubernetes,
        mounted(64 * MIB, 0),
        memory(None, 0),
        private_ipc(),
        gpus(&[0, 1], &pairs, 2),
        NeedSpec::Unspecified,
    );
    assert_eq!(r.verdict, Verdict::Fit);
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].severity, Severity::Warn);
    assert_eq!(r.problems[0].kind, "shm_small_for_gpus");
    assert!(r.fix.unwrap().contains("sizeLimit: 1Gi"));
}

#[test]
fn a_broken_pair_among_the_visible_gpus_fails_naming_it_and_others_pass() {
    let all = gpu7_broken();
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        gpus(&[6, 7], &all, 8),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!(r.verdict, Verdict::NotFit);
    let p = r.problems.iter().find(|p| p.kind == "gpu_pair").unwrap();
    assert!(
        p.message
            .starts_with("GPU 6 <-> GPU 7 (cuda:0 <-> cuda:1 in this process) is down"),
        "{}",
        p.message
    );
    let fix = r.fix.unwrap();
    assert!(fix.contains("Avoid GPU 7"), "{fix}");
    assert!(fix.contains("--gpus '\"device=0,1\"'"), "{fix}");
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        gpus(&[0, 1], &all, 8),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!(r.verdict, Verdict::Fit, "{:?}", r.problems);
    let r = judge(
        RunsIn::Kubernetes,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        gpus(&[6, 7], &all, 8),
        NeedSpec::Unspecified,
    );
    assert!(r.fix.unwrap().contains("kubectl cordon"));
}

#[test]
fn what_cannot_be_measured_exits_2_unless_something_already_fails() {
    let unreadable = ShmObs {
        state: ShmState::Unreadable,
        error: Some("Permission denied".into()),
        size_bytes: None,
        used_bytes: None,
        free_bytes: None,
        ..mounted(0, 0)
    };
    let r = judge(
        RunsIn::Docker,
        unreadable,
        memory(None, 0),
        private_ipc(),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    assert_eq!((r.verdict, r.exit_code), (Verdict::Unknown, 2));
    let mut g = no_gpus();
    g.nvml = NvmlState::Unavailable("loading NVML from /x.so: not found".into());
    g.explicit_lib = true;
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        g.clone(),
        NeedSpec::Unspecified,
    );
    assert_eq!(r.verdict, Verdict::Unknown);
    // Not asked for by name and no sign of a GPU: a machine without GPUs, fine.
    g.explicit_lib = false;
    let r = judge(
        RunsIn::Docker,
        mounted(2 * GIB, 0),
        memory(None, 0),
        private_ipc(),
        g,
        NeedSpec::Unspecified,
    );
    assert_eq!(r.verdict, Verdict::Fit);
}

#[test]
fn no_dev_shm_at_all_fails() {
    let absent = ShmObs {
        state: ShmState::Absent,
        fs_type: None,
        size_bytes: None,
        used_bytes: None,
        free_bytes: None,
        ..mounted(0, 0)
    };
    let r = judge(
        RunsIn::Kubernetes,
        absent,
        memory(None, 0),
        private_ipc(),
        no_gpus(),
        NeedSpec::Unspecified,
    );
    assert_eq!(r.verdict, Verdict::NotFit);
    assert!(r.fix.unwrap().contains("sizeLimit: 1Gi"));
}

#[test]
fn host_ipc_is_the_initial_namespace_or_the_hint() {
    assert_eq!(ipc_verdict(Some(4026531839), None).host, Some(true));
    assert_eq!(ipc_verdict(Some(4026532300), None).host, Some(false));
    assert_eq!(
        ipc_verdict(Some(4026532300), Some(4026532300)).host,
        Some(true)
    );
    assert_eq!(ipc_verdict(None, None).host, None);
    let r = judge(
        RunsIn::Docker,
        mounted(64 * MIB, 0),
        memory(None, 0),
        ipc_verdict(Some(INIT_IPC_NS_INODE), None),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    assert!(r.fix.unwrap().contains("host's IPC namespace"));
}

#[test]
fn the_json_report_has_the_documented_top_level_fields() {
    let r = judge(
        RunsIn::Docker,
        mounted(64 * MIB, 0),
        memory(None, 0),
        private_ipc(),
        no_gpus(),
        NeedSpec::MinShm(GIB),
    );
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "verdict",
        "exit_code",
        "runs_in",
        "shm",
        "available_bytes",
        "memory",
        "ipc",
        "gpus",
        "need",
        "problems",
        "fix",
    ] {
        assert!(v.get(key).is_some(), "{key}: {v}");
    }
    assert_eq!(v["verdict"], "not_fit");
    assert_eq!(v["gpus"]["nvml"]["state"], "disabled");
    assert_eq!(v["problems"][0]["severity"], "fail");
    assert_eq!(v["need"]["source"], "min_shm");
}

#[test]
fn the_example_training_pod_fits_what_its_preflight_asks_for() {
    let yaml = include_str!("../../../deploy/examples/training-pod.yaml");
    let value = |key: &str| -> &str {
        let at = yaml
            .find(key)
            .unwrap_or_else(|| panic!("{key} in the example"));
        yaml[at + key.len()..]
            .split(|c: char| c.is_whitespace() || c == '"')
            .next()
            .unwrap()
    };
    let workers: u64 = value("--dataloader-workers=").parse().unwrap();
    let batch = parse_size("batch", value("--batch-bytes=")).unwrap();
    let prefetch: u64 = value("--prefetch-factor=").parse().unwrap();
    let gpus: usize = value("nvidia.com/gpu: ").parse().unwrap();
    let size_limit = parse_size("sizeLimit", value("sizeLimit: ")).unwrap();
    let memory = parse_size("memory", value("memory: ")).unwrap();
    let need = need(
        NeedSpec::Sizing {
            workers,
            prefetch_factor: prefetch,
            batch_bytes: batch,
        },
        gpus,
    )
    .unwrap();
    assert_eq!(need.nccl_bytes, Some(56 * NCCL_SHM_SEGMENT_BYTES));
    assert!(
        need.bytes <= size_limit,
        "{need:?} vs sizeLimit {size_limit}"
    );
    assert!(size_limit < memory);
    // The figures its comment gives.
    assert!(yaml.contains(&format!("{} MiB)", nccl_bytes(8).div_ceil(MIB))));
    assert!(yaml.contains(&format!(": {:.1} GiB", need.bytes as f64 / GIB as f64)));
}

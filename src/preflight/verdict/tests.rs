use super::*;
use crate::fixtures::pair;
use crate::fixtures::preflight::{
    gpu7_broken, gpus, memory, mounted, no_gpus, private_ipc, unmeasured,
};
use crate::units::{GIB, MIB};

/// One test's observations, judged with [`judge`].
struct Case {
    runs_in: RunsIn,
    shm: ShmObs,
    memory: MemObs,
    ipc: IpcObs,
    gpus: GpuObs,
    need: NeedSpec,
}

/// A Docker container with a 2 GiB tmpfs, no memory limit, its own IPC namespace, no GPUs and
/// no need given.
fn case() -> Case {
    Case {
        runs_in: RunsIn::Docker,
        shm: mounted(2 * GIB, 0),
        memory: memory(None, 0),
        ipc: private_ipc(),
        gpus: no_gpus(),
        need: NeedSpec::Unspecified,
    }
}

impl Case {
    fn judge(self) -> Report {
        judge(
            self.runs_in,
            self.shm,
            self.memory,
            self.ipc,
            self.gpus,
            self.need,
        )
    }
}

#[test]
fn a_big_tmpfs_passes_and_prints_no_fix() {
    let r = Case {
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
    assert_eq!((r.verdict, r.exit_code), (Verdict::Fit, 0));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.fix, None);
}

#[test]
fn a_memory_limit_below_the_tmpfs_is_what_fails_and_what_the_fix_raises() {
    let r = Case {
        memory: memory(Some(256 * MIB), 16 * MIB),
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::NotFit);
    assert_eq!(r.available_bytes, Some(240 * MIB));
    let kinds: Vec<_> = r.problems.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, vec![ProblemKind::MemoryTooSmall]);
    let fix = r.fix.as_deref().unwrap();
    assert!(fix.contains("--memory=1280m"), "{fix}");
    // Without a need it is a warning: the tmpfs size is an illusion, but nothing asked for it.
    let r = Case {
        memory: memory(Some(256 * MIB), 16 * MIB),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::Fit);
    assert_eq!(r.problems[0].kind, ProblemKind::MemoryBelowShmSize);
}

#[test]
fn gpus_without_a_need_warn_below_1gi_but_pass() {
    let pairs = vec![pair(0, 1, PairStatus::Ok)];
    let r = Case {
        runs_in: RunsIn::Kubernetes,
        shm: mounted(64 * MIB, 0),
        gpus: gpus(&[0, 1], &pairs, 2),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::Fit);
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].severity, Grade::Warn);
    assert_eq!(r.problems[0].kind, ProblemKind::ShmSmallForGpus);
    assert!(r.fix.unwrap().contains("sizeLimit: 1Gi"));
}

/// Issue 37: one bad GPU of 8 is one line naming it and the GPUs to keep, not seven pair
/// lines; the JSON keeps every pair.
#[test]
fn a_culprit_gpu_is_one_line_and_pairs_without_one_are_one_line_each() {
    let r = Case {
        gpus: gpus(&[0, 1, 2, 3, 4, 5, 6, 7], &gpu7_broken(), 8),
        need: NeedSpec::MinShm(MIB),
        ..case()
    }
    .judge();
    let text = crate::preflight::render::render_text(&r);
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(
        fails,
        ["FAIL gpu_pair: GPU 7 (cuda:7 in this process): its pairs with all 7 other visible GPUs \
          are down (links of GPU 7 are inactive); avoid GPU 7: CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6"],
        "{text}"
    );
    let pairs = r.problems.iter().filter(|p| p.kind == ProblemKind::GpuPair);
    assert_eq!(pairs.count(), 7, "the JSON keeps every pair");
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["problems"][0].get("pair").is_none(), "{json}");

    // Two pairs that share no GPU: no culprit (either end may be at fault), a line each.
    let mut all = gpu7_broken();
    for p in &mut all {
        p.status = match (p.gpu, p.peer_gpu) {
            (0, 1) | (2, 3) => PairStatus::Degraded,
            _ => PairStatus::Ok,
        };
    }
    let r = Case {
        gpus: gpus(&[0, 1, 2, 3], &all, 8),
        need: NeedSpec::MinShm(MIB),
        ..case()
    }
    .judge();
    let text = crate::preflight::render::render_text(&r);
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 2, "{text}");
    assert!(
        fails[0].starts_with("FAIL gpu_pair: GPU 0 <-> GPU 1 (cuda:0 <-> cuda:1"),
        "{text}"
    );
}

#[test]
fn a_broken_pair_among_the_visible_gpus_fails_naming_it_and_others_pass() {
    let all = gpu7_broken();
    let r = Case {
        gpus: gpus(&[6, 7], &all, 8),
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::NotFit);
    let p = r
        .problems
        .iter()
        .find(|p| p.kind == ProblemKind::GpuPair)
        .unwrap();
    assert!(
        p.message
            .starts_with("GPU 6 <-> GPU 7 (cuda:0 <-> cuda:1 in this process) is down"),
        "{}",
        p.message
    );
    let fix = r.fix.unwrap();
    assert!(fix.contains("Avoid GPU 7"), "{fix}");
    assert!(fix.contains("--gpus '\"device=0,1\"'"), "{fix}");
    let r = Case {
        gpus: gpus(&[0, 1], &all, 8),
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::Fit, "{:?}", r.problems);
    let r = Case {
        runs_in: RunsIn::Kubernetes,
        gpus: gpus(&[6, 7], &all, 8),
        ..case()
    }
    .judge();
    assert!(r.fix.unwrap().contains("kubectl cordon"));
}

#[test]
fn what_cannot_be_measured_exits_2_unless_something_already_fails() {
    let unreadable = ShmObs {
        error: Some("Permission denied".into()),
        ..unmeasured(ShmState::Unreadable)
    };
    let r = Case {
        shm: unreadable,
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
    assert_eq!((r.verdict, r.exit_code), (Verdict::Unknown, 2));
    let mut g = no_gpus();
    g.nvml = NvmlState::Unavailable("loading NVML from /x.so: not found".into());
    g.explicit_lib = true;
    let r = Case {
        gpus: g.clone(),
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::Unknown);
    // Not asked for by name and no sign of a GPU: a machine without GPUs, fine.
    g.explicit_lib = false;
    let r = Case { gpus: g, ..case() }.judge();
    assert_eq!(r.verdict, Verdict::Fit);
}

#[test]
fn no_dev_shm_at_all_fails() {
    let absent = ShmObs {
        fs_type: None,
        ..unmeasured(ShmState::Absent)
    };
    let r = Case {
        runs_in: RunsIn::Kubernetes,
        shm: absent,
        ..case()
    }
    .judge();
    assert_eq!(r.verdict, Verdict::NotFit);
    assert!(r.fix.unwrap().contains("sizeLimit: 1Gi"));
}

#[test]
fn the_json_report_has_the_documented_top_level_fields() {
    let r = Case {
        shm: mounted(64 * MIB, 0),
        need: NeedSpec::MinShm(GIB),
        ..case()
    }
    .judge();
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
fn grades_keep_their_json_names() {
    for (grade, name) in [
        (Grade::Warn, "warn"),
        (Grade::Unknown, "unknown"),
        (Grade::Fail, "fail"),
    ] {
        assert_eq!(serde_json::to_value(grade).unwrap(), name);
    }
}

#[test]
fn problem_kinds_keep_their_json_names_and_the_text_says_the_same() {
    use ProblemKind::*;
    let kinds = [
        (ShmAbsent, "shm_absent"),
        (ShmUnreadable, "shm_unreadable"),
        (ShmNotMounted, "shm_not_mounted"),
        (ShmNotTmpfs, "shm_not_tmpfs"),
        (ShmTooSmall, "shm_too_small"),
        (ShmSmallForGpus, "shm_small_for_gpus"),
        (MemoryTooSmall, "memory_too_small"),
        (ShmUnboundedUnknown, "shm_unbounded_unknown"),
        (MemoryUnknown, "memory_unknown"),
        (MemoryBelowShmSize, "memory_below_shm_size"),
        (NvmlUnavailable, "nvml_unavailable"),
        (GpuHealthUnknown, "gpu_health_unknown"),
        (GpuNotFound, "gpu_not_found"),
        (GpuPair, "gpu_pair"),
    ];
    for (kind, name) in kinds {
        assert_eq!(serde_json::to_value(kind).unwrap(), name);
        assert_eq!(kind.as_str(), name);
    }
}

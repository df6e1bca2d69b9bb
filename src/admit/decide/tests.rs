use super::*;
use crate::units::{GIB, MIB};

fn gpu(name: &str, n: &str, memory: Option<&str>) -> Value {
    let mut limits = json!({"nvidia.com/gpu": n});
    if let Some(m) = memory {
        limits["memory"] = json!(m);
    }
    json!({"name": name, "resources": {"limits": limits}})
}

fn pod(containers: Value) -> Value {
    json!({"metadata": {"name": "p"}, "spec": {"containers": containers}})
}

fn paths(d: &Decision) -> Vec<String> {
    d.patch.iter().map(|op| op.path().to_string()).collect()
}

#[test]
fn the_size_is_the_gpu_default_or_the_annotation() {
    let mut w = Vec::new();
    assert_eq!(size(&pod(json!([gpu("t", "8", None)])), &mut w).text, "1Gi");
    let big = size(&pod(json!([gpu("t", "16", None)])), &mut w);
    assert_eq!((big.bytes, big.text.as_str()), (2206 * MIB, "2206Mi"));
    let mut p = pod(json!([gpu("t", "8", None)]));
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "1.5Gi"});
    assert_eq!(
        size(&p, &mut w),
        Size {
            bytes: 3 * GIB / 2,
            text: "1.5Gi".into()
        }
    );
    assert!(w.is_empty());
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "lots"});
    assert_eq!(size(&p, &mut w).text, "1Gi");
    assert_eq!(w.len(), 1);
    assert!(
        w[0].contains("\"lots\" is not a Kubernetes quantity"),
        "{w:?}"
    );
}

/// Kubernetes reads `512m` as 0.512 bytes, and a few thousand bytes of /dev/shm is a unit left
/// out: neither is taken, each is warned about, and the size is what the Pod would get without.
#[test]
fn a_milli_or_sub_mebibyte_annotation_is_warned_about_not_taken() {
    for (text, why) in [
        ("512m", "is 512 millibytes to Kubernetes (`m` is milli), not 512 MiB as Docker reads it: write 512Mi"),
        ("4096", "is 4096 bytes, less than 1Mi: a unit left out? (e.g. 4096Mi)"),
    ] {
        let mut p = pod(json!([gpu("t", "8", Some("32Gi"))]));
        p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": text});
        let mut w = Vec::new();
        assert_eq!(size(&p, &mut w).text, "1Gi");
        assert_eq!(
            w,
            vec![format!("shmlink: annotation shmlink.io/shm-size: {text:?} {why}; using 1Gi")]
        );
        // Mutated, the Pod gets the GPU default, not a tmpfs of a byte.
        let d = decide(&p, Mode::Mutate);
        assert_eq!(d.outcome, Outcome::Mutated);
        let volume = d.patch.iter().find_map(|op| match op {
            PatchOperation::Add(a) if a.path.as_str() == "/spec/volumes" => Some(a.value.clone()),
            _ => None,
        });
        assert_eq!(volume.unwrap()[0]["emptyDir"]["sizeLimit"], "1Gi");
        assert!(d.warnings[0].contains(why), "{:?}", d.warnings);
    }
}

/// A preflight init container states the need; the webhook sizes /dev/shm for exactly that,
/// read by preflight's own command line, and the patched container then passes it.
#[test]
fn the_size_is_what_a_preflight_the_pod_runs_asks_for() {
    let check = |words: Value, env: Option<&str>| {
        let mut init = json!({"name": "check", "command": words});
        if let Some(v) = env {
            init["env"] = json!([{"name": "SHMLINK_MIN_SHM", "value": v}]);
        }
        let mut p = pod(json!([gpu("t", "8", Some("64Gi"))]));
        p["spec"]["initContainers"] = json!([init]);
        p
    };
    let mut w = Vec::new();
    let p = check(json!(["/shmlink", "preflight", "--min-shm", "8Gi"]), None);
    assert_eq!(size(&p, &mut w).text, "8Gi");
    // workers x prefetch x batch + NCCL's segments for 8 GPUs: 8 x 2 x 256Mi + 540,121,... bytes
    let p = check(
        json!([
            "sh",
            "-c",
            "shmlink preflight --dataloader-workers 8 --batch-bytes 256Mi && echo ok"
        ]),
        None,
    );
    let s = size(&p, &mut w);
    assert_eq!(
        s.bytes,
        (8 * 2 * 256 * MIB + 9_637_888 * 56).div_ceil(MIB) * MIB
    );
    assert_eq!(
        size(&check(json!(["shmlink", "preflight"]), Some("3Gi")), &mut w).text,
        "3Gi"
    );
    // Options preflight would refuse say nothing: the GPU default.
    let p = check(json!(["shmlink", "preflight", "--min-shm", "lots"]), None);
    assert_eq!(size(&p, &mut w).text, "1Gi");
    assert!(w.is_empty(), "{w:?}");
    // The annotation overrides what preflight asks, and below it is warned about: the mount
    // would fail that preflight. From its env too.
    let mut p = check(json!(["shmlink", "preflight", "--min-shm", "8Gi"]), None);
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "2Gi"});
    assert_eq!(size(&p, &mut w).text, "2Gi");
    assert_eq!(w, vec!["shmlink: annotation shmlink.io/shm-size: \"2Gi\" is below the 8Gi the Pod's own `shmlink preflight` asks for: preflight will fail on it; raise the annotation to 8Gi".to_string()]);
    let mut p = check(json!(["shmlink", "preflight"]), Some("3Gi"));
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "2Gi"});
    w.clear();
    assert_eq!(size(&p, &mut w).text, "2Gi");
    assert!(w.len() == 1 && w[0].contains("below the 3Gi"), "{w:?}");
    // At or above it: nothing to say.
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "3Gi"});
    w.clear();
    assert_eq!(size(&p, &mut w).text, "3Gi");
    assert!(w.is_empty(), "{w:?}");
    // Mutated, the preflight container and the GPU container both pass an 8Gi need.
    let p = check(json!(["/shmlink", "preflight", "--min-shm", "8Gi"]), None);
    let d = decide(&p, Mode::Mutate);
    assert_eq!(d.outcome, Outcome::Mutated);
    let mut after = p.clone();
    json_patch::patch(&mut after, &d.patch).unwrap();
    for c in ["initContainers", "containers"] {
        let report = crate::admit::view::preflight_view(&after, &after["spec"][c][0]);
        assert!(report.problems.is_empty(), "{c}: {:?}", report.problems);
        assert_eq!(report.need.unwrap().bytes, 8 * GIB);
    }
}

#[test]
fn warn_mode_says_the_shared_text_and_patches_nothing() {
    let d = decide(&pod(json!([gpu("trainer", "8", Some("32Gi"))])), Mode::Warn);
    assert_eq!(d.outcome, Outcome::Warned);
    assert!(d.patch.is_empty());
    assert_eq!(d.warnings, vec!["shmlink: container \"trainer\" uses GPUs and gets the runtime's 64Mi /dev/shm: DataLoader workers die with \"Bus error\", NCCL fails. Fix: mount an emptyDir (medium: Memory, sizeLimit: 1Gi) at /dev/shm and add 1Gi to its memory limit".to_string()]);
}

#[test]
fn mutate_mode_mounts_and_raises_the_limit() {
    let d = decide(
        &pod(json!([gpu("trainer", "8", Some("32Gi")), {"name": "log"}])),
        Mode::Mutate,
    );
    assert_eq!(d.outcome, Outcome::Mutated);
    assert_eq!(
        paths(&d),
        [
            "/spec/volumes",
            "/spec/containers/0/volumeMounts",
            "/spec/containers/0/resources/limits/memory"
        ]
    );
    assert_eq!(d.warnings, vec!["shmlink: mounted emptyDir \"shmlink-dshm\" (medium: Memory, sizeLimit: 1Gi) at /dev/shm in \"trainer\"; memory limit 32Gi -> 33Gi: tmpfs pages count against it".to_string()]);
}

#[test]
fn nothing_is_done_where_nothing_should_be() {
    let g = pod(json!([gpu("t", "1", None)]));
    let mut host = g.clone();
    host["spec"]["hostIPC"] = json!(true);
    assert_eq!(decide(&host, Mode::Mutate).outcome, Outcome::HostIpc);
    let mut off = g.clone();
    off["metadata"]["annotations"] = json!({"shmlink.io/admission": "off"});
    assert_eq!(decide(&off, Mode::Mutate).outcome, Outcome::OptedOut);
    assert_eq!(decide(&g, Mode::Off).outcome, Outcome::OptedOut);
    assert_eq!(
        decide(&pod(json!([{"name": "web"}])), Mode::Mutate).outcome,
        Outcome::NoGpu
    );
    // A tiny annotation the runtime's 64Mi already holds: preflight passes, so nothing.
    let mut small = g.clone();
    small["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "32Mi"});
    assert_eq!(decide(&small, Mode::Mutate).outcome, Outcome::Fit);
}

#[test]
fn an_existing_small_memory_mount_is_warned_about_in_both_modes() {
    let mut p = pod(
        json!([{"name": "t", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm/"}],
        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "32Gi"}}}]),
    );
    p["spec"]["volumes"] =
        json!([{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}]);
    for mode in [Mode::Warn, Mode::Mutate] {
        let d = decide(&p, mode);
        assert_eq!(d.outcome, Outcome::Warned);
        assert!(d.patch.is_empty());
        assert_eq!(d.warnings, vec!["shmlink: container \"t\" uses GPUs; its emptyDir \"dshm\" at /dev/shm has sizeLimit 256Mi, below the 1Gi it needs: raise sizeLimit to 1Gi and add 1Gi to its memory limit".to_string()]);
    }
    p["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = json!("2Gi");
    assert_eq!(decide(&p, Mode::Mutate).outcome, Outcome::Fit);
}

#[test]
fn the_annotation_without_gpus_mounts_in_every_regular_container() {
    let mut p =
        pod(json!([{"name": "a"}, {"name": "b", "resources": {"limits": {"memory": "1Gi"}}}]));
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "512Mi"});
    p["spec"]["initContainers"] = json!([{"name": "setup"}]);
    let d = decide(&p, Mode::Mutate);
    assert_eq!(
        paths(&d),
        [
            "/spec/volumes",
            "/spec/containers/0/volumeMounts",
            "/spec/containers/1/volumeMounts",
            "/spec/containers/1/resources/limits/memory"
        ]
    );
    assert!(d.warnings[1].ends_with("memory limit 1Gi -> 1536Mi: tmpfs pages count against it"));
}

#[test]
fn what_is_not_a_container_gets_no_patch() {
    let mut p = pod(json!(["junk", {"name": "a"}, 7]));
    p["metadata"]["annotations"] = json!({"shmlink.io/shm-size": "1Gi"});
    let d = decide(&p, Mode::Mutate);
    assert_eq!(
        paths(&d),
        ["/spec/volumes", "/spec/containers/1/volumeMounts"]
    );
    let mut after = p.clone();
    json_patch::patch(&mut after, &d.patch).unwrap();
    assert_eq!(after["spec"]["containers"][0], json!("junk"));
}

#[test]
fn a_pod_of_more_containers_than_are_judged_gets_one_warning_and_no_patch() {
    let many = |n: usize| -> Value {
        (0..n)
            .map(|i| gpu(&format!("c{i}"), "1", Some("8Gi")))
            .collect()
    };
    let d = decide(&pod(many(MAX_CONTAINERS + 1)), Mode::Mutate);
    assert_eq!(d.outcome, Outcome::Warned);
    assert!(d.patch.is_empty());
    assert_eq!(d.warnings, vec!["shmlink: this Pod has 129 containers, more than the 128 the webhook judges: admitted unchanged. Run `shmlink preflight` in its GPU containers to check their /dev/shm".to_string()]);
    // As many as are judged: each is.
    let d = decide(&pod(many(MAX_CONTAINERS)), Mode::Mutate);
    assert_eq!(d.outcome, Outcome::Mutated);
    assert_eq!(d.warnings.len(), MAX_CONTAINERS);
    // Too large to read: left alone as any Pod would be, else the same one warning.
    let host = json!({"spec": {"hostIPC": true}});
    assert_eq!(
        unjudged(&host, Mode::Mutate, 20_000).outcome,
        Outcome::HostIpc
    );
    let d = unjudged(&json!({}), Mode::Warn, 3);
    assert!(
        d.warnings[0].contains("is larger than the webhook reads (2 MiB"),
        "{d:?}"
    );
}

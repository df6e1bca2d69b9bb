use super::*;
use std::time::SystemTime;

const NODE: &str = "gpu-node-7";

fn fixture_rule() -> Value {
    let path = format!(
        "{}/tests/fixtures/dra/devicetaintrule-gpu7-v1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn index() -> SliceIndex {
    let path = format!(
        "{}/tests/fixtures/dra/resourceslice-8gpu-v1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let slice: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    SliceIndex::from_slices([&slice], NODE)
}

const GPU7: &str = "GPU-9fd4e962-e6f8-1e2c-d44e-5428ff708072";

fn wanted(gpu: u32, uuid: &str, value: &str) -> Wanted {
    Wanted {
        gpu,
        uuid: uuid.into(),
        value: value.into(),
        description: format!("GPU {gpu} is bad"),
        since: SystemTime::UNIX_EPOCH,
    }
}

#[test]
fn names_and_the_node_label_stay_within_their_limits() {
    assert_eq!(rule_name(NODE, 7), "shmlink-gpu-node-7-gpu-7");
    assert_eq!(node_label(NODE), NODE);
    let long = format!("{}.example.internal", "a".repeat(60));
    let label = node_label(&long);
    assert_eq!(label.len(), 63);
    assert!(label.starts_with(&"a".repeat(46)), "{label}");
    assert_ne!(node_label(&long), node_label(&format!("{long}x")));
    // A DNS subdomain of 253 characters: the full rule name would pass 253.
    let longest = vec!["b".repeat(63); 4].join(".")[..253]
        .trim_end_matches('.')
        .to_string();
    let name = rule_name(&longest, 15);
    assert!(name.len() <= 253 && name.ends_with("-gpu-15"), "{name}");
    assert_eq!(name, format!("shmlink-{}-gpu-15", node_label(&longest)));
}

#[test]
fn only_a_rule_with_both_labels_of_this_node_is_the_agents() {
    let rule = fixture_rule();
    let stored = Stored::parse(&rule, NODE).unwrap();
    assert_eq!(stored.name, "shmlink-gpu-node-7-gpu-7");
    assert_eq!(stored.selector.as_ref().unwrap().device, "gpu-7");
    assert_eq!(
        (stored.value.as_str(), stored.effect.as_str()),
        ("nvlink-down", "None")
    );
    assert_eq!(Stored::parse(&rule, "gpu-node-8"), None);
    let mut foreign = rule.clone();
    foreign["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    assert_eq!(Stored::parse(&foreign, NODE), None);
    let mut renamed = rule;
    renamed["metadata"]["name"] = json!("gpu7-by-hand");
    assert_eq!(Stored::parse(&renamed, NODE), None);
}

#[test]
fn a_wanted_gpu_gets_one_rule_that_selects_its_device_and_an_unchanged_one_costs_nothing() {
    let w = [wanted(7, GPU7, "nvlink-down")];
    let p = plan(&w, &index(), &[], (NODE, Effect::None), |_| false);
    let [Action::Create(d)] = p.actions.as_slice() else {
        panic!("{p:#?}")
    };
    let object = d.object(NODE, Some((NODE, "node-uid")));
    assert_eq!(
        object["spec"],
        json!({"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-7"},
               "taint": {"key": "shmlink.io/gpu-unhealthy", "value": "nvlink-down",
                         "effect": "None"}})
    );
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "shmlink", "shmlink.io/node": NODE})
    );
    assert_eq!(
        object["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid"}])
    );
    // As the server stores it: the same, nothing to do.
    let mut held = object.clone();
    held["metadata"]["uid"] = json!("u1");
    held["metadata"]["resourceVersion"] = json!("5");
    held["spec"]["taint"]["timeAdded"] = json!("2026-11-27T10:03:12Z");
    let stored = [Stored::parse(&held, NODE).unwrap()];
    let p = plan(&w, &index(), &stored, (NODE, Effect::None), |_| false);
    assert_eq!(p, Plan::default());
    // A new description alone (a restarted agent's "since") is no write either.
    let mut later = w.clone();
    later[0].description = "GPU 7 is bad since later".into();
    let p = plan(&later, &index(), &stored, (NODE, Effect::None), |_| false);
    assert_eq!(p, Plan::default());
}

#[test]
fn a_new_effect_or_value_is_an_update_that_keeps_time_added_and_resource_version() {
    let stored = [Stored::parse(&fixture_rule(), NODE).unwrap()];
    let mut w = wanted(7, GPU7, "nvlink-down");
    let p = plan(
        &[w.clone()],
        &index(),
        &stored,
        (NODE, Effect::NoSchedule),
        |_| false,
    );
    let [Action::Update {
        desired,
        stored: s,
        effect_changed: true,
    }] = p.actions.as_slice()
    else {
        panic!("{p:#?}")
    };
    let object = desired.update_of(s);
    assert_eq!(object["metadata"]["resourceVersion"], "48377");
    assert_eq!(object["spec"]["taint"]["effect"], "NoSchedule");
    assert_eq!(object["spec"]["taint"]["timeAdded"], "2026-11-27T10:03:12Z");
    w.value = "xid-79".into();
    let p = plan(&[w], &index(), &stored, (NODE, Effect::None), |_| false);
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::Update {
                effect_changed: false,
                ..
            }]
        ),
        "{p:#?}"
    );
}

#[test]
fn a_rule_no_gpu_wants_is_deleted_unless_kept_and_an_unlisted_gpu_keeps_its_rule() {
    let stored = [Stored::parse(&fixture_rule(), NODE).unwrap()];
    let p = plan(&[], &index(), &stored, (NODE, Effect::None), |_| false);
    assert!(matches!(p.actions.as_slice(), [Action::Delete(s)] if s.uid == stored[0].uid));
    let p = plan(&[], &index(), &stored, (NODE, Effect::None), |n| {
        n == stored[0].name
    });
    assert_eq!(p, Plan::default());
    // GPU 7 is still wanted but no slice lists it now: its rule stays, and it is said.
    let w = [wanted(7, GPU7, "nvlink-down")];
    let p = plan(
        &w,
        &SliceIndex::default(),
        &stored,
        (NODE, Effect::None),
        |_| false,
    );
    assert_eq!(p.actions, Vec::new());
    assert_eq!(p.unmatched, [(7, GPU7.to_string())]);
}

fn mig_index() -> SliceIndex {
    let path = format!(
        "{}/tests/fixtures/dra/resourceslice-8gpu-mig-v1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let slice: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    SliceIndex::from_slices([&slice], NODE)
}

/// MIG on the blamed GPU: NVIDIA's driver lists its MIG devices (each with the GPU's UUID as
/// `parentUUID`) instead of it; each gets a rule, and they go with the GPU's blame.
#[test]
fn a_blamed_gpu_with_mig_taints_each_of_its_mig_devices() {
    let index = mig_index();
    assert_eq!(
        index.device_of(GPU7),
        None,
        "the full GPU is not listed under MIG"
    );
    let w = [wanted(7, GPU7, "nvlink-down")];
    let p = plan(&w, &index, &[], (NODE, Effect::NoSchedule), |_| false);
    assert!(p.unmatched.is_empty(), "{p:#?}");
    let made: Vec<(String, String)> = p
        .actions
        .iter()
        .map(|a| match a {
            Action::Create(d) => (d.name.clone(), d.device.device.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        made,
        [
            (
                mig_rule_name(NODE, 7, 0),
                "gpu-7-mig-1g10gb-19-0".to_string()
            ),
            (
                mig_rule_name(NODE, 7, 1),
                "gpu-7-mig-1g10gb-19-1".to_string()
            ),
        ]
    );
    assert_eq!(made[0].0, "shmlink-gpu-node-7-gpu-7-mig-0");
    let Action::Create(first) = &p.actions[0] else {
        unreachable!()
    };
    let object = first.object(NODE, Some((NODE, "node-uid")));
    println!(
        "MIG device's rule:\n{}",
        serde_json::to_string_pretty(&object).unwrap()
    );
    assert_eq!(
        object["spec"]["deviceSelector"],
        json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-7-mig-1g10gb-19-0"})
    );
    assert_eq!(object["spec"]["taint"]["effect"], "NoSchedule");
    // Stored, then GPU 7 no longer blamed: both go. A GPU on another MIG-less index keeps
    // nothing of them.
    let stored: Vec<Stored> = p
        .actions
        .iter()
        .map(|a| match a {
            Action::Create(d) => {
                let mut o = d.object(NODE, None);
                o["metadata"]["uid"] = json!("u");
                Stored::parse(&o, NODE).unwrap()
            }
            _ => unreachable!(),
        })
        .collect();
    let gone = plan(&[], &index, &stored, (NODE, Effect::NoSchedule), |_| false);
    assert_eq!(gone.actions.len(), 2);
    assert!(gone.actions.iter().all(|a| matches!(a, Action::Delete(_))));
    // GPU 7 blamed while no slice lists it (the slice went): its MIG rules are kept as they are.
    let unlisted = plan(
        &w,
        &SliceIndex::default(),
        &stored,
        (NODE, Effect::NoSchedule),
        |_| false,
    );
    assert_eq!(unlisted.actions, []);
    assert_eq!(unlisted.unmatched, [(7, GPU7.to_string())]);
}

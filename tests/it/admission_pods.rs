//! The admission webhook's answer for real Pod specs (tests/fixtures/admission): every fixture in
//! both modes; each patch applied to the Pod it came with, the patched Pod validated against the
//! Kubernetes schema (1.33 and 1.37, `kubernetes-validate --strict`) and judged by preflight's
//! view of the spec; the patch's exact operations and the warnings' exact words; nothing else
//! of the Pod changed; a reinvocation changes nothing; hostile input never panics.
//!
//! `cargo test --test it admission_pods:: -- --nocapture` prints each Pod's patch and warnings.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use base64::Engine as _;
use serde_json::{json, Value};
use shmlink::admit::review::{answer, Answer};
use shmlink::admit::view::{is_short, preflight_view};
use shmlink::admit::{Mode, Outcome};
use shmlink::preflight::verdict::Verdict;
use shmlink::units::{parse_quantity_bytes, GIB};

use crate::common::rng;

/// The seeded stream of tests/common, with `below` over lengths.
struct Rng(rng::SplitMix);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(rng::SplitMix::new(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n.max(1) as u64) as usize
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/admission");

fn fixture(name: &str) -> Value {
    let path = Path::new(FIXTURES).join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn run(review: &Value, mode: Mode) -> (Answer, Value) {
    let a = answer(&serde_json::to_vec(review).unwrap(), mode);
    let body: Value = serde_json::from_slice(&a.body).unwrap();
    (a, body)
}

/// The response's JSON Patch, decoded from base64, or none.
fn patch_of(body: &Value) -> Option<json_patch::Patch> {
    let r = &body["response"];
    let encoded = r.get("patch")?.as_str().unwrap();
    assert_eq!(r["patchType"], json!("JSONPatch"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    Some(serde_json::from_slice(&raw).unwrap())
}

fn warnings_of(body: &Value) -> Vec<String> {
    body["response"]["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// (fixture, outcome in warn mode, outcome in mutate mode)
const EXPECTED: &[(&str, Outcome, Outcome)] = &[
    ("pytorch-8gpu", Outcome::Warned, Outcome::Mutated),
    ("pytorchjob-worker", Outcome::Warned, Outcome::Mutated),
    ("vllm-deployment", Outcome::Warned, Outcome::Mutated),
    ("has-dshm", Outcome::Fit, Outcome::Fit),
    ("host-ipc", Outcome::HostIpc, Outcome::HostIpc),
    ("init-and-sidecar", Outcome::Warned, Outcome::Mutated),
    ("guaranteed", Outcome::Warned, Outcome::Mutated),
    ("pod-level-resources", Outcome::Warned, Outcome::Mutated),
    ("cpu-only", Outcome::NoGpu, Outcome::NoGpu),
    ("not-pod", Outcome::NotPod, Outcome::NotPod),
    ("malformed", Outcome::Error, Outcome::Error),
];

fn shared_warning(name: &str, size: &str) -> String {
    format!(
        "shmlink: container \"{name}\" uses GPUs and gets the runtime's 64Mi /dev/shm: DataLoader workers die with \"Bus error\", NCCL fails. Fix: mount an emptyDir (medium: Memory, sizeLimit: {size}) at /dev/shm and add {size} to its memory limit"
    )
}

fn mounted(name: &str, memory: &str) -> String {
    format!(
        "shmlink: mounted emptyDir \"shmlink-dshm\" (medium: Memory, sizeLimit: 1Gi) at /dev/shm in \"{name}\"; {memory}"
    )
}

/// The exact warnings of each fixture: (warn mode, mutate mode).
fn expected_warnings(name: &str) -> (Vec<String>, Vec<String>) {
    let raised =
        |a: &str, b: &str| format!("memory limit {a} -> {b}: tmpfs pages count against it");
    let unreadable =
        "shmlink: could not read the Pod (spec.containers is not a list); admitted unchanged";
    match name {
        "pytorch-8gpu" => (
            vec![shared_warning("trainer", "1Gi")],
            vec![mounted("trainer", &raised("512Gi", "513Gi"))],
        ),
        "pytorchjob-worker" => (
            vec![shared_warning("pytorch", "1Gi")],
            vec![mounted("pytorch", &raised("128Gi", "129Gi"))],
        ),
        "vllm-deployment" => (
            vec![shared_warning("vllm", "1Gi")],
            vec![mounted("vllm", "no memory limit of its own to raise")],
        ),
        "init-and-sidecar" => (
            vec![
                "shmlink: container \"preflight\" gets the runtime's 64Mi /dev/shm, less than the 1Gi this Pod needs. Fix: mount an emptyDir (medium: Memory, sizeLimit: 1Gi) at /dev/shm and add 1Gi to its memory limit".to_string(),
                shared_warning("trainer", "1Gi"),
            ],
            vec![
                mounted("preflight", "no memory limit of its own to raise"),
                mounted("trainer", &raised("64Gi", "65Gi")),
            ],
        ),
        "guaranteed" => (
            vec![shared_warning("trainer", "1Gi")],
            vec![mounted(
                "trainer",
                "memory limit 64Gi -> 65Gi, request 64Gi -> 65Gi (stays Guaranteed): tmpfs pages count against it",
            )],
        ),
        "pod-level-resources" => (
            vec![shared_warning("trainer", "1Gi")],
            vec![
                mounted("trainer", &raised("200Gi", "201Gi")),
                "shmlink: Pod memory limit 256Gi -> 257Gi, request 256Gi -> 257Gi (spec.resources): the tmpfs pages of \"shmlink-dshm\" count against it".to_string(),
            ],
        ),
        "malformed" => (vec![unreadable.to_string()], vec![unreadable.to_string()]),
        _ => (Vec::new(), Vec::new()),
    }
}

#[test]
fn every_fixture_in_both_modes() {
    let mut patched = Vec::new();
    for &(name, warn, mutate) in EXPECTED {
        let review = fixture(name);
        let (want_warn, want_mutate) = expected_warnings(name);
        for (mode, outcome, want) in [
            (Mode::Warn, warn, &want_warn),
            (Mode::Mutate, mutate, &want_mutate),
        ] {
            let started = Instant::now();
            let (a, body) = run(&review, mode);
            let took = started.elapsed();
            let patch = patch_of(&body);
            let warnings = warnings_of(&body);
            println!(
                "== {name} ({mode}): {} — {} [{took:?}]",
                a.outcome.as_str(),
                a.summary
            );
            if let Some(p) = &patch {
                println!("patch: {}", serde_json::to_string(p).unwrap());
            }
            for w in &warnings {
                println!("warning: {w}");
            }
            assert_eq!(a.status, 200, "{name}");
            assert_eq!(a.outcome, outcome, "{name} in {mode}: {}", a.summary);
            assert_eq!(&warnings, want, "{name} in {mode}");
            let response = &body["response"];
            assert_eq!(response["allowed"], json!(true));
            assert_eq!(response["uid"], review["request"]["uid"]);
            assert_eq!(body["apiVersion"], json!("admission.k8s.io/v1"));
            assert_eq!(
                patch.is_some(),
                outcome == Outcome::Mutated,
                "{name} in {mode}"
            );
            if let Some(p) = patch {
                let pod = &review["request"]["object"];
                let mut after = pod.clone();
                json_patch::patch(&mut after, &p).unwrap_or_else(|e| panic!("{name}: {e}"));
                only_our_changes(name, pod, &after);
                every_changed_container_is_fit(name, pod, &after);
                reinvocation_changes_nothing(name, &review, &after);
                patched.push((name, after));
            }
        }
    }
    validate_with_kubernetes(&patched);
}

#[test]
fn the_exact_patch_of_two_pods() {
    let ops = |name: &str| {
        let (_, body) = run(&fixture(name), Mode::Mutate);
        serde_json::to_value(patch_of(&body).unwrap()).unwrap()
    };
    let mount = json!({"name": "shmlink-dshm", "mountPath": "/dev/shm"});
    let volume =
        json!({"name": "shmlink-dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}});
    assert_eq!(
        ops("pytorch-8gpu"),
        json!([
            {"op": "add", "path": "/spec/volumes/-", "value": volume},
            {"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": mount},
            {"op": "replace", "path": "/spec/containers/0/resources/limits/memory", "value": "513Gi"},
        ])
    );
    assert_eq!(
        ops("guaranteed"),
        json!([
            {"op": "add", "path": "/spec/volumes/-", "value": volume},
            {"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": mount},
            {"op": "replace", "path": "/spec/containers/0/resources/limits/memory", "value": "65Gi"},
            {"op": "replace", "path": "/spec/containers/0/resources/requests/memory", "value": "65Gi"},
        ])
    );
}

/// Every difference between the Pod and the patched Pod is one the webhook means: our volume,
/// our mounts, and memory quantities raised by exactly the size.
fn only_our_changes(name: &str, before: &Value, after: &Value) {
    let mut changes = Vec::new();
    diff("", before, after, &mut changes);
    assert!(!changes.is_empty(), "{name}: a patch that changes nothing");
    for (path, old, new) in changes {
        let ours = new.get("name") == Some(&json!("shmlink-dshm"))
            && old.is_null()
            && (path.starts_with("/spec/volumes/") || path.contains("/volumeMounts/"));
        let raised = path.ends_with("/memory")
            && (path.contains("/resources/limits/") || path.contains("/resources/requests/"))
            && {
                let q = |v: &Value| parse_quantity_bytes(v.as_str().unwrap()).unwrap();
                q(&new) == q(&old) + GIB
            };
        assert!(
            ours || raised,
            "{name}: unexpected change at {path}: {old} -> {new}"
        );
    }
}

/// Leaf differences (path, old, new); an element only in `after` has old = null.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<(String, Value, Value)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let (p, q) = (x.get(key), y.get(key));
                let sub = format!("{path}/{key}");
                diff(
                    &sub,
                    p.unwrap_or(&Value::Null),
                    q.unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let (p, q) = (x.get(i), y.get(i));
                let sub = format!("{path}/{i}");
                diff(
                    &sub,
                    p.unwrap_or(&Value::Null),
                    q.unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        // A list the patch created whole: each element is one change.
        (Value::Null, Value::Array(y)) => {
            for (i, q) in y.iter().enumerate() {
                out.push((format!("{path}/{i}"), Value::Null, q.clone()));
            }
        }
        _ if a != b => out.push((path.to_string(), a.clone(), b.clone())),
        _ => {}
    }
}

/// Each container that now mounts shmlink-dshm is one preflight's view finds fit, and every
/// container preflight found short before is fit now.
fn every_changed_container_is_fit(name: &str, before: &Value, after: &Value) {
    let mut judged = 0;
    for list in ["initContainers", "containers"] {
        let Some(items) = after["spec"][list].as_array() else {
            continue;
        };
        for (i, c) in items.iter().enumerate() {
            let ours = c["volumeMounts"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["name"] == json!("shmlink-dshm")));
            let was_short = is_short(&preflight_view(before, &before["spec"][list][i]));
            let now = preflight_view(after, c);
            if ours {
                judged += 1;
                assert!(was_short, "{name}: {list}[{i}] was not short before");
                assert_eq!(
                    now.verdict,
                    Verdict::Fit,
                    "{name} {list}[{i}]: {:?}",
                    now.problems
                );
                assert!(
                    now.problems.is_empty(),
                    "{name} {list}[{i}]: {:?}",
                    now.problems
                );
                assert_eq!(now.shm.size_bytes, Some(GIB));
            } else if pod_uses_gpus(c) {
                assert!(
                    !is_short(&now),
                    "{name}: GPU container {list}[{i}] left short"
                );
            }
        }
    }
    assert!(judged > 0, "{name}: no container got the mount");
}

fn pod_uses_gpus(c: &Value) -> bool {
    ["limits", "requests"].iter().any(|w| {
        c["resources"][w]
            .as_object()
            .is_some_and(|m| m.keys().any(|k| k.ends_with("/gpu")))
    })
}

fn reinvocation_changes_nothing(name: &str, review: &Value, after: &Value) {
    let mut again = review.clone();
    again["request"]["object"] = after.clone();
    for mode in [Mode::Warn, Mode::Mutate] {
        let (a, body) = run(&again, mode);
        assert_eq!(
            a.outcome,
            Outcome::Fit,
            "{name} reinvoked in {mode}: {}",
            a.summary
        );
        assert_eq!(
            body["response"],
            json!({"uid": review["request"]["uid"], "allowed": true})
        );
    }
}

/// `kubernetes-validate --strict` for 1.33 and 1.37 over the patched Pods (and the originals,
/// so a fixture that is not a valid Pod is found too). SKIPPED where the tool is absent; a
/// failure under `SHMLINK_E2E=require`.
fn validate_with_kubernetes(patched: &[(&str, Value)]) {
    let tool = "kubernetes-validate";
    let present = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        let why = format!("SKIPPED: {tool} is not installed (pip install kubernetes-validate)");
        if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
            panic!("{why}");
        }
        // Straight to the process's stderr: libtest captures eprintln!, and a skip must show.
        let _ = writeln!(std::io::stderr(), "{why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut write = |file: String, pod: &Value| {
        // A controller's Pod reaches admission with generateName only; the API server names it
        // after admission. The tool needs a name, so give it the one the server would.
        let mut pod = pod.clone();
        if pod["metadata"].get("name").is_none() {
            let prefix = pod["metadata"]["generateName"]
                .as_str()
                .unwrap()
                .to_string();
            pod["metadata"]["name"] = json!(format!("{prefix}x2k9q"));
        }
        let path = dir.path().join(file);
        std::fs::write(&path, serde_json::to_vec_pretty(&pod).unwrap()).unwrap();
        files.push(path);
    };
    for (i, (name, pod)) in patched.iter().enumerate() {
        write(format!("{i}-{name}.json"), pod);
    }
    for &(name, _, _) in EXPECTED {
        if !["not-pod", "malformed"].contains(&name) {
            write(
                format!("original-{name}.json"),
                &fixture(name)["request"]["object"],
            );
        }
    }
    for version in ["1.33.0", "1.37.0"] {
        let out = Command::new(tool)
            .args(["-k", version, "--strict"])
            .args(&files)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        println!("kubernetes-validate {version}:\n{text}");
        assert!(out.status.success(), "{version}:\n{text}");
        assert_eq!(
            text.matches("passed").count(),
            files.len(),
            "{version}:\n{text}"
        );
    }
}

#[test]
fn what_is_not_an_admission_review_is_refused_without_a_panic() {
    let deep = "[".repeat(200_000);
    let nested_pod = format!(
        "{{\"request\": {{\"uid\": \"u\", \"object\": {}1{}}}}}",
        "{\"a\":".repeat(100_000),
        "}".repeat(100_000)
    );
    // The same depth inside a field the decision reads: past serde_json's recursion limit.
    let nested_args = format!(
        "{{\"request\": {{\"uid\": \"u\", \"object\": {{\"spec\": {{\"containers\": [{{\"args\": {}1{}}}]}}}}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    for body in [
        b"".to_vec(),
        b"null".to_vec(),
        b"{\"request\": null}".to_vec(),
        deep.into_bytes(),
        nested_args.into_bytes(),
        vec![0xff, 0xfe, 0x00],
    ] {
        let a = answer(&body, Mode::Mutate);
        assert_eq!(
            (a.status, a.outcome),
            (400, Outcome::Error),
            "{}",
            a.summary
        );
        let reply: Value = serde_json::from_slice(&a.body).unwrap();
        assert!(reply["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    // Nested as deep in a field the decision never reads: skipped as it is parsed (no stack
    // taken), and the review answered for what it is (here no Pod CREATE).
    let a = answer(nested_pod.as_bytes(), Mode::Mutate);
    assert_eq!(
        (a.status, a.outcome),
        (200, Outcome::NotPod),
        "{}",
        a.summary
    );
}

/// A Pod of 10,000 GPU containers is not patched at any cost: read within its budget (or
/// counted when past it), it is let through unchanged with one warning, at once.
#[test]
fn ten_thousand_gpu_containers() {
    let mut review = fixture("pytorch-8gpu");
    let one = review["request"]["object"]["spec"]["containers"][0].clone();
    let many: Vec<Value> = (0..10_000)
        .map(|i| {
            let mut c = one.clone();
            c["name"] = json!(format!("trainer-{i}"));
            c
        })
        .collect();
    review["request"]["object"]["spec"]["containers"] = Value::Array(many);
    for mode in [Mode::Mutate, Mode::Warn] {
        let started = Instant::now();
        let (a, body) = run(&review, mode);
        let took = started.elapsed();
        println!(
            "10,000 GPU containers ({mode}): {:?}, {} bytes, answered in {took:?}",
            a.outcome,
            a.body.len()
        );
        assert_eq!((a.status, a.outcome), (200, Outcome::Warned));
        assert!(patch_of(&body).is_none());
        assert_eq!(
            warnings_of(&body),
            vec!["shmlink: this Pod has 10000 containers, more than the 128 the webhook judges: admitted unchanged. Run `shmlink preflight` in its GPU containers to check their /dev/shm".to_string()]
        );
    }
}

/// Random changes to the fixtures' Pods (values swapped for other types, odd quantities, keys
/// removed): the answer is always a 200 that allows the Pod, and any patch applies to it.
#[test]
fn random_mutations_never_panic_and_patches_always_apply() {
    let mut rng = Rng::new(0x5eed_0039);
    let names: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    let mut outcomes = std::collections::BTreeMap::new();
    for round in 0..3000 {
        let mut review = fixture(names[rng.below(names.len())]);
        for _ in 0..=rng.below(4) {
            mutate_somewhere(&mut rng, &mut review["request"]["object"]);
        }
        let mode = if round % 2 == 0 {
            Mode::Warn
        } else {
            Mode::Mutate
        };
        let (a, body) = run(&review, mode);
        assert_eq!(a.status, 200, "round {round}: {}", a.summary);
        assert_eq!(body["response"]["allowed"], json!(true));
        *outcomes.entry(a.outcome.as_str()).or_insert(0) += 1;
        if let Some(p) = patch_of(&body) {
            let mut pod = review["request"]["object"].clone();
            json_patch::patch(&mut pod, &p).unwrap_or_else(|e| {
                panic!("round {round}: {e}\n{}", serde_json::to_string(&p).unwrap())
            });
        }
    }
    println!("outcomes over 3000 random Pods: {outcomes:?}");
    assert!(
        outcomes.len() >= 5,
        "the mutations reach few outcomes: {outcomes:?}"
    );
}

fn mutate_somewhere(rng: &mut Rng, root: &mut Value) {
    const ODD: &[&str] = &[
        "",
        "-1Gi",
        "1e999",
        "0",
        "1000m",
        "99999999999999999999Ei",
        "8",
        "Memory",
        "/dev/shm",
        "/dev/shm/",
        "/dev",
        "shmlink-dshm",
        "Always",
        "true",
        "shmlink preflight",
        "off",
    ];
    // Choose a random path down, then replace, remove or add there.
    let mut path = String::new();
    let mut at: &Value = root;
    for _ in 0..rng.below(8) {
        let token = match at {
            Value::Object(m) if !m.is_empty() => m.keys().nth(rng.below(m.len())).unwrap().clone(),
            Value::Array(v) if !v.is_empty() => rng.below(v.len()).to_string(),
            _ => break,
        };
        let escaped = token.replace('~', "~0").replace('/', "~1");
        path = format!("{path}/{escaped}");
        at = root.pointer(&path).unwrap();
    }
    let at = root.pointer_mut(&path).unwrap();
    let odd = json!(ODD[rng.below(ODD.len())]);
    let replacement = match rng.below(7) {
        0 => Value::Null,
        1 => json!(rng.next_u64() % 100),
        2 => json!([odd]),
        3 => json!({"nvidia.com/gpu": odd, "memory": odd}),
        4 => json!(-1.5),
        _ => odd,
    };
    match (rng.below(3), &mut *at) {
        (0, Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth(rng.below(m.len())).unwrap().clone();
            m.remove(&k);
        }
        (1, Value::Object(m)) => {
            let keys = [
                "resources",
                "volumeMounts",
                "hostIPC",
                "annotations",
                "shmlink.io/shm-size",
                "limits",
            ];
            m.insert(keys[rng.below(keys.len())].to_string(), replacement);
        }
        _ => *at = replacement,
    }
}

/// The ValidatingAdmissionPolicy (deploy/components/admission-policy) is the webhook's warning
/// for clusters that run no server: for each Pod of its test data, `shmlink admit` in warn mode
/// gives the very warnings that scripts/deploy/admission_cel.py asserts the policy's CEL gives
/// (testdata/expected.json), and none where the policy gives none.
#[test]
fn the_webhook_warns_as_the_policy_does() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/components/admission-policy/testdata");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let template = expected["template"].as_str().unwrap();
    let pods = expected["pods"].as_object().unwrap();
    assert!(pods.len() >= 10, "{} Pods", pods.len());
    for (name, want) in pods {
        let review: Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap())
                .unwrap();
        let (a, body) = run(&review, Mode::Warn);
        assert_eq!(a.status, 200, "{name}");
        // The policy speaks only of containers that use GPUs; the webhook may say more (an
        // annotation it cannot read).
        let gpu_warnings: Vec<String> = warnings_of(&body)
            .into_iter()
            .filter(|w| w.contains(" uses GPUs and gets the runtime's 64Mi /dev/shm"))
            .collect();
        let policy: Vec<String> = want["warnings"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .map(|w| {
                        template
                            .replace("{name}", w[0].as_str().unwrap())
                            .replace("{size}", w[1].as_str().unwrap())
                    })
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "{name}: {} ({} warning(s))",
            a.outcome.as_str(),
            gpu_warnings.len()
        );
        assert_eq!(gpu_warnings, policy, "{name}");
        if want["warnings"].is_null() {
            assert!(
                matches!(a.outcome, Outcome::HostIpc | Outcome::OptedOut),
                "{name}: the policy skips it, the webhook said {}",
                a.outcome.as_str()
            );
        }
    }
}

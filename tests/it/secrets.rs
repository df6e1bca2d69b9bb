//! A Pod's log line that names its failure beside its secrets (issue 51): `check` (JSON and
//! tables) keeps the matched words with their context, secrets redacted, far text left out,
//! and a bidi override written out, never raw. The same `Failure` is what serve stores, serves
//! and publishes (`Detected::matched` is where a line becomes evidence, for every source). No
//! root needed: the log is a file in a temporary pod log root.

use crate::common;

const SECRETS: [&str; 5] = [
    "hunter2",
    "abcdef0123456789abcdef",
    "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9",
    "far-away-words-of-the-pod",
];

fn lines(at: &str) -> String {
    let far = format!("far-away-words-of-the-pod {}", "x".repeat(400));
    [
        format!(
            "{at} stderr F password=hunter2 RuntimeError: unable to allocate shared memory(shm) \
             for file </torch_7_1_0>: No space left on device (28) Authorization: Bearer \
             abcdef0123456789abcdef"
        ),
        format!(
            "{at} stderr F {far} key AKIAIOSFODNN7EXAMPLE jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln \
             RuntimeError: unable to write to file </torch_8_1_0>: No space left on device (28)"
        ),
        format!(
            "{at} stderr F ERROR: Unexpected bus error encountered in worker. This might be caused \
             by insufficient shared memory (shm).\u{202e}gnp.exe"
        ),
    ]
    .join("\n")
        + "\n"
}

#[test]
fn a_pods_secrets_and_far_words_never_leave_it_and_a_bidi_override_is_written_out() {
    let (root, dir) = common::trainer_log_dir();
    let at = common::time_ago(std::time::Duration::from_secs(60));
    std::fs::write(dir.join("0.log"), lines(&at)).unwrap();
    let log_root = root.path().to_string_lossy().to_string();
    let args = [
        "--kube",
        "off",
        "--pod-log-root",
        &log_root,
        "--docker-root",
        "off",
        "--kmsg",
        "off",
        "--state-dir",
        "none",
        "--since",
        "1h",
    ];
    let report = common::run_check_json(&args);
    let ours: Vec<&serde_json::Value> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["pod"] == "trainer-0")
        .collect();
    assert_eq!(ours.len(), 3, "{ours:#?}");
    let text = serde_json::to_string(&ours).unwrap();
    let table = String::from_utf8_lossy(&common::run_check(&args).stdout).into_owned();
    for out in [&text, &table] {
        for secret in SECRETS {
            assert!(!out.contains(secret), "{secret} left the Pod:\n{out}");
        }
        assert!(!out.contains('\u{202e}'), "a raw bidi override:\n{out}");
    }
    let evidence: Vec<&str> = ours.iter().filter_map(|f| f["evidence"].as_str()).collect();
    assert!(
        evidence.iter().any(|e| e.contains(
            "password=<redacted> RuntimeError: unable to allocate shared memory(shm) for file \
             </torch_7_1_0>: No space left on device (28) Authorization: Bearer <redacted>"
        )),
        "{evidence:#?}"
    );
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with('…') && e.contains("key <redacted> jwt <redacted> RuntimeError")),
        "{evidence:#?}"
    );
    assert!(
        evidence
            .iter()
            .any(|e| e.ends_with("(shm).\\u{202e}gnp.exe")),
        "{evidence:#?}"
    );
    assert!(table.contains("\\u{202e}"), "{table}");
}

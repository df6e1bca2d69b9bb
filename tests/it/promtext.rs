//! The harnesses' Prometheus text parsers (tests/common/promtext.rs and .py): what they take
//! from a scrape, and that the two agree. A test of its own so that it runs once, not in every
//! binary that includes tests/common.

use crate::common::promtext;

use std::io::Write;
use std::process::{Command, Stdio};

use promtext::{samples, value, Sample};

const TEXT: &str = r#"# HELP shmlink_shm_used_bytes bytes used
# TYPE shmlink_shm_used_bytes gauge
shmlink_nvml_up 0
shmlink_shm_used_bytes{namespace="ml",pod="a,b}c",container_id="3f2a"} 8388608
shmlink_build_info{version="0.1.0",} 1
shmlink_scan_duration_seconds_bucket{collector="shm",le="+Inf"} 7 1700000000000
odd{msg="q\"uote\\back\nnl", b = "2" } NaN
  indented{x="1"} -2.5e-3

not a sample line
broken{x="1" 3
unquoted{x=1} 3
glued{x="1"}4
"#;

#[test]
fn parses_names_labels_values_and_skips_the_rest() {
    let all: Vec<Sample> = samples(TEXT).collect();
    let names: Vec<&str> = all.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "shmlink_nvml_up",
            "shmlink_shm_used_bytes",
            "shmlink_build_info",
            "shmlink_scan_duration_seconds_bucket",
            "odd",
            "indented",
        ]
    );
    assert_eq!(all[1].label("pod"), Some("a,b}c"));
    assert_eq!(all[1].value, 8388608.0);
    assert_eq!(all[2].labels, [("version", "0.1.0".to_string())]);
    assert_eq!(all[3].label("le"), Some("+Inf"));
    assert_eq!(all[3].value, 7.0);
    assert_eq!(all[4].label("msg"), Some("q\"uote\\back\nnl"));
    assert_eq!(all[4].label("b"), Some("2"));
    assert!(all[4].value.is_nan());
    assert_eq!(all[5].value, -2.5e-3);
}

#[test]
fn value_finds_the_series_with_every_label_asked() {
    assert_eq!(value(TEXT, "shmlink_nvml_up", &[]), Some(0.0));
    assert_eq!(
        value(TEXT, "shmlink_shm_used_bytes", &[("namespace", "ml")]),
        Some(8388608.0)
    );
    assert_eq!(
        value(
            TEXT,
            "shmlink_shm_used_bytes",
            &[("namespace", "ml"), ("pod", "x")]
        ),
        None
    );
    // A name is matched whole, never as a prefix.
    assert_eq!(value(TEXT, "shmlink_shm_used", &[]), None);
}

/// Prints what tests/common/promtext.py makes of its stdin, as JSON.
const PYTHON: &str = "import json, sys, promtext
print(json.dumps([[n, sorted(l.items()), repr(v)] for n, l, v in promtext.samples(sys.stdin.read())]))";

#[test]
fn the_python_parser_reads_the_same_samples() {
    let mut child = Command::new("python3")
        .args(["-c", PYTHON])
        .env(
            "PYTHONPATH",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (the Python harnesses need it too)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(TEXT.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rust: Vec<serde_json::Value> = samples(TEXT)
        .map(|s| {
            let mut labels: Vec<_> = s
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            labels.sort();
            serde_json::json!([s.name, labels, python_repr(s.value)])
        })
        .collect();
    assert_eq!(python, serde_json::Value::Array(rust));
}

/// A float as Python's repr() writes it.
fn python_repr(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == v.trunc() && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v:?}")
    }
}

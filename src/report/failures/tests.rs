use std::time::Duration;

use super::*;
use crate::fixtures;
use crate::model::{FailureSource, Snapshot};
use crate::report::{write_tables, Style};

fn now() -> SystemTime {
    text::parse_rfc3339("2026-11-26T18:00:00Z").unwrap()
}

/// A failure of `pod`'s container `minutes` before `now()`, its message with its time in it as
/// the texts write it.
fn failure(kind: FindingKind, pod: Option<&str>, minutes: u64) -> Failure {
    let at = k8s_openapi::jiff::Timestamp::try_from(now() - Duration::from_secs(minutes * 60))
        .unwrap()
        .to_string();
    let mut f = fixtures::failure(kind, "ml", pod.unwrap_or("x"), "uid-1");
    if pod.is_none() {
        f.placed = crate::model::ContainerRef::default();
        f.source = FailureSource::Kernel;
    }
    f.message = format!(
        "{} died at {at}: {}",
        pod.unwrap_or("process python (host PID 7)"),
        "word ".repeat(40).trim_end()
    );
    f.at = crate::model::Stamp::parse(&at).unwrap();
    f
}

/// The node: one container's three bus errors, another's allocation failure, and the
/// kernel's older deaths of host processes with one recent.
fn node() -> Vec<Failure> {
    let mut all = vec![
        failure(FindingKind::ShmBusError, Some("train-0"), 40),
        failure(FindingKind::GpuJobCrashed, None, 2),
        failure(FindingKind::ShmBusError, Some("train-0"), 12),
        failure(FindingKind::ShmAllocationFailed, Some("loader-1"), 5),
        failure(FindingKind::ShmBusError, Some("train-0"), 25),
    ];
    for minutes in [30, 35, 50] {
        all.push(failure(FindingKind::WorkloadOomKilled, None, minutes));
    }
    all
}

#[test]
fn failures_group_per_container_and_kind_newest_first_with_counts() {
    let failures = node();
    let (own, others) = groups(&failures);
    let heads: Vec<String> = own
        .iter()
        .map(|g| head(g, now(), Paint { on: false }))
        .collect();
    assert_eq!(
        heads,
        [
            "1x shm_allocation_failed  ml/loader-1/trainer  5 min ago",
            "3x shm_bus_error  ml/train-0/trainer  last 12 min ago, first 40 min ago",
        ]
    );
    assert_eq!(own[1].latest.at, failures[2].at, "the newest one's message");
    let kinds: Vec<(FindingKind, usize)> = others.iter().map(|g| (g.kind, g.count)).collect();
    assert_eq!(
        kinds,
        [
            (FindingKind::GpuJobCrashed, 1),
            (FindingKind::WorkloadOomKilled, 3)
        ]
    );
}

#[test]
fn a_message_says_how_long_ago_not_the_exact_time() {
    let f = failure(FindingKind::ShmBusError, Some("train-0"), 12);
    let m = message_then(&f, now());
    assert!(m.starts_with("train-0 died 12 min ago: word"), "{m}");
    assert!(!m.contains("2026-"), "{m}");
}

fn table(failures: Vec<Failure>, width: Option<usize>) -> String {
    let snap = Snapshot {
        node: "n1".into(),
        findings: failures
            .iter()
            .map(crate::failures::correlate::finding)
            .collect(),
        failures,
        taken_at: Some(now()),
        ..Snapshot::default()
    };
    let mut out = Vec::new();
    write_tables(
        &mut out,
        &snap,
        Style {
            colour: false,
            width,
        },
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn the_workloads_own_come_first_and_old_deaths_elsewhere_are_counted() {
    let text = table(node(), None);
    let own = text.find("Workload failures (4,").expect(&text);
    let bus = text
        .find("3x shm_bus_error  ml/train-0/trainer")
        .expect(&text);
    let others = text
        .find("Kernel-log deaths of processes outside any known container:")
        .expect(&text);
    assert!(own < bus && bus < others, "{text}");
    assert!(text.contains("  1x gpu_job_crashed  2 min ago\n"), "{text}");
    assert!(
        text.contains(
            "  3 older kernel-log deaths of other processes (the newest 30 min ago): \
             `check --json` lists them."
        ),
        "{text}"
    );
    assert!(
        !text.contains("workload_oom_killed"),
        "older ones are counted only: {text}"
    );
    assert!(
        !text.contains("CRITICAL"),
        "no finding repeats a failure: {text}"
    );
    assert!(text.contains("No other findings."), "{text}");
    assert!(!text.contains("2026-11-26T"), "relative times only: {text}");
    // A pipe gets every message whole on its line.
    assert!(text.lines().any(|l| l.len() > 200), "{text}");
}

#[test]
fn on_a_terminal_every_line_fits_and_messages_wrap_under_their_head() {
    let text = table(node(), Some(80));
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line:?}\n{text}");
    }
    assert!(
        text.contains("\n       train-0 died 12 min ago: word word"),
        "{text}"
    );
    assert!(
        text.contains("\n       word word"),
        "wrapped with its indent: {text}"
    );
}

#[test]
fn a_yaml_message_keeps_its_lines_and_indents_when_wrapped() {
    let mut out = Vec::new();
    let yaml = "Fix:\n  volumes:\n  - name: dshm";
    crate::report::write_wrapped(&mut out, yaml, "  ", "      ", Some(100)).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "  Fix:\n        volumes:\n        - name: dshm\n"
    );
    let mut piped = Vec::new();
    crate::report::write_wrapped(&mut piped, yaml, "  ", "      ", None).unwrap();
    assert_eq!(
        String::from_utf8(piped).unwrap(),
        "  Fix:\n        volumes:\n        - name: dshm\n"
    );
}

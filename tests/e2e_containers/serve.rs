//! `shmlink serve` end to end: readiness, /metrics from real containers, series that vanish
//! with their container, a clean exit on SIGTERM.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::agent::{get, method, Agent};
use common::{Container, ContainerSpec};

#[test]
fn serve_exposes_containers_and_drops_series_of_those_that_exit() {
    if !common::e2e_available() {
        return;
    }
    let pod = common::random_pod_uid();
    let c = Container::start(ContainerSpec {
        pod_uid: Some(pod.clone()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "dd if=/dev/zero of=/dev/shm/x bs=1M count=8 2>/dev/null; exec sleep 3600".into(),
        ],
        ..ContainerSpec::default()
    });
    let agent = Agent::start(&["--no-gpu"], &[]);
    assert!(
        common::wait_until(Duration::from_secs(20), || get(agent.addr, "/readyz")
            .is_some_and(|(s, _)| s == 200)),
        "never ready"
    );
    assert_eq!(get(agent.addr, "/healthz").map(|(s, _)| s), Some(200));

    let id_label = format!("container_id=\"{}\"", c.id);
    let series_with = |body: &str, metric: &str| {
        body.lines()
            .filter(|l| l.starts_with(metric) && l.contains(&id_label))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let mut body = String::new();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            body = agent.metrics();
            common::promtext::value(
                &body,
                "shmlink_shm_used_bytes",
                &[("container_id", c.id.as_str())],
            )
            .is_some_and(|used| used >= 8.0 * 1048576.0)
        }),
        "no used-bytes series with 8 MiB for {}:\n{body}",
        c.id
    );
    let size = series_with(&body, "shmlink_shm_size_bytes{");
    assert_eq!(size.len(), 1, "{size:?}");
    assert!(size[0].ends_with(" 67108864"), "{}", size[0]);
    assert!(
        size[0].contains(&format!("pod_uid=\"{pod}\"")),
        "{}",
        size[0]
    );
    assert!(body.contains("# TYPE shmlink_scan_duration_seconds histogram"));
    assert!(body.contains("shmlink_scan_errors_total{collector=\"shm\"}"));
    assert!(body.contains("shmlink_build_info{version="));
    assert!(body.contains("shmlink_nvml_up 0"));

    // Only GET on known paths.
    assert_eq!(get(agent.addr, "/nope").map(|(s, _)| s), Some(404));
    assert_eq!(method(agent.addr, "POST", "/metrics"), Some(405));

    drop(c);
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            body = agent.metrics();
            !body.contains(&id_label)
        }),
        "series of the exited container remain:\n{body}"
    );
    let status = agent.terminate();
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn bad_options_are_one_line_errors_with_exit_2() {
    for args in [
        vec!["serve", "--interval", "soon"],
        vec!["check", "--shm-warn-ratio", "1.5"],
        vec![
            "check",
            "--shm-warn-ratio",
            "0.9",
            "--shm-critical-ratio",
            "0.5",
        ],
    ] {
        let out = Command::new(common::shmlink_bin())
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).trim().is_empty());
    }
}

#[test]
fn a_young_container_that_fills_its_dev_shm_between_scans_shows_the_peak() {
    if !common::e2e_available() {
        return;
    }
    let agent = Agent::start(&["--no-gpu", "--kmsg", "off", "--interval", "4s"], &[]);
    agent.wait_ready();
    // A job that uses nothing while scans look, then fills /dev/shm for a moment. (Were no
    // young container sampled, this passes only when a scan lands in that moment, ~1 in 10.)
    let c = Container::start(ContainerSpec {
        pod_uid: Some(common::random_pod_uid()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "sleep 5; dd if=/dev/zero of=/dev/shm/x bs=1M count=48 2>/dev/null; sleep 0.3; \
             rm /dev/shm/x; exec sleep 3600"
                .into(),
        ],
        ..ContainerSpec::default()
    });
    let id = [("container_id", c.id.as_str())];
    let mut seen = Vec::new();
    let sampled = common::wait_until(Duration::from_secs(15), || {
        let body = agent.metrics();
        let peak = common::promtext::value(&body, "shmlink_shm_used_peak_bytes", &id);
        let used = common::promtext::value(&body, "shmlink_shm_used_bytes", &id);
        if let (Some(peak), Some(used)) = (peak, used) {
            seen.push((used, peak));
            // The scan read next to nothing; the peak between scans was the job's fill.
            return peak >= 48.0 * 1048576.0 && used < 1048576.0;
        }
        false
    });
    assert!(sampled, "no sampled peak; (used, peak) seen: {seen:?}");
}

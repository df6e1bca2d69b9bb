//! `--log-level`, and `SHMLINK_LOG` as the experts' full filter: a filter that does not parse
//! is an error (exit 2), not silently another level.

use crate::common;

use std::process::{Command, Stdio};

use common::agent::Agent;

const SERVING: &str = "serving /metrics";

#[test]
fn an_invalid_filter_is_an_error() {
    for var in ["SHMLINK_LOG", "RUST_LOG"] {
        let out = Command::new(common::shmlink_bin())
            .args(["check", "--no-gpu", "--kube", "off"])
            .env_remove("SHMLINK_LOG")
            .env_remove("RUST_LOG")
            .env(var, "shmlink=loudest")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {stderr}");
        assert!(
            stderr.contains(&format!("{var}=\"shmlink=loudest\" is not a valid filter")),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "it ran anyway");
    }
}

#[test]
fn an_unknown_level_is_an_error() {
    let out = Command::new(common::shmlink_bin())
        .args(["serve", "--log-level", "verbose"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-level"));
}

/// serve logs at info by default; `--log-level warn` leaves out its info lines, and
/// `SHMLINK_LOG` beats it.
#[test]
fn the_level_decides_what_serve_logs() {
    let log = |extra: &[&str], env: &[(&str, &std::ffi::OsStr)]| {
        let agent = Agent::start(extra, env);
        agent.wait_ready();
        agent.log_text()
    };
    assert!(log(&["--no-gpu"], &[]).contains(SERVING));
    assert!(!log(&["--no-gpu", "--log-level", "warn"], &[]).contains(SERVING));
    let expert = std::ffi::OsStr::new("shmlink=info");
    assert!(log(
        &["--no-gpu", "--log-level", "error"],
        &[("SHMLINK_LOG", expert)]
    )
    .contains(SERVING));
}

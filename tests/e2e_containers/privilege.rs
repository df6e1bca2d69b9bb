//! Least privilege: `serve` keeps only CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (what the
//! DaemonSet grants) and still measures every container; without either, it loses the
//! containers that capability exists for. Run as root under `setpriv`, which takes the others
//! out of the bounding set, so the exec'ed agent cannot hold them.

use crate::common;

use std::os::unix::fs::chown;
use std::process::Command;

use common::agent::{sample, Agent};
use common::{Container, ContainerSpec};
use serde_json::Value;

const MIB: f64 = 1048576.0;

fn setpriv(caps: &str) -> Vec<String> {
    [
        "setpriv",
        "--bounding-set",
        caps,
        "--inh-caps",
        "-all",
        "--no-new-privs",
        "--",
    ]
    .map(String::from)
    .to_vec()
}

/// A container with `mib` MiB in /dev/shm. Its processes hold CAP_KILL, CAP_CHOWN,
/// CAP_DAC_OVERRIDE and CAP_FOWNER, as a default Kubernetes container holds these and more:
/// reading its /proc entries takes CAP_SYS_PTRACE from an agent that lacks them.
fn container(mib: u64) -> Container {
    let c = Container::start(ContainerSpec {
        args: vec![
            "sh".into(),
            "-c".into(),
            format!("dd if=/dev/zero of=/dev/shm/d bs=1M count={mib} 2>/dev/null; touch /tmp/ready; exec sleep 3600"),
        ],
        ..ContainerSpec::default()
    });
    c.wait_ready();
    c
}

/// `check --json` under `setpriv` with `caps`: container ID -> used bytes (None: not measured).
fn used_under(caps: &str, ids: &[&str]) -> Vec<Option<f64>> {
    let wrapper = setpriv(caps);
    let out = Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .args([common::shmlink_bin(), "check", "--json", "--no-gpu"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{caps}: {e}; stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    ids.iter()
        .map(|id| {
            report["shm"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["container_id"] == *id)
                .and_then(|e| e["used_bytes"].as_f64())
        })
        .collect()
}

#[test]
fn serve_with_only_sys_ptrace_and_dac_read_search_sees_every_container() {
    if !common::e2e_available() {
        return;
    }
    if common::tool("setpriv", "util-linux").is_none() {
        return;
    }
    let plain = container(3);
    // A container whose root directory belongs to another user, mode 0700 (as with user
    // namespaces): root without CAP_DAC_READ_SEARCH cannot even look up its /dev.
    let private = container(2);
    let root = format!("/proc/{}/root", private.pid);
    chown(&root, Some(12345), Some(12345)).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();

    let wrapper = setpriv("-all,+sys_ptrace,+dac_read_search");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let agent = Agent::start_under(&wrapper, &["--no-gpu"], &[]);
    agent.wait_ready();
    let body = agent.wait_for_metrics("both containers measured", |b| {
        sample(b, "shmlink_shm_used_bytes", &[("container_id", &plain.id)]) == Some(3.0 * MIB)
            && sample(
                b,
                "shmlink_shm_used_bytes",
                &[("container_id", &private.id)],
            ) == Some(2.0 * MIB)
    });
    // It really ran without the rest: its effective set is exactly the two.
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    const CAP_DAC_READ_SEARCH: u32 = 2;
    const CAP_SYS_PTRACE: u32 = 19;
    assert_eq!(
        cap_eff,
        (1 << CAP_DAC_READ_SEARCH) | (1 << CAP_SYS_PTRACE),
        "{status}"
    );
    assert_eq!(
        sample(
            &body,
            "shmlink_shm_size_bytes",
            &[("container_id", &private.id)]
        ),
        Some(64.0 * MIB)
    );
    assert!(agent.terminate().success());

    // Each of the two is needed: without CAP_DAC_READ_SEARCH the private container is lost,
    // without CAP_SYS_PTRACE both are (their processes hold capabilities the agent does not).
    let ids = [plain.id.as_str(), private.id.as_str()];
    assert_eq!(
        used_under("-all,+sys_ptrace,+dac_read_search", &ids),
        [Some(3.0 * MIB), Some(2.0 * MIB)]
    );
    assert_eq!(
        used_under("-all,+sys_ptrace", &ids),
        [Some(3.0 * MIB), None]
    );
    assert_eq!(used_under("-all,+dac_read_search", &ids), [None, None]);
    assert_eq!(used_under("-all", &ids), [None, None]);
}

/// The DaemonSet's root filesystem is read-only: `serve` there (a private mount namespace
/// whose / is remounted read-only) scans and serves as anywhere else.
#[test]
fn serve_runs_on_a_read_only_root_filesystem() {
    if !common::e2e_available() {
        return;
    }
    let c = container(5);
    let agent = Agent::start_under(
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -o remount,bind,ro / && exec \"$0\" \"$@\"",
        ],
        &["--no-gpu"],
        &[],
    );
    agent.wait_ready();
    agent.wait_for_metrics("the container", |b| {
        sample(b, "shmlink_shm_used_bytes", &[("container_id", &c.id)]) == Some(5.0 * MIB)
    });
    // It really ran on a read-only /.
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", agent.pid())).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap();
    assert!(
        root.split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{root}"
    );
    assert!(agent.terminate().success());
}

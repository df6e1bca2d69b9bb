//! Issue 36's kernel-log and escape attacks, made for real as root: a binary whose file name
//! spells an OOM report naming a victim runc container segfaults (the kernel logs the name in
//! its segfault line, its newlines escaped on /dev/kmsg, repeated lines through syslog(2));
//! leftover /dev/shm names with ESC, BEL, CSI and a newline; a crashing process whose comm and
//! file name hold escapes. No victim is told killed while a real OOM kill still is, and no text
//! carries a raw control character or an attacker's line of its own. Needs root, runc and gcc
//! (each test says so when it skips).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::agent::{sample, Agent};
use common::kube_api::events::with_reason;
use common::kube_api::{pod, FakeApi};
use common::{Container, ContainerSpec, HostTmpfs, Shm};
use serde_json::Value;

const NODE: &str = "gpu-node-3";
const MIB: u64 = 1 << 20;

/// Runs it; its PID, once the kernel logged `[PID]: segfault` (the ring read with dmesg).
fn crash(bin: &Path) -> u32 {
    let mut child = Command::new(bin).spawn().unwrap();
    let pid = child.id();
    assert!(!child.wait().unwrap().success(), "it was to crash");
    let line = format!("[{pid}]: segfault at 0");
    assert!(
        common::wait_until(Duration::from_secs(5), || dmesg().contains(&line)),
        "the kernel did not log {line} (show_unhandled_signals off?)"
    );
    pid
}

fn dmesg() -> String {
    let out = Command::new("dmesg").output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `check --since 5m` reading the kernel log through `source`: its JSON and its text.
fn check_since(source: &str) -> (Value, String) {
    let run = |json: bool| {
        let mut c = Command::new(common::shmlink_bin());
        c.args(["check", "--no-gpu", "--since", "5m", "--kmsg", source])
            .args(["--pod-log-root", "off", "--docker-root", "off"]);
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    let json = run(true);
    let report = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&json.stderr)));
    let text = String::from_utf8_lossy(&run(false).stdout).into_owned();
    (report, text)
}

fn failures(report: &Value) -> Vec<Value> {
    report["failures"].as_array().cloned().unwrap_or_default()
}

/// A control character other than the line's own end: what a terminal would act on.
fn raw_control(text: &str) -> Option<char> {
    text.chars().find(|c| c.is_control() && *c != '\n')
}

/// Issue 36 item 3: the kernel's segfault line ends ` in <file name>[...]`, so this name puts
/// an OOM report's start, summary and kill, naming the victim's container, in a kernel record.
fn forged_report(victim_id: &str) -> String {
    let name = format!(
        "x\npy invoked oom-killer: gfp_mask=0xcc0\n\
         oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg={victim_id},task=py,pid=42\n\
         Killed process 42 (py) total-vm:0kB, anon-rss:0kB, shmem-rss:60000kB"
    );
    assert!(name.len() <= 255, "{} bytes", name.len());
    name
}

#[test]
fn a_file_name_spelling_an_oom_report_kills_no_one_while_a_real_kill_is_told() {
    if !common::e2e_available() || !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start();
    let (victim_uid, victim_id) = (common::random_pod_uid(), common::random_container_id());
    let (own_uid, own_id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(
        NODE,
        "prod",
        "victim-0",
        &victim_uid,
        &[("trainer", &victim_id)],
    ));
    api.apply_pod(pod(
        NODE,
        "ml",
        "trainer-0",
        &own_uid,
        &[("trainer", &own_id)],
    ));
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start_kube(&kubeconfig, NODE, &["--kmsg", "/dev/kmsg"]);
    agent.wait_ready();
    let victim = Container::start(ContainerSpec {
        pod_uid: Some(victim_uid.clone()),
        id: Some(victim_id.clone()),
        args: common::write_then_sleep(0),
        memory_limit: Some((64 * MIB) as i64),
        ..ContainerSpec::default()
    });
    victim.wait_ready();

    let Some(bin) = common::crash::segfaulting(dir.path(), &forged_report(&victim_id), None) else {
        return;
    };
    crash(&bin);
    assert!(dmesg().contains(&format!("task_memcg={victim_id}")));
    // A real OOM kill after it: told, so the agent was reading the kernel log all along.
    let _own = common::oom::own_memory_past_the_limit(&own_uid, &own_id);
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            !with_reason(&api.events_about("trainer-0"), "WorkloadOomKilled").is_empty()
        }),
        "the real OOM kill was not told: {:#?}",
        api.events()
    );
    std::thread::sleep(Duration::from_secs(2));
    let about_victim = api.events_about("victim-0");
    for reason in ["WorkloadOomKilled", "ShmOomKilled"] {
        assert!(
            with_reason(&about_victim, reason).is_empty(),
            "{about_victim:#?}"
        );
    }
    let body = agent.metrics();
    assert_eq!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "victim-0")]
        ),
        None,
        "{body}"
    );
    assert!(
        sample(
            &body,
            "shmlink_workload_failures_total",
            &[("pod", "trainer-0")]
        )
        .is_some(),
        "{body}"
    );
    assert!(agent.terminate().success());

    for source in ["/dev/kmsg", "syslog"] {
        let (report, text) = check_since(source);
        let told = failures(&report);
        let forged: Vec<&Value> = told
            .iter()
            .filter(|f| f["container_id"] == victim_id.as_str() || f["pid"] == 42)
            .collect();
        assert!(forged.is_empty(), "{source}: {forged:#?}");
        assert!(
            told.iter().any(|f| f["container_id"] == own_id.as_str()
                && f["kind"] == "workload_oom_killed"),
            "{source}: the real kill is not told: {told:#?}"
        );
        // The victim's row in the table is its /dev/shm, and no finding names it.
        let named: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("oom_killed") && l.contains(&victim_id[..12]))
            .collect();
        assert!(named.is_empty(), "{source}: {text}");
    }
    drop(victim);
}

/// Issue 36 item 5: names a container chose for the files its /dev/shm held before it started.
#[test]
fn leftover_names_with_escapes_reach_check_and_the_event_written_out() {
    if !common::e2e_available() {
        return;
    }
    let marker = &common::random_pod_uid()[..8];
    let names = [
        format!("nccl-{marker}\u{1b}[2J\u{1b}[H"),
        format!("psm_{marker}\u{7}\u{9b}31m"),
        format!("torch_{marker}\nCRITICAL {marker} all GPUs lost: drain the node"),
    ];
    let volume = HostTmpfs::new(64 * MIB);
    for name in &names {
        std::fs::write(volume.path.join(name), vec![1u8; MIB as usize]).unwrap();
    }
    // Older than the container by more than the clocks' grain.
    std::thread::sleep(Duration::from_secs(3));
    let api = FakeApi::start();
    let (uid, id) = (common::random_pod_uid(), common::random_container_id());
    api.apply_pod(pod(NODE, "ml", "restarted-0", &uid, &[("trainer", &id)]));
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::start(
        &["--kube", "on", "--node-name", NODE, "--no-gpu"],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    agent.wait_ready();
    let container = Container::start(ContainerSpec {
        pod_uid: Some(uid.clone()),
        id: Some(id.clone()),
        args: common::write_then_sleep(0),
        shm: Shm::Bind(volume.path.clone()),
        ..ContainerSpec::default()
    });
    container.wait_ready();

    let out = common::run_check(&[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("nccl-{marker}\\x1b[2J\\x1b[H")),
        "the finding is not in check's text: {text}"
    );
    for line in text.lines().filter(|l| l.contains(marker)) {
        assert_eq!(raw_control(line), None, "{line:?}");
        assert!(!line.trim_start().starts_with("CRITICAL"), "{line:?}");
    }
    let report = common::run_check_json(&[]);
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "shm_leftover_segments" && f["message"].to_string().contains(marker))
        .cloned()
        .unwrap_or_else(|| panic!("no finding: {report:#}"));
    let message = finding["message"].as_str().unwrap();
    assert!(!message.chars().any(char::is_control), "{message:?}");

    let mut notes = Vec::new();
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            notes = with_reason(&api.events_about("restarted-0"), "ShmLeftoverSegments")
                .iter()
                .filter_map(|e| e["note"].as_str().map(str::to_owned))
                .collect();
            !notes.is_empty()
        }),
        "no Event: {:#?}",
        api.events()
    );
    for note in &notes {
        assert!(!note.chars().any(char::is_control), "{note:?}");
        assert!(
            note.contains(&format!("torch_{marker}\\x0aCRITICAL")),
            "{note}"
        );
    }
    assert!(agent.terminate().success());
    drop(container);
}

/// Issue 36 item 5: a crash whose comm (prctl) and file name hold ESC, BEL, an OSC title and a
/// C1 CSI, in a file named like NCCL: told, each character written out, both ways of reading
/// the kernel log.
#[test]
fn a_crash_whose_comm_and_file_name_hold_escapes_is_told_written_out() {
    if !common::kmsg_readable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let comm = b"a\x1b[2J\x07\x1b]0;x";
    let name = "libnccl.so.2\u{1b}[31m\u{7}\u{9b}0m\nOK";
    let Some(bin) = common::crash::segfaulting(dir.path(), name, Some(comm)) else {
        return;
    };
    let pid = crash(&bin);
    for source in ["/dev/kmsg", "syslog"] {
        let (report, text) = check_since(source);
        let told: Vec<Value> = failures(&report)
            .into_iter()
            .filter(|f| f["pid"] == pid)
            .collect();
        assert_eq!(told.len(), 1, "{source}: {report:#}");
        let message = told[0]["message"].as_str().unwrap();
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(
            message.contains("a\\x1b[2J\\x07\\x1b]0;x")
                && message.contains("libnccl.so.2\\x1b[31m\\x07\\x9b0m\\x0aOK"),
            "{source}: {message}"
        );
        let evidence = told[0]["evidence"].as_str().unwrap();
        assert!(!evidence.chars().any(char::is_control), "{evidence:?}");
        for line in text.lines().filter(|l| l.contains(&pid.to_string())) {
            assert_eq!(raw_control(line), None, "{source}: {line:?}");
        }
        assert!(
            text.contains(&pid.to_string()),
            "{source}: not in check's text: {text}"
        );
    }
}

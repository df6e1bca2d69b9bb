//! The agent's binary run once: `shmlink check` and its JSON, and the peak memory of a run.

use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn shmlink_bin() -> &'static str {
    env!("CARGO_BIN_EXE_shmlink")
}

// The machine's own logs are no test's business: its kernel log holds other tests' crashes.
// Nor is its /var/lib/shmlink: a `serve` run on the machine within the hour left its failures
// there, which every `check` reads back. A test that reads a source or a store names it on the
// command line (options beat these). Set before main, while the process has one thread: glibc's
// setenv beside another thread's getenv (a test already running) is undefined.
#[used]
#[link_section = ".init_array"]
static QUIET_AT_START: extern "C" fn() = quiet_at_start;

extern "C" fn quiet_at_start() {
    for var in [
        "SHMLINK_KMSG",
        "SHMLINK_POD_LOG_ROOT",
        "SHMLINK_DOCKER_ROOT",
    ] {
        std::env::set_var(var, "off");
    }
    std::env::set_var("SHMLINK_STATE_DIR", "none");
}

/// `shmlink check --no-gpu ARGS`.
pub fn run_check(args: &[&str]) -> Output {
    Command::new(shmlink_bin())
        .arg("check")
        .arg("--no-gpu")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running shmlink check")
}

/// A command's stdout and its own peak RSS in MiB: its VmHWM as it exits, read while the
/// kernel holds it at its exit (ptrace's exit stop), when its memory is all still mapped.
/// Not wait4's ru_maxrss: that starts from the spawning process's peak (exec records the
/// memory it replaces, which a vfork'd child shares with its parent), and a test binary of
/// many tests is large.
// Reaped by waitpid below, past its exit stop, which Child::wait cannot do.
#[allow(clippy::zombie_processes)]
pub fn output_and_peak_rss(command: &mut Command) -> (Vec<u8>, f64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: one async-signal-safe syscall between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    // Read beside the tracing: a child blocked on a full pipe would never exit.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
        out
    });
    let mut peak_kib = None;
    let mut first = true;
    loop {
        let mut status = 0;
        // SAFETY: plain out-parameter; the child is ours and waited for nowhere else.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if !libc::WIFSTOPPED(status) {
            break;
        }
        let mut deliver = 0;
        if first {
            // The stop at its exec: from here on, stop it again as it exits.
            first = false;
            let options = libc::PTRACE_O_TRACEEXIT | libc::PTRACE_O_EXITKILL;
            // SAFETY: our stopped tracee; options is a plain integer.
            let set = unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, pid, 0, options) };
            assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        } else if status >> 8 == libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8) {
            peak_kib = Some(status_kib(pid as u32, "VmHWM:"));
        } else {
            // A signal for it (SIGPIPE, ...): delivered as it would have been.
            deliver = libc::WSTOPSIG(status);
        }
        // SAFETY: our stopped tracee.
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver) };
    }
    let out = reader.join().unwrap();
    let peak_kib = peak_kib.expect("the child stopped at its exit");
    (out, peak_kib / 1024.0)
}

fn status_kib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A running process's peak RSS so far in MiB (VmHWM).
pub fn peak_rss_of(pid: u32) -> f64 {
    status_kib(pid, "VmHWM:") / 1024.0
}

/// The `shm` entry of a `check --json` report for one container.
pub fn shm_entry(report: &Value, container_id: &str) -> Option<Value> {
    report["shm"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == container_id)
        .cloned()
}

/// `shmlink ARGS` with `env` added, its standard output read as JSON, whatever its exit.
pub fn shmlink_json(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Value {
    let out = Command::new(shmlink_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `check --json`: the report, whatever the findings (other tests' containers may be full).
pub fn run_check_json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = run_check(&all);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "check failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

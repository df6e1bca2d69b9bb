//! `shmlink serve` as the failure benchmarks run it: serve's own 5 s interval (not the tests'
//! 200 ms), Kubernetes on against the fake API server, the pod logs under `pod_log_root`, the
//! kernel log as asked; killed on drop. Included by bench_failures.rs and bench_deaths.rs.

#![allow(dead_code)] // each benchmark uses a part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common;
use super::common::agent::get;

pub const NODE: &str = "gpu-node-7";

pub struct Serve {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Serve {
    pub fn start(pod_log_root: &Path, kubeconfig: &Path, kmsg: &str) -> Serve {
        let addr = common::free_local_addr();
        let log = std::env::temp_dir().join(format!("shmlink-bench-deaths-{}.log", addr.port()));
        let child = Command::new(common::shmlink_bin())
            .args(["serve", "--listen", &addr.to_string(), "--interval", "5s"])
            .args(["--state-dir", "none"])
            .args(["--kube", "on", "--node-name", NODE, "--no-gpu"])
            .arg("--pod-log-root")
            .arg(pod_log_root)
            .args(["--docker-root", "off", "--kmsg", kmsg])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting shmlink serve");
        Serve { child, addr, log }
    }

    pub fn wait_ready(&self) {
        assert!(
            common::wait_until(Duration::from_secs(60), || get(self.addr, "/readyz")
                .is_some_and(|(s, _)| s == 200)),
            "serve never got ready; its log:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// utime + stime, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        ticks(&format!("/proc/{}/stat", self.child.id())).unwrap_or(0)
    }

    /// utime + stime per thread name (`scan`, `failures`, `shm-peak`, the runtime's workers).
    pub fn thread_ticks(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        let dir = format!("/proc/{}/task", self.child.id());
        for t in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if let Some(n) = ticks(&t.path().join("stat").to_string_lossy()) {
                *out.entry(comm.trim().to_string()).or_insert(0) += n;
            }
        }
        out
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// utime + stime of a /proc stat file, in clock ticks.
fn ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_comm.split(' ').collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

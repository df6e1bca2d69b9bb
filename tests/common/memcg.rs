//! A memory cgroup of its own for one child process, at a Deployment's or DaemonSet's limit, so
//! a test sees what the kubelet would: the kernel's OOM kill at the limit, and the peak the
//! process reached. cgroup v1 (the `memory` controller, as on this project's CI machine) or v2
//! (the unified hierarchy, as in the VM). Removed on drop, once its process is gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// A new cgroup limited to `limit` bytes (swap too, where the kernel has it), or None where
    /// none can be made here (not root, no memory controller): the caller says SKIPPED or fails.
    pub fn new(name: &str, limit: u64) -> Option<MemCgroup> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (parent, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), false)
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), true)
        } else {
            return None;
        };
        // Unique in the process too: one test binary runs many tests at once.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("shmlink-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        let cg = MemCgroup { dir, v2 };
        let written = if v2 {
            std::fs::write(cg.dir.join("memory.max"), limit.to_string())
                .and_then(|()| std::fs::write(cg.dir.join("memory.swap.max"), "0").or(Ok(())))
        } else {
            std::fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string()).and_then(|()| {
                // memsw exists only with swap accounting; without it there is no swap to use.
                let memsw = cg.dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    std::fs::write(memsw, limit.to_string())
                } else {
                    Ok(())
                }
            })
        };
        written.ok()?;
        Some(cg)
    }

    /// A wrapper for a command line (`sh -c ... exec "$0" "$@"`, then the program and its
    /// arguments): the shell moves itself into this cgroup and execs the program, so all the
    /// program ever allocates is charged here.
    pub fn wrapper(&self) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs");
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > '{}' && exec \"$0\" \"$@\"", procs.display()),
        ]
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// The highest the cgroup's charge reached, in bytes (v2 before 5.19 has no memory.peak:
    /// 0).
    pub fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).trim().parse().unwrap_or(0)
    }

    /// Processes the kernel's OOM killer killed in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The child is killed and reaped by its owner first; its cgroup empties a moment later.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

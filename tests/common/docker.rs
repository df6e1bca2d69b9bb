//! A private, real Docker engine for the tests: Debian's `dockerd` on its own socket, data root
//! and exec root (no bridge, no iptables), with a local image imported from busybox-static (no
//! registry is reachable). Stopped, with everything it ran, when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The local image: busybox-static's applets, nothing else.
pub const IMAGE: &str = "shmlink-busybox:e2e";

pub struct Dockerd {
    dir: tempfile::TempDir,
    child: Child,
    pub sock: PathBuf,
}

impl Dockerd {
    /// Starts the engine and imports the image; None (SKIPPED said, or a failure under
    /// `SHMLINK_E2E=require`) where it cannot run.
    pub fn start() -> Option<Dockerd> {
        if !super::e2e_available() {
            return None;
        }
        super::tool("dockerd", "docker.io")?;
        super::tool("docker", "docker.io")?;
        let dir = tempfile::Builder::new()
            .prefix("shmlink-dockerd-")
            .tempdir()
            .expect("a directory for dockerd");
        let sock = dir.path().join("docker.sock");
        let log = std::fs::File::create(dir.path().join("dockerd.log")).unwrap();
        let child = Command::new("dockerd")
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .args(["--exec-opt", "native.cgroupdriver=cgroupfs"])
            .args(["--storage-driver", "overlay2", "--log-driver", "json-file"])
            .arg("--data-root")
            .arg(dir.path().join("data"))
            .arg("--exec-root")
            .arg(dir.path().join("exec"))
            .arg("--pidfile")
            .arg(dir.path().join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", sock.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting dockerd");
        let d = Dockerd { dir, child, sock };
        let up = super::wait_until(Duration::from_secs(60), || {
            d.docker(&["version", "--format", "{{.Server.Version}}"])
                .status
                .success()
        });
        assert!(up, "dockerd never answered: {}", d.log());
        d.import_image();
        Some(d)
    }

    /// Docker's data root: what `check --docker-root` reads.
    pub fn data_root(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The docker CLI against this engine.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .env("DOCKER_HOST", format!("unix://{}", self.sock.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running docker")
    }

    /// `docker run -d ARGS`, which must succeed; the container's ID.
    pub fn run(&self, args: &[&str]) -> String {
        let mut all = vec!["run", "-d"];
        all.extend_from_slice(args);
        let out = self.docker(&all);
        assert!(
            out.status.success(),
            "docker {all:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `docker run -d --name NAME` of the host's Python 3 (/usr and the libraries bound
    /// read-only) running `program`; the container's ID.
    pub fn run_python(&self, name: &str, program: &str) -> String {
        self.run(&[
            "--name",
            name,
            "-v",
            "/usr:/usr:ro",
            "-v",
            "/lib:/lib:ro",
            "-v",
            "/lib64:/lib64:ro",
            IMAGE,
            "/usr/bin/python3",
            "-c",
            program,
        ])
    }

    /// Waits until the container stopped; its exit code.
    pub fn wait(&self, id: &str) -> i64 {
        let out = self.docker(&["wait", id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("docker wait prints the exit code")
    }

    /// `docker inspect -f FORMAT ID`.
    pub fn inspect(&self, id: &str, format: &str) -> String {
        let out = self.docker(&["inspect", "-f", format, id]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    fn import_image(&self) {
        let root = self.dir.path().join("image-root");
        for d in ["bin", "dev", "proc", "sys", "tmp", "etc"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy(super::BUSYBOX, root.join("bin/busybox")).expect("copying busybox");
        for applet in ["sh", "sleep", "dd", "echo", "kill", "cat", "true", "test"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let tar = self.dir.path().join("image.tar");
        let packed = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("running tar");
        assert!(packed.success());
        let out = self.docker(&["import", &tar.to_string_lossy(), IMAGE]);
        assert!(
            out.status.success(),
            "docker import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn stop(&mut self) {
        // Every container goes first, then the engine (and the containerd it started).
        let ids = self.docker(&["ps", "-aq"]);
        let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.docker(&args);
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let stopped = super::wait_until(Duration::from_secs(20), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Overlay mounts left by a killed engine would keep the temporary directory busy.
        unmount_under(&self.dir.path().join("data"));
        unmount_under(&self.dir.path().join("exec"));
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lazily unmounts whatever is still mounted beneath `dir`.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.to_string_lossy().to_string();
    for line in mounts.lines() {
        if let Some(point) = line.split(' ').nth(4) {
            if point.starts_with(&prefix) {
                let _ = rustix::mount::unmount(point, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

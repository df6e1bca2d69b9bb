//! A real containerd (Debian's, 1.6 with docker.io) with a root, state and socket of its own
//! in a temp dir, its CRI plugin on, driven through the CRI gRPC API as kubelet drives it:
//! Pod sandboxes in kubelet-style cgroups (`/kubepods/burstable/pod<uid>`, the cgroupfs
//! driver), host network (no CNI here), CRI logs written by containerd itself under
//! [`Containerd::pod_log_root`] where `--pod-log-root` reads them. One image, busybox-static,
//! made here and imported under the sandbox image's name and the workload's.
//!
//! Dropping the guard removes every sandbox through CRI, stops containerd, kills any shim it
//! left and unmounts what is still mounted under its directories.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// The sandbox ("pause") image the config names: the busybox image, whose command sleeps.
pub const SANDBOX_IMAGE: &str = "shmlink.test/pause:e2e";
/// The workload image: the same busybox root.
pub const IMAGE: &str = "shmlink.test/busybox:e2e";

pub struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    pub sock: PathBuf,
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    /// The Pods' UIDs: their cgroup directories go with the guard (kubelet removes them).
    uids: std::sync::Mutex<Vec<String>>,
}

/// A Pod as kubelet asks for it.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// `hostIPC: true`: the containers share the host's IPC namespace and /dev/shm.
    pub host_ipc: bool,
}

/// One container of a Pod.
#[derive(Debug, Clone, Default)]
pub struct CtrSpec {
    pub name: String,
    pub command: Vec<String>,
    /// (host path, container path, read-only)
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub memory_limit: Option<i64>,
}

impl CtrSpec {
    /// `sh -c script`.
    pub fn sh(name: &str, script: &str) -> CtrSpec {
        CtrSpec {
            name: name.into(),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..CtrSpec::default()
        }
    }

    /// With the host's Python in reach: /usr and the libraries bound read-only.
    pub fn with_host_python(mut self) -> CtrSpec {
        for dir in ["/usr", "/lib", "/lib64"] {
            self.mounts.push((dir.into(), dir.into(), true));
        }
        self
    }
}

/// A running Pod sandbox.
#[derive(Debug, Clone)]
pub struct Pod {
    pub id: String,
    pub spec: PodSpec,
    config: cri::PodSandboxConfig,
}

impl Pod {
    /// Where containerd writes this Pod's containers' CRI logs.
    pub fn log_dir(&self) -> PathBuf {
        PathBuf::from(&self.config.log_directory)
    }

    /// What containerd wrote of container `name`'s output so far (CRI lines).
    pub fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_dir().join(name).join("0.log")).unwrap_or_default()
    }
}

impl Containerd {
    /// Starts one, or says why not (SKIPPED; a failure under `SHMLINK_E2E=require`).
    pub fn start() -> Option<Containerd> {
        if !super::e2e_available() {
            return None;
        }
        let containerd = super::tool("containerd", "containerd (comes with docker.io)")?;
        super::tool("ctr", "containerd (comes with docker.io)")?;
        super::tool(
            "containerd-shim-runc-v2",
            "containerd (comes with docker.io)",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("shmlink-containerd-")
            .tempdir()
            .expect("a directory for containerd");
        let sock = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_toml(dir.path(), &sock)).unwrap();
        std::fs::create_dir_all(dir.path().join("pods")).unwrap();
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        let child = Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // Its socket file is made before containerd serves on it (a connect is refused until
        // then) and its CRI plugin answers later still: wait for CRI's answer, not for the file.
        let mut client = None;
        super::wait_until(Duration::from_secs(30), || {
            client = rt.block_on(answering(&sock));
            client.is_some()
        });
        let Some(client) = client else {
            panic!(
                "containerd's CRI never answered on its socket: {}",
                std::fs::read_to_string(dir.path().join("containerd.log")).unwrap_or_default()
            );
        };
        let mut c = Containerd {
            dir,
            child,
            sock,
            rt,
            client,
            uids: std::sync::Mutex::new(Vec::new()),
        };
        c.import_image();
        Some(c)
    }

    /// Where containerd writes the Pods' CRI logs (`--pod-log-root`).
    pub fn pod_log_root(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    /// containerd's state directory: the sandboxes' /dev/shm mounts are under it.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// A call on the CRI client, waited for here.
    fn call<T, F>(&self, what: &str, f: impl FnOnce(RuntimeServiceClient<Channel>) -> F) -> T
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match self.rt.block_on(f(self.client.clone())) {
            Ok(r) => r.into_inner(),
            Err(e) => panic!("CRI {what}: {e}\ncontainerd's log:\n{}", self.tail_of_log()),
        }
    }

    fn tail_of_log(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().rev().take(30).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// RunPodSandbox: host network, the Pod's cgroup under `/kubepods/burstable`.
    pub fn run_pod(&self, spec: &PodSpec) -> Pod {
        let log_dir = self
            .pod_log_root()
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        std::fs::create_dir_all(&log_dir).unwrap();
        self.uids.lock().unwrap().push(spec.uid.clone());
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            // Host network: the host's UTS namespace, so no hostname (as kubelet leaves it).
            log_directory: log_dir.to_string_lossy().into_owned(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/burstable/pod{}", spec.uid),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces(spec)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let reply = self.call("RunPodSandbox", |mut c| async move {
            c.run_pod_sandbox(req).await
        });
        Pod {
            id: reply.pod_sandbox_id,
            spec: spec.clone(),
            config,
        }
    }

    /// CreateContainer + StartContainer; the container's ID. Its log: `<name>/0.log`.
    pub fn start_container(&self, pod: &Pod, spec: &CtrSpec) -> String {
        let mounts = spec
            .mounts
            .iter()
            .map(|(host, container, readonly)| cri::Mount {
                container_path: container.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: *readonly,
                ..Default::default()
            })
            .collect();
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: spec.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            command: spec.command.clone(),
            mounts,
            log_path: format!("{}/0.log", spec.name),
            linux: Some(cri::LinuxContainerConfig {
                resources: spec.memory_limit.map(|l| cri::LinuxContainerResources {
                    memory_limit_in_bytes: l,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(namespaces(&pod.spec)),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let id = self
            .call("CreateContainer", |mut c| async move {
                c.create_container(req).await
            })
            .container_id;
        let req = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        self.call("StartContainer", |mut c| async move {
            c.start_container(req).await
        });
        id
    }

    /// ContainerStatus.
    pub fn status(&self, id: &str) -> cri::ContainerStatus {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        self.call("ContainerStatus", |mut c| async move {
            c.container_status(req).await
        })
        .status
        .expect("ContainerStatus has a status")
    }

    /// The container's exit code once it exited, waiting at most `timeout`.
    pub fn wait_exited(&self, id: &str, timeout: Duration) -> Option<i32> {
        let mut code = None;
        super::wait_until(timeout, || {
            let s = self.status(id);
            if s.state == cri::ContainerState::ContainerExited as i32 {
                code = Some(s.exit_code);
            }
            code.is_some()
        });
        code
    }

    /// Whether the container is running, waiting at most `timeout`.
    pub fn wait_running(&self, id: &str, timeout: Duration) -> bool {
        super::wait_until(timeout, || {
            self.status(id).state == cri::ContainerState::ContainerRunning as i32
        })
    }

    /// StopContainer + RemoveContainer.
    pub fn remove_container(&self, id: &str) {
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout: 0,
        };
        self.call("StopContainer", |mut c| async move {
            c.stop_container(req).await
        });
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", |mut c| async move {
            c.remove_container(req).await
        });
    }

    /// StopPodSandbox + RemovePodSandbox (its containers with it).
    pub fn remove_pod(&self, id: &str) {
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("StopPodSandbox", |mut c| async move {
            c.stop_pod_sandbox(stop).await
        });
        let remove = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(remove).await
        });
    }

    fn sandbox_ids(&self) -> Vec<String> {
        let req = cri::ListPodSandboxRequest { filter: None };
        let listed = self.rt.block_on(async {
            let mut c = self.client.clone();
            c.list_pod_sandbox(req).await
        });
        listed
            .map(|r| r.into_inner().items.into_iter().map(|s| s.id).collect())
            .unwrap_or_default()
    }

    /// The busybox root as a docker-archive tar (manifest, config, one layer), imported under
    /// both names into the `k8s.io` namespace, where CRI looks.
    fn import_image(&mut self) {
        let work = self.dir.path().join("image");
        let root = work.join("root");
        for d in ["bin", "dev", "proc", "sys", "tmp", "etc"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy(super::BUSYBOX, root.join("bin/busybox")).expect("copying busybox");
        for applet in ["sh", "sleep", "dd", "echo", "cat", "ls", "true", "rm"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let archive = work.join("archive");
        std::fs::create_dir_all(&archive).unwrap();
        run(Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(archive.join("layer.tar"))
            .arg("."));
        let digest = run(Command::new("sha256sum").arg(archive.join("layer.tar")));
        let digest = digest.split_whitespace().next().unwrap().to_string();
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["/bin/sleep", "2147483647"], "Env": ["PATH=/bin:/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{digest}")]},
        });
        std::fs::write(archive.join("config.json"), config.to_string()).unwrap();
        let manifest = serde_json::json!([{
            "Config": "config.json",
            "RepoTags": [SANDBOX_IMAGE, IMAGE],
            "Layers": ["layer.tar"],
        }]);
        std::fs::write(archive.join("manifest.json"), manifest.to_string()).unwrap();
        let tar = work.join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&archive)
            .arg("-cf")
            .arg(&tar)
            .args(["manifest.json", "config.json", "layer.tar"]));
        run(Command::new("ctr")
            .arg("-a")
            .arg(&self.sock)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&tar));
        let _ = std::fs::remove_dir_all(&work);
    }

    fn stop(&mut self) {
        for id in self.sandbox_ids() {
            let stop = cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            };
            let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: id };
            let _ = self.rt.block_on(async {
                let mut c = self.client.clone();
                c.stop_pod_sandbox(stop).await?;
                c.remove_pod_sandbox(remove).await
            });
        }
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let stopped = super::wait_until(Duration::from_secs(20), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        kill_shims_of(&self.sock);
        unmount_under(self.dir.path());
        for uid in self.uids.lock().unwrap().iter() {
            remove_pod_cgroups(uid);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn namespaces(spec: &PodSpec) -> cri::NamespaceOption {
    let node = cri::NamespaceMode::Node as i32;
    cri::NamespaceOption {
        network: node,
        ipc: if spec.host_ipc {
            node
        } else {
            cri::NamespaceMode::Pod as i32
        },
        pid: cri::NamespaceMode::Container as i32,
        ..Default::default()
    }
}

/// The config: everything under `dir`, the CRI plugin with the local sandbox image, cgroupfs
/// (this machine's memory controller is on cgroup v1), overlayfs, no CNI config (host-network
/// Pods need none).
fn config_toml(dir: &Path, sock: &Path) -> String {
    let d = dir.display();
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  disable_cgroup = false
  enable_selinux = false
  # No CAP_SYS_RESOURCE where the tests may run: no oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [{cri}.cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"#,
        sock = sock.display(),
    )
}

/// A client of containerd's CRI once it answers a call (Version), else None.
async fn answering(sock: &Path) -> Option<RuntimeServiceClient<Channel>> {
    let mut client = connect(sock).await.ok()?;
    let asked = client.version(cri::VersionRequest {
        version: "v1".into(),
    });
    tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .ok()?
        .ok()?;
    Some(client)
}

async fn connect(sock: &Path) -> Result<RuntimeServiceClient<Channel>, tonic::transport::Error> {
    let path = sock.to_path_buf();
    // The URI is required by the API and ignored by the connector.
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(RuntimeServiceClient::new(channel))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect("running a tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The shims this containerd started (their command line names its socket), killed by PID.
fn kill_shims_of(sock: &Path) {
    let sock = sock.to_string_lossy();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("containerd-shim") && cmdline.contains(sock.as_ref()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Unmounts (lazily, deepest first) whatever is still mounted under `dir`.
fn unmount_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = rustix::mount::unmount(p.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
}

/// The Pod's cgroup directory in every hierarchy, where empty (kubelet's part).
fn remove_pod_cgroups(uid: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let _ = std::fs::remove_dir(h.path().join(format!("kubepods/burstable/pod{uid}")));
    }
}

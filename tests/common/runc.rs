//! Real OCI containers started with runc: a busybox rootfs, a kubelet-style cgroup path, the
//! /dev/shm the test asks for; and a tmpfs of the test's own on the host.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

use super::{random_container_id, random_pod_uid, wait_until, BUSYBOX};

/// runc's state directory for these tests, apart from any other runc user on the machine.
const RUNC_ROOT: &str = "/run/shmlink-e2e";

/// What the container gets at /dev/shm.
#[derive(Debug, Clone, Default)]
pub enum Shm {
    /// The runtime's default: a private 64 MiB tmpfs (Docker's and containerd's).
    #[default]
    RuntimeDefault,
    /// A host directory bind-mounted there: a `medium: Memory` emptyDir.
    Bind(PathBuf),
    /// The host's IPC namespace and the host's /dev/shm (`hostIPC: true`, `--ipc=host`).
    HostIpc,
    /// Nothing mounted at /dev/shm.
    None,
}

#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Some: the cgroup is `/kubepods/burstable/pod<uid>/<id>`; None: a plain runc container.
    pub pod_uid: Option<String>,
    /// Defaults to a random 64-hex ID.
    pub id: Option<String>,
    /// The command; defaults to `sleep 3600`.
    pub args: Vec<String>,
    pub shm: Shm,
    /// memory.limit_in_bytes / memory.max of the container's cgroup.
    pub memory_limit: Option<i64>,
    /// More OCI mounts, after the default ones (e.g. [`ro_bind`], [`cgroup_mount`]).
    pub extra_mounts: Vec<Value>,
    /// Some: the container's stdout and stderr are written to this file as containerd writes
    /// a CRI log (`<RFC 3339 nano> <stream> F <line>`), by a shim thread of the test.
    pub cri_log: Option<PathBuf>,
}

/// An OCI mount: `source` on the host bound read-only at `destination` in the container.
pub fn ro_bind(source: impl AsRef<Path>, destination: &str) -> Value {
    json!({"destination": destination, "type": "bind", "source": source.as_ref(),
           "options": ["rbind", "ro"]})
}

/// The host's /usr, /lib and /lib64, read-only: what the host's Python needs in a busybox
/// rootfs.
pub fn host_libraries() -> Vec<Value> {
    vec![
        ro_bind("/usr", "/usr"),
        ro_bind("/lib", "/lib"),
        ro_bind("/lib64", "/lib64"),
    ]
}

/// An OCI mount of the container's own cgroups at /sys/fs/cgroup, read-only, as Docker and
/// containerd give every container.
pub fn cgroup_mount() -> Value {
    json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
           "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]})
}

/// containerd's log writer in small: each line of output becomes `<time> stderr F <line>`,
/// appended to `path` as it comes; the thread ends when the container closes its output.
fn cri_shim(output: std::io::PipeReader, path: PathBuf) {
    use std::io::{BufRead, Write};
    std::thread::spawn(move || {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("the CRI log file");
        for line in std::io::BufReader::new(output).split(b'\n') {
            let Ok(line) = line else { break };
            let now = k8s_openapi::jiff::Timestamp::now();
            let mut record =
                format!("{} stderr F ", now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")).into_bytes();
            record.extend_from_slice(&line);
            record.push(b'\n');
            let _ = file.write_all(&record);
        }
    });
}

/// A running runc container; killed and deleted on drop.
pub struct Container {
    pub id: String,
    pub pid: i32,
    pub cgroup: String,
    bundle: tempfile::TempDir,
    /// Dropped after the container is gone (fields drop after `drop`).
    _host: super::host::Shared,
}

impl Container {
    pub fn start(spec: ContainerSpec) -> Container {
        let host = super::host::share();
        let id = spec.id.clone().unwrap_or_else(random_container_id);
        let cgroup = match &spec.pod_uid {
            Some(uid) => format!("/kubepods/burstable/pod{uid}/{id}"),
            None => format!("/shmlink-e2e/{id}"),
        };
        let bundle = tempfile::Builder::new()
            .prefix("shmlink-e2e-")
            .tempdir()
            .expect("bundle dir");
        make_rootfs(&bundle.path().join("rootfs"));
        let config = oci_config(&spec, &cgroup);
        std::fs::write(
            bundle.path().join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        // Detached: the container keeps the stdio it is given, so give it a file, or a pipe
        // that only the CRI shim thread reads, never one this process would wait on.
        let log = std::fs::File::create(bundle.path().join("console.log")).unwrap();
        let (stdout, stderr): (Stdio, Stdio) = match &spec.cri_log {
            Some(path) => {
                let (reader, writer) = std::io::pipe().expect("a pipe for the CRI shim");
                cri_shim(reader, path.clone());
                (writer.try_clone().unwrap().into(), writer.into())
            }
            None => (log.try_clone().unwrap().into(), log.into()),
        };
        // Shared: runc makes the pod's parents, then the pod; no cleanup may remove an empty
        // parent between the two (runc then fails with "no such file or directory").
        let cgroups = cgroup_lock(rustix::fs::FlockOperation::LockShared);
        let out = Command::new("runc")
            .args(["--root", RUNC_ROOT, "run", "-d", "--bundle"])
            .arg(bundle.path())
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .status()
            .expect("running runc");
        drop(cgroups);
        assert!(
            out.success(),
            "runc run {id} failed: {}",
            std::fs::read_to_string(bundle.path().join("console.log")).unwrap_or_default()
        );
        let pid = runc_state(&id)["pid"]
            .as_i64()
            .expect("runc state has a pid") as i32;
        Container {
            id,
            pid,
            cgroup,
            bundle,
            _host: host,
        }
    }

    /// `runc exec` in the container.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("runc")
            .args(["--root", RUNC_ROOT, "exec", &self.id])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running runc exec")
    }

    /// `sh -c SCRIPT` in the container, which must succeed.
    pub fn sh(&self, script: &str) {
        let out = self.exec(&["sh", "-c", script]);
        assert!(
            out.status.success(),
            "`{script}` failed in {}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until the container's script has touched /tmp/ready.
    pub fn wait_ready(&self) {
        assert!(
            wait_until(Duration::from_secs(30), || self
                .exec(&["test", "-e", "/tmp/ready"])
                .status
                .success()),
            "container {} never got ready: {}",
            self.id,
            std::fs::read_to_string(self.bundle.path().join("console.log")).unwrap_or_default()
        );
    }

    /// Waits until the container's init has exited (runc says `stopped`).
    pub fn wait_exited(&self, timeout: Duration) -> bool {
        wait_until(timeout, || runc_state(&self.id)["status"] == "stopped")
    }

    /// What the container printed (stdout and stderr, when no CRI log was asked for).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.bundle.path().join("console.log")).unwrap_or_default()
    }

    /// Kills and deletes the container now (drop does the same).
    pub fn stop(self) {}
}

impl Drop for Container {
    fn drop(&mut self) {
        let runc = |args: &[&str]| {
            let _ = Command::new("runc")
                .args(["--root", RUNC_ROOT])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        runc(&["kill", &self.id, "KILL"]);
        runc(&["delete", "--force", &self.id]);
        remove_empty_parents(&self.cgroup);
    }
}

/// A lock every test process shares on the kubelet-style cgroup parents: shared while runc
/// creates a container in them, exclusive while empty ones are removed.
fn cgroup_lock(how: rustix::fs::FlockOperation) -> Option<std::fs::File> {
    let file = std::fs::File::create("/run/shmlink-test-cgroups.lock").ok()?;
    rustix::fs::flock(&file, how).ok()?;
    Some(file)
}

/// runc leaves the pod-level cgroups it created: remove them once empty, in every hierarchy.
fn remove_empty_parents(cgroup: &str) {
    let _cgroups = cgroup_lock(rustix::fs::FlockOperation::LockExclusive);
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut roots: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
    roots.push(PathBuf::from("/sys/fs/cgroup"));
    for root in roots {
        let mut path = Path::new(cgroup.trim_start_matches('/'));
        while let Some(parent) = path.parent() {
            if parent.as_os_str().is_empty() {
                break;
            }
            // Fails while another test's container still lives there: that test removes it.
            if std::fs::remove_dir(root.join(parent)).is_err() {
                break;
            }
            path = parent;
        }
    }
}

fn runc_state(id: &str) -> Value {
    let out = Command::new("runc")
        .args(["--root", RUNC_ROOT, "state", id])
        .stdin(Stdio::null())
        .output()
        .expect("running runc state");
    assert!(
        out.status.success(),
        "runc state {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("runc state JSON")
}

/// busybox and the applets the tests use, each a hard link to one copy per test process.
fn make_rootfs(rootfs: &Path) {
    static BUSYBOX_COPY: OnceLock<PathBuf> = OnceLock::new();
    let copy = BUSYBOX_COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("shmlink-e2e-busybox-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("busybox");
        std::fs::copy(BUSYBOX, &copy).expect("copying busybox");
        copy
    });
    for dir in ["bin", "dev", "proc", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    let busybox = rootfs.join("bin/busybox");
    if std::fs::hard_link(copy, &busybox).is_err() {
        std::fs::copy(copy, &busybox).expect("copying busybox into the rootfs");
    }
    for applet in [
        "sh",
        "sleep",
        "dd",
        "touch",
        "ln",
        "rm",
        "ls",
        "test",
        "cat",
        "mkdir",
        "head",
        "df",
        "true",
        "fallocate",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
}

fn oci_config(spec: &ContainerSpec, cgroup: &str) -> Value {
    let args: Vec<String> = if spec.args.is_empty() {
        vec!["sleep".into(), "3600".into()]
    } else {
        spec.args.clone()
    };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "network"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    match &spec.shm {
        Shm::RuntimeDefault => {
            namespaces.push(json!({"type": "ipc"}));
            // What containerd and Docker mount: a 64 MiB tmpfs.
            mounts.push(
                json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            );
        }
        Shm::Bind(path) => {
            namespaces.push(json!({"type": "ipc"}));
            mounts.push(json!({"destination": "/dev/shm", "type": "bind",
                "source": path, "options": ["rbind", "rw"]}));
        }
        Shm::HostIpc => {
            mounts.push(json!({"destination": "/dev/shm", "type": "bind",
                "source": "/dev/shm", "options": ["rbind", "rw"]}));
        }
        Shm::None => namespaces.push(json!({"type": "ipc"})),
    }
    mounts.extend(spec.extra_mounts.iter().cloned());
    let mut resources = json!({"devices": [{"allow": false, "access": "rwm"}]});
    if let Some(limit) = spec.memory_limit {
        resources["memory"] = json!({"limit": limit});
    }
    let caps = json!(["CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"]);
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": "e2e",
        "mounts": mounts,
        "linux": {
            "cgroupsPath": cgroup,
            "resources": resources,
            "namespaces": namespaces,
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

/// A tmpfs of its own on the host: a `medium: Memory` emptyDir, or a directory of a known size.
pub struct HostTmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl HostTmpfs {
    pub fn new(size_bytes: u64) -> HostTmpfs {
        let dir = tempfile::Builder::new()
            .prefix("shmlink-e2e-tmpfs-")
            .tempdir()
            .unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size_bytes},mode=1777"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a tmpfs at {}",
            dir.path().display()
        );
        HostTmpfs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for HostTmpfs {
    fn drop(&mut self) {
        // Lazy: a container that still has it mounted keeps it alive until it goes.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A container whose /dev/shm is a symlink to `target` (a host path): the attack an agent that
/// followed links would fall for. Ready when returned.
#[allow(dead_code)] // not every test crate that includes `common` uses it
pub fn dev_shm_symlink_to(target: &str) -> Container {
    let c = Container::start(ContainerSpec {
        pod_uid: Some(random_pod_uid()),
        args: vec![
            "sh".into(),
            "-c".into(),
            format!("ln -s {target} /dev/shm; touch /tmp/ready; exec sleep 3600"),
        ],
        shm: Shm::None,
        ..ContainerSpec::default()
    });
    c.wait_ready();
    c
}

/// A container's command: writes `mib` MiB to /dev/shm (nothing for 0: containers of one pod
/// share the file name), then says it is ready and sleeps.
#[allow(dead_code)] // not every test crate that includes `common` uses it
pub fn write_then_sleep(mib: u64) -> Vec<String> {
    let write = match mib {
        0 => String::new(),
        _ => format!("dd if=/dev/zero of=/dev/shm/data bs=1M count={mib} 2>/dev/null; "),
    };
    vec![
        "sh".into(),
        "-c".into(),
        format!("{write}touch /tmp/ready; exec sleep 3600"),
    ]
}

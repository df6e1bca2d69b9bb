//! Docker's names for containers, read from its own records on disk.
//!
//! On a plain Docker host a person knows a container by `--name`, not by its ID. Docker keeps
//! each container's configuration in `<root>/containers/<id>/config.v2.json`; reading it needs
//! no socket (which would grant control of Docker) and works while the daemon is down. The
//! files are read-only here and opened beneath `<root>/containers` without following symlinks.
//! Whether a container uses GPUs is read there too (no Pod says it): `NVIDIA_VISIBLE_DEVICES` in
//! its environment, or a GPU in `hostconfig.json`'s `DeviceRequests` (`--gpus`).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fd::AsFd;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use serde::Deserialize;

/// The largest config.v2.json read: real ones are a few KiB, huge with many mounts or labels.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A container as Docker names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerContainer {
    /// `--name`, without Docker's leading slash.
    pub name: String,
    /// The image as it was asked for (`pytorch/pytorch:2.5.1-...`), not its digest.
    pub image: String,
    /// It was given GPUs: `NVIDIA_VISIBLE_DEVICES` set to other than `void`/`none`/empty (what
    /// NVIDIA's runtime hook reads), or a GPU device request (`docker run --gpus`).
    pub uses_gpu: bool,
}

/// The fields of config.v2.json this needs; the others are ignored.
#[derive(Deserialize)]
struct ConfigV2 {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Config")]
    config: ContainerConfig,
}

#[derive(Deserialize)]
struct ContainerConfig {
    #[serde(rename = "Image")]
    image: String,
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
}

/// Pure: the name, image and GPU use out of config.v2.json's text and, where it could be read,
/// hostconfig.json's; None when config.v2.json is not that shape.
pub fn parse_config(json: &str, host_config: Option<&str>) -> Option<DockerContainer> {
    let config: ConfigV2 = serde_json::from_str(json).ok()?;
    let name = config.name.strip_prefix('/').unwrap_or(&config.name);
    if name.is_empty() {
        return None;
    }
    let env = config.config.env.as_deref().unwrap_or_default();
    Some(DockerContainer {
        name: name.to_string(),
        image: config.config.image,
        uses_gpu: env_gives_gpus(env) || host_config.is_some_and(requests_gpus),
    })
}

/// Whether the environment names GPUs for NVIDIA's hook: `NVIDIA_VISIBLE_DEVICES` set (the last
/// one wins, as in a process's environment) to other than `void`, `none` or nothing.
fn env_gives_gpus(env: &[String]) -> bool {
    let value = env
        .iter()
        .rev()
        .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="));
    value.is_some_and(|v| !matches!(v.trim(), "" | "void" | "none"))
}

/// hostconfig.json's device requests (`docker run --gpus` writes `Capabilities: [["gpu"]]`).
#[derive(Deserialize, Default)]
struct DeviceRequests {
    #[serde(rename = "DeviceRequests", default)]
    requests: Option<Vec<DeviceRequest>>,
}

#[derive(Deserialize)]
struct DeviceRequest {
    #[serde(rename = "Driver", default)]
    driver: Option<String>,
    /// An OR list of AND lists.
    #[serde(rename = "Capabilities", default)]
    capabilities: Option<Vec<Option<Vec<String>>>>,
}

/// Pure: whether hostconfig.json's text asks for a GPU: a device request for the `nvidia`
/// driver or with the `gpu` capability. Not that shape: no.
pub fn requests_gpus(host_config: &str) -> bool {
    let Ok(host) = serde_json::from_str::<DeviceRequests>(host_config) else {
        return false;
    };
    host.requests.unwrap_or_default().iter().any(|r| {
        r.driver.as_deref() == Some("nvidia")
            || r.capabilities
                .iter()
                .flatten()
                .flatten()
                .any(|all| all.iter().any(|c| c == "gpu"))
    })
}

/// What identifies one version of a config file: Docker rewrites it by rename (a new inode)
/// or in place (a new mtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileVersion {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

struct Cached {
    /// config.v2.json's, and hostconfig.json's where there is one.
    version: (FileVersion, Option<FileVersion>),
    /// `None` for a file that did not parse: not re-read until it changes.
    container: Option<DockerContainer>,
}

/// Names container IDs; caches by ID and re-reads a config whose mtime changed; a missing root
/// or file is None, not an error.
pub struct DockerNames {
    /// `<docker-root>/containers`; `None` when there is no Docker root to read.
    containers: Option<PathBuf>,
    cache: HashMap<String, Cached>,
    /// Whether an unexpected failure was logged at warn (later ones go to debug).
    warned: bool,
}

impl DockerNames {
    pub fn new(docker_root: Option<PathBuf>) -> DockerNames {
        DockerNames {
            containers: docker_root.map(|root| root.join("containers")),
            cache: HashMap::new(),
            warned: false,
        }
    }

    /// Docker's name and image for a container ID: only 64-hex IDs are looked up (anything
    /// else: None, no file access); never follows a symlink out of `<root>/containers`.
    pub fn lookup(&mut self, container_id: &str) -> Option<DockerContainer> {
        if !is_docker_id(container_id) {
            return None;
        }
        let containers = self.containers.as_ref()?;
        let file = match open_config(containers, container_id) {
            Ok(file) => file,
            Err(e) => {
                self.cache.remove(container_id);
                if e.kind() != io::ErrorKind::NotFound {
                    self.log(container_id, &e);
                }
                return None;
            }
        };
        let config_version = match version_of(&file) {
            Ok(Some(version)) => version,
            Ok(None) => return None,
            Err(e) => {
                self.log(container_id, &e);
                return None;
            }
        };
        // hostconfig.json is optional (the GPU request only): missing or odd, it says nothing.
        let host = open_record(containers, container_id, "hostconfig.json")
            .ok()
            .and_then(|f| Some((version_of(&f).ok().flatten()?, f)));
        let version = (config_version, host.as_ref().map(|h| h.0));
        if let Some(cached) = self.cache.get(container_id) {
            if cached.version == version {
                return cached.container.clone();
            }
        }
        let host_text = host.and_then(|(v, f)| read_bounded(f, v.size).ok().flatten());
        let container = match read_bounded(file, config_version.size) {
            Ok(Some(text)) => parse_config(&text, host_text.as_deref()),
            Ok(None) => None,
            Err(e) => {
                self.log(container_id, &e);
                return None;
            }
        };
        if container.is_none() {
            tracing::debug!(
                container_id,
                "config.v2.json is not Docker's shape; unnamed"
            );
        }
        self.cache.insert(
            container_id.to_string(),
            Cached {
                version,
                container: container.clone(),
            },
        );
        container
    }

    /// Forget cached IDs not in `live` (called once per scan).
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.cache.retain(|id, _| live.contains(id));
    }

    fn log(&mut self, container_id: &str, e: &io::Error) {
        if self.warned {
            tracing::debug!(container_id, "reading Docker's config.v2.json: {e}");
        } else {
            self.warned = true;
            tracing::warn!(container_id, "reading Docker's config.v2.json: {e}");
        }
    }
}

/// A regular file's version; None for anything else.
fn version_of(file: &File) -> io::Result<Option<FileVersion>> {
    let meta = file.metadata()?;
    Ok(meta.is_file().then(|| FileVersion {
        ino: meta.ino(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    }))
}

/// Docker's IDs as it spells its directories: 64 lowercase hex digits. Nothing else can name a
/// path, so no `..` or `/` reaches the file system.
fn is_docker_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Opens `<containers>/<id>/config.v2.json` confined beneath `containers`, refusing symlinks
/// (ELOOP) so a planted link cannot point the read elsewhere.
fn open_config(containers: &Path, id: &str) -> io::Result<File> {
    open_record(containers, id, "config.v2.json")
}

/// Opens `<containers>/<id>/<file>` the same confined way.
fn open_record(containers: &Path, id: &str, file: &str) -> io::Result<File> {
    let dir = rustix::fs::open(
        containers,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // openat2, or on kernels without it the walk that refuses symlinks the same way.
    let fd = crate::beneath::open(
        &dir,
        &format!("{id}/{file}"),
        // NONBLOCK: a FIFO planted in place of the file must not hang the scan on open.
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(File::from(fd))
}

/// How a container ended, as Docker recorded it: config.v2.json's `State`, and what
/// hostconfig.json says it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerExit {
    pub id: String,
    /// `--name`, without the leading slash.
    pub name: String,
    pub exit_code: i32,
    /// The kernel OOM-killed a process of it (Docker's `OOMKilled`).
    pub oom_killed: bool,
    pub finished_at: SystemTime,
    /// `--memory` (None when unlimited).
    pub memory_limit: Option<u64>,
    /// `--shm-size` (None with `--ipc=host` or where Docker did not record one).
    pub shm_size: Option<u64>,
}

/// The fields of config.v2.json an exit needs.
#[derive(Deserialize)]
struct RecordV2 {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "State")]
    state: StateV2,
}

#[derive(Deserialize)]
struct StateV2 {
    #[serde(rename = "Running")]
    running: bool,
    #[serde(rename = "OOMKilled", default)]
    oom_killed: bool,
    #[serde(rename = "ExitCode")]
    exit_code: i32,
    #[serde(rename = "FinishedAt")]
    finished_at: String,
}

#[derive(Deserialize, Default)]
struct HostConfig {
    #[serde(rename = "Memory", default)]
    memory: i64,
    #[serde(rename = "ShmSize", default)]
    shm_size: i64,
    #[serde(rename = "IpcMode", default)]
    ipc_mode: String,
}

/// Pure: a stopped container's exit out of config.v2.json's and hostconfig.json's texts; None
/// while it runs, when it never finished, or when the text is not Docker's shape.
pub fn parse_exit(config: &str, host_config: Option<&str>) -> Option<DockerExit> {
    let record: RecordV2 = serde_json::from_str(config).ok()?;
    if record.state.running || !is_docker_id(&record.id) {
        return None;
    }
    let finished: k8s_openapi::jiff::Timestamp = record.state.finished_at.parse().ok()?;
    let finished_at = SystemTime::from(finished);
    // Docker writes year 1 for a container that never ran to an end.
    if finished_at <= SystemTime::UNIX_EPOCH {
        return None;
    }
    let host: HostConfig = host_config
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let positive = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
    Some(DockerExit {
        name: record
            .name
            .strip_prefix('/')
            .unwrap_or(&record.name)
            .to_string(),
        id: record.id,
        exit_code: record.state.exit_code,
        oom_killed: record.state.oom_killed,
        finished_at,
        memory_limit: positive(host.memory),
        shm_size: (host.ipc_mode != "host")
            .then(|| positive(host.shm_size))
            .flatten(),
    })
}

/// Records read at most per call: a host with more stopped containers than this is told about
/// the first ones in directory order (Docker keeps stopped containers until removed).
const MAX_RECORDS: usize = 10_000;

/// The records already read, by their modification time and size: `serve` looks at Docker's
/// records every second and reads again only those that changed. An unchanged record costs one
/// stat and no allocation.
#[derive(Debug, Default)]
pub struct RecordsSeen {
    by_id: HashMap<String, (Stamp, u64)>,
    /// Which look this is: a record not seen in the last one is forgotten.
    look: u64,
}

/// A record's modification time (seconds, nanoseconds) and size.
type Stamp = (i64, i64, i64);

impl RecordsSeen {
    /// Whether `<id>/config.v2.json` changed since it was last looked at: one stat, no open.
    /// Only a gate: a changed record is still read beneath the root, refusing symlinks.
    fn changed(&mut self, containers: &impl AsFd, id: &str) -> bool {
        let path = format!("{id}/config.v2.json");
        let Ok(st) = rustix::fs::statat(containers, path.as_str(), AtFlags::SYMLINK_NOFOLLOW)
        else {
            return false;
        };
        let stamp = (st.st_mtime, st.st_mtime_nsec as i64, st.st_size);
        let look = self.look;
        match self.by_id.get_mut(id) {
            Some((old, seen)) => {
                *seen = look;
                std::mem::replace(old, stamp) != stamp
            }
            None => {
                self.by_id.insert(id.to_string(), (stamp, look));
                true
            }
        }
    }

    /// Ends a look: the records not seen in it are forgotten.
    fn end_look(&mut self) {
        let look = self.look;
        self.by_id.retain(|_, (_, seen)| *seen == look);
        self.look += 1;
    }
}

/// The containers under `<docker-root>/containers` that stopped at or after `since`, each read
/// confined beneath that directory; unreadable or foreign entries are skipped. With `seen`, a
/// record unchanged since it was last read here is not read again.
pub fn exited_since(
    docker_root: &Path,
    since: SystemTime,
    mut seen: Option<&mut RecordsSeen>,
) -> Vec<DockerExit> {
    let containers = docker_root.join("containers");
    let Ok(entries) = std::fs::read_dir(&containers) else {
        return Vec::new();
    };
    let dir = rustix::fs::open(
        &containers,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_RECORDS) {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !is_docker_id(&id) {
            continue;
        }
        if let (Some(seen), Ok(dir)) = (seen.as_deref_mut(), &dir) {
            if !seen.changed(dir, &id) {
                continue;
            }
        }
        let read = |file: &str| {
            let f = open_record(&containers, &id, file).ok()?;
            let size = f.metadata().ok().filter(|m| m.is_file())?.len();
            read_bounded(f, size).ok().flatten()
        };
        let Some(config) = read("config.v2.json") else {
            continue;
        };
        let host = read("hostconfig.json");
        if let Some(exit) = parse_exit(&config, host.as_deref()) {
            // The record's ID must be its directory's: a copied file speaks for no one else.
            if exit.id == id && exit.finished_at >= since {
                out.push(exit);
            }
        }
    }
    if let Some(seen) = seen {
        seen.end_look();
    }
    out.sort_by_key(|e| e.finished_at);
    out
}

/// The file's text, or `None` when it is larger than [`MAX_CONFIG_BYTES`] or not UTF-8.
fn read_bounded(file: File, size: u64) -> io::Result<Option<String>> {
    if size > MAX_CONFIG_BYTES {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte over the bound tells a file that grew since fstat from one that fits.
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Ok(None);
    }
    Ok(String::from_utf8(bytes).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::{Duration, SystemTime};

    const ID: &str = "3f4e8a1b2c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f";

    /// config.v2.json as Docker 27 writes it (abridged values, every section present).
    fn real_config(id: &str, name: &str) -> String {
        format!(
            r#"{{"StreamConfig":{{}},"State":{{"Running":true,"Paused":false,"Restarting":false,"OOMKilled":false,"RemovalInProgress":false,"Dead":false,"Pid":48213,"ExitCode":0,"Error":"","StartedAt":"2025-11-03T09:14:27.518934201Z","FinishedAt":"0001-01-01T00:00:00Z","Health":null}},"ID":"{id}","Created":"2025-11-03T09:14:26.902113845Z","Managed":false,"Path":"python","Args":["-m","asr.serve","--workers","8"],"Config":{{"Hostname":"3f4e8a1b2c9d","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"ExposedPorts":{{"8080/tcp":{{}}}},"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":["PATH=/opt/conda/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","NVIDIA_VISIBLE_DEVICES=all","NVIDIA_DRIVER_CAPABILITIES=compute,utility","LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64","PYTORCH_VERSION=2.5.1"],"Cmd":["python","-m","asr.serve","--workers","8"],"Image":"pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime","Volumes":null,"WorkingDir":"/workspace","Entrypoint":null,"OnBuild":null,"Labels":{{"com.nvidia.volumes.needed":"nvidia_driver","org.opencontainers.image.ref.name":"ubuntu","org.opencontainers.image.version":"22.04"}}}},"Image":"sha256:7f1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9","ImageManifest":null,"NetworkSettings":{{"Bridge":"","SandboxID":"9a8b7c6d5e4f","SandboxKey":"/var/run/docker/netns/9a8b7c6d5e4f","HairpinMode":false,"LinkLocalIPv6Address":"","LinkLocalIPv6PrefixLen":0,"Networks":{{"bridge":{{"IPAMConfig":null,"Links":null,"Aliases":null,"MacAddress":"02:42:ac:11:00:02","DriverOpts":null,"NetworkID":"0c1d2e3f4a5b","EndpointID":"1a2b3c4d5e6f","Gateway":"172.17.0.1","IPAddress":"172.17.0.2","IPPrefixLen":16,"IPv6Gateway":"","GlobalIPv6Address":"","GlobalIPv6PrefixLen":0,"DNSNames":null,"IPAMOperational":false,"DesiredMacAddress":""}}}},"Service":null,"Ports":{{"8080/tcp":[{{"HostIp":"0.0.0.0","HostPort":"8080"}}]}},"SecondaryIPAddresses":null,"SecondaryIPv6Addresses":null,"HasSwarmEndpoint":false}},"LogPath":"/var/lib/docker/containers/{id}/{id}-json.log","Name":"{name}","Driver":"overlay2","OS":"linux","RestartCount":0,"HasBeenStartedBefore":true,"HasBeenManuallyStopped":false,"MountPoints":{{"/workspace/models":{{"Source":"/srv/models","Destination":"/workspace/models","RW":false,"Name":"","Driver":"","Type":"bind","Propagation":"rprivate","Spec":{{"Type":"bind","Source":"/srv/models","Target":"/workspace/models","ReadOnly":true}},"SkipMountpointCreation":false}}}},"SecretReferences":null,"ConfigReferences":null,"MountLabel":"","ProcessLabel":"","AppArmorProfile":"docker-default","SeccompProfile":"","NoNewPrivileges":false,"HostnamePath":"/var/lib/docker/containers/{id}/hostname","HostsPath":"/var/lib/docker/containers/{id}/hosts","ShmPath":"/var/lib/docker/containers/{id}/mounts/shm","ResolvConfPath":"/var/lib/docker/containers/{id}/resolv.conf","LocalLogCacheMeta":{{"HaveNotifyEnabled":false}}}}"#
        )
    }

    fn write_config(root: &Path, id: &str, text: &str) -> PathBuf {
        let dir = root.join("containers").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.v2.json");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn set_mtime(path: &Path, secs: u64) {
        let file = File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    }

    fn asr() -> DockerContainer {
        DockerContainer {
            name: "asr".into(),
            image: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime".into(),
            uses_gpu: true, // NVIDIA_VISIBLE_DEVICES=all
        }
    }

    /// Records the real engine wrote (Docker 20.10, tests/fixtures/docker/).
    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/docker")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn a_real_oom_killed_and_a_real_sigbus_record_are_their_exits() {
        let oom = parse_exit(
            &fixture("oomk.config.v2.json"),
            Some(&fixture("oomk.hostconfig.json")),
        )
        .expect("a stopped container");
        assert_eq!(
            (oom.name.as_str(), oom.exit_code, oom.oom_killed),
            ("oomk", 137, true)
        );
        assert_eq!(oom.memory_limit, Some(64 << 20), "--memory=64m");
        assert_eq!(oom.shm_size, Some(1 << 30), "--shm-size=1g");
        assert_eq!(
            k8s_openapi::jiff::Timestamp::try_from(oom.finished_at)
                .unwrap()
                .to_string(),
            "2026-11-24T22:41:18.292537149Z"
        );
        let bus = parse_exit(
            &fixture("bus2.config.v2.json"),
            Some(&fixture("bus2.hostconfig.json")),
        )
        .unwrap();
        assert_eq!((bus.exit_code, bus.oom_killed), (135, false));
        assert_eq!(bus.memory_limit, None, "no --memory");
        assert_eq!(bus.shm_size, Some(64 << 20), "Docker's default");
        // A running container has not ended; without hostconfig.json the limits are unknown.
        assert_eq!(parse_exit(&fixture("running.config.v2.json"), None), None);
        let no_host = parse_exit(&fixture("oomk.config.v2.json"), None).unwrap();
        assert_eq!((no_host.memory_limit, no_host.shm_size), (None, None));
        let never = format!(
            r#"{{"ID":"{}","Name":"/a","State":{{"Running":false,"ExitCode":0,"FinishedAt":"0001-01-01T00:00:00Z"}}}}"#,
            "a".repeat(64)
        );
        for text in [
            "",
            "{}",
            "null",
            r#"{"ID":"x","Name":"/a","State":{}}"#,
            &never,
        ] {
            assert_eq!(parse_exit(text, None), None, "{text}");
        }
    }

    #[test]
    fn exited_since_reads_each_record_beneath_the_root_by_its_own_id() {
        let dir = tempfile::tempdir().unwrap();
        let oom = fixture("oomk.config.v2.json");
        let id = parse_exit(&oom, None).unwrap().id;
        write_config(dir.path(), &id, &oom);
        // The same record copied under another ID speaks for no one.
        write_config(dir.path(), &id.replace('e', "f"), &oom);
        // A running one, and a symlinked directory to a record elsewhere.
        let running = fixture("running.config.v2.json");
        write_config(dir.path(), &"b".repeat(64), &running);
        let elsewhere = tempfile::tempdir().unwrap();
        write_config(elsewhere.path(), &id, &oom);
        std::os::unix::fs::symlink(
            elsewhere.path().join("containers").join(&id),
            dir.path().join("containers").join("c".repeat(64)),
        )
        .unwrap();
        let found = exited_since(dir.path(), SystemTime::UNIX_EPOCH, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].id, id);
        let later = found[0].finished_at + Duration::from_secs(1);
        assert!(exited_since(dir.path(), later, None).is_empty());
        let absent = dir.path().join("absent");
        assert!(exited_since(&absent, SystemTime::UNIX_EPOCH, None).is_empty());
    }

    #[test]
    fn serve_reads_a_record_again_only_once_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let oom = fixture("oomk.config.v2.json");
        let id = parse_exit(&oom, None).unwrap().id;
        write_config(dir.path(), &id, &oom);
        let mut seen = RecordsSeen::default();
        let read =
            |seen: &mut RecordsSeen| exited_since(dir.path(), SystemTime::UNIX_EPOCH, Some(seen));
        assert_eq!(read(&mut seen).len(), 1, "first look: read");
        assert!(read(&mut seen).is_empty(), "unchanged: not read again");
        // Docker rewrites the record (a restart that stopped again): read again.
        let config = dir
            .path()
            .join("containers")
            .join(&id)
            .join("config.v2.json");
        let f = std::fs::File::options().write(true).open(&config).unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        assert_eq!(read(&mut seen).len(), 1, "changed: read");
        // A container removed is forgotten.
        std::fs::remove_dir_all(dir.path().join("containers").join(&id)).unwrap();
        assert!(read(&mut seen).is_empty());
        assert!(seen.by_id.is_empty());
    }

    #[test]
    fn real_records_say_which_containers_were_given_gpus() {
        let gpu = |n: &str| {
            let c = fixture(&format!("{n}.config.v2.json"));
            let h = fixture(&format!("{n}.hostconfig.json"));
            parse_config(&c, Some(&h)).unwrap().uses_gpu
        };
        // `--gpus all` (DeviceRequests, no NVIDIA_VISIBLE_DEVICES); `-e ...=all`; `-e ...=void`.
        assert!(gpu("gpus"));
        assert!(gpu("envgpu"));
        assert!(!gpu("envvoid"));
        // Without hostconfig.json, `--gpus` is not known; the environment still is.
        assert!(
            !parse_config(&fixture("gpus.config.v2.json"), None)
                .unwrap()
                .uses_gpu
        );
        for n in ["oomk", "bus2"] {
            assert!(!gpu(n), "{n}");
        }
    }

    #[test]
    fn the_gpu_words_of_the_environment_and_the_device_requests() {
        let env =
            |vars: &[&str]| env_gives_gpus(&vars.iter().map(|v| v.to_string()).collect::<Vec<_>>());
        assert!(env(&["NVIDIA_VISIBLE_DEVICES=0,1"]));
        assert!(env(&["NVIDIA_VISIBLE_DEVICES=GPU-5f3c"]));
        for none in ["", "void", "none", " none "] {
            assert!(
                !env(&[&format!("NVIDIA_VISIBLE_DEVICES={none}")]),
                "{none:?}"
            );
        }
        assert!(!env(&[
            "NVIDIA_DRIVER_CAPABILITIES=all",
            "XNVIDIA_VISIBLE_DEVICES=all"
        ]));
        // The last one wins, as in the process's environment.
        assert!(!env(&[
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_VISIBLE_DEVICES=void"
        ]));
        assert!(requests_gpus(
            r#"{"DeviceRequests":[{"Driver":"nvidia","Count":1}]}"#
        ));
        assert!(requests_gpus(
            r#"{"DeviceRequests":[{"Capabilities":[["compute"],["gpu","utility"]]}]}"#
        ));
        for no in [
            r#"{"DeviceRequests":null}"#,
            r#"{"DeviceRequests":[{"Driver":"","Capabilities":[null,["tpu"]]}]}"#,
            r#"{"DeviceRequests":[{"Driver":"cdi","DeviceIDs":["vendor.com/x=1"]}]}"#,
            r#"{"DeviceRequests":"gpu"}"#,
            "{}",
            "",
            "not json",
        ] {
            assert!(!requests_gpus(no), "{no}");
        }
    }

    #[test]
    fn a_hostconfig_written_later_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            format!(r#"{{"ID":"{ID}","Name":"/trainer","Config":{{"Image":"x","Env":null}}}}"#);
        write_config(dir.path(), ID, &config);
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert!(
            !names.lookup(ID).unwrap().uses_gpu,
            "no hostconfig.json yet"
        );
        let host = dir
            .path()
            .join("containers")
            .join(ID)
            .join("hostconfig.json");
        std::fs::write(&host, fixture("gpus.hostconfig.json")).unwrap();
        assert!(names.lookup(ID).unwrap().uses_gpu);
        // A symlinked hostconfig.json is not followed.
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, fixture("gpus.hostconfig.json")).unwrap();
        std::fs::remove_file(&host).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &host).unwrap();
        assert!(!names.lookup(ID).unwrap().uses_gpu);
    }

    #[test]
    fn parses_a_real_config() {
        assert_eq!(parse_config(&real_config(ID, "/asr"), None), Some(asr()));
    }

    #[test]
    fn other_shapes_are_none() {
        for text in [
            "",
            "not json",
            "[]",
            "null",
            r#"{"Name":"/asr"}"#,
            r#"{"Config":{"Image":"x"}}"#,
            r#"{"Name":"/","Config":{"Image":"x"}}"#,
            r#"{"Name":7,"Config":{"Image":"x"}}"#,
            r#"{"Name":"/asr","Config":{"Image":null}}"#,
            r#"{"Name":"/asr","Config":{"Image":"x"}"#,
        ] {
            assert_eq!(parse_config(text, None), None, "{text}");
        }
    }

    #[test]
    fn looks_up_by_id_from_the_docker_root() {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), ID, &real_config(ID, "/asr"));
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert_eq!(names.lookup(ID), Some(asr()));
        // From the cache the second time, the same answer.
        assert_eq!(names.lookup(ID), Some(asr()));
    }

    #[test]
    fn a_missing_root_or_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DockerNames::new(None).lookup(ID), None);
        let mut names = DockerNames::new(Some(dir.path().join("absent")));
        assert_eq!(names.lookup(ID), None);
        std::fs::create_dir_all(dir.path().join("containers").join(ID)).unwrap();
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert_eq!(names.lookup(ID), None);
    }

    #[test]
    fn garbage_json_is_none() {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), ID, "{\"Name\": \"/asr\", \"Config\": {\x00");
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert_eq!(names.lookup(ID), None);
    }

    #[test]
    fn only_64_hex_ids_are_looked_up() {
        let dir = tempfile::tempdir().unwrap();
        // Files that would answer if the ID reached the file system.
        for id in ["asr", "../containers/x", &ID.to_uppercase(), &ID[..63]] {
            write_config(dir.path(), id, &real_config(ID, "/asr"));
        }
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        for id in [
            "",
            "asr",
            "../containers/x",
            &ID.to_uppercase(),
            &ID[..63],
            &format!("{ID}0"),
            &format!("{}/", &ID[..63]),
        ] {
            assert_eq!(names.lookup(id), None, "{id}");
        }
    }

    #[test]
    fn a_symlink_out_of_the_containers_dir_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("docker");
        std::fs::create_dir_all(root.join("containers")).unwrap();
        let outside = dir.path().join("outside");
        write_config(&outside, ID, &real_config(ID, "/asr"));
        std::os::unix::fs::symlink(
            outside.join("containers").join(ID),
            root.join("containers").join(ID),
        )
        .unwrap();
        let mut names = DockerNames::new(Some(root.clone()));
        assert_eq!(names.lookup(ID), None);

        // Nor a symlinked file inside a real container directory.
        let other = ID.replace('3', "4");
        std::fs::create_dir_all(root.join("containers").join(&other)).unwrap();
        std::os::unix::fs::symlink(
            outside.join("containers").join(ID).join("config.v2.json"),
            root.join("containers").join(&other).join("config.v2.json"),
        )
        .unwrap();
        assert_eq!(names.lookup(&other), None);

        // Nor a relative one, even to a real container directory beside it.
        let real = ID.replace('3', "5");
        write_config(&root, &real, &real_config(&real, "/asr"));
        let alias = ID.replace('3', "6");
        std::os::unix::fs::symlink(&real, root.join("containers").join(&alias)).unwrap();
        assert_eq!(names.lookup(&real), Some(asr()));
        assert_eq!(names.lookup(&alias), None);
    }

    #[test]
    fn a_changed_mtime_is_re_read_and_an_unchanged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(dir.path(), ID, &real_config(ID, "/asr"));
        set_mtime(&path, 1_700_000_000);
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert_eq!(names.lookup(ID).unwrap().name, "asr");

        // Rewritten in place to the same length (same inode, same size) with the mtime put
        // back: the cache answers, which shows the file is not re-read on every lookup.
        std::fs::write(&path, real_config(ID, "/tts")).unwrap();
        set_mtime(&path, 1_700_000_000);
        assert_eq!(names.lookup(ID).unwrap().name, "asr");

        // The same bytes with a new mtime: re-read.
        set_mtime(&path, 1_700_000_060);
        assert_eq!(names.lookup(ID).unwrap().name, "tts");
    }

    #[test]
    fn retain_forgets_containers_no_longer_live() {
        let dir = tempfile::tempdir().unwrap();
        let other = ID.replace('3', "4");
        write_config(dir.path(), ID, &real_config(ID, "/asr"));
        write_config(dir.path(), &other, &real_config(&other, "/tts"));
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert!(names.lookup(ID).is_some() && names.lookup(&other).is_some());
        names.retain(&HashSet::from([ID.to_string()]));
        assert_eq!(names.cache.len(), 1);
        assert!(names.cache.contains_key(ID));
    }

    #[test]
    fn an_oversized_config_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = real_config(ID, "/asr");
        text.truncate(text.len() - 1);
        text.push_str(&format!(
            ",\"Padding\":\"{}\"}}",
            "x".repeat(MAX_CONFIG_BYTES as usize)
        ));
        assert!(
            parse_config(&text, None).is_some(),
            "well-formed, only too big"
        );
        write_config(dir.path(), ID, &text);
        let mut names = DockerNames::new(Some(dir.path().to_path_buf()));
        assert_eq!(names.lookup(ID), None);
    }
}

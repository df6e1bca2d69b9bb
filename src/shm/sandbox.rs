//! The Pod's /dev/shm on the host. containerd and CRI-O mount one tmpfs per Pod sandbox on the
//! host (containerd: `<state>/io.containerd.grpc.v1.cri/sandboxes/<sandbox id>/shm`, 64 MiB;
//! CRI-O: `<run root>/overlay-containers/<sandbox id>/userdata/shm`) and bind it into every
//! container of the Pod. It outlives any one container (until the sandbox is removed), so
//! after a death it still holds what the dead container wrote: the reading a death is judged
//! with when the container's own is gone.
//!
//! Which Pod a sandbox is: the sandbox ID is the cgroup leaf of the Pod's sandbox ("pause")
//! container, under `pod<uid>`, which the scan measured as a container like any other.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::deadline::Measurer;
use super::statfs;
use crate::model::{ShmReading, ShmStatus};
use crate::procfs::mountinfo::parse_line;
use rustix::fs::{Mode, OFlags};

/// One sandbox's /dev/shm mount on the host, from the host's mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxMount {
    pub sandbox_id: String,
    /// Where it is mounted, in the host's mount namespace.
    pub mount_point: String,
    pub fs_type: String,
    /// Its mount ID: the handle opened at `mount_point` must be on this very mount.
    pub mount_id: u64,
}

/// Pure: the sandboxes' /dev/shm mounts in the host's mountinfo, one per mount point (the
/// topmost). Lines that are not a sandbox's shm, or malformed, are skipped.
pub fn sandbox_mounts(mountinfo: &str) -> Vec<SandboxMount> {
    let mut out: Vec<SandboxMount> = Vec::new();
    // A cheap test on the raw line first: a node has thousands of mounts, a few of them these.
    let candidates = mountinfo
        .lines()
        .filter(|l| l.contains("/sandboxes/") || l.contains("/userdata/shm"));
    for entry in candidates.filter_map(parse_line) {
        let Some(sandbox_id) = sandbox_of(&entry.mount_point) else {
            continue;
        };
        let mount = SandboxMount {
            sandbox_id: sandbox_id.to_string(),
            mount_point: entry.mount_point,
            fs_type: entry.fs_type,
            mount_id: entry.mount_id,
        };
        match out.iter_mut().find(|m| m.mount_point == mount.mount_point) {
            Some(earlier) => *earlier = mount,
            None => out.push(mount),
        }
    }
    out
}

/// The sandbox ID a mount point names, if it is a sandbox's shm of containerd's CRI plugin or
/// of CRI-O.
fn sandbox_of(mount_point: &str) -> Option<&str> {
    let rest = mount_point.strip_suffix("/shm")?;
    let id = if let Some(rest) = rest.strip_suffix("/userdata") {
        let (parent, id) = rest.rsplit_once('/')?;
        parent.ends_with("/overlay-containers").then_some(id)?
    } else {
        let (parent, id) = rest.rsplit_once('/')?;
        parent
            .ends_with("io.containerd.grpc.v1.cri/sandboxes")
            .then_some(id)?
    };
    is_runtime_id(id).then_some(id)
}

/// Runtimes name sandboxes with 64 hex digits.
fn is_runtime_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Pure: each mount with the scan's reading of its sandbox container (which names the Pod);
/// a mount whose sandbox the scan did not find is left out (no Pod to tie it to).
pub fn tie<'a>(
    mounts: &'a [SandboxMount],
    readings: &'a [ShmReading],
) -> Vec<(&'a SandboxMount, &'a ShmReading)> {
    let by_id: HashMap<&str, &ShmReading> = readings
        .iter()
        .filter(|r| r.pod_uid.is_some())
        .map(|r| (r.container_id.as_str(), r))
        .collect();
    mounts
        .iter()
        .filter_map(|m| by_id.get(m.sandbox_id.as_str()).map(|r| (m, *r)))
        .collect()
}

/// Pure: the sandbox's /dev/shm as a reading of its Pod: the sandbox container's identity and
/// memory limit, the tmpfs's numbers.
pub fn reading(mount: &SandboxMount, sandbox: &ShmReading, stat: &statfs::ShmStat) -> ShmReading {
    ShmReading {
        namespace: sandbox.namespace.clone(),
        pod: sandbox.pod.clone(),
        pod_uid: sandbox.pod_uid.clone(),
        container: None,
        container_id: mount.sandbox_id.clone(),
        pid: sandbox.pid,
        cgroup: sandbox.cgroup.clone(),
        host_ipc: false,
        mounted: Some(true),
        fs_type: Some(mount.fs_type.clone()),
        size_bytes: stat.size_bytes(),
        used_bytes: stat.used_bytes(),
        available_bytes: stat.size_bytes().map(|_| stat.free_bytes),
        memory_limit_bytes: sandbox.memory_limit_bytes,
        memory_shmem_bytes: None,
        memory_oom_kills: None,
        used_peak_bytes: stat.used_bytes(),
        image: None,
        status: ShmStatus::Ok,
        error: None,
        leftovers: None,
    }
}

/// Measures the sandboxes' /dev/shm each scan, through the host's root (`<proc-root>/1/root`),
/// under the same deadline as a container's.
pub struct SandboxShm {
    /// `<proc-root>/1`, or `<proc-root>/self` where PID 1 cannot be read and the agent's own
    /// namespaces are taken as the host's (`host::NsSource::Agent`).
    host: PathBuf,
    measurer: Measurer,
    /// Mounts that did not answer in time: not asked again.
    hung: HashSet<String>,
    logged: HashSet<String>,
}

impl SandboxShm {
    pub fn new(host: PathBuf) -> SandboxShm {
        SandboxShm {
            host,
            measurer: Measurer::default(),
            hung: HashSet::new(),
            logged: HashSet::new(),
        }
    }

    /// The Pods' sandbox /dev/shm, for the sandboxes among `readings`; errors are logged once
    /// and counted in `errors`.
    pub fn scan(&mut self, readings: &[ShmReading], errors: &mut u64) -> Vec<ShmReading> {
        if !readings.iter().any(|r| r.pod_uid.is_some()) {
            return Vec::new();
        }
        let path = self.host.join("mountinfo");
        let mountinfo = match std::fs::read_to_string(&path) {
            Ok(m) => m,
            Err(e) => {
                *errors += 1;
                self.warn_once(format!("reading {}: {e}", path.display()));
                return Vec::new();
            }
        };
        let mounts = sandbox_mounts(&mountinfo);
        let mut out = Vec::new();
        for (mount, sandbox) in tie(&mounts, readings) {
            // Only a tmpfs is asked (see statfs::is_measured_type): a sandbox's is one.
            if self.hung.contains(&mount.mount_point) || !statfs::is_measured_type(&mount.fs_type) {
                continue;
            }
            if let Some(stat) = self.measure(&mount.mount_point, Some(mount.mount_id), errors) {
                out.push(reading(mount, sandbox, &stat));
            }
        }
        self.hung
            .retain(|p| mounts.iter().any(|m| &m.mount_point == p));
        out
    }

    /// statfs of the mount at `mount_point`, only when the handle opened there is on mount
    /// `mount_id` (the tmpfs mountinfo listed; `None`: any, for tests).
    fn measure(
        &mut self,
        mount_point: &str,
        mount_id: Option<u64>,
        errors: &mut u64,
    ) -> Option<statfs::ShmStat> {
        // Following the magic link is the point: the kernel's handle on the host's root.
        let root = rustix::fs::open(
            self.host.join("root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let root = match root {
            Ok(root) => root,
            Err(e) => {
                *errors += 1;
                self.warn_once(format!("opening the host's root: {e}"));
                return None;
            }
        };
        let rel = mount_point.trim_start_matches('/');
        match self.measurer.open_and_identify_at(root, rel) {
            // Another mount was put there since mountinfo was read: not asked.
            Ok(Ok((_, id))) if mount_id.is_some_and(|m| m != id.mount_id) => None,
            Ok(Ok((fd, id))) => match statfs::measure_tmpfs(&fd, id) {
                Ok(stat) => Some(stat),
                Err(e) => {
                    *errors += 1;
                    self.warn_once(format!("measuring the Pod sandbox's {mount_point}: {e}"));
                    None
                }
            },
            // Removed between the mountinfo and the look: the sandbox went.
            Ok(Err(statfs::OpenShmError::Absent(_))) => None,
            Ok(Err(e)) => {
                *errors += 1;
                self.warn_once(format!("measuring the Pod sandbox's {mount_point}: {e}"));
                None
            }
            Err(why) => {
                *errors += 1;
                self.hung.insert(mount_point.to_string());
                self.warn_once(format!(
                    "the Pod sandbox's {mount_point} did not answer ({why:?}): not asked again"
                ));
                None
            }
        }
    }

    fn warn_once(&mut self, message: String) {
        if self.logged.len() < 1_000 && self.logged.insert(message.clone()) {
            tracing::warn!("{message}");
        } else {
            tracing::debug!("{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDBOX: &str = "74985231fd01b296ed937dbe7a2a540419c9a5c24bba2eab5020dd641bfbb809";
    const OTHER: &str = "9033b3094ce734db564c254afadea4fb81b4b862d2ca63d625266c6babfbfd55";

    /// Lines as containerd 1.6 and CRI-O leave them in the host's mountinfo.
    fn mountinfo() -> String {
        format!(
            "27 1 253:0 / / rw,relatime - ext4 /dev/vda rw\n\
             42 27 0:39 / /run/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm \
             rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k\n\
             45 27 0:40 / /run/containerd/io.containerd.runtime.v2.task/k8s.io/{SANDBOX}/rootfs \
             rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c\n\
             51 27 0:44 / /run/containers/storage/overlay-containers/{OTHER}/userdata/shm \
             rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k\n\
             52 27 0:45 / /var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/shm \
             rw,relatime - tmpfs tmpfs rw\n\
             53 27 0:46 / /run/containerd/io.containerd.grpc.v1.cri/sandboxes/short/shm \
             rw - tmpfs shm rw\n\
             54 27 0:47 / /run/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm \
             rw - tmpfs shm rw,size=131072k\n\
             55 27 0:48 /sandboxes/ broken\n"
        )
    }

    #[test]
    fn containerd_and_cri_o_sandboxes_are_found_and_nothing_else() {
        let mounts = sandbox_mounts(&mountinfo());
        let ids: Vec<&str> = mounts.iter().map(|m| m.sandbox_id.as_str()).collect();
        assert_eq!(ids, [SANDBOX, OTHER]);
        // Mounted twice at one point: the topmost (last listed) is the one seen there.
        assert_eq!(
            mounts[0].mount_point,
            format!("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/shm")
        );
        assert_eq!(mounts[1].fs_type, "tmpfs");
    }

    #[test]
    fn a_path_that_only_looks_like_a_sandbox_is_not_one() {
        assert_eq!(sandbox_of(&format!("/x/sandboxes/{SANDBOX}/shm")), None);
        assert_eq!(sandbox_of(&format!("/x/{SANDBOX}/userdata/shm")), None);
        let id = "g".repeat(64);
        let p = format!("/r/io.containerd.grpc.v1.cri/sandboxes/{id}/shm");
        assert_eq!(sandbox_of(&p), None);
        assert_eq!(sandbox_of(""), None);
    }

    fn pause(id: &str, uid: Option<&str>) -> ShmReading {
        let mut r = crate::fixtures::shm_reading(id, 64 << 20, 1);
        r.pod_uid = uid.map(str::to_string);
        r.memory_limit_bytes = Some(1 << 30);
        r
    }

    #[test]
    fn a_sandbox_is_tied_to_its_pod_through_its_sandbox_container() {
        let mounts = sandbox_mounts(&mountinfo());
        let readings = [pause(SANDBOX, Some("uid-1")), pause(OTHER, None)];
        let tied = tie(&mounts, &readings);
        assert_eq!(tied.len(), 1, "a reading without a Pod names none");
        assert_eq!(tied[0].0.sandbox_id, SANDBOX);
        assert_eq!(tied[0].1.pod_uid.as_deref(), Some("uid-1"));
        let stat = statfs::ShmStat {
            mount_id: None,
            is_mount_root: Some(true),
            dev: None,
            is_tmpfs: true,
            total_bytes: 64 << 20,
            free_bytes: 24 << 20,
        };
        let r = reading(tied[0].0, tied[0].1, &stat);
        assert_eq!(r.pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(r.container, None);
        assert_eq!(r.size_bytes, Some(64 << 20));
        assert_eq!(r.used_bytes, Some(40 << 20));
        assert_eq!(r.available_bytes, Some(24 << 20));
        assert_eq!(r.memory_limit_bytes, Some(1 << 30));
    }

    #[test]
    fn the_hosts_own_dev_shm_is_measured_by_its_path() {
        // This machine's /dev/shm stands in for a sandbox's: the same path, the same calls.
        let mut s = SandboxShm::new("/proc/self".into());
        let mut errors = 0;
        let stat = s.measure("/dev/shm", None, &mut errors);
        assert!(stat.is_some_and(|st| st.is_tmpfs), "{errors} errors");
        let id = stat.and_then(|st| st.mount_id);
        assert!(s.measure("/dev/shm", id, &mut errors).is_some());
        let other = id.map(|id| id + 1);
        assert_eq!(
            s.measure("/dev/shm", other, &mut errors),
            None,
            "another mount"
        );
        assert_eq!(s.measure("/nonexistent/shm", None, &mut errors), None);
        assert_eq!(errors, 0, "a mount gone is no error");
    }

    #[test]
    fn without_pods_the_mountinfo_is_not_read() {
        let mut s = SandboxShm::new("/nonexistent/1".into());
        let mut errors = 0;
        assert!(s.scan(&[pause(SANDBOX, None)], &mut errors).is_empty());
        assert_eq!(errors, 0);
        assert!(s.scan(&[pause(SANDBOX, Some("u"))], &mut errors).is_empty());
        assert_eq!(errors, 1, "a host that cannot be read is counted");
    }
}

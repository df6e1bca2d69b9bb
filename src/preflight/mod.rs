//! `shmlink preflight`: run inside a workload container, it measures the container's own
//! /dev/shm, memory cgroup, IPC namespace and GPUs, and says whether the workload fits.
//!
//! This file does the I/O, every path under [`Roots`] so tests can point it at fixtures. The
//! rest decides without touching the machine: the need (`need`), the GPUs the workload sees
//! (`gpus`), the observations (`observe`), the problems, verdict and report (`verdict`), the fix
//! (`fix`) and the text (`render`).

pub mod fix;
pub mod gpus;
pub mod need;
pub mod observe;
pub mod problem;
pub mod render;
pub mod verdict;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{Mode, OFlags};

use crate::cgroup::memory::{parse_limit, parse_memory_stat, parse_usage, tightest, Level};
use crate::cgroup::proc::locate_memory_cgroup;
use crate::cgroup::CgroupVersion;
use crate::gpu::nvml::NvmlGpus;
use crate::gpu::pairs::{PairJudge, PairRules};
use crate::host::read_ns;
use crate::procfs::mountinfo;
use crate::shm::statfs;
use crate::text;
use gpus::{gpus_to_avoid, selector, visible_gpus, visible_pairs, NvmlGpu};
use need::NeedSpec;
use observe::{ipc_verdict, GpuObs, IpcObs, MemObs, NvmlState, RunsIn, ShmObs, ShmState};
use verdict::Report;

/// Where preflight reads: `<proc_root>/self/...`, the cgroup file system (mount points under
/// /sys/fs/cgroup are re-rooted at `cgroup_root`), and the /dev/shm directory.
#[derive(Debug, Clone)]
pub struct Roots {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
    pub shm_dir: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc_root: "/proc".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
            shm_dir: "/dev/shm".into(),
        }
    }
}

/// The environment variables preflight reads.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub cuda_visible_devices: Option<String>,
    pub nvidia_visible_devices: Option<String>,
    pub kubernetes_service_host: Option<String>,
}

impl Env {
    pub fn from_process() -> Env {
        let var = |name| std::env::var(name).ok();
        Env {
            cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
            nvidia_visible_devices: var("NVIDIA_VISIBLE_DEVICES"),
            kubernetes_service_host: var("KUBERNETES_SERVICE_HOST"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub need: NeedSpec,
    pub no_gpu: bool,
    pub nvml_lib: Option<PathBuf>,
    pub rules: PairRules,
    /// The host's IPC namespace inode, when the node is itself a container.
    pub host_ipc_ns: Option<u64>,
    /// `--p2p`: the pair probe over the visible GPUs, its results judged with the pairs.
    pub p2p: Option<crate::probe::ProbeOptions>,
}

/// Measures and judges: one call, one [`Report`].
pub fn run(roots: &Roots, env: &Env, options: &Options) -> Report {
    let mountinfo = std::fs::read(roots.proc_root.join("self/mountinfo"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let shm = roots.shm(&mountinfo);
    let memory = roots.memory(&mountinfo);
    let ipc = roots.ipc(options.host_ipc_ns);
    let gpus = roots.gpus(env, options);
    verdict::judge(
        RunsIn::detect(env.kubernetes_service_host.as_deref()),
        shm,
        memory,
        ipc,
        gpus,
        options.need,
    )
}

impl Roots {
    /// statfs and statx of the /dev/shm directory; mountinfo for the file system's type.
    pub fn shm(&self, mountinfo: &str) -> ShmObs {
        let path = self.shm_dir.display().to_string();
        let mut obs = ShmObs {
            path: path.clone(),
            state: ShmState::Absent,
            fs_type: None,
            size_bytes: None,
            used_bytes: None,
            free_bytes: None,
            error: None,
        };
        let fd = match rustix::fs::open(
            &self.shm_dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return obs,
            Err(e) => {
                obs.state = ShmState::Unreadable;
                obs.error = Some(io::Error::from(e).to_string());
                return obs;
            }
        };
        let stat = match statfs::measure(&fd) {
            Ok(stat) => stat,
            Err(e) => {
                obs.state = ShmState::Unreadable;
                obs.error = Some(e.to_string());
                return obs;
            }
        };
        let entry = mountinfo::find_mount(mountinfo, &path).filter(|e| match stat.dev {
            // Without statx (old kernels): a tmpfs's device is its own and mountinfo prints it,
            // so the line must be the mount the directory is on.
            Some(dev) if stat.is_tmpfs && stat.mount_id.is_none() => dev == (e.major, e.minor),
            _ => true,
        });
        obs.state = match (stat.is_mount_root, &entry) {
            (Some(true), _) | (None, Some(_)) => ShmState::Mounted,
            _ => ShmState::NotMounted,
        };
        obs.fs_type = match (&entry, obs.state) {
            (Some(e), ShmState::Mounted) => Some(e.fs_type.clone()),
            _ if stat.is_tmpfs => Some("tmpfs".into()),
            _ => Some(holding_fs_type(mountinfo, &path).unwrap_or_else(|| "not tmpfs".into())),
        };
        obs.size_bytes = stat.size_bytes();
        obs.used_bytes = stat.used_bytes();
        obs.free_bytes = stat.size_bytes().map(|_| stat.free_bytes);
        obs
    }

    /// This process's memory cgroup: limit, usage and headroom of it and of the ancestors
    /// mounted here (a container usually sees only its own), v1 and v2.
    pub fn memory(&self, mountinfo: &str) -> MemObs {
        let mut obs = MemObs::default();
        let proc_cgroup = match std::fs::read_to_string(self.proc_root.join("self/cgroup")) {
            Ok(text) => text,
            Err(e) => {
                obs.note = Some(format!("reading /proc/self/cgroup: {e}"));
                return obs;
            }
        };
        let location = match locate_memory_cgroup(&proc_cgroup, mountinfo) {
            Ok(location) => location,
            Err(note) => {
                obs.note = Some(note);
                return obs;
            }
        };
        obs.cgroup = Some(location.cgroup.clone());
        obs.version = Some(location.version);
        let mount_dir = self.reroot(&location.mount_point);
        let leaf = mount_dir.join(&location.rel);
        let files = location.version.memory_files();
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        // The leaf's own limit file must be there, else the memory controller is not visible
        // (or, on v2, not delegated to this cgroup).
        if read(&leaf, files.limit).is_none() && read(&leaf, files.usage).is_none() {
            obs.note = Some(format!("{} has no {}", leaf.display(), files.limit));
            return obs;
        }
        obs.visible = true;
        let mut levels = Vec::new();
        let mut dir = leaf.clone();
        loop {
            let level = Level {
                limit: read(&dir, files.limit).as_deref().and_then(parse_limit),
                usage: read(&dir, files.usage).as_deref().and_then(parse_usage),
            };
            if dir == leaf {
                obs.usage_bytes = level.usage;
            }
            levels.push(level);
            if dir == mount_dir || !dir.pop() || !dir.starts_with(&mount_dir) {
                break;
            }
        }
        if location.version == CgroupVersion::V1 {
            // The kernel's own fold over every ancestor, including those not mounted here.
            if let Some(limit) = read(&leaf, files.stat)
                .and_then(|s| parse_memory_stat(&s).hierarchical_memory_limit)
            {
                levels.push(Level {
                    limit: Some(limit),
                    usage: None,
                });
            }
        }
        let reading = tightest(levels);
        obs.limit_bytes = reading.limit_bytes;
        obs.headroom_bytes = reading.headroom_bytes;
        obs
    }

    pub fn ipc(&self, hint: Option<u64>) -> IpcObs {
        let own = read_ns(&self.proc_root, "self", "ipc").ok().map(|ns| ns.0);
        ipc_verdict(own, hint)
    }

    /// NVML's GPUs, the ones the environment selects, and the pair verdicts among them by the
    /// same judge `check` uses (one sample: link state and P2P, no counter history).
    pub fn gpus(&self, env: &Env, options: &Options) -> GpuObs {
        let (selector, selected_by) = selector(
            env.cuda_visible_devices.as_deref(),
            env.nvidia_visible_devices.as_deref(),
        );
        let mut obs = GpuObs::unchecked(selected_by, options.nvml_lib.is_some());
        if options.no_gpu {
            return obs;
        }
        let gpus = match NvmlGpus::open(options.nvml_lib.as_deref()) {
            Ok(gpus) => gpus,
            Err(e) => {
                obs.nvml =
                    NvmlState::Unavailable(text::nvml_load_failed(options.nvml_lib.as_deref(), &e));
                obs.evidence = self.gpu_evidence(env);
                return obs;
            }
        };
        obs.nvml = NvmlState::Loaded;
        let (mut sample, _) = gpus.sample();
        let nvml: Vec<NvmlGpu> = sample
            .gpus
            .iter()
            .map(|g| NvmlGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
            })
            .collect();
        let (visible, unmatched) = visible_gpus(&selector, selected_by, &nvml);
        if let Some(opts) = &options.p2p {
            // CUDA in this container sees only its GPUs; the pairs are judged as rule 8 does.
            let only: Vec<u32> = visible.iter().map(|g| g.index).collect();
            match crate::probe::run(opts, |devices| {
                crate::probe::pairs_among(devices, &sample.gpus, Some(&only))
            }) {
                Ok(probed) => {
                    sample.probes = crate::probe::assess::assess(&probed, &sample).pairs;
                }
                Err(e) => obs.probe_error = Some(e),
            }
        }
        let judgement = PairJudge::new(options.rules).judge(&sample, Instant::now());
        obs.pairs = visible_pairs(&judgement.pairs, &visible);
        obs.avoid = gpus_to_avoid(&judgement.pairs);
        obs.culprits = gpus::culprits(&judgement.blame);
        // The scan's own verdict per GPU (no held XIDs: preflight keeps no state), rendered.
        let verdicts = crate::gpu::verdict::judge(&crate::gpu::verdict::Facts {
            nvml_up: true,
            gpus: &sample.gpus,
            driver_gpus: &[],
            pairs: &judgement.pairs,
            blame: &judgement.blame,
            held: &[],
            training: &[],
            fatal_sxids: &[],
            pcie: &judgement.pcie,
            iommu: &std::collections::BTreeMap::new(),
        });
        obs.healthy = verdicts
            .iter()
            .filter(|v| v.out.is_none() && !v.is_fault())
            .filter_map(|v| v.gpu)
            .filter(|g| !obs.avoid.contains(g))
            .collect();
        obs.visible = visible;
        obs.unmatched = unmatched;
        obs
    }

    fn gpu_evidence(&self, env: &Env) -> Option<String> {
        if let Some(list) = env.nvidia_visible_devices.as_deref() {
            if !matches!(list.trim(), "" | "void" | "none") {
                return Some(format!("NVIDIA_VISIBLE_DEVICES={list}"));
            }
        }
        if env
            .cuda_visible_devices
            .as_deref()
            .is_some_and(|l| !l.trim().is_empty())
        {
            return Some("CUDA_VISIBLE_DEVICES is set".into());
        }
        crate::gpu::collector::driver_gpu_evidence(&self.proc_root)
    }

    /// A mount point as this container sees it: /sys/fs/cgroup/... moves under `cgroup_root`.
    fn reroot(&self, mount_point: &str) -> PathBuf {
        match Path::new(mount_point).strip_prefix("/sys/fs/cgroup") {
            Ok(rest) => self.cgroup_root.join(rest),
            Err(_) => PathBuf::from(mount_point),
        }
    }
}

/// The type of the file system holding `path`: the mount with the longest mount point above it.
fn holding_fs_type(mountinfo: &str, path: &str) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(mountinfo::parse_line)
        .filter(|m| {
            let mp = m.mount_point.trim_end_matches('/');
            path == mp || path.starts_with(&format!("{mp}/"))
        })
        .max_by_key(|m| m.mount_point.len())
        .map(|m| m.fs_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};
    use need::NeedSource;
    use verdict::{ProblemKind, Verdict};

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A container's view under a TempDir: /proc/self/{cgroup,mountinfo}, a cgroup tree.
    fn fixture(cgroup: &str, mountinfo: &str) -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("proc/self/cgroup"), cgroup);
        write(&dir.path().join("proc/self/mountinfo"), mountinfo);
        std::fs::create_dir_all(dir.path().join("shm")).unwrap();
        let roots = Roots {
            proc_root: dir.path().join("proc"),
            cgroup_root: dir.path().join("cgroup"),
            shm_dir: dir.path().join("shm"),
        };
        (dir, roots)
    }

    const V1_MOUNTINFO: &str = "\
600 500 0:50 / / rw,relatime - overlay overlay rw
610 600 0:60 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
611 610 0:35 /kubepods/burstable/podX/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory
612 610 0:36 /kubepods/burstable/podX/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
620 600 0:70 / /dev/shm rw - tmpfs shm rw,size=65536k
";

    #[test]
    fn a_v1_container_sees_its_own_cgroup_at_the_mount_root_and_the_hierarchical_limit() {
        let (dir, roots) = fixture(
            "12:memory:/kubepods/burstable/podX/abc\n3:cpu,cpuacct:/kubepods/burstable/podX/abc\n",
            V1_MOUNTINFO,
        );
        let mem = dir.path().join("cgroup/memory");
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(&mem.join("memory.usage_in_bytes"), "104857600\n");
        write(
            &mem.join("memory.stat"),
            "cache 0\nrss 104857600\nhierarchical_memory_limit 536870912\n",
        );
        let m = roots.memory(V1_MOUNTINFO);
        assert!(m.visible, "{m:?}");
        assert_eq!(m.version, Some(CgroupVersion::V1));
        assert_eq!(m.cgroup.as_deref(), Some("/kubepods/burstable/podX/abc"));
        assert_eq!(
            m.limit_bytes,
            Some(512 * MIB),
            "the pod's limit, out of sight"
        );
        assert_eq!(m.usage_bytes, Some(100 * MIB));
    }

    #[test]
    fn a_v2_container_with_ancestors_mounted_walks_up_to_the_mount() {
        let mountinfo = "\
700 600 0:80 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
";
        let (dir, roots) = fixture("0::/pod/ctr\n", mountinfo);
        let root = dir.path().join("cgroup");
        write(&root.join("pod/memory.max"), "1073741824\n");
        write(&root.join("pod/memory.current"), "943718400\n");
        write(&root.join("pod/ctr/memory.max"), "max\n");
        write(&root.join("pod/ctr/memory.current"), "52428800\n");
        let m = roots.memory(mountinfo);
        assert!(m.visible);
        assert_eq!(m.version, Some(CgroupVersion::V2));
        assert_eq!(m.limit_bytes, Some(GIB));
        assert_eq!(m.headroom_bytes, Some(GIB - 900 * MIB));
        assert_eq!(m.usage_bytes, Some(50 * MIB));
    }

    #[test]
    fn no_cgroup_file_system_in_the_container_is_not_visible_with_a_note() {
        let mountinfo = "600 500 0:50 / / rw - overlay overlay rw\n";
        let (_dir, roots) = fixture("4:memory:/shmlink-e2e/abc\n", mountinfo);
        let m = roots.memory(mountinfo);
        assert!(!m.visible);
        assert!(m
            .note
            .unwrap()
            .contains("no cgroup v1 memory cgroup mounted"));
    }

    #[test]
    fn the_real_dev_shm_measures_and_a_plain_directory_is_not_a_mount() {
        let roots = Roots::default();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let shm = roots.shm(&mountinfo);
        assert_eq!(shm.state, ShmState::Mounted, "{shm:?}");
        assert_eq!(shm.fs_type.as_deref(), Some("tmpfs"));
        assert!(shm.size_bytes.is_some());
        let (_dir, roots) = fixture("", "");
        let shm = roots.shm("");
        assert_eq!(shm.state, ShmState::NotMounted, "{shm:?}");
        let gone = Roots {
            shm_dir: "/nonexistent/shm".into(),
            ..Roots::default()
        };
        assert_eq!(gone.shm("").state, ShmState::Absent);
    }

    #[test]
    fn a_whole_run_on_fixtures_without_gpus_judges_the_need() {
        let (dir, roots) = fixture("12:memory:/kubepods/burstable/podX/abc\n", V1_MOUNTINFO);
        let mem = dir.path().join("cgroup/memory");
        write(&mem.join("memory.limit_in_bytes"), "268435456\n");
        write(&mem.join("memory.usage_in_bytes"), "0\n");
        let options = Options {
            need: NeedSpec::MinShm(GIB),
            no_gpu: true,
            nvml_lib: None,
            rules: PairRules::default(),
            host_ipc_ns: None,
            p2p: None,
        };
        let env = Env {
            kubernetes_service_host: Some("10.0.0.1".into()),
            ..Env::default()
        };
        let r = run(&roots, &env, &options);
        assert_eq!(r.verdict, Verdict::NotFit);
        assert_eq!(r.need.as_ref().unwrap().source, NeedSource::MinShm);
        assert!(r
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::MemoryTooSmall));
        let fix = r.fix.unwrap();
        assert!(fix.contains("memory: 1280Mi"), "{fix}");
    }
}

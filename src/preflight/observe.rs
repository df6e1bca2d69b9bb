//! What preflight saw, as plain data: the container's /dev/shm, its memory cgroup, its IPC
//! namespace, its GPUs, and where it runs; and what follows from them alone (the bytes
//! available, whether the IPC namespace is the host's).

use serde::Serialize;

use super::gpus::{SelectorSource, VisibleGpu};
use crate::cgroup::CgroupVersion;
use crate::model::PairVerdict;

/// What the container's /dev/shm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmState {
    /// A file system mounted at /dev/shm.
    Mounted,
    /// A plain directory of the container's root file system: shared memory there lives on
    /// whatever that is (often disk-backed overlay).
    NotMounted,
    /// No /dev/shm at all: `shm_open` fails.
    Absent,
    /// It could not be measured (the message says why).
    Unreadable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShmObs {
    pub path: String,
    pub state: ShmState,
    pub fs_type: Option<String>,
    /// None for a tmpfs without a size limit.
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    /// Free in the file system itself (size - used).
    pub free_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MemObs {
    /// This process's memory cgroup as /proc/self/cgroup names it.
    pub cgroup: Option<String>,
    /// "v1" or "v2".
    pub version: Option<CgroupVersion>,
    /// Whether its files could be read (a cgroup file system mounted in the container).
    pub visible: bool,
    /// Lowest limit of the cgroup and its ancestors visible here (v1: also the kernel's
    /// hierarchical_memory_limit, which covers ancestors mounted out of sight).
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// min over limited levels of limit - usage.
    pub headroom_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The kernel's initial IPC namespace's inode number (`PROC_IPC_INIT_INO`, 0xEFFFFFFF), the
/// same on every kernel: a process whose `/proc/self/ns/ipc` is `ipc:[4026531839]` shares the
/// host's IPC namespace, and so the host's /dev/shm.
pub const INIT_IPC_NS_INODE: u64 = 0xEFFF_FFFF;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpcObs {
    /// This process's IPC namespace inode.
    pub namespace: Option<u64>,
    /// Whether it is the host's; null when that cannot be known.
    pub host: Option<bool>,
    /// How that was decided.
    pub basis: String,
}

/// Host IPC from our IPC namespace inode, and the host's when a hint gives it. /proc/1 is no
/// help inside a container (its PID 1 is the container's own); the initial namespace's fixed
/// inode is, except where the "host" is itself a container (kind, nested runtimes): pass the
/// node's inode then (`--host-ipc-ns`).
pub fn ipc_verdict(own: Option<u64>, hint: Option<u64>) -> IpcObs {
    let (host, basis) = match (own, hint) {
        (None, _) => (None, "/proc/self/ns/ipc is unreadable".to_string()),
        (Some(own), Some(hint)) => (
            Some(own == hint),
            format!("compared with the host's IPC namespace given by --host-ipc-ns ({hint})"),
        ),
        (Some(own), None) if own == INIT_IPC_NS_INODE => (
            Some(true),
            "the kernel's initial IPC namespace (inode 4026531839)".to_string(),
        ),
        (Some(_), None) => (
            Some(false),
            "not the kernel's initial IPC namespace (inode 4026531839); on a node that is itself \
             a container, give the node's with --host-ipc-ns"
                .to_string(),
        ),
    };
    IpcObs {
        namespace: own,
        host,
        basis,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum NvmlState {
    Loaded,
    /// `--no-gpu`.
    Disabled,
    /// It did not load: why.
    Unavailable(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuObs {
    pub nvml: NvmlState,
    /// Whether the library was named with `--nvml-lib` (then failing to load it is an error).
    #[serde(skip)]
    pub explicit_lib: bool,
    /// Signs of an NVIDIA GPU even without NVML (a /dev/nvidia0, a runtime's device list).
    #[serde(skip)]
    pub evidence: Option<String>,
    pub selected_by: SelectorSource,
    pub visible: Vec<VisibleGpu>,
    /// Entries of the selecting variable that name no GPU NVML lists.
    pub unmatched: Vec<String>,
    /// Pairs among the visible GPUs, judged by the same rules as `check`.
    pub pairs: Vec<PairVerdict>,
    /// GPUs of this machine that every healthy choice leaves out (from all of NVML's pairs).
    pub avoid: Vec<u32>,
    /// NVML's GPUs not to avoid, for the fix.
    #[serde(skip)]
    pub healthy: Vec<u32>,
    /// The GPUs the pair judge blames (`gpu::blame`: failing with all their peers, or in the
    /// most failing pairs), with their reasons: the text says one line for each.
    #[serde(skip)]
    pub culprits: Vec<crate::model::Suspect>,
    /// `--p2p`: why the pair probe could not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_error: Option<String>,
}

impl GpuObs {
    /// GPUs not (yet) looked at: NVML not loaded, nothing visible, no pairs.
    pub fn unchecked(selected_by: SelectorSource, explicit_lib: bool) -> GpuObs {
        GpuObs {
            nvml: NvmlState::Disabled,
            explicit_lib,
            evidence: None,
            selected_by,
            visible: Vec::new(),
            unmatched: Vec::new(),
            pairs: Vec::new(),
            avoid: Vec::new(),
            healthy: Vec::new(),
            culprits: Vec::new(),
            probe_error: None,
        }
    }
}

/// Where the container runs, for the fix (CONTRACT.md: Kubernetes when
/// `KUBERNETES_SERVICE_HOST` is set, else Docker/other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunsIn {
    Kubernetes,
    Docker,
}

impl RunsIn {
    pub fn detect(kubernetes_service_host: Option<&str>) -> RunsIn {
        match kubernetes_service_host {
            Some(h) if !h.trim().is_empty() => RunsIn::Kubernetes,
            _ => RunsIn::Docker,
        }
    }
}

/// Effective available bytes: min(tmpfs free, memory headroom), either alone when the other is
/// unknown (an unlimited tmpfs, no memory limit).
pub fn effective_available(shm: &ShmObs, mem: &MemObs) -> Option<u64> {
    if shm.state != ShmState::Mounted && shm.state != ShmState::NotMounted {
        return None;
    }
    match (shm.free_bytes, mem.headroom_bytes) {
        (Some(free), Some(headroom)) => Some(free.min(headroom)),
        (free, headroom) => free.or(headroom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::preflight::{memory, mounted, no_gpus};
    use crate::preflight::need::NeedSpec;
    use crate::preflight::verdict::judge;
    use crate::units::{GIB, MIB};

    #[test]
    fn host_ipc_is_the_initial_namespace_or_the_hint() {
        assert_eq!(ipc_verdict(Some(4026531839), None).host, Some(true));
        assert_eq!(ipc_verdict(Some(4026532300), None).host, Some(false));
        assert_eq!(
            ipc_verdict(Some(4026532300), Some(4026532300)).host,
            Some(true)
        );
        assert_eq!(ipc_verdict(None, None).host, None);
        let r = judge(
            RunsIn::Docker,
            mounted(64 * MIB, 0),
            memory(None, 0),
            ipc_verdict(Some(INIT_IPC_NS_INODE), None),
            no_gpus(),
            NeedSpec::MinShm(GIB),
        );
        assert!(r.fix.unwrap().contains("host's IPC namespace"));
    }
}

//! `shmlink preflight`'s problems, as the workload's owner reads them: what its /dev/shm, its
//! memory limit and its GPUs are against what it needs. (The exact change to make is
//! `preflight::fix`, the layout `preflight::render`.)

use crate::model::PairReason;
use crate::units::human_bytes;

/// Nothing at `path`.
pub fn preflight_shm_absent(path: &str) -> String {
    format!("nothing at {path}: shm_open fails, and with it DataLoader workers and NCCL")
}

/// `path` could not be measured.
pub fn preflight_shm_unreadable(path: &str, error: Option<&str>) -> String {
    format!(
        "cannot measure {path}: {}",
        error.unwrap_or("unknown error")
    )
}

/// `path` is a directory of the root file system (`fs_type`), not a tmpfs mount.
pub fn preflight_shm_not_mounted(path: &str, fs_type: Option<&str>) -> String {
    format!(
        "{path} is a plain directory of the container's root file system, not a tmpfs: shared \
         memory there is written to {}",
        fs_type.unwrap_or("that file system")
    )
}

/// `path` is mounted, but not a tmpfs.
pub fn preflight_shm_not_tmpfs(path: &str, fs_type: Option<&str>) -> String {
    format!("{path} is {}, not tmpfs", fs_type.unwrap_or("?"))
}

/// Too little free in /dev/shm for `why` (the need, in words).
pub fn preflight_shm_too_small(
    path: &str,
    free: Option<u64>,
    size: Option<u64>,
    used: Option<u64>,
    why: &str,
    need: u64,
) -> String {
    format!(
        "{path} has {} free ({} size, {} used); {why} needs {}",
        human_bytes(free.unwrap_or(0)),
        size.map_or("no".into(), human_bytes),
        human_bytes(used.unwrap_or(0)),
        human_bytes(need),
    )
}

/// Too little memory cgroup headroom for the need, which tmpfs pages are charged to.
pub fn preflight_memory_too_small(
    headroom: Option<u64>,
    limit: Option<u64>,
    usage: Option<u64>,
    why: &str,
    need: u64,
    path: &str,
) -> String {
    format!(
        "the memory cgroup has {} of headroom (limit {}, {} in use) and tmpfs pages count \
         against it: {why} needs {} in {path}, so the OOM killer (or a bus error) comes first",
        human_bytes(headroom.unwrap_or(0)),
        limit.map_or("none".into(), human_bytes),
        usage.map_or("?".into(), human_bytes),
        human_bytes(need),
    )
}

/// Neither bound is visible.
pub fn preflight_unbounded_unknown(path: &str, need: u64) -> String {
    format!(
        "{path} has no size limit and no memory limit is visible: cannot tell whether {} fit",
        human_bytes(need)
    )
}

/// The memory cgroup is not visible (`note`: why).
pub fn preflight_memory_unknown(note: Option<&str>) -> String {
    format!(
        "the memory cgroup is not visible ({}): judged by the tmpfs alone",
        note.unwrap_or("no cgroup file system here")
    )
}

/// A tmpfs larger than the memory limit: only `fillable` of it can ever be filled.
pub fn preflight_memory_below_shm_size(path: &str, size: u64, limit: u64, fillable: u64) -> String {
    format!(
        "{path} is {} but the memory limit is {}: tmpfs pages count against the limit, so at \
         most {} of it can ever be filled",
        human_bytes(size),
        human_bytes(limit),
        human_bytes(fillable)
    )
}

/// NVML, named with --nvml-lib, did not load.
pub fn preflight_nvml_unavailable(reason: &str) -> String {
    format!("{reason}: cannot judge the GPUs")
}

/// Signs of a GPU, but NVML did not load.
pub fn preflight_gpu_health_unknown(evidence: &str, reason: &str) -> String {
    format!(
        "{}: GPU pairs not checked",
        super::nvml_not_loading(evidence, reason)
    )
}

/// The selecting variable `var` names GPUs NVML does not list; CUDA's variable stops there.
pub fn preflight_gpu_not_found(var: &str, unmatched: &[String], cuda: bool) -> String {
    format!(
        "{var} names {} that NVML does not list{}",
        unmatched.join(","),
        if cuda {
            " (CUDA ignores it and every entry after it)"
        } else {
            ""
        }
    )
}

/// A visible pair that is not ok, with its CUDA ordinals in this process.
pub fn preflight_gpu_pair(
    gpu: u32,
    peer: u32,
    cuda: (u32, u32),
    status: &str,
    reasons: &[PairReason],
) -> String {
    let reasons = if reasons.is_empty() {
        String::new()
    } else {
        format!(": {}", super::joined(reasons))
    };
    format!(
        "GPU {gpu} <-> GPU {peer} (cuda:{} <-> cuda:{} in this process) is {status}{reasons}",
        cuda.0, cuda.1
    )
}

/// `p2p_probe_unavailable`: `--p2p` asked for copies the probe could not make.
pub fn preflight_probe_unavailable(error: &str) -> String {
    format!(
        "--p2p: the GPU pair probe could not run ({error}), so the copies between the visible \
         GPUs are untested"
    )
}

/// `gpu_pair` for a GPU the pair judge blames (`gpu::blame`): one line for all its failing
/// pairs with the visible GPUs (`peers`, of `others` visible besides it), its first reasons,
/// and the GPUs to run on instead (`keep`, as `var` selects them).
pub struct Culprit<'a> {
    pub gpu: u32,
    pub cuda: u32,
    pub peers: &'a [u32],
    pub others: usize,
    pub status: &'a str,
    pub reasons: &'a [PairReason],
    pub var: &'a str,
    pub keep: &'a [u32],
}

pub fn preflight_gpu_culprit(c: &Culprit<'_>) -> String {
    let with = if c.peers.len() == c.others && c.others > 1 {
        format!("its pairs with all {} other visible GPUs are", c.others)
    } else if c.peers.len() == 1 {
        format!("its {} is", super::pairs_with(c.peers))
    } else {
        format!("its {} are", super::pairs_with(c.peers))
    };
    let reasons: Vec<&str> = c
        .reasons
        .iter()
        .take(2)
        .map(|r| crate::model::prefix_within(r.as_str(), 120))
        .collect();
    let why = if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join("; "))
    };
    let instead = if c.keep.is_empty() {
        "no other visible GPU is left: run on other GPUs".to_string()
    } else {
        let keep: Vec<String> = c.keep.iter().map(u32::to_string).collect();
        format!("{}={}", c.var, keep.join(","))
    };
    format!(
        "GPU {} (cuda:{} in this process): {with} {}{why}; avoid GPU {}: {instead}",
        c.gpu, c.cuda, c.status, c.gpu
    )
}

//! Every sentence a person reads about a condition, written once: `check` prints these as
//! findings, `serve` publishes them as Event notes and Node condition messages, `preflight`
//! reuses the parts it shares. The alert rules' annotations (deploy/prometheus) say the same in
//! their own templates; `tests` below keeps their /dev/shm fix in step with this one.
//!
//! - `shm.rs`: a container's /dev/shm; `gpu.rs`: GPUs, links, pairs, XIDs, NVML;
//! - `pairs.rs`: the reasons a GPU pair is not ok;
//! - `gpu_failures.rs`: GPU failures in the job's own words (CUDA, NCCL, RCCL);
//! - `failures.rs`: why a workload died; `ipc.rs`: what else failed its IPC (a /dev/shm not
//!   shared or missing, descriptors, CUDA IPC, IMEX, peer access, fallbacks);
//! - `conditions.rs`: the Node's conditions, reasons too;
//! - `preflight.rs`: preflight's problems; `blind.rs`: what a scan could not see, and NVML's
//!   state when it lists no GPU;
//! - `when.rs`: how long ago, for tables;
//! - here: the small pieces they share (lists of GPUs and links, rates, durations).

mod blind;
mod conditions;
mod device_taint;
mod failures;
mod gpu;
mod gpu_failures;
mod hang;
mod ipc;
mod pairs;
mod preflight;
mod probe;
mod shm;
mod when;

pub use blind::{blind, death_trace_off, no_findings_but_blind, no_gpus_because};
pub use conditions::{
    fault_gpu_lost, gpu_fault, gpu_health_unknown, no_gpu_fault, no_gpus, pairs_failing,
    pairs_healthy, ConditionReason, CONDITION_MESSAGE_MAX,
};
pub use device_taint::{
    no_slice_device, no_taint_api, taint_culprit, taint_description, taint_gpu_lost, taint_lifted,
    taint_made, taint_recovery_action, taint_xid,
};
pub use failures::{
    bus_error_unmeasured, gpu_job_crashed, named_from, nccl_p2p_disabled, older_deaths_elsewhere,
    reading_age, shm_allocation_failed, shm_bus_error, shm_oom_killed, told_by_workload,
    workload_bus_error, workload_oom_killed, JobGpus, FOUND_LATE, UNKNOWN_PROCESS,
};
pub use gpu::{
    all_pairs_fail, driver_lists_gpus, fault_recovery_action, fault_xid, gpu_describe,
    gpu_fabric_unhealthy, gpu_fails_with_all, gpu_iommu_fault, gpu_links_recovered, gpu_lost,
    gpu_not_in_nvml, gpu_nvlink_training_failed, gpu_nvswitch_fatal, gpu_pcie_degraded,
    gpu_pcie_errors, gpu_recovery_action, link_errors, nvml_load_failed, nvml_not_loading,
    nvml_unavailable, pair_fails, pcie_acs_enabled, reason_acs, xid, xid_advice,
    DEV_NVIDIA0_EXISTS,
};
pub use gpu_failures::{
    cuda_ipc_invalid_device, gpu_ecc_uncorrectable, gpu_fabric_not_ready, gpu_failure,
    gpu_nvlink_error, gpu_p2p_failed, gpu_peer_mapping_failed, gpu_too_many_peers, in_gpu_words,
    iommu_not_passthrough, nccl_p2p_check_failed, nccl_ranks_dead, nvls_multicast_failed,
    GpuEvidence,
};
pub use hang::{gpu_collective_timeout, span};
pub use ipc::{
    cuda_ipc_denied, fd_limit_reached, gpu_peer_access_refused, imex_channel_missing, shm_fallback,
    shm_not_shared, shm_unavailable,
};
pub use pairs::{
    fabric_problem, growth, growth_at_rate, link_growth, p2p_failing, reason_ber,
    reason_counter_growth, reason_crc_rate, reason_fabric, reason_gpu_lost, reason_link_inactive,
    reason_nvlink5_count, reason_nvlink5_rate, reason_p2p_lost, reason_p2p_nvlink_unlike_peers,
    reason_p2p_unlike_peers, reason_recovery_drains_p2p, reason_switch_links_down,
    reason_switch_links_some_down, some_reasons,
};
pub use preflight::{
    preflight_gpu_culprit, preflight_gpu_health_unknown, preflight_gpu_not_found,
    preflight_gpu_pair, preflight_memory_below_shm_size, preflight_memory_too_small,
    preflight_memory_unknown, preflight_nvml_unavailable, preflight_probe_unavailable,
    preflight_shm_absent, preflight_shm_not_mounted, preflight_shm_not_tmpfs,
    preflight_shm_too_small, preflight_shm_unreadable, preflight_unbounded_unknown,
    Culprit as PreflightCulprit,
};
pub use probe::{
    probe_copy_error, probe_corrupted, probe_crashed, probe_hung, probe_peer_refused, probe_slow,
    probe_slow_among_like, probe_table, reason_probe,
};
pub use shm::{
    shm_evicted, shm_full, shm_leftovers, shm_runtime_default, shm_unmeasured, SHM_FIX_KUBERNETES,
};
pub use when::{ago, parse_rfc3339, RECENT};

use std::time::Duration;

use crate::model::PairStatus;

/// Where a failed container runs, for the fix its text gives: a Pod's spec (it has a Pod, by
/// name or only by its UID), Docker's flags (Docker runs it), or words any runtime takes (a
/// bare runc or containerd container).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Pod,
    Docker,
    Other,
}

/// `down` / `degraded`: a failing pair's state as a person says it.
/// A line a workload printed, without the full stop it may end with: it is quoted into a
/// sentence that ends with its own.
pub fn said(line: &str) -> &str {
    line.trim_end().trim_end_matches('.').trim_end()
}

pub fn pair_status(status: PairStatus) -> &'static str {
    match status {
        PairStatus::Down => "down",
        PairStatus::Degraded => "degraded",
        PairStatus::Ok => "ok",
    }
}

/// `pairs with GPUs 0-6` / `pair with GPU 3`.
pub fn pairs_with(peers: &[u32]) -> String {
    match peers {
        [one] => format!("pair with GPU {one}"),
        _ => format!("pairs with GPUs {}", ranges(peers)),
    }
}

/// A pair's reasons as one clause, `; ` between them.
pub fn joined(reasons: &[crate::model::PairReason]) -> String {
    let words: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
    words.join("; ")
}

/// `link 3` / `links 0, 2, 5-17`.
pub fn link_list(links: &[u32]) -> String {
    let mut sorted = links.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    match sorted.as_slice() {
        [one] => format!("link {one}"),
        _ => format!("links {}", ranges(&sorted)),
    }
}

/// Sorted, deduplicated numbers with runs of three or more as `a-b`.
pub fn ranges(numbers: &[u32]) -> String {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while let Some(&next) = iter.peek() {
            if end.checked_add(1) == Some(next) {
                end = next;
                iter.next();
            } else {
                break;
            }
        }
        match end - start {
            0 => parts.push(start.to_string()),
            1 => parts.push(format!("{start}, {end}")),
            _ => parts.push(format!("{start}-{end}")),
        }
    }
    parts.join(", ")
}

/// `a`, `a and b`, `a, b and c`: items as a sentence lists them; empty for none.
pub fn and_list<T: AsRef<str>>(items: &[T]) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.as_ref().to_string(),
        Some((last, rest)) => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} and {}", rest.join(", "), last.as_ref())
        }
    }
}

/// `250`, `1`, `0.4`: a rate per second, whole above 10.
pub fn rate(per_sec: f64) -> String {
    if per_sec >= 10.0 || per_sec.fract() == 0.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.1}")
    }
}

/// `60`, `0.5`: a duration in seconds as a person writes it.
pub fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_format_as_a_person_writes() {
        assert_eq!(link_list(&[3]), "link 3");
        assert_eq!(and_list::<&str>(&[]), "");
        assert_eq!(and_list(&["GPU 2"]), "GPU 2");
        assert_eq!(and_list(&["2", "4", "7"]), "2, 4 and 7");
        assert_eq!(link_list(&[5, 0, 1, 2, 7, 8, 2]), "links 0-2, 5, 7, 8");
        assert_eq!(
            ranges(&[u32::MAX - 1, u32::MAX]),
            format!("{}, {}", u32::MAX - 1, u32::MAX)
        );
        assert_eq!(ranges(&[]), "");
        assert_eq!(secs(Duration::from_secs(60)), "60");
        assert_eq!(rate(250.4), "250");
        assert_eq!(rate(1.0), "1");
        assert_eq!(rate(0.4), "0.4");
        assert_eq!(secs(Duration::from_millis(500)), "0.5");
        assert_eq!(pairs_with(&[3]), "pair with GPU 3");
    }

    /// The alert that pages for a full /dev/shm gives the fix in the same words as `check`.
    #[test]
    fn the_alert_rules_give_the_same_shm_fix() {
        let rules = include_str!("../../deploy/prometheus/shmlink.rules.yml");
        assert!(
            rules.contains(SHM_FIX_KUBERNETES),
            "deploy/prometheus/shmlink.rules.yml no longer says {SHM_FIX_KUBERNETES:?}"
        );
    }
}

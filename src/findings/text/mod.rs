//! Every sentence a person reads about a condition, written once: `check` prints these as
//! findings, `serve` publishes them as Event notes and Node condition messages, `preflight`
//! reuses the parts it shares. The alert rules' annotations (deploy/prometheus) say the same in
//! their own templates; `tests` below keeps their /dev/shm fix in step with this one.
//!
//! - `shm.rs`: a container's /dev/shm; `gpu.rs`: GPUs, links, pairs, XIDs, NVML;
//! - `pairs.rs`: the reasons a GPU pair is not ok;
//! - `failures.rs`: why a workload died; `ipc.rs`: what else failed its IPC (a /dev/shm not
//!   shared or missing, descriptors, CUDA IPC, IMEX, peer access, fallbacks);
//! - `conditions.rs`: the Node's conditions, reasons too;
//! - `preflight.rs`: preflight's problems;
//! - here: the small pieces they share (lists of GPUs and links, rates, durations).

mod conditions;
mod failures;
mod gpu;
mod ipc;
mod pairs;
mod preflight;
mod probe;
mod shm;

pub use conditions::*;
pub use failures::*;
pub use gpu::*;
pub use ipc::*;
pub use pairs::*;
pub use preflight::*;
pub use probe::*;
pub use shm::*;

use std::time::Duration;

use crate::model::PairStatus;

/// `down` / `degraded`: a failing pair's state as a person says it.
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
        let rules = include_str!("../../../deploy/prometheus/shmlink.rules.yml");
        assert!(
            rules.contains(SHM_FIX_KUBERNETES),
            "deploy/prometheus/shmlink.rules.yml no longer says {SHM_FIX_KUBERNETES:?}"
        );
    }
}

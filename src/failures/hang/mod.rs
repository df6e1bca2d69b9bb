//! A collective that hung until a watchdog ended the job (`gpu_collective_timeout`): the line's
//! facts (`parse.rs`), and what the links of the job's GPUs did over the hang's window, from the
//! start of the collective to the timeout (`window.rs`). Both pure; `correlate` asks [`judged`]
//! once per hang, with the GPUs it placed the job on.

pub mod parse;
mod window;

use std::time::SystemTime;

use crate::model::{Hang, HangFacts, Snapshot, Stamp};

/// The hang told at `at` by `facts`, on `gpus` (NVML indices), judged by the ledger the
/// snapshot carries.
pub fn judged(
    facts: &HangFacts,
    at: SystemTime,
    gpus: &[u32],
    snapshot: Option<&Snapshot>,
) -> Hang {
    let window = facts.window(at);
    let asked = window::Asked {
        gpus,
        ledger: snapshot.map(|s| s.job_links.as_ref()),
    };
    Hang {
        said_by: facts.said_by,
        op: facts.op.clone(),
        seq: facts.seq,
        rank: facts.rank,
        process_group: facts.process_group.clone(),
        timeout_ms: facts.timeout_ms,
        ran_for_ms: facts.ran_for_ms,
        started: window.map(|(s, _)| Stamp(s)),
        timed_out: Stamp(at),
        links: window::links_over(window, &asked),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::parse;
    use crate::failures::correlate::{correlate, Known};
    use crate::kube::podresources::GpuHolders;
    use crate::model::{
        ContainerRef, DeathRules, Detected, Failure, FailureSource, FindingKind, HangVerdict,
        JobLinks, LinkErrors, LinkReading, Peer,
    };

    const LINE: &str = "[rank3]:[E1124 10:10:00.000000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG \
                        GUID 0(default_pg) Rank 3] Watchdog caught collective operation timeout: \
                        WorkNCCL(SeqNum=4812, OpType=ALLREDUCE, NumelIn=25165824, \
                        NumelOut=25165824, Timeout(ms)=600000) ran for 600000 milliseconds \
                        before timing out.";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_000_000 + secs)
    }

    /// An 8-GPU NVSwitch board as the ledger sees it at `t`: 18 links per GPU; GPU 7's link 3
    /// down from `down_at` on.
    fn board(t: u64, down_at: Option<u64>) -> crate::model::Snapshot {
        let mut s = crate::fixtures::gpu_board(8);
        for g in &mut s.gpus {
            g.links = (0..18)
                .map(|l| LinkReading {
                    link: l,
                    active: !(g.index == 7 && l == 3 && down_at.is_some_and(|d| t >= d)),
                    peer: Peer::Switch,
                    errors: Some(LinkErrors::default()),
                    nvlink5: None,
                })
                .collect();
        }
        s
    }

    /// The hang's failure on GPUs 5 and 7 after serve scanned every 5 s from `first` to 620 s.
    fn told(first: u64, down_at: Option<u64>) -> Failure {
        let mut ledger = JobLinks::default();
        let mut s = board(0, None);
        for t in (first..=620).step_by(5) {
            s = board(t, down_at);
            ledger.feed_judged(&s.gpus, &s.gpu_pairs, &HashSet::new(), at(t), true);
        }
        s.job_links = Arc::new(ledger);
        s.gpu_users.seen(
            4242,
            Some(1),
            Some("python3"),
            BTreeSet::from([5, 7]),
            at(0),
            || Some(ContainerRef::by_id("c0ffee", None)),
        );
        let who = ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("llama-0".into()),
            pod_uid: Some("u-1".into()),
            container: Some("trainer".into()),
            container_id: Some("c0ffee".into()),
        };
        let mut d = Detected::new(
            who,
            FindingKind::GpuCollectiveTimeout,
            at(610),
            FailureSource::Log,
            LINE,
        );
        d.hang = parse::facts(parse::TORCH_WATCHDOG, LINE);
        let known = Known {
            snapshot: Some(&s),
            pods: None,
            holders: &GpuHolders::new(),
            rules: DeathRules::default(),
            recent: None,
        };
        correlate(&d, known).expect("told")
    }

    #[test]
    fn a_hang_whose_gpu_lost_a_link_in_its_window_names_that_gpu() {
        let f = told(0, Some(550));
        let h = f.hang.as_ref().unwrap();
        assert_eq!(
            (h.links.verdict, h.links.gpus.as_slice()),
            (HangVerdict::Culprit, &[7][..])
        );
        assert_eq!(
            h.started.map(|s| s.to_string()).as_deref(),
            Some("2026-11-18T11:06:50Z")
        );
        println!("{}", f.message);
        for part in [
            "PyTorch's NCCL watchdog ended ml/llama-0/trainer at 2026-11-18T11:16:50Z: ALLREDUCE \
             (SeqNum 4812, rank 3, process group 0 (default_pg)) ran for 10 min, past its \
             timeout of 10 min; its container was using GPUs 5 and 7.",
            "GPU 7's links went down 9 min into the hang (GPU 7 link 3 to an NVSwitch at 11:15:50 \
             UTC): the culprit, the hardware and not the job. Fix: drain the node, reset GPU 7 \
             (`nvidia-smi -r -i 7`)",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        assert_eq!(
            f.named_from.as_deref(),
            Some(
                "PyTorch's NCCL watchdog: ALLREDUCE SeqNum=4812 on rank 3 (process group 0 \
                 (default_pg)) ran for 600000 ms, Timeout(ms)=600000"
            )
        );
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["hang"]["links"]["verdict"], "culprit");
        assert_eq!(json["hang"]["links"]["events"][0]["went"], "down");
        assert_eq!(json["hang"]["op"], "ALLREDUCE");
        let back: Failure = serde_json::from_value(json).unwrap();
        assert_eq!(back, f, "the store keeps it whole");
    }

    #[test]
    fn a_hang_over_clean_links_points_at_the_ranks() {
        let f = told(0, None);
        println!("{}", f.message);
        assert!(
            f.message.contains(
                "Every link of its GPUs (36 NVLinks) was clean over the hang's window (11:06:50 \
                 to 11:16:50 UTC): no drop, no error, no pair verdict change. Look at the ranks: \
                 a CPU-side stall, a data-loader wait"
            ),
            "{}",
            f.message
        );
        assert!(!f.message.contains("culprit"), "{}", f.message);
    }

    #[test]
    fn a_hang_the_agent_did_not_watch_is_said_so_never_clean() {
        let f = told(300, None);
        println!("{}", f.message);
        assert!(
            f.message.contains(
                "The agent watched the hang's window (11:06:50 to 11:16:50 UTC) only from \
                 11:11:40 UTC to 11:16:50 UTC (the agent started after the collective began): \
                 nothing moved then, but the rest was not seen, so its links are not known clean."
            ),
            "{}",
            f.message
        );
        assert!(!f.message.contains("was clean"), "{}", f.message);
        assert_eq!(f.hang.unwrap().links.verdict, HangVerdict::Unknown);
    }
}

//! Pure: a failure's `gpu_links`, what the links of the job's GPUs did between its baseline and
//! its end, from the ledger the snapshot carries (`model::JobLinks`, fed by `links::ledger` after serve's scans).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::{GpuLinkDelta, GpuLinks, JobLinks, LinkTrend, Snapshot};

use crate::model::rfc3339;

/// None when the container or its GPUs are not known, or the ledger has no baseline for it
/// (check without serve's checkpoint; a container gone before serve saw it).
pub fn gpu_links(
    container_id: Option<&str>,
    gpus: &[u32],
    snapshot: Option<&Snapshot>,
) -> Option<GpuLinks> {
    if gpus.is_empty() {
        return None;
    }
    let d = snapshot?.job_links.deltas(container_id?, gpus)?;
    Some(GpuLinks {
        since: rfc3339(d.since),
        since_start: d.since_start,
        until: rfc3339(d.until),
        watched: d.watched,
        unread: d.unread,
        changed: d.changed.iter().map(GpuLinkDelta::from).collect(),
    })
}

/// What the message says of the links after its own words: what they did while the job ran
/// (not for a hang, whose message says its window's instead: the whole run's is JSON only), and
/// a link of its GPUs wearing out.
pub fn said(
    links: Option<&GpuLinks>,
    hang: bool,
    gpus: &[u32],
    snapshot: Option<&Snapshot>,
) -> String {
    let mut out = links
        .filter(|_| !hang)
        .map(crate::links::job_words::job_links)
        .unwrap_or_default();
    out.push_str(&super::trend::words::wearing_links_of_job(&wearing(
        gpus, snapshot,
    )));
    out
}

/// The steadily growing link counters (`links::trend`) of the job's `gpus`, as the last scan
/// judged them.
pub fn wearing<'a>(gpus: &[u32], snapshot: Option<&'a Snapshot>) -> Vec<&'a LinkTrend> {
    snapshot
        .map(|s| s.link_trends.iter())
        .into_iter()
        .flatten()
        .filter(|t| t.growing.is_some() && gpus.contains(&t.gpu))
        .collect()
}

/// The containers a scan saw running: those it measured and those NVML listed on a GPU.
pub fn running(snapshot: &Snapshot) -> HashSet<String> {
    let mut out: HashSet<String> = snapshot
        .shm
        .iter()
        .map(|r| r.container_id.clone())
        .collect();
    out.extend(
        snapshot
            .gpu_users
            .containers_now()
            .into_iter()
            .filter_map(|(c, _)| c.container_id.clone()),
    );
    out
}

/// Feeds `ledger` the scan's GPU sample and hands the snapshot a copy (`baselines`: serve).
pub fn feed(ledger: &mut JobLinks, snapshot: &mut Snapshot, now: SystemTime, baselines: bool) {
    let running = running(snapshot);
    ledger.feed_judged(
        &snapshot.gpus,
        &snapshot.gpu_pairs,
        &running,
        now,
        baselines,
    );
    snapshot.job_links = Arc::new(ledger.clone());
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::failures::correlate::{correlate, Known};
    use crate::kube::podresources::GpuHolders;
    use crate::model::{
        ContainerRef, DeathRules, Detected, FailureSource, FindingKind, LinkErrors, LinkReading,
        Peer,
    };

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_000_000 + secs)
    }

    /// Two GPUs of 2 links each; GPU 1's link 1 (to GPU 0) with `recovery` and `active`.
    fn board(recovery: u64, active: bool) -> Snapshot {
        let mut s = crate::fixtures::gpu_board(2);
        for g in &mut s.gpus {
            g.links = (0..2)
                .map(|l| LinkReading {
                    link: l,
                    active: !(g.index == 1 && l == 1) || active,
                    peer: Peer::Gpu(1 - g.index),
                    errors: Some(LinkErrors {
                        recovery: if g.index == 1 && l == 1 { recovery } else { 0 },
                        ..LinkErrors::default()
                    }),
                    nvlink5: None,
                })
                .collect();
        }
        s.gpu_users.seen(
            4242,
            Some(1),
            Some("python3"),
            BTreeSet::from([0, 1]),
            at(0),
            || Some(ContainerRef::by_id("aaaa", None)),
        );
        s
    }

    fn crashed(s: &Snapshot) -> crate::model::Failure {
        let mut d = Detected::new(
            ContainerRef {
                pod_uid: None,
                container_id: Some("aaaa".into()),
                ..ContainerRef::default()
            },
            FindingKind::GpuJobCrashed,
            at(30),
            FailureSource::Kernel,
            "python3[4242]: segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2",
        );
        d.library = Some("libnccl.so.2".into());
        let known = Known {
            snapshot: Some(s),
            pods: None,
            holders: &GpuHolders::new(),
            rules: DeathRules::default(),
            recent: None,
        };
        correlate(&d, known).expect("told")
    }

    #[test]
    fn a_crashed_jobs_failure_carries_its_links_deltas_and_says_them() {
        let mut ledger = JobLinks::default();
        let mut s = board(5, true);
        feed(&mut ledger, &mut s, at(0), true);
        let mut s = board(5, false);
        feed(&mut ledger, &mut s, at(10), true);
        let mut s = board(7, true);
        feed(&mut ledger, &mut s, at(20), true);
        let f = crashed(&s);
        let links = f.gpu_links.clone().expect("a baseline");
        assert_eq!(
            (links.watched, links.unread, links.since_start),
            (4, 0, false)
        );
        assert_eq!(links.since, "2026-11-18T11:06:40Z");
        assert_eq!(links.changed.len(), 1);
        let c = &links.changed[0];
        assert_eq!((c.gpu, c.link, c.peer.as_str()), (1, 1, "gpu:0"));
        assert_eq!(
            (c.recovery, c.replay, c.went_down, c.came_up),
            (Some(2), Some(0), 1, 1)
        );
        assert!(
            f.message.ends_with(
                " Its GPUs' 4 NVLinks while it ran (since 11:06:40 UTC, when the agent first \
                 saw it, to 11:07:00 UTC): GPU 1 link 1 (to GPU 0) recovery +2, down 1x, up 1x; \
                 the rest clean."
            ),
            "{}",
            f.message
        );
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["gpu_links"]["changed"][0]["recovery"], 2);
        assert!(
            json["gpu_links"]["changed"][0].get("symbol").is_none(),
            "no NVLink5 here"
        );
    }

    #[test]
    fn without_a_baseline_gpu_links_is_null_and_nothing_is_said() {
        let s = board(0, true);
        let f = crashed(&s);
        assert_eq!(f.gpu_links, None);
        assert!(!f.message.contains("NVLink"), "{}", f.message);
        assert!(serde_json::to_value(&f).unwrap()["gpu_links"].is_null());
    }

    #[test]
    fn a_failure_on_a_gpu_whose_link_wears_out_says_so() {
        let mut s = board(0, true);
        let trend = |gpu, growing| crate::model::LinkTrend {
            gpu,
            uuid: format!("GPU-{gpu}"),
            link: 1,
            peer: Peer::Gpu(0),
            counter: crate::model::LinkCounter::Recovery,
            per_hour: 0.1,
            growing,
        };
        let steady = crate::model::SteadyGrowth {
            since: at(0) - Duration::from_secs(5 * 86_400),
            growth: 12,
            days: 5,
            per_day: 2.4,
        };
        // GPU 1's link wears out; a rate without steady growth is not told.
        s.link_trends = vec![trend(1, Some(steady)), trend(0, None)];
        let f = crashed(&s);
        assert!(
            f.message.ends_with(
                " A link of its GPUs has been wearing out for days (GPU 1 NVLink 1 recovery +2.4 \
                 a day since 2026-11-13T11:06:40Z): a hardware ticket, whatever killed this run."
            ),
            "{}",
            f.message
        );
        // Not its GPU: nothing said.
        s.link_trends = vec![trend(5, Some(steady))];
        assert!(!crashed(&s).message.contains("wearing"));
    }
}

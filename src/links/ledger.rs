//! Pure: what each NVLink did while a container ran. A ledger fed each scan's GPU sample keeps,
//! per (GPU UUID, link), cumulative counts that survive counter resets (only increases add) and
//! how often the link went down and came up; per container, the ledger as it was just before
//! the container was first seen (its baseline) and, once it is gone, as it was at the last scan
//! that saw it (its end). A failure's deltas are end minus baseline.
//!
//! A ledger's totals are one table behind an `Arc`, replaced (copy on write) only when a sample
//! changes it: every container first seen in one scan shares one table, so memory grows with
//! the scans in which counters moved and containers came, not with containers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::history::SavedHistory;
use crate::model::{
    from_unix_ms, unix_ms, GpuLinkDelta, GpuReading, JobLinks, LinkCounts, LinkHistory, LinkLast,
    LinkTable, LinkTotal, PairVerdict, Watch,
};

/// The state store's checkpoint key of serve's ledger (`check` reads it too).
pub const JOB_LINKS_KEY: &str = "job_links";
/// How often the ledger's checkpoint is written at most when only counts moved (a new or gone
/// container is written at once): a restart counts on from the raw values saved with the
/// totals, so a late save loses nothing but drops and returns in between.
pub const JOB_LINKS_SAVE_EVERY: Duration = Duration::from_secs(60);
/// How long a gone container's baseline and end are kept: its failures are told within
/// seconds, `check --since` reads back further.
pub const JOB_LINKS_KEEP_GONE: Duration = Duration::from_secs(3600);
/// Containers kept at most (the longest gone go first; running ones are never dropped for it).
pub const JOB_LINKS_CONTAINERS: usize = 1024;

/// One link of a job's GPUs that did something while the job ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkChange {
    pub gpu: u32,
    pub link: u32,
    pub peer: String,
    pub delta: LinkCounts,
    pub dl: bool,
    pub nvlink5: bool,
}

/// What the links of a job's GPUs did between its baseline and its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDeltas {
    pub since: SystemTime,
    pub since_start: bool,
    pub until: SystemTime,
    /// Links of its GPUs whose counters were read at the end.
    pub watched: u32,
    /// Links of its GPUs whose counters were not read at the end (NVML did not answer).
    pub unread: u32,
    pub changed: Vec<LinkChange>,
}

/// The increase of each counter since `before`; a counter lower than before was reset and
/// counts from 0.
fn increase(now: [u64; 5], before: Option<[u64; 5]>) -> [u64; 5] {
    let Some(before) = before else {
        return [0; 5];
    };
    std::array::from_fn(|i| {
        if now[i] >= before[i] {
            now[i] - before[i]
        } else {
            now[i]
        }
    })
}

impl JobLinks {
    /// One scan's sample, without pair verdicts ([`JobLinks::feed_judged`]).
    pub fn feed(
        &mut self,
        gpus: &[GpuReading],
        running: &HashSet<String>,
        now: SystemTime,
        baselines: bool,
    ) {
        self.feed_judged(gpus, &[], running, now, baselines);
    }

    /// One scan's sample: its GPUs and pair verdicts. `running`: the containers it saw;
    /// `baselines`: whether containers new to the ledger get one (serve; `check` has one sample
    /// and no history).
    pub fn feed_judged(
        &mut self,
        gpus: &[GpuReading],
        pairs: &[PairVerdict],
        running: &HashSet<String>,
        now: SystemTime,
        baselines: bool,
    ) {
        let before = Arc::clone(&self.totals);
        let before_at = self.sampled_at;
        self.add_sample(gpus);
        let new_run = !self.fed_here;
        (self.history).scan(now, (gpus, pairs), (&self.totals, &self.last), new_run);
        for (id, w) in &mut self.containers {
            if running.contains(id) {
                // Back (a scan missed it): it runs on from the same baseline.
                w.end = None;
                w.gone_at = None;
            } else if w.gone_at.is_none() {
                w.end = Some((before_at.unwrap_or(now), Arc::clone(&before)));
                w.gone_at = Some(now);
            }
        }
        if baselines {
            let (baseline, since, since_start) = match (self.fed_here, before_at) {
                (true, Some(at)) => (before, at, true),
                _ => (Arc::clone(&self.totals), now, false),
            };
            for id in running {
                self.containers.entry(id.clone()).or_insert_with(|| Watch {
                    since,
                    since_start,
                    baseline: Arc::clone(&baseline),
                    end: None,
                    gone_at: None,
                });
            }
        }
        self.sampled_at = Some(now);
        self.fed_here = true;
        self.prune(now);
    }

    /// Adds the sample's increases to the totals (a new table only when something changed).
    fn add_sample(&mut self, gpus: &[GpuReading]) {
        let mut next: LinkTable = (*self.totals).clone();
        for t in next.values_mut() {
            t.read = false;
        }
        for g in gpus.iter().filter(|g| !g.uuid.is_empty() && !g.lost) {
            for r in &g.links {
                let key = (g.uuid.clone(), r.link);
                let (dl, n5) = (r.errors.map(|e| e.values()), r.nvlink5.map(|n| n.counts()));
                let last = self.last.get(&key);
                let t = next.entry(key.clone()).or_default();
                let c = &mut t.counts;
                if let Some(now) = dl {
                    let [a, b, d, e, f] = increase(now, last.and_then(|l| l.dl));
                    c.replay += a;
                    c.recovery += b;
                    c.crc_flit += d;
                    c.crc_data += e;
                    c.ecc_data += f;
                }
                if let Some(now) = n5 {
                    let [a, b, d, e, f] = increase(now, last.and_then(|l| l.nvlink5));
                    c.recovery_successful += a;
                    c.recovery_failed += b;
                    c.recovery_events += d;
                    c.symbol += e;
                    c.effective += f;
                }
                match last.map(|l| l.active) {
                    Some(true) if !r.active => c.went_down += 1,
                    Some(false) if r.active => c.came_up += 1,
                    _ => {}
                }
                t.dl |= dl.is_some();
                t.nvlink5 |= n5.is_some();
                t.read = dl.is_some() || n5.is_some();
                // Counters NVML did not answer this time keep their last values to count from.
                let prev = last.cloned();
                self.last.insert(
                    key,
                    LinkLast {
                        gpu: g.index,
                        peer: r.peer.to_string(),
                        active: r.active,
                        dl: dl.or(prev.as_ref().and_then(|p| p.dl)),
                        nvlink5: n5.or(prev.as_ref().and_then(|p| p.nvlink5)),
                    },
                );
            }
        }
        if next != *self.totals {
            self.totals = Arc::new(next);
        }
    }

    /// Forgets containers gone longer than [`JOB_LINKS_KEEP_GONE`], and the longest gone past
    /// [`JOB_LINKS_CONTAINERS`].
    fn prune(&mut self, now: SystemTime) {
        self.containers.retain(|_, w| {
            w.gone_at
                .is_none_or(|g| now.duration_since(g).unwrap_or_default() <= JOB_LINKS_KEEP_GONE)
        });
        if self.containers.len() > JOB_LINKS_CONTAINERS {
            let mut gone: Vec<(SystemTime, String)> = self
                .containers
                .iter()
                .filter_map(|(id, w)| Some((w.gone_at?, id.clone())))
                .collect();
            gone.sort_unstable();
            let extra = self.containers.len() - JOB_LINKS_CONTAINERS;
            for (_, id) in gone.into_iter().take(extra) {
                self.containers.remove(&id);
            }
        }
    }

    /// What the links of `gpus` (NVML indices now) did while container `container_id` ran;
    /// None without a baseline for it.
    pub fn deltas(&self, container_id: &str, gpus: &[u32]) -> Option<LinkDeltas> {
        let w = self.containers.get(container_id)?;
        let (until, end) = match &w.end {
            Some((at, table)) => (*at, table),
            None => (self.sampled_at?, &self.totals),
        };
        let mut out = LinkDeltas {
            since: w.since,
            since_start: w.since_start,
            until,
            watched: 0,
            unread: 0,
            changed: Vec::new(),
        };
        let of_job = self.last.iter().filter(|(_, l)| gpus.contains(&l.gpu));
        for ((uuid, link), last) in of_job {
            let key = (uuid.clone(), *link);
            let Some(t) = end.get(&key).filter(|t| t.read) else {
                out.unread += 1;
                continue;
            };
            out.watched += 1;
            let base = w.baseline.get(&key).map(|b| b.counts).unwrap_or_default();
            let delta = t.counts.since(&base);
            if !delta.is_zero() {
                out.changed.push(LinkChange {
                    gpu: last.gpu,
                    link: *link,
                    peer: last.peer.clone(),
                    delta,
                    dl: t.dl,
                    nvlink5: t.nvlink5,
                });
            }
        }
        out.changed.sort_by_key(|c| (c.gpu, c.link));
        Some(out)
    }

    /// Distinct tables held (the live totals, baselines and ends), for the memory figure.
    pub fn tables(&self) -> usize {
        let mut seen: Vec<*const LinkTable> = vec![Arc::as_ptr(&self.totals)];
        let held = self
            .containers
            .values()
            .flat_map(|w| std::iter::once(&w.baseline).chain(w.end.as_ref().map(|(_, t)| t)));
        for t in held {
            if !seen.contains(&Arc::as_ptr(t)) {
                seen.push(Arc::as_ptr(t));
            }
        }
        seen.len()
    }
}

/// The ledger as a checkpoint stores it: each table once, the containers naming them.
#[derive(Debug, Serialize, Deserialize)]
pub struct SavedJobLinks {
    pub sampled_ms: Option<i64>,
    pub last: Vec<SavedLast>,
    pub tables: Vec<Vec<SavedTotal>>,
    /// Which of `tables` the live totals are.
    pub totals: usize,
    pub containers: Vec<SavedWatch>,
    /// The links and pairs over time (absent in a checkpoint from before it was kept).
    #[serde(default)]
    pub history: SavedHistory,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedLast {
    pub uuid: String,
    pub link: u32,
    #[serde(flatten)]
    pub last: LinkLast,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedTotal {
    pub uuid: String,
    pub link: u32,
    #[serde(flatten)]
    pub total: LinkTotal,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedWatch {
    pub id: String,
    pub since_ms: i64,
    pub since_start: bool,
    pub baseline: usize,
    pub end: Option<(i64, usize)>,
    pub gone_ms: Option<i64>,
}

impl JobLinks {
    pub fn save(&self) -> SavedJobLinks {
        let mut tables: Vec<Arc<LinkTable>> = Vec::new();
        let mut index = |t: &Arc<LinkTable>| -> usize {
            if let Some(i) = tables.iter().position(|s| Arc::ptr_eq(s, t)) {
                return i;
            }
            tables.push(Arc::clone(t));
            tables.len() - 1
        };
        let totals = index(&self.totals);
        let mut containers: Vec<SavedWatch> = Vec::new();
        for (id, w) in &self.containers {
            containers.push(SavedWatch {
                id: id.clone(),
                since_ms: unix_ms(w.since),
                since_start: w.since_start,
                baseline: index(&w.baseline),
                end: w.end.as_ref().map(|(at, t)| (unix_ms(*at), index(t))),
                gone_ms: w.gone_at.map(unix_ms),
            });
        }
        containers.sort_by(|a, b| a.id.cmp(&b.id));
        let table = |t: &LinkTable| {
            t.iter()
                .map(|((uuid, link), total)| SavedTotal {
                    uuid: uuid.clone(),
                    link: *link,
                    total: *total,
                })
                .collect()
        };
        SavedJobLinks {
            sampled_ms: self.sampled_at.map(unix_ms),
            last: self
                .last
                .iter()
                .map(|((uuid, link), last)| SavedLast {
                    uuid: uuid.clone(),
                    link: *link,
                    last: last.clone(),
                })
                .collect(),
            tables: tables.iter().map(|t| table(t)).collect(),
            totals,
            containers,
            history: self.history.save(),
        }
    }

    /// The ledger a checkpoint saved (not fed in this process); None if it does not hold
    /// together (a table index out of range).
    pub fn restore(saved: SavedJobLinks) -> Option<JobLinks> {
        let tables: Vec<Arc<LinkTable>> = saved
            .tables
            .into_iter()
            .map(|t| Arc::new(t.into_iter().map(|s| ((s.uuid, s.link), s.total)).collect()))
            .collect();
        let mut containers = HashMap::new();
        for c in saved.containers {
            let end = match c.end {
                Some((at, i)) => Some((from_unix_ms(at), Arc::clone(tables.get(i)?))),
                None => None,
            };
            containers.insert(
                c.id,
                Watch {
                    since: from_unix_ms(c.since_ms),
                    since_start: c.since_start,
                    baseline: Arc::clone(tables.get(c.baseline)?),
                    end,
                    gone_at: c.gone_ms.map(from_unix_ms),
                },
            );
        }
        Some(JobLinks {
            totals: Arc::clone(tables.get(saved.totals)?),
            last: saved
                .last
                .into_iter()
                .map(|s| ((s.uuid, s.link), s.last))
                .collect(),
            sampled_at: saved.sampled_ms.map(from_unix_ms),
            fed_here: false,
            containers,
            history: LinkHistory::restore(saved.history),
        })
    }
}

impl From<&LinkChange> for GpuLinkDelta {
    fn from(c: &LinkChange) -> GpuLinkDelta {
        let d = &c.delta;
        let dl = |v: u64| c.dl.then_some(v);
        let n5 = |v: u64| c.nvlink5.then_some(v);
        GpuLinkDelta {
            gpu: c.gpu,
            link: c.link,
            peer: c.peer.clone(),
            replay: dl(d.replay),
            recovery: dl(d.recovery),
            crc_flit: dl(d.crc_flit),
            crc_data: dl(d.crc_data),
            ecc_data: dl(d.ecc_data),
            recovery_successful: n5(d.recovery_successful),
            recovery_failed: n5(d.recovery_failed),
            recovery_events: n5(d.recovery_events),
            symbol: n5(d.symbol),
            effective: n5(d.effective),
            went_down: d.went_down,
            came_up: d.came_up,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LinkErrors, LinkReading, Nvlink5Errors, Peer};
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn link(link: u32, active: bool, recovery: u64, replay: u64) -> LinkReading {
        LinkReading {
            link,
            active,
            peer: Peer::Gpu(link % 2),
            errors: Some(LinkErrors {
                recovery,
                replay,
                ..LinkErrors::default()
            }),
            nvlink5: None,
        }
    }

    fn gpu(index: u32, uuid: &str, links: Vec<LinkReading>) -> GpuReading {
        GpuReading {
            index,
            uuid: uuid.into(),
            links,
            ..GpuReading::default()
        }
    }

    fn running(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_counter_reset_adds_only_what_grew() {
        let mut l = JobLinks::default();
        for (t, recovery) in [(0, 10), (10, 15), (20, 3), (30, 5)] {
            let g = gpu(0, "GPU-a", vec![link(0, true, recovery, 0)]);
            l.feed(&[g], &running(&["c1"]), at(t), true);
        }
        // 15-10, then reset to 3 (3 since the reset), then 5-3.
        let d = l.deltas("c1", &[0]).unwrap();
        assert_eq!(d.changed.len(), 1);
        assert_eq!(d.changed[0].delta.recovery, 5 + 3 + 2);
        assert_eq!((d.watched, d.unread), (1, 0));
    }

    #[test]
    fn drops_and_returns_are_counted_between_scans() {
        let mut l = JobLinks::default();
        for (t, active) in [(0, true), (10, false), (20, true), (30, false), (40, false)] {
            let g = gpu(0, "GPU-a", vec![link(3, active, 0, 0)]);
            l.feed(&[g], &running(&["c1"]), at(t), true);
        }
        let d = l.deltas("c1", &[0]).unwrap();
        let c = d.changed[0].delta;
        assert_eq!((c.went_down, c.came_up), (2, 1));
        assert_eq!(d.changed[0].link, 3);
    }

    #[test]
    fn a_gpu_renumbered_keeps_its_counts_by_uuid() {
        let mut l = JobLinks::default();
        l.feed(
            &[
                gpu(0, "GPU-a", vec![link(0, true, 1, 0)]),
                gpu(1, "GPU-b", vec![link(0, true, 0, 0)]),
            ],
            &running(&["c1"]),
            at(0),
            true,
        );
        // NVML numbers them the other way round now (a restart, a GPU reset).
        l.feed(
            &[
                gpu(1, "GPU-a", vec![link(0, true, 4, 0)]),
                gpu(0, "GPU-b", vec![link(0, true, 0, 0)]),
            ],
            &running(&["c1"]),
            at(10),
            true,
        );
        let d = l.deltas("c1", &[1]).unwrap();
        assert_eq!(d.changed.len(), 1);
        assert_eq!((d.changed[0].gpu, d.changed[0].delta.recovery), (1, 3));
        assert!(l.deltas("c1", &[0]).unwrap().changed.is_empty());
    }

    #[test]
    fn a_container_new_after_the_first_scan_counts_from_before_its_start() {
        let mut l = JobLinks::default();
        l.feed(
            &[gpu(0, "GPU-a", vec![link(0, true, 0, 0)])],
            &running(&["old"]),
            at(0),
            true,
        );
        // The link recovered in the scan that first saw the new container: during its life.
        l.feed(
            &[gpu(0, "GPU-a", vec![link(0, true, 2, 0)])],
            &running(&["old", "new"]),
            at(10),
            true,
        );
        let new = l.deltas("new", &[0]).unwrap();
        assert!(new.since_start);
        assert_eq!(new.since, at(0));
        assert_eq!(new.changed[0].delta.recovery, 2);
        let old = l.deltas("old", &[0]).unwrap();
        assert!(!old.since_start, "running before the agent's first scan");
        assert_eq!(old.since, at(0));
        assert_eq!(old.changed[0].delta.recovery, 2);
        assert!(l.deltas("never-seen", &[0]).is_none());
    }

    #[test]
    fn a_gone_container_ends_at_its_last_scan() {
        let mut l = JobLinks::default();
        let sample = |r| [gpu(0, "GPU-a", vec![link(0, true, r, 0)])];
        l.feed(&sample(0), &running(&["c1"]), at(0), true);
        l.feed(&sample(1), &running(&["c1"]), at(10), true);
        l.feed(&sample(9), &running(&[]), at(20), true);
        let d = l.deltas("c1", &[0]).unwrap();
        assert_eq!(d.until, at(10));
        assert_eq!(
            d.changed[0].delta.recovery, 1,
            "growth after it was gone is not its"
        );
        // Kept an hour after it went, then forgotten.
        l.feed(&sample(9), &running(&[]), at(20 + 3600), true);
        assert!(l.deltas("c1", &[0]).is_some());
        l.feed(&sample(9), &running(&[]), at(21 + 3600), true);
        assert!(l.deltas("c1", &[0]).is_none());
    }

    #[test]
    fn links_not_read_are_never_clean() {
        let mut l = JobLinks::default();
        l.feed(
            &[gpu(
                0,
                "GPU-a",
                vec![link(0, true, 0, 0), link(1, true, 0, 0)],
            )],
            &running(&["c1"]),
            at(0),
            true,
        );
        // NVML does not answer: no GPU at all.
        l.feed(&[], &running(&["c1"]), at(10), true);
        let d = l.deltas("c1", &[0]).unwrap();
        assert_eq!((d.watched, d.unread), (0, 2));
        // A link whose counters fail to read, the other read.
        let mut unread = link(1, true, 0, 0);
        unread.errors = None;
        l.feed(
            &[gpu(0, "GPU-a", vec![link(0, true, 0, 0), unread])],
            &running(&["c1"]),
            at(20),
            true,
        );
        let d = l.deltas("c1", &[0]).unwrap();
        assert_eq!((d.watched, d.unread), (1, 1));
    }

    #[test]
    fn nvlink5_counts_are_kept_apart_and_flagged() {
        let mut l = JobLinks::default();
        let n5 = |events| LinkReading {
            link: 0,
            active: true,
            peer: Peer::Switch,
            errors: None,
            nvlink5: Some(Nvlink5Errors {
                recovery_events: events,
                recovery_successful: events,
                ..Nvlink5Errors::default()
            }),
        };
        l.feed(
            &[gpu(0, "GPU-b200", vec![n5(1)])],
            &running(&["c1"]),
            at(0),
            true,
        );
        l.feed(
            &[gpu(0, "GPU-b200", vec![n5(4)])],
            &running(&["c1"]),
            at(10),
            true,
        );
        let c = &l.deltas("c1", &[0]).unwrap().changed[0];
        assert!(c.nvlink5 && !c.dl);
        assert_eq!((c.delta.recovery_events, c.delta.recovery), (3, 0));
        assert_eq!(c.peer, "switch");
    }

    #[test]
    fn check_adds_no_baseline_of_its_own() {
        let mut l = JobLinks::default();
        l.feed(
            &[gpu(0, "GPU-a", vec![link(0, true, 0, 0)])],
            &running(&["c1"]),
            at(0),
            false,
        );
        assert!(l.deltas("c1", &[0]).is_none());
    }

    #[test]
    fn a_saved_ledger_counts_on_after_a_restart() {
        let mut l = JobLinks::default();
        let sample = |r, active| [gpu(0, "GPU-a", vec![link(0, active, r, 0)])];
        l.feed(&sample(0, true), &running(&["c1"]), at(0), true);
        l.feed(&sample(2, true), &running(&["c1", "c2"]), at(10), true);
        l.feed(&sample(2, true), &running(&["c2"]), at(20), true);
        let json = serde_json::to_value(l.save()).unwrap();
        let saved: SavedJobLinks = serde_json::from_value(json).unwrap();
        assert!(
            saved.tables.len() <= 3,
            "tables shared, not one per container"
        );
        let mut back = JobLinks::restore(saved).unwrap();
        assert_eq!(back.deltas("c1", &[0]), l.deltas("c1", &[0]));
        // Counted on from the raw values saved: 2 -> 7 while the agent was down.
        back.feed(&sample(7, true), &running(&["c2", "c3"]), at(100), true);
        // c2 began after the scan at 0: the 2 before 10 are its too.
        assert_eq!(
            back.deltas("c2", &[0]).unwrap().changed[0].delta.recovery,
            2 + 5
        );
        let c3 = back.deltas("c3", &[0]).unwrap();
        assert!(
            !c3.since_start,
            "started while the agent was down: first sight"
        );
        assert!(c3.changed.is_empty());
        assert_eq!(
            back.deltas("c1", &[0]).unwrap().changed[0].delta.recovery,
            2
        );
    }

    /// The figure CONTRACT.md gives: 100 containers on an 8-GPU, 18-link board, each first seen
    /// in a scan of its own with counters moving every scan (the worst case: no table shared).
    #[test]
    fn memory_for_100_containers_on_8_gpus_of_18_links() {
        let mut l = JobLinks::default();
        let board = |t: u64| -> Vec<GpuReading> {
            (0..8)
                .map(|g| {
                    let links = (0..18).map(|k| link(k, true, t, t)).collect();
                    gpu(
                        g,
                        &format!("GPU-{g:08x}-0000-0000-0000-000000000000"),
                        links,
                    )
                })
                .collect()
        };
        let mut ids: Vec<String> = Vec::new();
        for t in 0..100 {
            ids.push(format!("{t:064x}"));
            let run: HashSet<String> = ids.iter().cloned().collect();
            l.feed(&board(t), &run, at(t), true);
        }
        // All gone in the next scan: each gets an end too.
        l.feed(&board(100), &HashSet::new(), at(100), true);
        let tables = l.tables();
        let per_table = 144
            * (std::mem::size_of::<(String, u32)>() + 44 + std::mem::size_of::<LinkTotal>() + 16);
        let bytes = tables * per_table;
        eprintln!("{tables} tables of 144 links, about {} KiB", bytes / 1024);
        assert!(tables <= 102, "{tables}");
        assert!(bytes < 8 << 20, "{bytes}");
    }
}

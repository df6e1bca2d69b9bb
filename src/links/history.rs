//! Pure: the links over time, for a window that ended in the past (a hang's, from the start of
//! its collective to its timeout). The job links ledger ([`super::JobLinks`]) keeps totals at a
//! container's baseline and end; this keeps, per (GPU UUID, link), the totals and state after
//! each scan that changed them (and at first sight), the pairs' verdicts as they changed, and
//! when the agent was sampling (one run per process): so "what did the links do between 10:00
//! and 10:10" has an answer, and "not watched" is known, never taken for clean.
//!
//! Bounded: at most [`LINK_MARKS`] marks per link and [`PAIR_MARKS`] pair marks, none older
//! than [`LINK_HISTORY_KEEP`]; a link whose older marks were dropped says from when it is
//! known (`cut`). A link that does not change costs one mark.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::model::{
    from_unix_ms, unix_ms, GpuReading, LinkCounts, LinkHistory, LinkKey, LinkLast, LinkTable, Mark,
    PairKey, PairMark, PairStatus, PairVerdict, Run,
};

/// How long marks are kept: past PyTorch's default collective timeout (10 minutes, 30 before
/// 2.2) and the hour-long timeouts jobs with long checkpoints set.
pub const LINK_HISTORY_KEEP: Duration = Duration::from_secs(3 * 3600);
/// Marks kept per link at most: a link whose counters move every scan keeps its last 128
/// changes (about 10 minutes at a 5 s interval).
pub const LINK_MARKS: usize = 128;
/// Pair verdict changes kept at most (all pairs).
pub const PAIR_MARKS: usize = 1024;
/// Sampling runs kept at most (one per process start).
pub const LINK_RUNS: usize = 16;

/// One scan's view of a pair, as [`LinkHistory::sample`] takes it.
pub struct PairNow {
    pub pair: PairKey,
    pub status: PairStatus,
    pub reason: Option<String>,
}

impl LinkHistory {
    /// A scan as the job links ledger took it: its GPUs and pair verdicts (pairs kept by their
    /// GPUs' UUIDs: indices change), the ledger's totals and last states after it.
    pub fn scan(
        &mut self,
        now: SystemTime,
        (gpus, pairs): (&[GpuReading], &[PairVerdict]),
        (totals, last): (&LinkTable, &BTreeMap<LinkKey, LinkLast>),
        new_run: bool,
    ) {
        let uuid = |i: u32| {
            gpus.iter()
                .find(|g| g.index == i && !g.uuid.is_empty())
                .map(|g| g.uuid.clone())
        };
        let pairs = pairs
            .iter()
            .filter_map(|p| {
                Some(PairNow {
                    pair: (uuid(p.gpu)?, uuid(p.peer_gpu)?),
                    status: p.status,
                    reason: p.reasons.first().map(ToString::to_string),
                })
            })
            .collect();
        let active = last.iter().map(|(k, l)| (k.clone(), l.active)).collect();
        self.sample(now, totals, &active, pairs, new_run);
    }

    /// One scan at `now`: `totals` and `active` (the ledger's, after the sample), `pairs` as
    /// judged; `new_run`: the first sample of this process.
    pub fn sample(
        &mut self,
        now: SystemTime,
        totals: &LinkTable,
        active: &BTreeMap<LinkKey, bool>,
        pairs: Vec<PairNow>,
        new_run: bool,
    ) {
        match self.runs.back_mut() {
            Some(run) if !new_run => run.to = now,
            _ => self.runs.push_back(Run { from: now, to: now }),
        }
        for (key, total) in totals {
            let mark = Mark {
                at: now,
                counts: total.counts,
                active: active.get(key).copied().unwrap_or(true),
                read: total.read,
            };
            let marks = self.marks.entry(key.clone()).or_default();
            let same = marks.back().is_some_and(|m| {
                (m.counts, m.active, m.read) == (mark.counts, mark.active, mark.read)
            });
            if !same {
                marks.push_back(mark);
            }
        }
        for p in pairs {
            let before = self.pairs_now.insert(p.pair.clone(), p.status);
            // A pair first seen ok needs no mark: no mark before a moment the runs cover is ok.
            if before.unwrap_or(PairStatus::Ok) != p.status {
                self.pairs.push_back(PairMark {
                    at: now,
                    pair: p.pair,
                    status: p.status,
                    reason: p.reason,
                });
            }
        }
        self.prune(now);
    }

    fn prune(&mut self, now: SystemTime) {
        let old = now.checked_sub(LINK_HISTORY_KEEP);
        let is_old = |at: SystemTime| old.is_some_and(|o| at < o);
        for (key, marks) in &mut self.marks {
            // The oldest mark stands for the link until the next: it goes only once the next
            // is old too, or past the bound.
            while marks.len() > LINK_MARKS || (marks.len() > 1 && is_old(marks[1].at)) {
                if let Some(m) = marks.pop_front() {
                    self.cut.insert(key.clone(), m.at);
                }
            }
        }
        while self.pairs.len() > PAIR_MARKS || self.pairs.front().is_some_and(|m| is_old(m.at)) {
            if let Some(m) = self.pairs.pop_front() {
                self.pairs_cut = Some(m.at);
            }
        }
        while self.runs.len() > LINK_RUNS || (self.runs.len() > 1 && is_old(self.runs[0].to)) {
            self.runs.pop_front();
        }
    }

    /// The run that covers `at`, if any.
    pub fn run_at(&self, at: SystemTime) -> Option<Run> {
        self.runs
            .iter()
            .copied()
            .find(|r| r.from <= at && at <= r.to)
    }

    /// The link's last mark at or before `at`: its totals and state then. None when the ledger
    /// does not know it then (first seen later, or its marks from then were dropped: `cut`).
    /// Marks are dropped oldest first, so a kept one is the last before `at`.
    pub fn mark_at(&self, key: &LinkKey, at: SystemTime) -> Option<Mark> {
        self.marks
            .get(key)?
            .iter()
            .rev()
            .find(|m| m.at <= at)
            .copied()
    }

    /// The link's marks in `(after, until]`, oldest first.
    pub fn marks_within(
        &self,
        key: &LinkKey,
        after: SystemTime,
        until: SystemTime,
    ) -> impl Iterator<Item = &Mark> {
        self.marks
            .get(key)
            .into_iter()
            .flatten()
            .filter(move |m| m.at > after && m.at <= until)
    }

    /// The pair's verdict at `at` and since when, where it was failing then.
    pub fn pair_failing_at(&self, pair: &PairKey, at: SystemTime) -> Option<&PairMark> {
        self.pairs
            .iter()
            .rev()
            .find(|m| &m.pair == pair && m.at <= at)
            .filter(|m| m.status != PairStatus::Ok)
    }

    /// The pairs' verdict changes in `(after, until]`, oldest first.
    pub fn pairs_within(
        &self,
        after: SystemTime,
        until: SystemTime,
    ) -> impl Iterator<Item = &PairMark> {
        self.pairs
            .iter()
            .filter(move |m| m.at > after && m.at <= until)
    }
}

/// The history as a checkpoint keeps it (`job_links`, beside the ledger): times in Unix ms,
/// counts as arrays (twelve, in [`LinkCounts`]' order).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SavedHistory {
    pub links: Vec<SavedLinkMarks>,
    pub pairs: Vec<SavedPairMark>,
    #[serde(default)]
    pub pairs_now: Vec<(String, String, PairStatus)>,
    pub pairs_cut_ms: Option<i64>,
    pub runs: Vec<(i64, i64)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedLinkMarks {
    pub uuid: String,
    pub link: u32,
    pub cut_ms: Option<i64>,
    /// (at ms, counts, active, read).
    pub marks: Vec<(i64, [u64; 12], bool, bool)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedPairMark {
    pub at_ms: i64,
    pub gpu: String,
    pub peer: String,
    pub status: PairStatus,
    pub reason: Option<String>,
}

impl LinkHistory {
    pub fn save(&self) -> SavedHistory {
        SavedHistory {
            links: self
                .marks
                .iter()
                .map(|((uuid, link), marks)| SavedLinkMarks {
                    uuid: uuid.clone(),
                    link: *link,
                    cut_ms: self.cut.get(&(uuid.clone(), *link)).map(|t| unix_ms(*t)),
                    marks: marks
                        .iter()
                        .map(|m| (unix_ms(m.at), m.counts.to_array(), m.active, m.read))
                        .collect(),
                })
                .collect(),
            pairs: self
                .pairs
                .iter()
                .map(|m| SavedPairMark {
                    at_ms: unix_ms(m.at),
                    gpu: m.pair.0.clone(),
                    peer: m.pair.1.clone(),
                    status: m.status,
                    reason: m.reason.clone(),
                })
                .collect(),
            pairs_now: self
                .pairs_now
                .iter()
                .map(|((a, b), s)| (a.clone(), b.clone(), *s))
                .collect(),
            pairs_cut_ms: self.pairs_cut.map(unix_ms),
            runs: self
                .runs
                .iter()
                .map(|r| (unix_ms(r.from), unix_ms(r.to)))
                .collect(),
        }
    }

    pub fn restore(saved: SavedHistory) -> LinkHistory {
        let mut out = LinkHistory::default();
        for l in saved.links {
            let key = (l.uuid, l.link);
            if let Some(c) = l.cut_ms {
                out.cut.insert(key.clone(), from_unix_ms(c));
            }
            let marks = l
                .marks
                .into_iter()
                .map(|(at, counts, active, read)| Mark {
                    at: from_unix_ms(at),
                    counts: LinkCounts::from_array(counts),
                    active,
                    read,
                })
                .collect();
            out.marks.insert(key, marks);
        }
        out.pairs = saved
            .pairs
            .into_iter()
            .map(|p| PairMark {
                at: from_unix_ms(p.at_ms),
                pair: (p.gpu, p.peer),
                status: p.status,
                reason: p.reason,
            })
            .collect();
        out.pairs_now = saved
            .pairs_now
            .into_iter()
            .map(|(a, b, s)| ((a, b), s))
            .collect();
        out.pairs_cut = saved.pairs_cut_ms.map(from_unix_ms);
        out.runs = saved
            .runs
            .into_iter()
            .map(|(from, to)| Run {
                from: from_unix_ms(from),
                to: from_unix_ms(to),
            })
            .collect();
        out
    }
}

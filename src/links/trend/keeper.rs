//! The samples kept per link (by GPU UUID), thinned to one per [`TrendRules::every`] and
//! bounded by [`TrendRules::keep`], and each scan's judgement of them.
//!
//! In memory a run of equal samples keeps only its first and last: the rule sees rises between
//! consecutive samples and the span from the first to the last, and neither changes when the
//! middle of a flat run goes. A board of flat links (most links, most days) then holds two
//! samples a link, not 240 (the store keeps every hourly row).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::SystemTime;

use super::words;
use super::{judge_counter, TrendRules};
use crate::model::{
    unix_ms, Finding, FindingKind, GpuReading, LinkCounter, LinkSample, LinkTrend, Peer, Subject,
};

/// What one scan's sample made: the samples to store (those kept), every growing counter's
/// trend, and a finding per GPU with a steadily growing link.
#[derive(Debug, Default)]
pub struct Observed {
    pub to_store: Vec<LinkSample>,
    pub trends: Vec<LinkTrend>,
    pub findings: Vec<Finding>,
}

/// The kept samples; `serve` keeps one across scans (taking up the store's at start),
/// `check` one with the store's and its one sample.
#[derive(Debug, Clone, Default)]
pub struct TrendKeeper {
    rules: TrendRules,
    links: BTreeMap<(String, u32), VecDeque<Kept>>,
}

/// One kept sample of a link (its key is the map's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kept {
    at_ms: i64,
    counts: [Option<u64>; 10],
}

impl Kept {
    fn of(s: &LinkSample) -> Kept {
        Kept {
            at_ms: s.at_ms,
            counts: s.counts,
        }
    }
}

/// Appends `s`; the middle of three equal samples goes.
fn push(kept: &mut VecDeque<Kept>, s: Kept) {
    let n = kept.len();
    if n >= 2 && kept[n - 1].counts == s.counts && kept[n - 2].counts == s.counts {
        kept.pop_back();
    }
    kept.push_back(s);
}

impl TrendKeeper {
    pub fn new(rules: TrendRules) -> TrendKeeper {
        TrendKeeper {
            rules,
            links: BTreeMap::new(),
        }
    }

    /// Takes up samples kept before (the store's), in any order.
    pub fn resume(&mut self, mut stored: Vec<LinkSample>) {
        stored.sort_by_key(|s| s.at_ms);
        let max = self.rules.max_per_link();
        for s in stored {
            let kept = self.links.entry((s.gpu.clone(), s.link)).or_default();
            if kept.back().is_none_or(|last| s.at_ms > last.at_ms) {
                push(kept, Kept::of(&s));
            }
            if kept.len() > max {
                kept.pop_front();
            }
        }
    }

    /// Samples kept now, over every link.
    pub fn len(&self) -> usize {
        self.links.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// One scan's GPUs at `now`: kept where the link's last kept sample is `every` old, the
    /// oldest dropped past `keep`, and every link judged with this sample last.
    pub fn observe(&mut self, gpus: &[GpuReading], now: SystemTime) -> Observed {
        let now_ms = unix_ms(now);
        let samples = LinkSample::of(gpus, now_ms);
        let every_ms = i64::try_from(self.rules.every.as_millis()).unwrap_or(i64::MAX);
        let mut to_store = Vec::new();
        for s in &samples {
            let kept = self.links.entry((s.gpu.clone(), s.link)).or_default();
            // Dated after now: the clock was set back; they would hold back the hourly samples.
            while kept.back().is_some_and(|k| k.at_ms > now_ms) {
                kept.pop_back();
            }
            if kept
                .back()
                .is_none_or(|last| now_ms - last.at_ms >= every_ms)
            {
                push(kept, Kept::of(s));
                to_store.push(s.clone());
            }
        }
        self.prune(now_ms);
        let trends = self.judge(gpus, &samples, now_ms);
        let findings = findings(&trends);
        Observed {
            to_store,
            trends,
            findings,
        }
    }

    /// Drops what is past `keep` (a flat run reaching past it starts at its edge instead, as
    /// the hourly samples within it would) and what is dated after now (a clock set back) of
    /// links not sampled now.
    fn prune(&mut self, now_ms: i64) {
        let keep_ms = i64::try_from(self.rules.keep.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(keep_ms);
        let max = self.rules.max_per_link();
        self.links.retain(|_, kept| {
            while kept.back().is_some_and(|s| s.at_ms > now_ms) {
                kept.pop_back();
            }
            while kept.len() > max {
                kept.pop_front();
            }
            while let Some(front) = kept.front().copied().filter(|s| s.at_ms < cutoff) {
                kept.pop_front();
                if kept
                    .front()
                    .is_some_and(|next| next.counts == front.counts && next.at_ms > cutoff)
                {
                    kept.push_front(Kept {
                        at_ms: cutoff,
                        ..front
                    });
                    break;
                }
            }
            !kept.is_empty()
        });
    }

    /// Every counter of the links sampled now that grew over the kept span.
    fn judge(&self, gpus: &[GpuReading], samples: &[LinkSample], now_ms: i64) -> Vec<LinkTrend> {
        let where_now: HashMap<(&str, u32), (u32, &Peer)> = gpus
            .iter()
            .flat_map(|g| {
                g.links
                    .iter()
                    .map(move |l| ((g.uuid.as_str(), l.link), (g.index, &l.peer)))
            })
            .collect();
        let mut trends = Vec::new();
        for s in samples {
            let Some(kept) = self.links.get(&(s.gpu.clone(), s.link)) else {
                continue;
            };
            let Some(&(index, peer)) = where_now.get(&(s.gpu.as_str(), s.link)) else {
                continue;
            };
            let now = Kept::of(s);
            let series = kept.iter().chain(
                // This scan's sample, where it was not kept.
                (kept.back().map(|k| k.at_ms) != Some(s.at_ms)).then_some(&now),
            );
            for c in LinkCounter::ALL {
                let values: Vec<(i64, u64)> = series
                    .clone()
                    .filter_map(|x| Some((x.at_ms, x.counts[c.index()]?)))
                    .collect();
                let t = judge_counter(&values, now_ms, &self.rules);
                if t.growth == 0 {
                    continue;
                }
                trends.push(LinkTrend {
                    gpu: index,
                    uuid: s.gpu.clone(),
                    link: s.link,
                    peer: peer.clone(),
                    counter: c,
                    per_hour: t.per_hour,
                    growing: t.steady,
                });
            }
        }
        trends.sort_by_key(|t| (t.gpu, t.link, t.counter));
        trends
    }
}

/// One warning per GPU naming its steadily growing links.
fn findings(trends: &[LinkTrend]) -> Vec<Finding> {
    let mut by_gpu: BTreeMap<u32, Vec<&LinkTrend>> = BTreeMap::new();
    for t in trends.iter().filter(|t| t.growing.is_some()) {
        by_gpu.entry(t.gpu).or_default().push(t);
    }
    by_gpu
        .into_iter()
        .map(|(gpu, links)| {
            Finding::new(
                FindingKind::GpuLinkErrorsGrowing,
                Subject::Gpu(gpu),
                words::link_errors_growing(gpu, &links),
            )
        })
        .collect()
}

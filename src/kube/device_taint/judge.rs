//! Pure: which GPUs should be out of scheduling now, rendered from the snapshot's GPU verdicts
//! (`gpu::verdict`: a GPU whose verdict has an `out` reason is blamed; the verdict decided it).
//! A blamed GPU stays wanted until it has been blamed by nothing for the hold (the
//! `--gpu-fault-hold` the XIDs use), so a link that goes down and up does not make and lift
//! rules; a held XID already carries that hold, so it is not added twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::gpu::xid::catalogue;
use crate::model::{OutReason, Snapshot};
use crate::text;

/// One GPU blamed by this snapshot: the taint's value and the sentence that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blamed {
    pub gpu: u32,
    pub uuid: String,
    /// A label value (the taint's value): `nvlink-down`, `pair-degraded`, `gpu-lost`, `xid-<n>`,
    /// `recovery-action`.
    pub value: String,
    pub why: String,
    /// Whether only a held XID blames it (the XID's hold is the hold).
    pub held_xid_only: bool,
    /// Since when its failing pairs have failed, where the pair judge knows.
    pub since: Option<SystemTime>,
}

/// A GPU that should be out now, with since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub gpu: u32,
    pub uuid: String,
    pub value: String,
    /// Why and since when: the rule's description and its Events' note.
    pub description: String,
    pub since: SystemTime,
}

/// The GPUs this snapshot's verdicts put out, one entry per GPU (its strongest reason), by
/// index; a GPU without a UUID has no device to select.
pub fn blamed(snapshot: &Snapshot) -> Vec<Blamed> {
    snapshot
        .gpu_verdicts
        .iter()
        .filter(|v| !v.uuid.is_empty())
        .filter_map(|v| Some((v.gpu?, v, v.out?)))
        .map(|(gpu, v, out)| {
            let culprit = v.culprit.as_ref();
            let why = match out {
                OutReason::Lost => text::taint_gpu_lost(gpu),
                OutReason::Xid(xid) => {
                    let what = catalogue::lookup(xid).map_or("unknown", |e| e.what);
                    text::taint_xid(gpu, xid, what)
                }
                OutReason::RecoveryAction(action) => text::taint_recovery_action(gpu, action),
                OutReason::NvlinkDown | OutReason::PairDegraded => {
                    let (bad, all) =
                        culprit.map_or((0, false), |c| (c.bad_pairs, c.fails_with_all));
                    text::taint_culprit(gpu, bad, all, out == OutReason::NvlinkDown)
                }
            };
            let by_pairs = matches!(out, OutReason::NvlinkDown | OutReason::PairDegraded);
            Blamed {
                gpu,
                uuid: v.uuid.clone(),
                value: out.value(),
                why,
                held_xid_only: matches!(out, OutReason::Xid(_)) && !v.out_besides_xids(),
                since: culprit.filter(|_| by_pairs).and_then(|c| c.since),
            }
        })
        .collect()
}

/// Keeps, per GPU UUID, since when it has been blamed and when last, and says which GPUs are
/// wanted out.
#[derive(Debug)]
pub struct TaintJudge {
    hold: Duration,
    held: BTreeMap<String, Holding>,
}

#[derive(Debug, Clone)]
struct Holding {
    last: Blamed,
    since: SystemTime,
    /// When something other than a held XID last blamed it.
    last_seen: Option<Instant>,
}

impl TaintJudge {
    pub fn new(hold: Duration) -> TaintJudge {
        TaintJudge {
            hold,
            held: BTreeMap::new(),
        }
    }

    /// This snapshot's blame in; the GPUs wanted out, by index. `now` and `wall` are the same
    /// moment on the two clocks.
    pub fn decide(&mut self, blamed: Vec<Blamed>, now: Instant, wall: SystemTime) -> Vec<Wanted> {
        let current: Vec<String> = blamed.iter().map(|b| b.uuid.clone()).collect();
        for b in blamed {
            let seen = (!b.held_xid_only).then_some(now);
            let since = b.since.unwrap_or(wall);
            match self.held.get_mut(&b.uuid) {
                Some(h) => {
                    h.since = h.since.min(since);
                    h.last_seen = seen.or(h.last_seen);
                    h.last = b;
                }
                None => {
                    let holding = Holding {
                        last: b.clone(),
                        since,
                        last_seen: seen,
                    };
                    self.held.insert(b.uuid, holding);
                }
            }
        }
        let hold = self.hold;
        self.held.retain(|uuid, h| {
            current.contains(uuid)
                || h.last_seen
                    .is_some_and(|t| now.saturating_duration_since(t) < hold)
        });
        let mut out: Vec<Wanted> = self
            .held
            .values()
            .map(|h| Wanted {
                gpu: h.last.gpu,
                uuid: h.last.uuid.clone(),
                value: h.last.value.clone(),
                description: text::taint_description(&h.last.why, h.since),
                since: h.since,
            })
            .collect();
        out.sort_by_key(|w| w.gpu);
        out
    }
}

#[cfg(test)]
mod tests;

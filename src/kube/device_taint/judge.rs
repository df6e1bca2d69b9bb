//! Pure: which GPUs should be out of scheduling now. A GPU is blamed when the pair judge names
//! it as a culprit (never "either end" of pairs, never on a node where every pair fails: that is
//! the node's problem, not one GPU's), when NVML says it is lost or asks for a reset or reboot,
//! or while an XID that makes `GpuFault` True is held on it. It stays wanted until it has been
//! blamed by none of these for the hold (the `--gpu-fault-hold` the Node conditions use), so a
//! link that goes down and up does not make and lift rules; a held XID already carries that
//! hold, so it is not added twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::gpu::xid::{catalogue, HeldXid};
use crate::model::{GpuReading, PairStatus, Snapshot, Suspect, SuspectBy};
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

/// The GPUs this snapshot blames, one entry per GPU (the strongest reason), by index.
pub fn blamed(snapshot: &Snapshot, held: &[HeldXid]) -> Vec<Blamed> {
    let mut out: BTreeMap<u32, Blamed> = BTreeMap::new();
    let by_index = |i: u32| snapshot.gpus.iter().find(|g| g.index == i);
    let mut put = |g: &GpuReading, value: String, why: String, xid: bool, since| {
        out.entry(g.index).or_insert(Blamed {
            gpu: g.index,
            uuid: g.uuid.clone(),
            value,
            why,
            held_xid_only: xid,
            since,
        });
    };
    if !snapshot.nvml_up {
        return Vec::new();
    }
    // Strongest first: the first reason put for a GPU is its value.
    for g in snapshot.gpus.iter().filter(|g| g.lost) {
        put(
            g,
            "gpu-lost".into(),
            text::taint_gpu_lost(g.index),
            false,
            None,
        );
    }
    for h in held.iter().filter(|h| h.action.is_fatal()) {
        if let Some(g) = by_index(h.gpu) {
            let what = catalogue::lookup(h.xid).map_or("unknown", |e| e.what);
            let why = text::taint_xid(h.gpu, h.xid, what);
            put(g, format!("xid-{}", h.xid), why, true, None);
        }
    }
    for g in &snapshot.gpus {
        if let Some(action) = g.recovery_action.filter(|a| a.is_fault()) {
            let why = text::taint_recovery_action(g.index, action);
            put(g, "recovery-action".into(), why, false, None);
        }
    }
    for s in snapshot.gpu_blame.culprits() {
        if let Some(g) = by_index(s.gpu) {
            let failing = snapshot
                .gpu_pairs
                .iter()
                .filter(|p| (p.gpu == s.gpu || p.peer_gpu == s.gpu) && p.status != PairStatus::Ok);
            let down = failing.clone().any(|p| p.status == PairStatus::Down);
            let since = failing.filter_map(|p| p.since).min();
            let value = if down { "nvlink-down" } else { "pair-degraded" };
            put(g, value.into(), culprit_why(s, down), false, since);
        }
    }
    // A GPU blamed by something besides a held XID is held by this judge too.
    for b in out.values_mut() {
        b.held_xid_only = b.held_xid_only && !other_blame(snapshot, b.gpu);
    }
    out.into_values().filter(|b| !b.uuid.is_empty()).collect()
}

fn culprit_why(s: &Suspect, down: bool) -> String {
    let all = s.by == SuspectBy::FailsWithAll;
    text::taint_culprit(s.gpu, s.bad_pairs, all, down)
}

fn other_blame(snapshot: &Snapshot, gpu: u32) -> bool {
    snapshot
        .gpus
        .iter()
        .any(|g| g.index == gpu && (g.lost || g.recovery_action.is_some_and(|a| a.is_fault())))
        || snapshot.gpu_blame.culprits().any(|s| s.gpu == gpu)
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

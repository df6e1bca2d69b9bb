//! Rules 4 and 5: P2P that was ok and is not, and P2P failing where pairs like it work.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::gpu::pairs::board::Board;
use crate::gpu::pairs::reasons::PairState;
use crate::model::{P2pStatus, TopologyLevel};
use crate::model::{PairReason, ReasonKind, Weight};
use crate::text;

/// Per (GPU key of `gpu`, GPU key of `peer_gpu`): whether read, write, nvlink, atomics were
/// ever ok. Directional, so a reorder that flips a pair forgets rather than misjudges.
pub(crate) type P2pMemory = HashMap<(String, String), [bool; 4]>;

/// Rule 4: a P2P capability that was ever ok for the pair and now is not.
pub(crate) fn p2p_regression_rule(
    p2p_ever_ok: &mut P2pMemory,
    board: &Board<'_>,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) {
    let present: HashSet<String> = board.indices.iter().map(|&i| board.key(i)).collect();
    p2p_ever_ok.retain(|(x, y), _| present.contains(x) && present.contains(y));
    for (&(a, b), st) in pairs.iter_mut() {
        let Some(caps) = st.p2p else {
            continue;
        };
        let ever_ok = p2p_ever_ok.entry((board.key(a), board.key(b))).or_default();
        for (was_ok, (name, status)) in ever_ok.iter_mut().zip(caps.iter()) {
            if status == P2pStatus::Ok {
                *was_ok = true;
            } else if *was_ok {
                st.push(PairReason::new(
                    ReasonKind::P2pLost,
                    Weight::Broken,
                    text::reason_p2p_lost(name, status),
                ));
            }
        }
    }
}

/// Rule 5: P2P failing where pairs like it work. Pairs are alike when they sit at the same
/// topology level and join the same two GPU models: on a node that mixes models, P2P between
/// two different models is legitimately `gpu_not_supported` and says nothing about either GPU.
pub(crate) fn outlier_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    let models = |(a, b): (u32, u32)| {
        let name = |i: u32| board.gpus.get(&i).map_or("", |g| g.name.as_str());
        let (x, y) = (name(a), name(b));
        if x <= y {
            (x, y)
        } else {
            (y, x)
        }
    };
    let mut read_write_ok: HashMap<(Option<TopologyLevel>, (&str, &str)), usize> = HashMap::new();
    let mut nvlink_ok: HashMap<(&str, &str), usize> = HashMap::new();
    for (&key, st) in pairs.iter() {
        let Some(caps) = st.p2p.filter(|_| !board.is_lost(key)) else {
            continue;
        };
        if caps.read == P2pStatus::Ok && caps.write == P2pStatus::Ok {
            *read_write_ok.entry((st.topology, models(key))).or_default() += 1;
        }
        if caps.nvlink == P2pStatus::Ok {
            *nvlink_ok.entry(models(key)).or_default() += 1;
        }
    }
    for (&key, st) in pairs.iter_mut() {
        let Some(caps) = st.p2p.filter(|_| !board.is_lost(key)) else {
            continue;
        };
        let can = read_write_ok
            .get(&(st.topology, models(key)))
            .copied()
            .unwrap_or(0);
        let failing = text::p2p_failing(caps.read, caps.write);
        if let Some(failing) = failing.filter(|_| can > 0) {
            let words = text::reason_p2p_unlike_peers(&failing, can, st.topology);
            st.push(PairReason::new(
                ReasonKind::P2pUnlikePeers,
                Weight::Broken,
                words,
            ));
        }
        let nvlink_can = nvlink_ok.get(&models(key)).copied().unwrap_or(0);
        if board.nvswitch && caps.nvlink != P2pStatus::Ok && nvlink_can > 0 {
            st.push(PairReason::new(
                ReasonKind::P2pUnlikePeers,
                Weight::Broken,
                text::reason_p2p_nvlink_unlike_peers(caps.nvlink, nvlink_can),
            ));
        }
    }
}

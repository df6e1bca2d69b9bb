//! Rule 8: the pair probe's last verdicts (`serve --p2p-probe-interval`), judged once by
//! `probe::assess` and weighed by [`ProbeStatus::weight`], placed on their unordered pairs
//! (a lost GPU's pairs are down already).
//!
//! [`ProbeStatus::weight`]: crate::model::ProbeStatus::weight

use std::collections::BTreeMap;

use crate::gpu::pairs::board::{ordered, Board};
use crate::gpu::pairs::reasons::PairState;
use crate::model::{GpuSample, PairReason, ReasonKind};
use crate::text;

pub(crate) fn probe_rule(
    sample: &GpuSample,
    board: &Board<'_>,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) {
    for p in &sample.probes {
        let Some(weight) = p.status.weight() else {
            continue;
        };
        let key = ordered(p.from_gpu, p.to_gpu);
        if board.is_lost(key) {
            continue;
        }
        if let Some(st) = pairs.get_mut(&key) {
            st.push(PairReason::new(
                ReasonKind::Probe,
                weight,
                text::reason_probe(p),
            ));
        }
    }
}

//! Rule 8: the pair probe's last results (`serve --p2p-probe-interval`). A direction whose
//! copies failed (an error, corrupted bytes, a hang, a crash, peer access refused where NVML
//! says P2P works) makes the pair `degraded` as `Broken`: transfers fail. One that ran at under
//! half of what it should makes it `degraded` as `Errors`: jobs slow down.

use std::collections::BTreeMap;

use crate::findings::text;
use crate::gpu::pairs::board::{ordered, Board};
use crate::gpu::pairs::reasons::PairState;
use crate::model::{GpuSample, ProbeStatus, Weight};

pub(crate) fn probe_rule(
    sample: &GpuSample,
    board: &Board<'_>,
    pairs: &mut BTreeMap<(u32, u32), PairState>,
) {
    for p in &sample.probes {
        let weight = match p.status {
            ProbeStatus::Ok => continue,
            ProbeStatus::Degraded => Weight::Errors,
            ProbeStatus::Failed => Weight::Broken,
        };
        let key = ordered(p.from_gpu, p.to_gpu);
        if board.is_lost(key) {
            continue;
        }
        if let Some(st) = pairs.get_mut(&key) {
            st.push(weight, text::reason_probe(p));
        }
    }
}

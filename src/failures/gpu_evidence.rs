//! Pure: what the last scan knew of a failed job's GPUs beyond their pairs, for the texts of
//! GPU failures in the job's own words (`text::gpu_failures`): which of them had an ECC XID
//! lately, and their NVSwitch fabric state.

use crate::model::{FindingKind, Snapshot, Subject};
use crate::text;

/// XIDs that report GPU memory ECC trouble (NVIDIA's catalogue): double-bit errors, row
/// remapping, contained and uncontained memory errors, ECC unrecovered.
const ECC_XIDS: &[u64] = &[48, 63, 64, 92, 94, 95, 140];

/// What the last scan knew of the job's GPUs (all the node's when they are not known) beyond
/// their pairs: recent ECC XIDs (the `gpu_xid` findings) and fabric state.
pub(super) fn gpu_evidence(gpus: &[u32], snapshot: Option<&Snapshot>) -> text::GpuEvidence {
    let Some(s) = snapshot.filter(|s| s.nvml_up) else {
        return text::GpuEvidence::default();
    };
    let ours = |g: u32| gpus.is_empty() || gpus.contains(&g);
    let mut out = text::GpuEvidence {
        nvml: true,
        ..Default::default()
    };
    for f in &s.findings {
        if let (FindingKind::GpuXid, Subject::Xid { gpu, xid }) = (f.kind, &f.subject) {
            if ours(*gpu) && ECC_XIDS.contains(xid) {
                let what = crate::gpu::xid::catalogue::lookup(*xid).map_or("", |e| e.what);
                out.ecc_xids.push((*gpu, *xid, what));
            }
        }
    }
    for g in s.gpus.iter().filter(|g| ours(g.index)) {
        match g.fabric.as_ref().map(|f| (f, text::fabric_problem(f))) {
            Some((_, Some(problem))) => out.fabric.push((g.index, problem)),
            Some((_, None)) => out.fabric_ok.push(g.index),
            None => {}
        }
    }
    out
}

//! Pure: what NCCL's own diagnostics say, read as NCCL prints them (the rows in
//! `signatures/gpu_table.rs` find the lines; this refuses a line that only looks like one).
//!
//! - The active P2P check (`NCCL_RUN_DIAGNOSTICS=1`, NCCL 2.31+, src/diagnostics/p2p.cc),
//!   printed by the process of the communicator's rank 0: a failed edge, `NCCL DIAG [INFO] p2p:
//!   write mismatch srcRank=0 srcCudaDev=0 srcNvmlDev=5 dstRank=1 dstCudaDev=1 dstNvmlDev=7
//!   path=NVL handle=CUMEM_POSIX_FD ...` (also `read mismatch`, `peer-memory import failed`,
//!   `launch/check failed`, `topology check failed`, `destination buffer unavailable`, `local
//!   CUDA setup failed`), and the partial summary, `NCCL DIAG [INFO] p2p: only 52/56
//!   GPU-to-GPU peer accesses passed verification` (2.31's documentation and release; later
//!   sources print `52/56 directed GPU P2P edges verified`). Its own failures (`setup failed on
//!   rank`, `check returned`, `resource cleanup failed`) say nothing of the GPUs.
//! - RAS (src/ras/client_support.cc): the ncclras client's report `N job process(es) is/are
//!   considered dead (unreachable via the RAS network)` (2.24+), and its monitor mode's event
//!   (2.29+), `[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing
//!   GPU 1`, or in JSON, `"event": "PEER_DEAD",`.

/// The rows' ids (`signatures/gpu_table.rs`).
pub const NCCL_DIAG_P2P: &str = "nccl-diag-p2p";
pub const NCCL_RAS_PEER_DEAD: &str = "nccl-ras-peer-dead";

/// The rows' needles.
pub const NCCL_DIAG_P2P_NEEDLE: &str = "NCCL DIAG [INFO] p2p: ";
pub const NCCL_RAS_PEER_DEAD_NEEDLE: &str = "PEER_DEAD";

/// The verification of these rows (`row`: its id; its needle between `start` and `end` of
/// `line`): None for another row; else None when the line only looks like it, or the pair it
/// names.
#[allow(clippy::option_option)]
pub fn verified(
    row: &str,
    line: &str,
    start: usize,
    end: usize,
) -> Option<Option<Option<(u32, u32)>>> {
    let (before, rest) = (line.get(..start)?, line.get(end..)?);
    match row {
        NCCL_DIAG_P2P => Some(p2p_check(rest)),
        NCCL_RAS_PEER_DEAD => Some(ras_peer_dead(before, rest).then_some(None)),
        _ => None,
    }
}

/// The P2P check's words for an edge that failed.
const EDGE_FAILURES: [&str; 7] = [
    "write mismatch ",
    "read mismatch ",
    "peer-memory import failed ",
    "launch/check failed ",
    "topology check failed ",
    "destination buffer unavailable ",
    "local CUDA setup failed ",
];

/// What the P2P check's line (after `NCCL DIAG [INFO] p2p: `) says: None when it is no
/// failure of the GPUs; else the pair it names (`srcNvmlDev`, `dstNvmlDev`: NVML indices as the
/// process saw them), if it names one.
pub fn p2p_check(rest: &str) -> Option<Option<(u32, u32)>> {
    if EDGE_FAILURES.iter().any(|f| rest.starts_with(f)) {
        let src = field(rest, " srcNvmlDev=")?;
        let dst = field(rest, " dstNvmlDev=")?;
        return Some(Some((src, dst)));
    }
    // `only 52/56 GPU-to-GPU peer accesses passed verification`, `52/56 directed GPU P2P edges
    // verified`: some failed (`all 56` is the [OK] line).
    let counts = rest.strip_prefix("only ").unwrap_or(rest);
    let (passed, rest) = counts.split_once('/')?;
    let (tested, words) = rest.split_once(' ')?;
    let (passed, tested) = (passed.parse::<u64>().ok()?, tested.parse::<u64>().ok()?);
    let summary = words.starts_with("GPU-to-GPU peer accesses passed verification")
        || words.starts_with("directed GPU P2P edges verified");
    (summary && passed < tested).then_some(None)
}

/// The number after `key` in `text`.
fn field(text: &str, key: &str) -> Option<u32> {
    let at = text.find(key)? + key.len();
    let digits = text[at..].bytes().take_while(u8::is_ascii_digit).count();
    text[at..at + digits].parse().ok()
}

/// Whether `PEER_DEAD` (between `before` and `rest`) is the RAS monitor's event: `] PEER_DEAD:
/// ` in text, `"event": "PEER_DEAD"` in JSON.
pub fn ras_peer_dead(before: &str, rest: &str) -> bool {
    (before.ends_with("] ") && rest.starts_with(": "))
        || (before.trim_end().ends_with("\"event\": \"") && rest.starts_with('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p2p(line: &str) -> Option<Option<(u32, u32)>> {
        let at = line.find(NCCL_DIAG_P2P_NEEDLE)? + NCCL_DIAG_P2P_NEEDLE.len();
        p2p_check(&line[at..])
    }

    #[test]
    fn a_failed_edge_names_its_gpus_and_a_partial_summary_says_some_failed() {
        assert_eq!(
            p2p(
                "node0:24563 NCCL DIAG [INFO] p2p: write mismatch srcRank=0 srcCudaDev=0 \
                 srcNvmlDev=5 dstRank=1 dstCudaDev=1 dstNvmlDev=7 path=NVL handle=CUMEM_POSIX_FD \
                 expected=0x00000000d1a60100 got=0x0000000000000000 verify=0x0000000000000000; \
                 check the single-node NVLink topology and peer-access state with 'nvidia-smi \
                 topo -m' and 'nvidia-smi topo -p2p n'"
            ),
            Some(Some((5, 7)))
        );
        assert_eq!(
            p2p(
                "NCCL DIAG [INFO] p2p: peer-memory import failed srcRank=3 srcCudaDev=3 \
                 srcNvmlDev=3 dstRank=2 dstCudaDev=2 dstNvmlDev=2 path=PIX handle=LEGACY_CUDA_IPC \
                 reason=import; check CUDA IPC support, GPU visibility, and process or container \
                 isolation"
            ),
            Some(Some((3, 2)))
        );
        assert_eq!(
            p2p("NCCL DIAG [INFO] p2p: only 52/56 GPU-to-GPU peer accesses passed verification"),
            Some(None)
        );
        assert_eq!(
            p2p("NCCL DIAG [INFO] p2p: 52/56 directed GPU P2P edges verified (skipped indirect=2)"),
            Some(None)
        );
    }

    #[test]
    fn the_checks_own_trouble_and_passing_lines_are_nothing() {
        for line in [
            "NCCL DIAG [OK]   p2p: verified P2P access in both directions between every GPU \
             pair (56 peer accesses)",
            "NCCL DIAG [INFO] p2p: setup failed on rank 3 result=2",
            "NCCL DIAG [INFO] p2p: check returned 3",
            "NCCL DIAG [INFO] p2p: resource cleanup failed on rank 1 result=1",
            "NCCL DIAG [INFO] p2p: 56/56 directed GPU P2P edges verified",
            "NCCL DIAG [INFO] p2p: write mismatch srcRank=0 (fields cut)",
        ] {
            assert_eq!(p2p(line), None, "{line}");
        }
    }

    #[test]
    fn the_ras_monitors_dead_peer_in_text_and_json() {
        assert!(ras_peer_dead(
            "[2025-12-19 13:07:07] ",
            ": Process 1524345 on node x"
        ));
        assert!(ras_peer_dead("  \"event\": \"", "\","));
        assert!(!ras_peer_dead("grep ", " ras.log"));
        assert!(!ras_peer_dead("RAS_", "_TIMEOUT"));
    }

    #[test]
    fn the_rows_tell_them_and_name_the_pair() {
        use crate::failures::Signatures;
        use crate::model::FindingKind;
        let sigs = Signatures::new();
        let m = sigs
            .match_line(
                "node0:24563 NCCL DIAG [INFO] p2p: read mismatch srcRank=1 srcCudaDev=1 \
                 srcNvmlDev=7 dstRank=0 dstCudaDev=0 dstNvmlDev=5 path=NVL handle=DIRECT \
                 expected=0x1 got=0x0; check the single-node NVLink topology",
            )
            .unwrap();
        assert_eq!(
            (m.kind, m.gpus),
            (FindingKind::NcclP2pCheckFailed, Some((7, 5)))
        );
        for line in [
            "  1 job process is considered dead (unreachable via the RAS network)",
            "[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing GPU 1",
            "  \"event\": \"PEER_DEAD\",",
        ] {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(m.kind, FindingKind::NcclRanksDead, "{line}");
        }
        for line in [
            "[2025-12-19 13:07:00] PEER_NEW: Process 1524345 on node 172.16.64.245 managing GPU 1",
            "NCCL DIAG [OK]   p2p: all 56 directed GPU P2P edges verified",
            "if event == PEER_DEAD: restart()",
        ] {
            assert_eq!(sigs.match_line(line), None, "{line}");
        }
    }
}

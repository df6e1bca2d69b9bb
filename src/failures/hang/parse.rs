//! Pure: what a watchdog's line says of the collective that hung, read as printed (the rows in
//! `signatures/gpu_table.rs` find the lines; this reads their facts and refuses a line that only
//! looks like one).
//!
//! PyTorch's ProcessGroupNCCL has printed the timeout as (`WorkNCCL`'s `operator<<`, the
//! watchdog's message, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp):
//! - 1.7: `[Rank 0] Watchdog caught collective operation timeout for work: WorkNCCL(OpType=
//!   ALLREDUCE, TensorShape=[1024], Timeout(ms)=1800000)` (no duration: the timeout stands for it);
//! - 1.8-1.12: `[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4,
//!   OpType=ALLREDUCE, TensorShape=[2, 3], Timeout(ms)=1800000) ran for 1800347 milliseconds
//!   before timing out.`, and `Caught collective operation timeout: ...` from `wait()`;
//! - 1.13-2.x: `WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)`,
//!   the prefix `[Rank 3] `, then `[PG 0 (default_pg) Rank 3] `, `[PG ID 0 PG GUID
//!   0(default_pg) Rank 3] ` (`logPrefix()`), the same text again in `terminate`'s `what():`.
//!
//! Its heartbeat monitor: `[PG 0 Rank 25] ProcessGroupNCCL's watchdog got stuck for 600 seconds
//! without making progress in monitoring enqueued collectives.` XLA's NCCL rendezvous
//! (xla/service/gpu/nccl_utils.cc, later xla/service/rendezvous.cc): `Termination timeout of 30
//! seconds exceeded. Exiting to ensure a consistent program state.` (the later one names the
//! rendezvous: `Termination timeout for `...` of 30 seconds exceeded. ...`). Horovod's stall
//! inspector (horovod/common/stall_inspector.cc) with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: `One
//! or more rank (marked by "!") is stalled for longer than 60 seconds. Will shutdown.`

use crate::model::{printable, HangFacts, HangSaidBy};

/// The rows' ids (`signatures/gpu_table.rs`).
pub const TORCH_WATCHDOG: &str = "torch-watchdog-timeout";
pub const TORCH_WATCHDOG_STUCK: &str = "torch-watchdog-stuck";
pub const XLA_TERMINATION: &str = "xla-rendezvous-termination";
pub const HOROVOD_STALL: &str = "horovod-stall-shutdown";

/// The rows' needles.
pub const TORCH_WATCHDOG_NEEDLE: &str = "collective operation timeout";
pub const TORCH_WATCHDOG_STUCK_NEEDLE: &str = "ProcessGroupNCCL's watchdog got stuck for ";
pub const XLA_TERMINATION_NEEDLE: &str =
    " seconds exceeded. Exiting to ensure a consistent program state";
pub const HOROVOD_STALL_NEEDLE: &str = "is stalled for longer than ";

/// A process group's text kept at most.
const PG_MAX: usize = 64;

/// The facts of a hang row's line (`row`: its id), None when the line only looks like it.
pub fn facts(row: &str, line: &str) -> Option<HangFacts> {
    match row {
        TORCH_WATCHDOG => torch_watchdog(line),
        TORCH_WATCHDOG_STUCK => torch_stuck(line),
        XLA_TERMINATION => xla(line),
        HOROVOD_STALL => horovod(line),
        _ => None,
    }
}

fn empty(said_by: HangSaidBy) -> HangFacts {
    HangFacts {
        said_by,
        rank: None,
        process_group: None,
        seq: None,
        op: None,
        numel_in: None,
        numel_out: None,
        timeout_ms: None,
        ran_for_ms: None,
    }
}

/// `... Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds
/// before timing out.`
fn torch_watchdog(line: &str) -> Option<HangFacts> {
    let at = line.find(TORCH_WATCHDOG_NEEDLE)?;
    let (before, after) = (&line[..at], &line[at + TORCH_WATCHDOG_NEEDLE.len()..]);
    if before.contains("grep ") {
        return None;
    }
    // `: WorkNCCL(` (or ` for work: WorkNCCL(`) right after the needle, nothing else between.
    let open = after.find("WorkNCCL(")?;
    let between = &after[..open];
    if !(between == ": " || between == " for work: ") {
        return None;
    }
    let mut f = empty(HangSaidBy::PytorchWatchdog);
    let rest = work_fields(&after[open + "WorkNCCL(".len()..], &mut f)?;
    if f.op.is_none() && f.timeout_ms.is_none() {
        return None;
    }
    f.ran_for_ms = rest
        .strip_prefix(" ran for ")
        .and_then(leading_number)
        .filter(|(_, r)| r.starts_with(" milliseconds"))
        .map(|(n, _)| n);
    (f.rank, f.process_group) = prefix(before);
    Some(f)
}

/// The fields of `WorkNCCL(` up to its `)`, into `f`; what follows the `)`.
fn work_fields<'a>(mut s: &'a str, f: &mut HangFacts) -> Option<&'a str> {
    loop {
        let (key, rest) = s.split_once('=')?;
        // A value runs to `, ` or `)`; a shape's `[2, 3]` to its `]`.
        let end = if rest.starts_with('[') {
            rest.find(']')? + 1
        } else {
            rest.find([',', ')'])?
        };
        let value = &rest[..end];
        match key {
            "SeqNum" => f.seq = value.parse().ok(),
            "OpType" => {
                let op_ok = !value.is_empty()
                    && value.len() <= 32
                    && value.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
                f.op = op_ok.then(|| value.to_string());
            }
            "NumelIn" => f.numel_in = value.parse().ok(),
            "NumelOut" => f.numel_out = value.parse().ok(),
            "Timeout(ms)" => f.timeout_ms = value.parse().ok(),
            "TensorShape" => {}
            _ => return None,
        }
        let after = &rest[end..];
        if let Some(next) = after.strip_prefix(", ") {
            s = next;
        } else {
            return after.strip_prefix(')');
        }
    }
}

/// The rank and process group of the nearest `[... Rank N]` before the text: `[Rank 3]`, `[PG
/// 0 (default_pg) Rank 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`.
fn prefix(before: &str) -> (Option<u32>, Option<String>) {
    let Some(close) = before.rfind(']') else {
        return (None, None);
    };
    // The bracket that opens the prefix (a group's name may hold brackets of its own).
    let head = &before[..close];
    let Some(open) = head.rfind("[PG ").max(head.rfind("[Rank ")) else {
        return (None, None);
    };
    let inside = &before[open + 1..close];
    let Some((head, rank)) = inside.rsplit_once("Rank ") else {
        return (None, None);
    };
    let Ok(rank) = rank.parse::<u32>() else {
        return (None, None);
    };
    let pg = head.trim().strip_prefix("PG ").map(process_group);
    (Some(rank), pg.filter(|p| !p.is_empty()))
}

/// `0 (default_pg)` from `0 (default_pg)`, `ID 0 PG GUID 0(default_pg)` or `0`.
fn process_group(text: &str) -> String {
    let text = text.trim();
    let id = text
        .strip_prefix("ID ")
        .unwrap_or(text)
        .split([' ', '('])
        .next()
        .unwrap_or("");
    let name = text
        .rsplit_once('(')
        .and_then(|(_, n)| n.strip_suffix(')'))
        .filter(|n| !n.is_empty());
    let out = match name {
        Some(n) => format!("{id} ({n})"),
        None => id.to_string(),
    };
    crate::model::cut(&printable(&out), PG_MAX)
}

/// `[PG 0 Rank 25] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making
/// progress`.
fn torch_stuck(line: &str) -> Option<HangFacts> {
    let at = line.find(TORCH_WATCHDOG_STUCK_NEEDLE)?;
    let (n, rest) = leading_number(&line[at + TORCH_WATCHDOG_STUCK_NEEDLE.len()..])?;
    if !rest.starts_with(" seconds without making progress") {
        return None;
    }
    let mut f = empty(HangSaidBy::PytorchWatchdogStuck);
    f.timeout_ms = n.checked_mul(1000);
    (f.rank, f.process_group) = prefix(&line[..at]);
    Some(f)
}

/// `Termination timeout of 30 seconds exceeded. Exiting to ensure a consistent program state.`
fn xla(line: &str) -> Option<HangFacts> {
    let at = line.find(XLA_TERMINATION_NEEDLE)?;
    let before = &line[..at];
    let head = before.rfind("Termination timeout ")?;
    let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let number = &before[before.len() - digits..];
    if digits == 0 || !before[head..before.len() - digits].ends_with(" of ") {
        return None;
    }
    let mut f = empty(HangSaidBy::XlaRendezvous);
    f.timeout_ms = number.parse::<u64>().ok()?.checked_mul(1000);
    Some(f)
}

/// `One or more rank (marked by "!") is stalled for longer than 60 seconds. Will shutdown.`
fn horovod(line: &str) -> Option<HangFacts> {
    let at = line.find(HOROVOD_STALL_NEEDLE)?;
    if !line[..at].ends_with("One or more rank (marked by \"!\") ") {
        return None;
    }
    let (n, rest) = leading_number(&line[at + HOROVOD_STALL_NEEDLE.len()..])?;
    if !rest.starts_with(" seconds. Will shutdown") {
        return None;
    }
    let mut f = empty(HangSaidBy::HorovodStall);
    f.timeout_ms = n.checked_mul(1000);
    Some(f)
}

/// The decimal number `s` starts with, and what follows it.
fn leading_number(s: &str) -> Option<(u64, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n = s.get(..digits)?.parse().ok()?;
    Some((n, &s[digits..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn torch(line: &str) -> HangFacts {
        facts(TORCH_WATCHDOG, line).unwrap_or_else(|| panic!("{line}"))
    }

    #[test]
    fn every_spelling_pytorch_has_printed_is_read_whole() {
        // 2.5+ (seen in a job's log): the glog prefix, `[Rank N]`.
        let f = torch(
            "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught \
             collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, \
             NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 \
             milliseconds before timing out.",
        );
        assert_eq!(
            f,
            HangFacts {
                said_by: HangSaidBy::PytorchWatchdog,
                rank: Some(0),
                process_group: None,
                seq: Some(1),
                op: Some("BROADCAST".into()),
                numel_in: Some(131_072_000),
                numel_out: Some(131_072_000),
                timeout_ms: Some(600_000),
                ran_for_ms: Some(600_081),
            }
        );
        // logPrefix() with the process group, 2.3 and 2.4+.
        let f = torch(
            "[PG 0 (default_pg) Rank 3] Watchdog caught collective operation timeout: \
             WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran \
             for 600003 milliseconds before timing out.",
        );
        assert_eq!(
            (f.rank, f.process_group.as_deref()),
            (Some(3), Some("0 (default_pg)"))
        );
        let f = torch(
            "  what():  [PG ID 1 PG GUID 1(tp) Rank 5] Process group watchdog thread terminated \
             with exception: [PG ID 1 PG GUID 1(tp) Rank 5] Watchdog caught collective operation \
             timeout: WorkNCCL(SeqNum=155856, OpType=_ALLGATHER_BASE, NumelIn=11577920, \
             NumelOut=92623360, Timeout(ms)=600000) ran for 600071 milliseconds before timing \
             out.",
        );
        assert_eq!(
            (f.rank, f.process_group.as_deref(), f.op.as_deref()),
            (Some(5), Some("1 (tp)"), Some("_ALLGATHER_BASE"))
        );
        // 1.9-1.12: a shape, commas inside it.
        let f = torch(
            "RuntimeError: [Rank 1] Watchdog caught collective operation timeout: \
             WorkNCCL(SeqNum=4565, OpType=ALLREDUCE, TensorShape=[2, 3], Timeout(ms)=1800000) \
             ran for 1800347 milliseconds before timing out.",
        );
        assert_eq!(
            (f.seq, f.timeout_ms, f.ran_for_ms),
            (Some(4565), Some(1_800_000), Some(1_800_347))
        );
        // 1.7: no SeqNum, no duration; the timeout stands for it.
        let f = torch(
            "I0101 ProcessGroupNCCL.cpp:436] [Rank 2] Watchdog caught collective operation \
             timeout for work: WorkNCCL(OpType=ALLGATHER, TensorShape=[1024], \
             Timeout(ms)=1800000)",
        );
        assert_eq!(
            (f.rank, f.op.as_deref(), f.ran_for_ms, f.timeout_ms),
            (Some(2), Some("ALLGATHER"), None, Some(1_800_000))
        );
        assert_eq!(
            f.duration(),
            Some(std::time::Duration::from_secs(1800)),
            "the timeout when it ran for nothing said"
        );
        // `wait()`'s spelling (NCCL_BLOCKING_WAIT).
        let f = torch(
            "Caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BARRIER, \
             Timeout(ms)=5000) ran for 5012 milliseconds before timing out.",
        );
        assert_eq!((f.rank, f.ran_for_ms), (None, Some(5012)));
    }

    #[test]
    fn lookalikes_are_not_hangs() {
        for line in [
            "grep 'Watchdog caught collective operation timeout' train.log",
            "Watchdog caught collective operation timeout",
            "on a collective operation timeout: retry",
            "Watchdog caught collective operation timeout: WorkNCCL(Foo=1)",
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1",
            "Watchdog caught collective operation timeout: see WorkNCCL(SeqNum=1, \
             OpType=ALLREDUCE, Timeout(ms)=1)",
        ] {
            assert_eq!(facts(TORCH_WATCHDOG, line), None, "{line}");
        }
        assert_eq!(
            facts(
                TORCH_WATCHDOG_STUCK,
                "ProcessGroupNCCL's watchdog got stuck for a while"
            ),
            None
        );
        assert_eq!(
            facts(
                XLA_TERMINATION,
                "15 seconds exceeded. Exiting to ensure a consistent program state."
            ),
            None
        );
        assert_eq!(
            facts(
                HOROVOD_STALL,
                "a tensor is stalled for longer than 60 seconds. Will shutdown."
            ),
            None
        );
    }

    #[test]
    fn the_other_watchdogs_give_their_timeouts() {
        let f = facts(
            TORCH_WATCHDOG_STUCK,
            "[rank25]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 25] [PG 0 Rank 25] \
             ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress in \
             monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang",
        )
        .unwrap();
        assert_eq!(
            (f.said_by, f.rank, f.process_group.as_deref(), f.timeout_ms),
            (
                HangSaidBy::PytorchWatchdogStuck,
                Some(25),
                Some("0"),
                Some(600_000)
            )
        );
        let f = facts(
            XLA_TERMINATION,
            "E0625 12:01:02.000000 1234 rendezvous.cc:120] Termination timeout for \
             `acquire clique` of 30 seconds exceeded. Exiting to ensure a consistent program \
             state. Expected 8 threads to join the rendezvous, but only 7 of them arrived on time.",
        )
        .unwrap();
        assert_eq!(
            (f.said_by, f.timeout_ms),
            (HangSaidBy::XlaRendezvous, Some(30_000))
        );
        let f = facts(
            XLA_TERMINATION,
            "nccl_utils.cc:318] Termination timeout of 1800 seconds exceeded. Exiting to ensure a \
             consistent program state.",
        )
        .unwrap();
        assert_eq!(f.timeout_ms, Some(1_800_000));
        let f = facts(
            HOROVOD_STALL,
            "One or more rank (marked by \"!\") is stalled for longer than 300 seconds. Will \
             shutdown.",
        )
        .unwrap();
        assert_eq!(
            (f.said_by, f.timeout_ms),
            (HangSaidBy::HorovodStall, Some(300_000))
        );
    }

    #[test]
    fn named_from_says_the_facts_on_one_line() {
        let f = torch(
            "[PG 0 (default_pg) Rank 3] Watchdog caught collective operation timeout: \
             WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran \
             for 600003 milliseconds before timing out.",
        );
        assert_eq!(
            f.named_from(),
            "PyTorch's NCCL watchdog: ALLREDUCE SeqNum=7 on rank 3 (process group 0 \
             (default_pg)) ran for 600003 ms, Timeout(ms)=600000"
        );
    }

    #[test]
    fn garbage_never_panics_and_control_characters_are_written_out() {
        let f = torch(
            "[PG 0 (a\u{1b}[2Jb) Rank 1] Watchdog caught collective operation timeout: \
             WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=1) ran for 2 milliseconds before \
             timing out.",
        );
        assert_eq!(f.process_group.as_deref(), Some("0 (a\\x1b[2Jb)"));
        let seed = "[PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught collective operation \
                    timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, TensorShape=[1, 2], \
                    Timeout(ms)=600000) ran for 600003 milliseconds before timing out.";
        let mut rng = crate::fixtures::rng::Rng::new(0x4a46);
        for _ in 0..5_000 {
            let line = rng.mutate(seed.as_bytes());
            let line = String::from_utf8_lossy(&line);
            for row in [
                TORCH_WATCHDOG,
                TORCH_WATCHDOG_STUCK,
                XLA_TERMINATION,
                HOROVOD_STALL,
            ] {
                let _ = facts(row, &line);
            }
        }
        for cut in 0..=seed.len() {
            if let Some(p) = seed.get(..cut) {
                let _ = facts(TORCH_WATCHDOG, p);
            }
        }
    }
}

//! Pure: `shmlink probe` for a person. The table (what each column says is only what is known:
//! a copy that went through host memory is labelled so, a hung pair keeps the peer access it
//! was granted), a legend under it, and the progress lines written while it runs. Colours are
//! anstyle's ANSI styles, put in only when `colour` says (the caller decides: a terminal,
//! NO_COLOR, `--color`).

use std::time::Duration;

use anstyle::{AnsiColor, Style};

use super::assess::{CopyFacts, CopyPath, PeerAccess, ProbeReport};
use crate::model::{PairProbe, ProbeStatus};
use crate::text;

const OK: Style = AnsiColor::Green.on_default();
const DEGRADED: Style = AnsiColor::Yellow.on_default();
const FAILED: Style = AnsiColor::Red.on_default();
const CULPRIT: Style = AnsiColor::Red.on_default().bold();
const DIM: Style = Style::new().dimmed();

/// `text` in `style` when `colour`, padded to `width` by its visible length.
fn paint(text: &str, width: usize, style: Style, colour: bool) -> String {
    let pad = width.saturating_sub(text.chars().count());
    if colour {
        format!("{style}{text}{style:#}{:pad$}", "")
    } else {
        format!("{text}{:pad$}", "")
    }
}

fn status_word(s: ProbeStatus) -> (&'static str, Style) {
    match s {
        ProbeStatus::Ok => ("ok", OK),
        ProbeStatus::Degraded => ("DEGRADED", DEGRADED),
        ProbeStatus::Failed => ("FAILED", FAILED),
    }
}

fn peer_word(f: &CopyFacts) -> &'static str {
    match f.peer {
        PeerAccess::Granted => "yes",
        PeerAccess::Refused => "no",
        PeerAccess::NotTried => "-",
    }
}

fn path_word(f: &CopyFacts) -> &'static str {
    match f.path {
        Some(CopyPath::Peer) => "peer",
        Some(CopyPath::Host) => "host",
        None => "-",
    }
}

fn verified_word(p: &PairProbe, f: &CopyFacts) -> &'static str {
    match (f.compared, p.verified) {
        (true, true) => "yes",
        (true, false) => "NO",
        (false, _) => "-",
    }
}

/// The copy's speed; through host memory it is the host's, and says so.
fn gbps_word(p: &PairProbe, f: &CopyFacts) -> String {
    match (p.gbps, f.path) {
        (None, _) => "-".into(),
        (Some(g), Some(CopyPath::Host)) => format!("{g:.1} host"),
        (Some(g), _) => format!("{g:.1}"),
    }
}

const HEADER: &str = "FROM  TO  STATUS    PEER  PATH  VERIFIED  GB/s        EXPECTED  REASON";

/// The lines under the table: what each word means.
const LEGEND: &[&str] = &[
    "STATUS    ok: copied, the bytes matched, at half or more of EXPECTED and of like pairs;",
    "          DEGRADED: slower than that; FAILED: an error, wrong bytes, no answer within the",
    "          deadline, a crash, or peer access refused where NVML says the pair can do P2P",
    "PEER      yes: peer access granted; no: CUDA refused it; -: not reached",
    "PATH      peer: GPU to GPU; host: staged through host memory (no peer access), its GB/s",
    "          the host's, not the pair's link",
    "VERIFIED  yes: the bytes read back matched; NO: they differed; -: not compared",
    "EXPECTED  GB/s the pair's path carries per NVML (its NVLinks, or PCIe generation x width)",
];

/// The table, the legend, the count, and each culprit GPU with what to do.
pub fn table(report: &ProbeReport, took: Duration, colour: bool) -> String {
    let mut out = format!("{HEADER}\n");
    for (p, f) in report.pairs.iter().zip(&report.facts) {
        let (word, style) = status_word(p.status);
        let num = |v: Option<f64>| v.map_or("-".to_string(), |g| format!("{g:.1}"));
        let row = format!(
            "{:<5} {:<3} {} {:<5} {:<5} {:<9} {:<11} {:<9} {}",
            p.from_gpu,
            p.to_gpu,
            paint(word, 9, style, colour),
            peer_word(f),
            path_word(f),
            verified_word(p, f),
            gbps_word(p, f),
            num(p.expected_gbps),
            p.reason.as_deref().unwrap_or("")
        );
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out.push('\n');
    for line in LEGEND {
        out.push_str(&paint(line, 0, DIM, colour));
        out.push('\n');
    }
    let (summary, advice) = text::probe_table(&report.pairs, &report.culprits, took);
    out.push('\n');
    out.push_str(&summary);
    out.push('\n');
    for line in advice {
        out.push_str(&paint(&line, 0, CULPRIT, colour));
        out.push('\n');
    }
    out
}

/// A pair as it ends: `[ 3/56] GPU 0 -> GPU 3  ok  181.2 GB/s  (0.4 s)`, and why when not ok.
pub fn progress_line(
    (done, total): (usize, usize),
    p: &PairProbe,
    f: &CopyFacts,
    took: Duration,
    colour: bool,
) -> String {
    let width = total.to_string().len();
    let (word, style) = status_word(p.status);
    let speed = match (p.gbps, f.path) {
        (Some(g), Some(CopyPath::Host)) => format!("  {g:.1} GB/s through the host"),
        (Some(g), _) => format!("  {g:.1} GB/s"),
        (None, _) => String::new(),
    };
    let why = p
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(": {r}"));
    format!(
        "[{done:>width$}/{total}] GPU {} -> GPU {}  {}{speed}  ({:.1} s){why}",
        p.from_gpu,
        p.to_gpu,
        paint(word, 0, style, colour),
        took.as_secs_f64()
    )
}

/// A pair not answering yet: `GPU 0 -> GPU 7 still copying after 5 s (deadline 10 s)`.
pub fn waiting_line(
    (from, to): (u32, u32),
    copying: bool,
    waited: Duration,
    deadline: Duration,
) -> String {
    let doing = if copying {
        "still copying"
    } else {
        "still setting up (contexts, peer access)"
    };
    format!(
        "        GPU {from} -> GPU {to} {doing} after {} s (deadline {} s)",
        waited.as_secs(),
        deadline.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(from: u32, to: u32, status: ProbeStatus, gbps: Option<f64>) -> PairProbe {
        PairProbe {
            from_gpu: from,
            to_gpu: to,
            status,
            peer_access: true,
            verified: status != ProbeStatus::Failed,
            gbps,
            expected_gbps: Some(450.0),
            reason: (status != ProbeStatus::Ok).then(|| "why".to_string()),
        }
    }

    fn facts(peer: PeerAccess, path: Option<CopyPath>, compared: bool) -> CopyFacts {
        CopyFacts {
            peer,
            path,
            compared,
        }
    }

    /// GPU 0 -> 1 fine; 1 -> 0 hung after peer access was granted; 0 -> 2 refused, copied
    /// through the host; 2 -> 0 corrupted.
    fn report() -> ProbeReport {
        let mut refused = pair(0, 2, ProbeStatus::Failed, Some(300.0));
        refused.peer_access = false;
        refused.verified = true;
        ProbeReport {
            pairs: vec![
                pair(0, 1, ProbeStatus::Ok, Some(300.0)),
                refused,
                pair(1, 0, ProbeStatus::Failed, None),
                pair(2, 0, ProbeStatus::Failed, Some(300.0)),
            ],
            facts: vec![
                facts(PeerAccess::Granted, Some(CopyPath::Peer), true),
                facts(PeerAccess::Refused, Some(CopyPath::Host), true),
                facts(PeerAccess::Granted, Some(CopyPath::Peer), false),
                facts(PeerAccess::Granted, Some(CopyPath::Peer), true),
            ],
            culprits: vec![0],
            unmatched: vec![],
        }
    }

    #[test]
    fn columns_say_what_is_known() {
        let t = table(&report(), Duration::from_millis(1500), false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], HEADER);
        assert_eq!(
            lines[1],
            "0     1   ok        yes   peer  yes       300.0       450.0"
        );
        assert_eq!(
            lines[2],
            "0     2   FAILED    no    host  yes       300.0 host  450.0     why"
        );
        assert_eq!(
            lines[3],
            "1     0   FAILED    yes   peer  -         -           450.0     why"
        );
        assert_eq!(
            lines[4],
            "2     0   FAILED    yes   peer  NO        300.0       450.0     why"
        );
        assert!(t.contains("\nPEER      yes: peer access granted; no: CUDA refused it"));
        assert!(t.contains("\n4 ordered pairs probed in 1.5 s: 1 ok, 3 not.\n"));
        assert!(t.contains("\nGPU 0 fails with every peer"));
        assert!(!t.contains('\x1b'), "no colour asked: {t}");
    }

    #[test]
    fn colour_marks_status_and_culprit_and_keeps_columns() {
        let t = table(&report(), Duration::from_secs(1), true);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[1],
            "0     1   \x1b[32mok\x1b[0m        yes   peer  yes       300.0       450.0"
        );
        assert!(lines[2].contains("\x1b[31mFAILED\x1b[0m    no    host"));
        assert!(
            t.contains("\x1b[1m\x1b[31mGPU 0 fails with every peer"),
            "bold red culprit: {t}"
        );
        let plain = |s: &str| {
            let mut out = String::new();
            let mut esc = false;
            for c in s.chars() {
                match (esc, c) {
                    (_, '\x1b') => esc = true,
                    (true, 'm') => esc = false,
                    (true, _) => {}
                    (false, c) => out.push(c),
                }
            }
            out
        };
        assert_eq!(
            plain(&t),
            table(&report(), Duration::from_secs(1), false),
            "the same text without the styles"
        );
    }

    #[test]
    fn progress_lines_for_a_finished_a_host_copied_and_a_waiting_pair() {
        let r = report();
        let took = Duration::from_millis(400);
        assert_eq!(
            progress_line((3, 56), &r.pairs[0], &r.facts[0], took, false),
            "[ 3/56] GPU 0 -> GPU 1  ok  300.0 GB/s  (0.4 s)"
        );
        assert_eq!(
            progress_line((12, 56), &r.pairs[1], &r.facts[1], took, false),
            "[12/56] GPU 0 -> GPU 2  FAILED  300.0 GB/s through the host  (0.4 s): why"
        );
        assert_eq!(
            progress_line((1, 2), &r.pairs[0], &r.facts[0], took, true),
            "[1/2] GPU 0 -> GPU 1  \x1b[32mok\x1b[0m  300.0 GB/s  (0.4 s)"
        );
        assert_eq!(
            waiting_line(
                (0, 7),
                true,
                Duration::from_millis(5200),
                Duration::from_secs(10)
            ),
            "        GPU 0 -> GPU 7 still copying after 5 s (deadline 10 s)"
        );
        assert!(waiting_line((0, 7), false, Duration::ZERO, Duration::ZERO)
            .contains("still setting up"));
    }
}

//! `check`'s output: tables for a person, JSON for machines. Failures are grouped
//! (`failures.rs`); on a terminal long messages wrap under their line, on a pipe each stays
//! whole on one line (a reader of the pipe greps whole messages).

pub mod failures;

use std::io::{self, Write};
use std::time::SystemTime;

use crate::model::PairStatus;
use crate::model::Severity;
use crate::model::{ShmReading, ShmStatus, Snapshot};
use crate::units::human_bytes;

pub fn write_json(out: &mut impl Write, snapshot: &Snapshot) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, snapshot)?;
    writeln!(out)
}

/// How the tables are written: colour, and the width to wrap messages at (None: never wrap).
#[derive(Debug, Clone, Copy, Default)]
pub struct Style {
    pub colour: bool,
    pub width: Option<usize>,
}

impl Style {
    fn paint(self) -> Paint {
        Paint { on: self.colour }
    }
}

/// The narrowest width wrapped to: a narrower terminal gets long lines rather than a column of
/// single words.
const WIDTH_MIN: usize = 40;

/// Tables sorted by fullness, fullest first; the failures grouped, the workload's own first.
pub fn write_tables(out: &mut impl Write, snapshot: &Snapshot, style: Style) -> io::Result<()> {
    let paint = style.paint();
    writeln!(out, "node {}", snapshot.node)?;
    writeln!(out)?;
    // What the scan could not see comes first: a person must read it before any table.
    for &reason in &snapshot.blind {
        let line = crate::text::blind(reason, &snapshot.sight);
        let line = if reason.is_total() {
            paint.red(&line)
        } else {
            paint.yellow(&line)
        };
        write_wrapped(out, &line, "", "  ", style.width)?;
    }
    if !snapshot.blind.is_empty() {
        writeln!(out)?;
    }
    if snapshot.shm.is_empty() {
        let none = if snapshot.blind_totally().next().is_some() {
            "No containers measured."
        } else {
            "No containers found."
        };
        writeln!(out, "{none}")?;
    } else {
        write_shm_table(out, &snapshot.shm, paint)?;
    }
    writeln!(out)?;
    if snapshot.gpus.is_empty() {
        writeln!(out, "{}", crate::text::no_gpus_because(&snapshot.nvml))?;
    } else {
        write_gpus(out, snapshot, paint)?;
    }
    writeln!(out)?;
    let now = snapshot.taken_at.unwrap_or_else(SystemTime::now);
    failures::write(out, &snapshot.failures, now, style)?;
    write_findings(out, snapshot, style)
}

/// The scan's findings (the failures' own are in their groups), or why there are none.
fn write_findings(out: &mut impl Write, snapshot: &Snapshot, style: Style) -> io::Result<()> {
    let paint = style.paint();
    let of_a_failure = |f: &crate::model::Finding| {
        snapshot
            .failures
            .iter()
            .any(|x| x.kind == f.kind && x.message == f.message)
    };
    let findings: Vec<_> = snapshot
        .findings
        .iter()
        .filter(|f| !of_a_failure(f))
        .collect();
    if snapshot.findings.is_empty() && !snapshot.blind.is_empty() {
        let total = snapshot.blind_totally().next().is_some();
        writeln!(out, "{}", crate::text::no_findings_but_blind(total))?;
    } else if snapshot.findings.is_empty() {
        writeln!(out, "{}", paint.green("No findings: all healthy."))?;
    } else if findings.is_empty() {
        writeln!(out, "No other findings.")?;
    } else {
        writeln!(out, "Findings:")?;
        for f in findings {
            let level = match f.severity {
                Severity::Critical => paint.red("CRITICAL"),
                Severity::Warning => paint.yellow("WARNING"),
            };
            // A message with a YAML snippet keeps its lines under the finding.
            let line = format!("{level} {} ({}): {}", f.subject, f.kind, f.message);
            write_wrapped(out, &line, "  ", "      ", style.width)?;
        }
    }
    Ok(())
}

/// `text` with `first` before its first line and `rest` before the others; with a width, each
/// line wrapped at it (a line's own leading spaces kept on its wrapped lines).
fn write_wrapped(
    out: &mut impl Write,
    text: &str,
    first: &str,
    rest: &str,
    width: Option<usize>,
) -> io::Result<()> {
    for (i, line) in text.lines().enumerate() {
        let indent = if i == 0 { first } else { rest };
        let Some(width) = width else {
            writeln!(out, "{indent}{line}")?;
            continue;
        };
        let body = line.trim_start();
        let lead = &line[..line.len() - body.len()];
        let (initial, subsequent) = (format!("{indent}{lead}"), format!("{rest}{lead}"));
        let options = textwrap::Options::new(width.max(WIDTH_MIN))
            .initial_indent(&initial)
            .subsequent_indent(&subsequent)
            .break_words(false);
        writeln!(out, "{}", textwrap::fill(body, options))?;
    }
    Ok(())
}

fn write_shm_table(out: &mut impl Write, readings: &[ShmReading], paint: Paint) -> io::Result<()> {
    let mut rows: Vec<&ShmReading> = readings.iter().collect();
    rows.sort_by(|a, b| {
        let fa = a.fullness().unwrap_or(-1.0);
        let fb = b.fullness().unwrap_or(-1.0);
        fb.total_cmp(&fa)
            .then_with(|| a.subject().cmp(&b.subject()))
    });
    let header = [
        "STATUS",
        "CONTAINER",
        "PID",
        "/DEV/SHM",
        "USED",
        "AVAILABLE",
        "USE%",
        "MEM LIMIT",
        "IPC",
    ];
    let table: Vec<[String; 9]> = rows.iter().map(|r| shm_row(r)).collect();
    let mut widths = header.map(str::len);
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 9]| {
        cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i >= 2 && i != 8 {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header).trim_end())?;
    for (row, r) in table.iter().zip(&rows) {
        let text = line(row.each_ref().map(String::as_str));
        // Colour the status word after padding so escape codes do not skew the columns.
        let text = match r.status {
            ShmStatus::Critical => text.replacen("critical", &paint.red("critical"), 1),
            ShmStatus::Warning => text.replacen("warning", &paint.yellow("warning"), 1),
            ShmStatus::Ok => text,
        };
        writeln!(out, "{}", text.trim_end())?;
    }
    Ok(())
}

fn write_gpus(out: &mut impl Write, snapshot: &Snapshot, paint: Paint) -> io::Result<()> {
    writeln!(
        out,
        "{:<4}  {:<28}  {:<16}  {:>12}  {:>12}",
        "GPU", "NAME", "PCI BUS", "NVLINKS UP", "PCIE REPLAYS"
    )?;
    for g in &snapshot.gpus {
        let up = g.links.iter().filter(|l| l.active).count();
        let links = if g.lost {
            paint.red("LOST")
        } else {
            format!("{up}/{}", g.links.len())
        };
        let replays = g
            .pcie_replays
            .map_or_else(|| "-".to_string(), |n| n.to_string());
        writeln!(
            out,
            "{:<4}  {:<28}  {:<16}  {:>12}  {:>12}",
            g.index, g.name, g.pci_bus_id, links, replays
        )?;
    }
    if snapshot.gpu_pairs.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "GPU pair health (ok, DEG = degraded, DOWN):")?;
    let n = snapshot.gpus.len();
    let mut header = String::from("      ");
    for g in &snapshot.gpus {
        header.push_str(&format!("{:>6}", format!("GPU{}", g.index)));
    }
    writeln!(out, "{header}")?;
    let status_of = |a: u32, b: u32| {
        let (lo, hi) = (a.min(b), a.max(b));
        snapshot
            .gpu_pairs
            .iter()
            .find(|p| p.gpu == lo && p.peer_gpu == hi)
            .map(|p| p.status)
    };
    for a in snapshot.gpus.iter().map(|g| g.index) {
        let mut row = format!("{:<6}", format!("GPU{a}"));
        for b in snapshot.gpus.iter().map(|g| g.index).take(n) {
            let cell = match (a == b, status_of(a, b)) {
                (true, _) => format!("{:>6}", "X"),
                (_, Some(PairStatus::Ok)) => format!("{:>6}", "ok"),
                (_, Some(PairStatus::Degraded)) => paint.yellow(&format!("{:>6}", "DEG")),
                (_, Some(PairStatus::Down)) => paint.red(&format!("{:>6}", "DOWN")),
                (_, None) => format!("{:>6}", "?"),
            };
            row.push_str(&cell);
        }
        writeln!(out, "{row}")?;
    }
    for p in snapshot
        .gpu_pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
    {
        for reason in &p.reasons {
            writeln!(out, "  GPU{} <-> GPU{}: {reason}", p.gpu, p.peer_gpu)?;
        }
    }
    Ok(())
}

fn shm_row(r: &ShmReading) -> [String; 9] {
    let size = |v: Option<u64>| v.map_or_else(|| "-".to_string(), human_bytes);
    let (shm, used, available) = match r.mounted {
        Some(true) => (
            r.size_bytes
                .map_or_else(|| "unlimited".to_string(), human_bytes),
            size(r.used_bytes),
            size(r.available_bytes),
        ),
        Some(false) => ("not mounted".to_string(), "-".to_string(), "-".to_string()),
        None => ("not measured".to_string(), "-".to_string(), "-".to_string()),
    };
    [
        r.status.as_str().to_string(),
        r.subject(),
        r.pid.to_string(),
        shm,
        used,
        available,
        r.fullness()
            .map_or_else(|| "-".to_string(), |f| format!("{:.0}%", f * 100.0)),
        r.memory_limit_bytes
            .map_or_else(|| "none".to_string(), human_bytes),
        if r.host_ipc { "host" } else { "private" }.to_string(),
    ]
}

#[derive(Clone, Copy)]
struct Paint {
    on: bool,
}

impl Paint {
    fn wrap(self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn red(self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    fn yellow(self, s: &str) -> String {
        self.wrap("33", s)
    }
    fn green(self, s: &str) -> String {
        self.wrap("32", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    const MIB: u64 = 1 << 20;

    fn reading(id: &str, used: u64, size: u64, status: ShmStatus) -> ShmReading {
        ShmReading {
            pid: 42,
            status,
            ..fixtures::shm_reading(id, size, used)
        }
    }

    #[test]
    fn the_table_lists_the_fullest_first_in_mib() {
        let snap = Snapshot {
            node: "n1".into(),
            shm: vec![
                reading("aaa", 10 * MIB, 64 * MIB, ShmStatus::Ok),
                reading("bbb", 62 * MIB, 64 * MIB, ShmStatus::Critical),
            ],
            ..Snapshot::default()
        };
        let mut out = Vec::new();
        write_tables(&mut out, &snap, Style::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let bbb = text.find("container bbb").unwrap();
        let aaa = text.find("container aaa").unwrap();
        assert!(bbb < aaa, "fullest first:\n{text}");
        assert!(text.contains("62.0 MiB"), "{text}");
        assert!(text.contains("97%"), "{text}");
        assert!(!text.contains('\x1b'), "no colour off a terminal");
    }

    #[test]
    fn colour_marks_the_status_only_when_asked() {
        let snap = Snapshot {
            shm: vec![reading("bbb", 62 * MIB, 64 * MIB, ShmStatus::Critical)],
            ..Snapshot::default()
        };
        let mut out = Vec::new();
        write_tables(
            &mut out,
            &snap,
            Style {
                colour: true,
                width: None,
            },
        )
        .unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("\x1b[1;31mcritical\x1b[0m"));
    }

    #[test]
    fn json_has_the_contract_fields() {
        let snap = Snapshot {
            node: "n1".into(),
            shm: vec![reading("bbb", 62 * MIB, 64 * MIB, ShmStatus::Critical)],
            ..Snapshot::default()
        };
        let mut out = Vec::new();
        write_json(&mut out, &snap).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["node"], "n1");
        assert_eq!(v["gpus"], serde_json::json!([]));
        assert_eq!(v["gpu_pairs"], serde_json::json!([]));
        let s = &v["shm"][0];
        for key in [
            "namespace",
            "pod",
            "pod_uid",
            "container",
            "container_id",
            "pid",
            "host_ipc",
            "mounted",
            "size_bytes",
            "used_bytes",
            "available_bytes",
            "memory_limit_bytes",
            "status",
        ] {
            assert!(s.get(key).is_some(), "missing {key}");
        }
        assert_eq!(s["status"], "critical");
        assert_eq!(s["size_bytes"], 64 * MIB);
    }

    fn blind_snapshot(blind: Vec<crate::model::Blind>) -> Snapshot {
        Snapshot {
            node: "n1".into(),
            blind,
            sight: crate::model::Sight {
                proc_root: "/host/prc".into(),
                unreadable: 10,
                ..Default::default()
            },
            nvml: crate::model::NvmlState {
                loaded: false,
                library: Some("/nonexistent/x.so".into()),
                error: Some("cannot open".into()),
                disabled: false,
            },
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_blind_scan_says_why_and_never_all_healthy() {
        use crate::model::Blind;
        let snap = blind_snapshot(vec![Blind::ContainersUnreadable]);
        let mut out = Vec::new();
        write_tables(&mut out, &snap, Style::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("all healthy"), "{text}");
        assert!(text.contains("blind (containers_unreadable): the processes of 10 cgroups"));
        assert!(text.contains("No containers measured."), "{text}");
        assert!(
            text.contains("nothing here is known to be healthy"),
            "{text}"
        );
        assert!(text.contains("GPUs: none (NVML did not load from /nonexistent/x.so: cannot open)"));

        let snap = blind_snapshot(vec![Blind::SomeContainersUnreadable]);
        let mut out = Vec::new();
        write_tables(&mut out, &snap, Style::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("all healthy"), "{text}");
        assert!(text.contains("partly blind"), "{text}");

        let mut out = Vec::new();
        write_tables(&mut out, &Snapshot::default(), Style::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("No containers found.") && text.contains("all healthy"));
    }

    #[test]
    fn json_carries_nvml_and_blind() {
        let snap = blind_snapshot(vec![crate::model::Blind::NoProcesses]);
        let mut out = Vec::new();
        write_json(&mut out, &snap).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["blind"], serde_json::json!(["no_processes"]));
        assert_eq!(v["nvml"]["loaded"], false);
        assert_eq!(v["nvml"]["library"], "/nonexistent/x.so");
        assert_eq!(v["nvml"]["error"], "cannot open");
        assert_eq!(v["sight"]["unreadable"], 10);
        let mut out = Vec::new();
        write_json(&mut out, &Snapshot::default()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["blind"],
            serde_json::json!([]),
            "empty when it saw everything"
        );
    }
}

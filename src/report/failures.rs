//! `check`'s failures for a person: grouped per container and kind with a count and the first
//! and last time, the workload's own first; deaths the kernel told of processes no scan placed
//! in a container after, in a short section (recent ones in full, older ones counted). Times
//! are relative to the check's own clock; `check --json` keeps every failure with its exact time.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::SystemTime;

use super::{write_wrapped, Paint, Style};
use crate::model::{Failure, FindingKind, Severity};
use crate::text;

/// Where a group's latest message starts, under its head line.
const MESSAGE_INDENT: &str = "       ";

/// One kind of failure of one container (or of processes outside any known container).
#[derive(Debug, Clone, PartialEq)]
pub struct Group<'a> {
    pub kind: FindingKind,
    /// The container as findings name it; None: processes outside any known container.
    pub who: Option<String>,
    pub count: usize,
    pub first: SystemTime,
    pub last: SystemTime,
    /// The newest of them, whose message the table prints.
    pub latest: &'a Failure,
}

/// A failure no scan placed in a container: a process the kernel named (a host process, or one
/// gone before it could be placed).
pub fn outside_containers(f: &Failure) -> bool {
    f.placed.is_outside_containers()
}

/// The failures grouped: (the workload's own, the processes outside any known container), each
/// newest first.
pub fn groups(failures: &[Failure]) -> (Vec<Group<'_>>, Vec<Group<'_>>) {
    let mut by: BTreeMap<(bool, Option<String>, FindingKind), Group<'_>> = BTreeMap::new();
    for f in failures.iter().filter(|f| !f.is_workload_word()) {
        let at = f.at.time();
        let other = outside_containers(f);
        let who = (!other).then(|| f.placed.clone().to_string());
        by.entry((other, who.clone(), f.kind))
            .and_modify(|g| {
                g.count += 1;
                g.first = g.first.min(at);
                if at >= g.last {
                    g.last = at;
                    g.latest = f;
                }
            })
            .or_insert(Group {
                kind: f.kind,
                who,
                count: 1,
                first: at,
                last: at,
                latest: f,
            });
    }
    let (mut others, mut own): (Vec<Group<'_>>, Vec<Group<'_>>) =
        by.into_values().partition(|g| g.who.is_none());
    for list in [&mut own, &mut others] {
        list.sort_by(|a, b| b.last.cmp(&a.last).then(a.kind.cmp(&b.kind)));
    }
    (own, others)
}

/// `3x shm_bus_error  ml/train-0/worker  last 12 min ago, first 40 min ago`.
pub(super) fn head(g: &Group<'_>, now: SystemTime, paint: Paint) -> String {
    let what = format!("{}x {}", g.count, g.kind);
    let what = match g.kind.default_severity() {
        Severity::Critical => paint.red(&what),
        Severity::Warning => paint.yellow(&what),
    };
    let who = g.who.as_deref().map_or(String::new(), |w| format!("  {w}"));
    let when = if g.count == 1 {
        text::ago(g.last, now)
    } else {
        format!(
            "last {}, first {}",
            text::ago(g.last, now),
            text::ago(g.first, now)
        )
    };
    format!("{what}{who}  {when}")
}

/// The latest failure's message with its exact time said as how long ago (the time is the
/// failure's own `at`, written into the sentence as ` at <at>`).
pub fn message_then(f: &Failure, now: SystemTime) -> String {
    f.message.replacen(
        &format!(" at {}", f.at),
        &format!(" {}", text::ago(f.at.time(), now)),
        1,
    )
}

/// The workload's own failures, then the deaths of processes outside any known container:
/// those of the last [`text::RECENT`] in full, older ones counted in one line.
pub fn write(
    out: &mut impl Write,
    failures: &[Failure],
    now: SystemTime,
    style: Style,
) -> io::Result<()> {
    let (own, others) = groups(failures);
    if !own.is_empty() {
        let deaths: usize = own.iter().map(|g| g.count).sum();
        writeln!(
            out,
            "Workload failures ({deaths}, by container and kind, newest first):"
        )?;
        write_groups(out, &own, now, style)?;
        writeln!(out)?;
    }
    if others.is_empty() {
        return Ok(());
    }
    let recent_since = now
        .checked_sub(text::RECENT)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let (recent, older): (Vec<Group<'_>>, Vec<Group<'_>>) =
        others.into_iter().partition(|g| g.last >= recent_since);
    writeln!(
        out,
        "Kernel-log deaths of processes outside any known container:"
    )?;
    write_groups(out, &recent, now, style)?;
    if !older.is_empty() {
        let n: usize = older.iter().map(|g| g.count).sum();
        let newest = older.iter().map(|g| g.last).max().unwrap_or(now);
        let line = text::older_deaths_elsewhere(n, &text::ago(newest, now));
        write_wrapped(out, &line, "  ", "    ", style.width)?;
    }
    writeln!(out)
}

fn write_groups(
    out: &mut impl Write,
    groups: &[Group<'_>],
    now: SystemTime,
    style: Style,
) -> io::Result<()> {
    for g in groups {
        writeln!(out, "  {}", head(g, now, style.paint()))?;
        let message = message_then(g.latest, now);
        write_wrapped(out, &message, MESSAGE_INDENT, MESSAGE_INDENT, style.width)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

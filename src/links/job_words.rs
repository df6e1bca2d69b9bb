//! What the links of a failed job's GPUs did while it ran: the sentence appended to the
//! failure's message (and so its Event note, cut at 1 KiB: at most three links are named).

use crate::model::{GpuLinkDelta, GpuLinks};

/// Links named at most; the rest are counted.
const NAMED: usize = 3;
/// Bytes the named links take at most (the first is named whatever its length): the note
/// keeps room for the failure's own words.
const BUDGET: usize = 240;

/// ` Its GPUs' 36 NVLinks while it ran (since 12:01:07 UTC, before it started): GPU 7 link 3
/// (to GPU 0) recovery +2, down 1x, up 1x; the rest clean.` Never "clean" for a link whose
/// counters were not read.
pub fn job_links(l: &GpuLinks) -> String {
    let total = l.watched + l.unread;
    if total == 0 {
        // No NVLink listed on its GPUs (a PCIe board, or NVML never answered): nothing to say,
        // and nothing called clean.
        return String::new();
    }
    let since = clock(&l.since);
    let when = if l.since_start {
        format!("since {since}, before it started")
    } else {
        format!("since {since}, when the agent first saw it")
    };
    let head = format!(
        " Its GPUs' {total} NVLink{} while it ran ({when}, to {})",
        if total == 1 { "" } else { "s" },
        clock(&l.until)
    );
    let unread = match l.unread {
        0 => String::new(),
        n if n == total => {
            return format!(
                "{head}: not read at the end (NVML did not answer): nothing known of them."
            )
        }
        n => format!("; {n} not read at the end (NVML did not answer), so not known clean"),
    };
    if l.changed.is_empty() {
        let clean = if l.unread == 0 {
            "all clean: no errors, recoveries or link drops (the hardware's links were not the \
             cause)"
                .to_string()
        } else {
            format!("the {} read ones clean", l.watched)
        };
        return format!("{head}: {clean}{unread}.");
    }
    // Named while they fit the budget (the first always), the rest counted.
    let mut parts: Vec<String> = Vec::new();
    let mut used = 0;
    for c in l.changed.iter().take(NAMED) {
        let part = change(c);
        if !parts.is_empty() && used + part.len() > BUDGET {
            break;
        }
        used += part.len() + 2;
        parts.push(part);
    }
    if l.changed.len() > parts.len() {
        parts.push(format!(
            "{} more links changed",
            l.changed.len() - parts.len()
        ));
    }
    let rest = if (l.changed.len() as u32) < l.watched {
        "; the rest clean"
    } else {
        ""
    };
    format!("{head}: {}{rest}{unread}.", parts.join("; "))
}

/// `GPU 0`, `an NVSwitch`: a link's far end as the metrics' `peer` label spells it.
pub(crate) fn peer_name(peer: &str) -> String {
    match peer.strip_prefix("gpu:") {
        Some(i) => format!("GPU {i}"),
        None if peer == "switch" => "an NVSwitch".into(),
        None => peer.to_string(),
    }
}

/// `recovery +2, down 1x, up 1x`: what a link's counters did.
pub(crate) fn counted(d: &GpuLinkDelta) -> Vec<String> {
    let counters = [
        ("replay", d.replay),
        ("recovery", d.recovery),
        ("CRC flit", d.crc_flit),
        ("CRC data", d.crc_data),
        ("ECC data", d.ecc_data),
        ("recoveries ok", d.recovery_successful),
        ("recoveries failed", d.recovery_failed),
        ("recovery events", d.recovery_events),
        ("symbol errors", d.symbol),
        ("effective errors", d.effective),
    ];
    let mut what: Vec<String> = counters
        .iter()
        .filter_map(|(name, v)| v.filter(|&v| v > 0).map(|v| format!("{name} +{v}")))
        .collect();
    if d.went_down > 0 {
        what.push(format!("down {}x", d.went_down));
    }
    if d.came_up > 0 {
        what.push(format!("up {}x", d.came_up));
    }
    what
}

/// `GPU 7 link 3 (to GPU 0) recovery +2, down 1x, up 1x`.
fn change(d: &GpuLinkDelta) -> String {
    format!(
        "GPU {} link {} (to {}) {}",
        d.gpu,
        d.link,
        peer_name(&d.peer),
        counted(d).join(", ")
    )
}

/// `12:01:07 UTC` of an RFC 3339 time in UTC; the text as it is otherwise.
pub(crate) fn clock(rfc3339: &str) -> String {
    match rfc3339.get(11..19) {
        Some(hms) if rfc3339.as_bytes().get(10) == Some(&b'T') && rfc3339.ends_with('Z') => {
            format!("{hms} UTC")
        }
        _ => rfc3339.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(changed: Vec<GpuLinkDelta>, watched: u32, unread: u32) -> GpuLinks {
        GpuLinks {
            since: "2026-11-27T12:01:07.25Z".into(),
            since_start: true,
            until: "2026-11-27T12:09:30Z".into(),
            watched,
            unread,
            changed,
        }
    }

    fn recovered() -> GpuLinkDelta {
        GpuLinkDelta {
            gpu: 7,
            link: 3,
            peer: "gpu:0".into(),
            replay: Some(0),
            recovery: Some(2),
            went_down: 1,
            came_up: 1,
            ..GpuLinkDelta::default()
        }
    }

    #[test]
    fn a_changed_link_is_named_with_its_counts_and_the_rest_called_clean() {
        assert_eq!(
            job_links(&links(vec![recovered()], 36, 0)),
            " Its GPUs' 36 NVLinks while it ran (since 12:01:07 UTC, before it started, to \
             12:09:30 UTC): GPU 7 link 3 (to GPU 0) recovery +2, down 1x, up 1x; the rest clean."
        );
    }

    #[test]
    fn clean_only_when_every_link_was_read() {
        let all = job_links(&links(vec![], 36, 0));
        assert!(all.ends_with("all clean: no errors, recoveries or link drops (the hardware's links were not the cause)."), "{all}");
        let some = job_links(&links(vec![], 30, 6));
        assert!(!some.contains("all clean"), "{some}");
        assert!(
            some.contains("the 30 read ones clean; 6 not read at the end"),
            "{some}"
        );
        let none = job_links(&links(vec![], 0, 36));
        assert!(!none.contains("clean"), "{none}");
        assert!(none.contains("nothing known"), "{none}");
        assert_eq!(
            job_links(&links(vec![], 0, 0)),
            "",
            "no NVLink listed: nothing said"
        );
    }

    #[test]
    fn at_most_three_links_are_named_and_the_note_stays_short() {
        let many: Vec<GpuLinkDelta> = (0..18)
            .map(|l| GpuLinkDelta {
                link: l,
                peer: "switch".into(),
                recovery_successful: Some(4),
                recovery_failed: Some(1),
                symbol: Some(1000),
                went_down: 2,
                came_up: 2,
                ..GpuLinkDelta::default()
            })
            .collect();
        let text = job_links(&links(many, 144, 0));
        assert!(text.contains("more links changed"), "{text}");
        assert!(
            text.contains(
                "(to an NVSwitch) recoveries ok +4, recoveries failed +1, symbol errors +1000"
            ),
            "{text}"
        );
        assert!(text.len() < 400, "{} bytes", text.len());
    }
}

//! Links that fail slowly: an NVLink error counter growing a little every day.

use crate::model::{LinkTrend, Peer};

/// Links named in one finding at most; the rest are counted.
const NAMED_MAX: usize = 3;

/// `gpu`'s steadily growing link counters (`links`: each with `growing` set), and the fix.
pub fn link_errors_growing(gpu: u32, links: &[&LinkTrend]) -> String {
    let mut parts: Vec<String> = links
        .iter()
        .take(NAMED_MAX)
        .filter_map(|t| {
            let g = t.growing?;
            Some(format!(
                "NVLink {} ({}) {} grew by {} on {} days since {} ({} a day, {} an hour)",
                t.link,
                peer(&t.peer),
                t.counter.as_str(),
                g.growth,
                g.days,
                humantime::format_rfc3339_seconds(g.since),
                rate(g.per_day),
                rate(g.per_day / 24.0),
            ))
        })
        .collect();
    if links.len() > NAMED_MAX {
        parts.push(format!("and {} more", links.len() - NAMED_MAX));
    }
    format!(
        "NVLink errors on GPU {gpu} grow a little every day: {}. A link that wears out like this \
         tends to fail outright later and kill the jobs across it. Open a hardware ticket for \
         this GPU's link: drain its jobs when convenient, then reseat or replace the GPU, its \
         NVLink bridge or cable as the vendor says; meanwhile watch it with `shmlink check`.",
        parts.join("; ")
    )
}

/// On a failure: the job's GPUs whose links wear out (`links`: each with `growing` set), in one
/// short sentence ("" when none), so a death on such a link is not blamed on the code alone.
pub fn wearing_links_of_job(links: &[&LinkTrend]) -> String {
    let parts: Vec<String> = links
        .iter()
        .take(NAMED_MAX)
        .filter_map(|t| {
            let g = t.growing?;
            Some(format!(
                "GPU {} NVLink {} {} +{} a day since {}",
                t.gpu,
                t.link,
                t.counter.as_str(),
                rate(g.per_day),
                humantime::format_rfc3339_seconds(g.since),
            ))
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    let more = match links.len().saturating_sub(NAMED_MAX) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        " A link of its GPUs has been wearing out for days ({}{more}): a hardware ticket, whatever \
         killed this run.",
        parts.join("; ")
    )
}

fn peer(p: &Peer) -> String {
    match p {
        Peer::Gpu(i) => format!("to GPU {i}"),
        Peer::Switch => "to the NVSwitch".into(),
        Peer::Pci(bus) => format!("to {bus}"),
        Peer::Unknown => "peer unknown".into(),
    }
}

/// Two significant decimals below 10, whole numbers above.
fn rate(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}")
    } else if r >= 1.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LinkCounter, SteadyGrowth};
    use std::time::{Duration, UNIX_EPOCH};

    /// Link 14 to the NVSwitch, its recovery count grown 15 over 5 days.
    fn growing_recovery(gpu: u32, uuid: &str) -> LinkTrend {
        LinkTrend {
            gpu,
            uuid: uuid.into(),
            link: 14,
            peer: Peer::Switch,
            counter: LinkCounter::Recovery,
            per_hour: 0.1,
            growing: Some(SteadyGrowth {
                since: UNIX_EPOCH + Duration::from_secs(1_788_566_400),
                growth: 15,
                days: 5,
                per_day: 3.0,
            }),
        }
    }

    #[test]
    fn names_the_link_its_peer_counter_rate_since_and_fix() {
        let t = growing_recovery(0, "GPU-a");
        let m = link_errors_growing(0, &[&t]);
        assert!(
            m.contains("NVLink 14 (to the NVSwitch) recovery grew by 15 on 5 days"),
            "{m}"
        );
        assert!(
            m.contains("since 2026-09-05T00:00:00Z (3.0 a day, 0.12 an hour)"),
            "{m}"
        );
        assert!(
            m.contains("hardware ticket") && m.contains("shmlink check"),
            "{m}"
        );
        assert!(m.len() < 600, "fits an Event note with room: {}", m.len());
    }

    #[test]
    fn a_jobs_wearing_links_are_one_short_sentence_and_none_says_nothing() {
        let t = growing_recovery(7, "GPU-h");
        let said = wearing_links_of_job(&[&t]);
        assert_eq!(
            said,
            " A link of its GPUs has been wearing out for days (GPU 7 NVLink 14 recovery +3.0 a \
             day since 2026-09-05T00:00:00Z): a hardware ticket, whatever killed this run."
        );
        assert_eq!(wearing_links_of_job(&[]), "");
    }
}

//! Where tracefs is, and what it says of the two tracepoints: their ids (`perf_event_open`'s
//! config) and formats; and which CPUs are online (one event per CPU).

use std::io;
use std::path::{Path, PathBuf};

use super::format::parse_format;
use super::sample::Formats;

/// The file that tells a tracing directory holds the tracepoints.
pub const HAS_SIGNAL: &str = "events/signal/signal_generate/id";

/// Where tracefs is mounted under `sys_root` (`/sys`): the first of these that holds the
/// tracepoints, unless `explicit` names a mount.
pub fn find(sys_root: &Path, explicit: Option<&Path>) -> io::Result<PathBuf> {
    let candidates: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_path_buf()],
        None => vec![
            sys_root.join("kernel/tracing"),
            sys_root.join("kernel/debug/tracing"),
        ],
    };
    candidates
        .into_iter()
        .find(|dir| dir.join(HAS_SIGNAL).exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no tracefs with signal:signal_generate under {} (mount it: mount -t \
                     tracefs nodev {}/kernel/tracing)",
                    explicit.unwrap_or(sys_root).display(),
                    sys_root.display()
                ),
            )
        })
}

/// The ids and formats of `signal:signal_generate` and `oom:mark_victim`.
pub fn formats(tracefs: &Path) -> io::Result<Formats> {
    let read = |event: &str, file: &str| {
        crate::procfs::kfile::read_attribute_text(&tracefs.join("events").join(event).join(file))
    };
    let id = |event: &str| -> io::Result<u64> {
        read(event, "id")?
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{event} id: {e}")))
    };
    Ok(Formats {
        signal_id: id("signal/signal_generate")?,
        signal: parse_format(&read("signal/signal_generate", "format")?),
        victim_id: id("oom/mark_victim")?,
        victim: parse_format(&read("oom/mark_victim", "format")?),
    })
}

/// Pure: `0-3,5,7-8` (sysfs `devices/system/cpu/online`) -> the CPU numbers.
pub fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            // A bound against garbage: no machine has a million CPUs.
            cpus.extend((a..=b.min(a.saturating_add(1 << 20))).take(1 << 16));
        }
    }
    cpus
}

/// The online CPUs, from `sys_root`.
pub fn online_cpus(sys_root: &Path) -> io::Result<Vec<u32>> {
    let cpus = parse_cpu_list(&crate::procfs::kfile::read_attribute_text(
        &sys_root.join("devices/system/cpu/online"),
    )?);
    if cpus.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no online CPU listed",
        ));
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read_as_sysfs_writes_them() {
        assert_eq!(parse_cpu_list("0-1\n"), [0, 1]);
        assert_eq!(parse_cpu_list("0,2-4,7"), [0, 2, 3, 4, 7]);
        assert_eq!(parse_cpu_list("x-y,\n"), Vec::<u32>::new());
        assert!(parse_cpu_list("0-4294967295").len() <= 1 << 16);
    }

    #[test]
    fn tracefs_is_found_where_it_holds_the_tracepoints_and_its_formats_are_read() {
        let sys = tempfile::tempdir().unwrap();
        assert_eq!(
            find(sys.path(), None).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let t = sys.path().join("kernel/debug/tracing");
        for (event, id, format) in [
            (
                "signal/signal_generate",
                "261\n",
                include_str!("testdata/signal_generate.format"),
            ),
            (
                "oom/mark_victim",
                "609\n",
                include_str!("testdata/mark_victim.format"),
            ),
        ] {
            let dir = t.join("events").join(event);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("id"), id).unwrap();
            std::fs::write(dir.join("format"), format).unwrap();
        }
        std::fs::create_dir_all(sys.path().join("kernel/tracing")).unwrap();
        let found = find(sys.path(), None).unwrap();
        assert_eq!(found, t);
        let f = formats(&found).unwrap();
        assert_eq!((f.signal_id, f.victim_id), (261, 609));
        assert!(f.victim.field("anon_rss").is_some());
    }
}

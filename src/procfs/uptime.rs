//! How long the machine has been up, as /proc/uptime says it: to the hundredth of a second.
//! sysinfo(2) rounds it up to the next whole second, which would put a process's start up to a
//! second early. (A kernel record's time comes from the clocks themselves: `kernel_log::time`.)

use std::path::Path;
use std::time::Duration;

/// Time since boot from `<proc_root>/uptime`; sysinfo(2)'s whole seconds if that cannot be read.
pub fn since_boot(proc_root: &Path) -> Duration {
    let mut buf = [0u8; 128];
    super::kfile::read_small(&proc_root.join("uptime"), &mut buf)
        .ok()
        .and_then(|b| parse_uptime(std::str::from_utf8(b).ok()?))
        .unwrap_or_else(|| {
            Duration::from_secs(u64::try_from(rustix::system::sysinfo().uptime).unwrap_or(0))
        })
}

/// The first field of /proc/uptime: seconds since boot, `4312.84`.
fn parse_uptime(content: &str) -> Option<Duration> {
    let field = content.split_ascii_whitespace().next()?;
    let (secs, frac) = field.split_once('.').unwrap_or((field, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if secs.is_empty() || !digits(secs) || !digits(frac) || frac.len() > 9 {
        return None;
    }
    let nanos = if frac.is_empty() {
        0
    } else {
        frac.parse::<u32>().ok()? * 10u32.pow(9 - frac.len() as u32)
    };
    Some(Duration::new(secs.parse().ok()?, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_parses_to_the_hundredth() {
        assert_eq!(
            parse_uptime("4312.84 5164.96\n"),
            Some(Duration::from_millis(4_312_840))
        );
        assert_eq!(parse_uptime("7 1\n"), Some(Duration::from_secs(7)));
        for bad in [
            "",
            "\n",
            "-1.0 2",
            "1.2.3 4",
            "x",
            "1.1234567890 2",
            "+4.0 1",
        ] {
            assert_eq!(parse_uptime(bad), None, "{bad:?}");
        }
        assert!(parse_uptime(&std::fs::read_to_string("/proc/uptime").unwrap()).is_some());
    }
}

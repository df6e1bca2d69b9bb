//! When something happened, as a person reads it in a table: "12 min ago". JSON keeps the
//! exact RFC 3339 time; a table against the check's own clock says how long ago.

use std::time::{Duration, SystemTime};

/// `just now`, `40 s ago`, `12 min ago`, `3 h ago`, `2 days ago`: `then` against `now`, whole
/// units rounded down. A time after `now` (clocks apart by a little) is `just now`.
pub fn ago(then: SystemTime, now: SystemTime) -> String {
    let Ok(d) = now.duration_since(then) else {
        return "just now".into();
    };
    let s = d.as_secs();
    match s {
        0..5 => "just now".into(),
        5..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

pub use crate::model::parse_rfc3339;

/// How far back a time may be and still be "recent" in a table's short section.
pub const RECENT: Duration = Duration::from_secs(15 * 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_how_long_ago() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let at = |secs: u64| now - Duration::from_secs(secs);
        assert_eq!(ago(at(0), now), "just now");
        assert_eq!(
            ago(now + Duration::from_secs(3), now),
            "just now",
            "a clock ahead"
        );
        assert_eq!(ago(at(40), now), "40 s ago");
        assert_eq!(ago(at(12 * 60 + 59), now), "12 min ago");
        assert_eq!(ago(at(3 * 3600 + 1800), now), "3 h ago");
        assert_eq!(ago(at(47 * 3600), now), "47 h ago");
        assert_eq!(ago(at(2 * 86_400 + 5), now), "2 days ago");
    }

    #[test]
    fn rfc3339_times_read_back_to_the_nanosecond() {
        let t = parse_rfc3339("2026-11-26T17:11:00.659641085Z").unwrap();
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.subsec_nanos(), 659_641_085);
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}

//! A failure's moment, typed from the moment it is made to the moment it is written out: one
//! formatter ([`rfc3339`]) and one parser ([`parse_rfc3339`]) for the JSON, the store and the
//! API, so nothing downstream reads a time back from text.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{parse_rfc3339, rfc3339};

/// A moment written out as RFC 3339 UTC (the fraction's digits it has, `Z`), read back from
/// any RFC 3339 time. Ordered as time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(pub SystemTime);

impl Stamp {
    pub fn time(self) -> SystemTime {
        self.0
    }

    /// RFC 3339 text as a stamp; None when it is not a time.
    pub fn parse(text: &str) -> Option<Stamp> {
        parse_rfc3339(text).map(Stamp)
    }
}

impl From<SystemTime> for Stamp {
    fn from(t: SystemTime) -> Stamp {
        Stamp(t)
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&rfc3339(self.0))
    }
}

impl Serialize for Stamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stamp, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        Stamp::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn written_as_rfc3339_and_read_back_exactly() {
        for text in [
            "2026-11-26T18:00:00Z",
            "2026-11-26T17:11:00.659641085Z",
            "2026-11-26T17:11:00.5Z",
        ] {
            let s: Stamp = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(text));
        }
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_795_000_000, 123_000_000);
        let back: Stamp = serde_json::from_str(&serde_json::to_string(&Stamp(t)).unwrap()).unwrap();
        assert_eq!(back.time(), t);
    }

    #[test]
    fn any_offset_reads_and_is_written_in_utc() {
        let s = Stamp::parse("2026-11-26T19:00:00+01:00").unwrap();
        assert_eq!(s.to_string(), "2026-11-26T18:00:00Z");
        let bad: Result<Stamp, _> = serde_json::from_value(serde_json::json!("yesterday"));
        assert!(bad.is_err(), "a word is no time");
    }

    #[test]
    fn ordered_as_time_not_as_text() {
        // As text, "…:00Z" sorts after "…:00.5Z" ('Z' > '.') and an offset sorts by its
        // local clock: time orders them right.
        let a = Stamp::parse("2026-11-26T18:00:00Z").unwrap();
        let b = Stamp::parse("2026-11-26T18:00:00.5Z").unwrap();
        let c = Stamp::parse("2026-11-26T19:00:01+01:00").unwrap();
        assert!(a < b && b < c);
        assert!("2026-11-26T18:00:00Z" > "2026-11-26T18:00:00.5Z");
    }
}

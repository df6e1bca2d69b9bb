//! Pure: one /dev/kmsg record, its header and its message.
//!
//! A record is `<prefix>,<seq>,<usec>,<flags>[,more];<message>\n`, then optional continuation
//! lines that start with a space (` SUBSYSTEM=pci`); prefix = facility * 8 + level. The kernel
//! writes every byte of the message outside printable ASCII, and `\` itself, as `\xNN`
//! (`printk.c`, `msg_add_ext_text`), so unescaping is exact.

use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord {
    pub facility: u8,
    pub level: u8,
    pub seq: u64,
    /// microseconds since boot (CLOCK_MONOTONIC)
    pub usec: u64,
    pub message: String,
}

impl KmsgRecord {
    /// Whether the kernel wrote it: user space can write to /dev/kmsg, but its records carry
    /// another facility than the kernel's (0), and are never kernel facts.
    pub fn is_kernel(&self) -> bool {
        self.facility == 0
    }
}

/// One record as a read(2) of /dev/kmsg returns it; continuation lines are ignored.
pub fn parse_record(bytes: &[u8]) -> Option<KmsgRecord> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    let semi = line.iter().position(|&b| b == b';')?;
    let mut fields = line[..semi].split(|&b| b == b',');
    let prefix: u32 = decimal(fields.next()?)?;
    let seq = decimal(fields.next()?)?;
    let usec = decimal(fields.next()?)?;
    // The flags field is always there; a header without it is not a record.
    fields.next()?;
    Some(KmsgRecord {
        facility: u8::try_from(prefix >> 3).ok()?,
        level: (prefix & 7) as u8,
        seq,
        usec,
        message: String::from_utf8_lossy(&unescape(&line[semi + 1..])).into_owned(),
    })
}

/// Digits only: `str::parse` would also take a sign.
pub fn decimal<T: FromStr>(field: &[u8]) -> Option<T> {
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// The decimal number `s` starts with, and what follows it.
pub fn leading_decimal<T: FromStr>(s: &str) -> Option<(T, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    Some((decimal(&s.as_bytes()[..digits])?, &s[digits..]))
}

fn unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'\\' && text.get(i + 1) == Some(&b'x') {
            let hex = text
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok());
            if let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::kmsg::{self, records};

    #[test]
    fn every_fixture_record_parses() {
        for content in kmsg::ALL {
            let records = records(content);
            assert!(!records.is_empty());
            for r in &records {
                assert!(parse_record(r.as_bytes()).is_some(), "{r}");
            }
        }
    }

    #[test]
    fn a_record_splits_into_its_fields() {
        let r = parse_record(
            b"6,1234,5503016123,-,caller=T4242;python3[4242]: segfault at 0\n SUBSYSTEM=pci\n",
        )
        .unwrap();
        assert_eq!(
            r,
            KmsgRecord {
                facility: 0,
                level: 6,
                seq: 1234,
                usec: 5503016123,
                message: "python3[4242]: segfault at 0".into(),
            }
        );
        let user = parse_record(b"12,9,10,-;hello").unwrap();
        assert_eq!((user.facility, user.level), (1, 4));
    }

    #[test]
    fn continuation_lines_are_not_the_message() {
        let rs = records(kmsg::OTHER);
        let r = parse_record(rs[0].as_bytes()).unwrap();
        assert_eq!(
            r.message,
            "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint"
        );
    }

    #[test]
    fn escapes_are_undone_and_a_stray_backslash_stays() {
        let r = parse_record(b"6,1,2,-;rcu: \\x09RCU \\x5cx41 caf\\xc3\\xa9 \\xZZ \\x4").unwrap();
        assert_eq!(r.message, "rcu: \tRCU \\x41 café \\xZZ \\x4");
    }

    #[test]
    fn malformed_headers_are_no_record() {
        for bad in [
            &b""[..],
            b"\n",
            b"6,1,2,-",
            b"6,1,2;no flags",
            b"6,1;x",
            b"x,1,2,-;m",
            b"+6,1,2,-;m",
            b"6,-1,2,-;m",
            b"6,1,99999999999999999999999,-;m",
            b"2048,1,2,-;facility 256 does not fit",
            b" SUBSYSTEM=pci",
        ] {
            assert_eq!(parse_record(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // The largest facility the kernel can print still fits.
        assert_eq!(parse_record(b"2047,1,2,-;m").unwrap().facility, 255);
    }
}

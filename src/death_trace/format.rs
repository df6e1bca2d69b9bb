//! Pure: a tracepoint's format file (tracefs `events/<sys>/<name>/format`) and the fields of
//! its raw record, read by name at the offsets the running kernel states: never assumed.

/// One field of a tracepoint's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
    /// `__data_loc`: the field holds (length << 16 | offset) of data placed after the record.
    pub data_loc: bool,
}

/// The fields of one tracepoint, as its format file lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Format {
    pub fields: Vec<Field>,
}

/// Parses the `field:<decl>;\toffset:N;\tsize:N;\tsigned:N;` lines; others are skipped.
pub fn parse_format(text: &str) -> Format {
    let fields = text.lines().filter_map(parse_field).collect();
    Format { fields }
}

fn parse_field(line: &str) -> Option<Field> {
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in line.trim().split(';') {
        let Some((key, value)) = part.trim().split_once(':') else {
            continue;
        };
        match key {
            "field" => decl = Some(value.trim()),
            "offset" => offset = value.trim().parse().ok(),
            "size" => size = value.trim().parse().ok(),
            "signed" => signed = value.trim() == "1",
            _ => {}
        }
    }
    let decl = decl?;
    // The name is the declaration's last word, less an array's brackets: `char comm[16]`.
    let last = decl.split_whitespace().last()?;
    let name = last.split('[').next()?.to_string();
    Some(Field {
        name,
        offset: offset?,
        size: size?,
        signed,
        data_loc: decl.starts_with("__data_loc"),
    })
}

impl Format {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// An integer field of `raw` (native byte order), sign-extended where the kernel says it
    /// is signed; `None` when the format has no such field or the record is too short.
    pub fn int(&self, raw: &[u8], name: &str) -> Option<i64> {
        let f = self.field(name)?;
        let bytes = raw.get(f.offset..f.offset.checked_add(f.size)?)?;
        Some(match (f.size, f.signed) {
            (1, true) => i64::from(bytes[0] as i8),
            (1, false) => i64::from(bytes[0]),
            (2, true) => i64::from(i16::from_ne_bytes(bytes.try_into().ok()?)),
            (2, false) => i64::from(u16::from_ne_bytes(bytes.try_into().ok()?)),
            (4, true) => i64::from(i32::from_ne_bytes(bytes.try_into().ok()?)),
            (4, false) => i64::from(u32::from_ne_bytes(bytes.try_into().ok()?)),
            (8, _) => i64::from_ne_bytes(bytes.try_into().ok()?),
            _ => return None,
        })
    }

    /// A string field: inline (`char comm[16]`) or `__data_loc char[]`, up to its first NUL.
    pub fn string(&self, raw: &[u8], name: &str) -> Option<String> {
        let f = self.field(name)?;
        let bytes = if f.data_loc {
            let loc = self.int(raw, name)? as u32;
            let (off, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
            raw.get(off..off.checked_add(len)?)?
        } else {
            raw.get(f.offset..f.offset.checked_add(f.size)?)?
        };
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGNAL: &str = include_str!("testdata/signal_generate.format");
    const VICTIM: &str = include_str!("testdata/mark_victim.format");

    #[test]
    fn this_machines_signal_generate_format_names_its_fields() {
        let f = parse_format(SIGNAL);
        let names: Vec<&str> = f.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "common_type",
                "common_flags",
                "common_preempt_count",
                "common_pid",
                "sig",
                "errno",
                "code",
                "comm",
                "pid",
                "group",
                "result"
            ]
        );
        let code = f.field("code").unwrap();
        assert_eq!((code.offset, code.size, code.signed), (16, 4, true));
        assert_eq!(f.field("comm").unwrap().size, 16);
    }

    #[test]
    fn this_machines_mark_victim_format_has_the_rss_fields_and_a_data_loc_comm() {
        let f = parse_format(VICTIM);
        let shmem = f.field("shmem_rss").unwrap();
        assert_eq!((shmem.offset, shmem.size, shmem.signed), (40, 8, false));
        assert!(f.field("comm").unwrap().data_loc);
        assert!(!f.field("pid").unwrap().data_loc);
    }

    #[test]
    fn fields_are_read_by_the_stated_offsets_and_signs() {
        let f = parse_format(SIGNAL);
        let mut raw = vec![0u8; 48];
        raw[8..12].copy_from_slice(&7i32.to_ne_bytes());
        raw[16..20].copy_from_slice(&(-6i32).to_ne_bytes());
        raw[20..26].copy_from_slice(b"python");
        raw[36..40].copy_from_slice(&4242i32.to_ne_bytes());
        assert_eq!(f.int(&raw, "sig"), Some(7));
        assert_eq!(f.int(&raw, "code"), Some(-6));
        assert_eq!(f.int(&raw, "pid"), Some(4242));
        assert_eq!(f.string(&raw, "comm").as_deref(), Some("python"));
        assert_eq!(f.int(&raw, "nonesuch"), None);
        // A short record is refused, never read past.
        assert_eq!(f.int(&raw[..30], "pid"), None);
        assert_eq!(
            parse_format("garbage\nfield:int x;\toffset:zz;"),
            Format::default()
        );
    }
}

//! Pure: /proc/PID/mountinfo lines -> the mount at a given point.

/// One mountinfo line, with octal escapes (`\040`) decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u64,
    pub parent_id: u64,
    pub major: u32,
    pub minor: u32,
    pub root: String,
    pub mount_point: String,
    pub mount_options: String,
    pub fs_type: String,
    pub source: String,
    pub super_options: String,
}

/// The topmost (last listed) mount at `mount_point`, or `None`. Malformed lines are skipped.
pub fn find_mount(content: &str, mount_point: &str) -> Option<MountEntry> {
    // The last matching line is the topmost mount: search from the end.
    content
        .lines()
        .rev()
        .filter(|line| {
            // Cheap pre-filter on the raw 5th field; an escaped field may still decode to a match.
            line.split(' ')
                .nth(4)
                .is_some_and(|raw| raw == mount_point || raw.contains('\\'))
        })
        .filter_map(parse_line)
        .find(|e| e.mount_point == mount_point)
}

/// Parses one line; `None` when it is malformed.
pub fn parse_line(line: &str) -> Option<MountEntry> {
    let (head, tail) = line.split_once(" - ")?;
    let mut f = head.split(' ');
    let mount_id = f.next()?.parse().ok()?;
    let parent_id = f.next()?.parse().ok()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let root = unescape(f.next()?);
    let mount_point = unescape(f.next()?);
    let mount_options = f.next()?.to_string();
    let mut t = tail.split(' ');
    Some(MountEntry {
        mount_id,
        parent_id,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root,
        mount_point,
        mount_options,
        fs_type: t.next()?.to_string(),
        source: unescape(t.next()?),
        super_options: t.next().unwrap_or("").to_string(),
    })
}

/// Decodes the kernel's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push(v as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

//! Segments a container found in its /dev/shm when it started: files written before it, left by
//! an earlier instance of it (a memory emptyDir outlives a container's restarts) or by another
//! container sharing the volume. NCCL's `nccl-*` and PSM's `psm_*` segments of a crashed run
//! stay there, count against the memory limit, and can turn one crash into a crash loop.
//!
//! Listed beneath the container's root through the /dev/shm handle the scan opened (only a
//! tmpfs is listed), never following a link, at most [`MAX_ENTRIES`] entries and [`DEADLINE`]
//! per container; only while the container is young ([`YOUNG`]). An entry something is
//! mounted on (a FUSE over `/dev/shm/nccl-x`) is never entered: each is looked at with a
//! statx that does not sync (answered from the inode cache even on a FUSE), and one that is a
//! mount's root, or on another mount than the directory, is passed by. Without statx nothing
//! is listed: the mount roots could not be told without asking them.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, Statx, StatxAttributes, StatxFlags};

use crate::model::Leftovers;

/// Containers started this long ago or less are looked at.
pub const YOUNG: Duration = Duration::from_secs(600);
/// Entries looked at per /dev/shm at most.
pub const MAX_ENTRIES: usize = 4096;
/// Time spent listing one /dev/shm at most.
pub const DEADLINE: Duration = Duration::from_millis(50);
/// Files named in a finding, the largest.
const NAMED: usize = 5;
/// A file written within this of the start is the container's own (clocks' grain, start-up).
const GRACE: Duration = Duration::from_secs(2);

/// One regular file of a /dev/shm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// What it holds in memory (its blocks; a sparse segment holds less than its size).
    pub bytes: u64,
    pub modified: SystemTime,
}

/// Pure: the files last written before the container started, largest first; None when none.
pub fn inherited(entries: &[Entry], started: SystemTime, truncated: bool) -> Option<Leftovers> {
    let before = started.checked_sub(GRACE).unwrap_or(started);
    let mut old: Vec<&Entry> = entries.iter().filter(|e| e.modified < before).collect();
    if old.is_empty() {
        return None;
    }
    old.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    Some(Leftovers {
        count: old.len() as u64,
        bytes: old.iter().map(|e| e.bytes).sum(),
        largest: old
            .iter()
            .take(NAMED)
            // The container chose the names: written out when captured (ESC, BEL, newline as
            // `\x1b`...), so neither the JSON nor a message carries them raw. `printable` leaves
            // its own output unchanged, so a second pass where it is printed changes nothing.
            .map(|e| (crate::model::printable(&e.name), e.bytes))
            .collect(),
        truncated,
    })
}

/// Pure: whether a /dev/shm whose file system was made at `born` may hold a file last written
/// before a container that started at `started` ([`inherited`]'s test). Not when it was made
/// after that (within the grace): a file system holds nothing older than itself, so the one a
/// runtime makes with each container (Docker's, runc's) is not listed, only one that outlives
/// the container (a Pod's sandbox /dev/shm, a memory emptyDir) or whose birth is unknown.
pub fn may_hold_older(born: Option<SystemTime>, started: SystemTime) -> bool {
    let before = started.checked_sub(GRACE).unwrap_or(started);
    born.is_none_or(|born| born < before)
}

/// Pure: whether an entry of the directory on mount `dir_mount` is entered: not when it is a
/// mount's root, nor on another mount (a mount ID the kernel did not give counts as another).
pub fn on_the_directorys_mount(dir_mount: u64, entry: &Statx) -> bool {
    let root = entry
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
        && entry.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
    let has_id = StatxFlags::from_bits_retain(entry.stx_mask).contains(StatxFlags::MNT_ID);
    !root && has_id && entry.stx_mnt_id == dir_mount
}

/// statx of `name` in `dir` (or of `dir` itself for ""), the link itself, never what it
/// points at, from the inode cache: nothing is asked of a file system mounted there.
fn look(dir: impl AsFd, name: &CStr) -> rustix::io::Result<Statx> {
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC;
    let flags = if name.is_empty() {
        flags | AtFlags::EMPTY_PATH
    } else {
        flags
    };
    rustix::fs::statx(
        dir,
        name,
        flags,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
}

/// Lists the regular files of the /dev/shm behind `shm` (an `O_PATH` handle opened beneath the
/// container's root, its mount a tmpfs): never through a link nor into a mount, at most
/// [`MAX_ENTRIES`], within [`DEADLINE`]. Whether the listing stopped early comes back with it.
pub fn list(shm: &OwnedFd) -> io::Result<(Vec<Entry>, bool)> {
    let started = Instant::now();
    let here = look(shm, c"")?;
    if !StatxFlags::from_bits_retain(here.stx_mask).contains(StatxFlags::MNT_ID) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx gives no mount ID (before Linux 5.8): not listed",
        ));
    }
    let dir = rustix::fs::openat(
        shm,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // getdents through a borrowed handle, the same one each entry is looked up in (no
    // duplicate of it to make and close).
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut entries = RawDir::new(&dir, &mut buf);
    let mut out = Vec::new();
    let mut seen = 0;
    while let Some(entry) = entries.next() {
        let entry = entry?;
        seen += 1;
        if seen > MAX_ENTRIES || started.elapsed() > DEADLINE {
            return Ok((out, true));
        }
        let name: &CStr = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if !matches!(entry.file_type(), FileType::RegularFile | FileType::Unknown) {
            continue;
        }
        let Ok(st) = look(&dir, name) else {
            continue; // removed meanwhile
        };
        if !on_the_directorys_mount(here.stx_mnt_id, &st)
            || FileType::from_raw_mode(st.stx_mode.into()) != FileType::RegularFile
        {
            continue;
        }
        out.push(Entry {
            name: name.to_string_lossy().into_owned(),
            bytes: st.stx_blocks.saturating_mul(512),
            modified: modified(&st),
        });
    }
    Ok((out, false))
}

fn modified(st: &Statx) -> SystemTime {
    super::statfs::statx_time(st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, mib: u64, secs_before: u64, start: SystemTime) -> Entry {
        Entry {
            name: name.into(),
            bytes: mib << 20,
            modified: start - Duration::from_secs(secs_before),
        }
    }

    #[test]
    fn a_dev_shm_made_with_the_container_is_not_listed_one_older_or_of_unknown_birth_is() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // Docker's and runc's: made as the container started (or just before, its /dev).
        assert!(!may_hold_older(Some(start), start));
        assert!(!may_hold_older(Some(start - Duration::from_secs(1)), start));
        assert!(!may_hold_older(
            Some(start + Duration::from_secs(30)),
            start
        ));
        // A sandbox's or a memory emptyDir's, from before a restart: listed.
        assert!(may_hold_older(Some(start - Duration::from_secs(3)), start));
        assert!(may_hold_older(
            Some(start - Duration::from_secs(3600)),
            start
        ));
        // A birth the file system did not give: listed, as before.
        assert!(may_hold_older(None, start));
        // The edge is inherited()'s: a file written exactly GRACE before is not inherited, and
        // a file system made then holds nothing older.
        assert!(!may_hold_older(Some(start - GRACE), start));
        let edge = [entry("x", 1, GRACE.as_secs(), start)];
        assert_eq!(inherited(&edge, start, false), None);
    }

    #[test]
    fn files_from_before_the_start_are_inherited_largest_first() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut files = vec![
            entry("nccl-Y7jXhK", 9, 120, start),
            entry("psm_4a1b2c3d", 1, 300, start),
            entry("torch_12_34_0", 30, 0, start), // its own, just written
        ];
        files.push(Entry {
            modified: start + Duration::from_secs(5),
            ..entry("nccl-new", 4, 0, start)
        });
        let got = inherited(&files, start, false).unwrap();
        assert_eq!(got.count, 2);
        assert_eq!(got.bytes, 10 << 20);
        assert_eq!(
            got.largest,
            [
                ("nccl-Y7jXhK".to_string(), 9 << 20),
                ("psm_4a1b2c3d".to_string(), 1 << 20)
            ]
        );
        assert_eq!(inherited(&files[2..], start, false), None, "only its own");
    }

    #[test]
    fn names_are_captured_written_out_and_a_second_pass_changes_nothing() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let files = [entry("nccl-\x1b[2J\x07\nCRITICAL: fake", 2, 60, start)];
        let got = inherited(&files, start, false).unwrap();
        let name = &got.largest[0].0;
        assert_eq!(name, "nccl-\\x1b[2J\\x07\\x0aCRITICAL: fake");
        assert!(!name.chars().any(char::is_control));
        assert_eq!(&crate::model::printable(name), name);
        // In the JSON: the written-out text, not a control character escaped by JSON.
        let json = serde_json::to_string(&got).unwrap();
        assert!(json.contains(r"nccl-\\x1b[2J\\x07\\x0aCRITICAL"), "{json}");
    }

    #[test]
    fn a_listing_never_follows_a_link_and_reports_what_the_files_hold() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nccl-abc"), vec![1u8; 1 << 20]).unwrap();
        std::fs::write(dir.path().join("outside"), vec![1u8; 4096]).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let (mut got, truncated) = list(&fd).unwrap();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        assert!(!truncated);
        let names: Vec<&str> = got.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["nccl-abc", "outside"], "no link, no directory");
        assert!(got[0].bytes >= 1 << 20);
    }

    #[test]
    fn an_entry_that_is_a_mount_root_or_on_another_mount_is_not_entered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let fd =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let here = look(&fd, c"").unwrap();
        let mut file = look(&fd, c"f").unwrap();
        assert!(on_the_directorys_mount(here.stx_mnt_id, &file));
        assert!(!on_the_directorys_mount(here.stx_mnt_id + 1, &file));
        file.stx_attributes |= StatxAttributes::MOUNT_ROOT;
        assert!(
            !on_the_directorys_mount(here.stx_mnt_id, &file),
            "a mount's root"
        );
        file.stx_attributes = StatxAttributes::empty();
        file.stx_mask &= !StatxFlags::MNT_ID.bits();
        assert!(
            !on_the_directorys_mount(here.stx_mnt_id, &file),
            "no mount ID"
        );
    }
}

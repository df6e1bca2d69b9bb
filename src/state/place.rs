//! The store's place on disk, looked at without trusting it. DIR must be the agent's alone (who
//! may write in it decides what the agent opens); each of the store's names must be absent or a
//! regular file of the agent's with one link. Nothing here follows a symlink, opens a device or
//! blocks on a FIFO: a name is opened `O_PATH|O_NOFOLLOW` (which touches nothing) and looked at
//! with fstat.
//!
//! Nothing here opens a store file for reading while the process may hold the store open
//! (`look` is also how `serve`'s own history readers begin). A POSIX lock belongs to the
//! process, and closing *any* descriptor of a file drops every lock the process holds on it:
//! the writer's lock on `-shm` would go, the next program to open the store (`shmlink history`)
//! would take itself for the first, reset `-shm`, and `serve` would die of SIGBUS in its
//! mapping (or two writers would meet in the WAL). Closing an `O_PATH` descriptor drops no lock
//! (Linux: `filp_flush`). Only [`read_head`], which the writer calls before it opens the store,
//! reads.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, RenameFlags, Stat, CWD};

/// The files SQLite keeps beside the store: each is the store's too, looked at and moved with it.
pub const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// `DIR` made (0700) where missing and resolved once: how it is reached (a symlink to a bigger
/// disk) is the operator's choice, made by `--state-dir`. What it resolves to must be a
/// directory of the agent's user; one that others may write is made 0700, since anyone who can
/// write in it can plant what the agent then opens.
pub fn own_dir(dir: &Path) -> io::Result<PathBuf> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let dir = fs::canonicalize(dir)?;
    let meta = fs::symlink_metadata(&dir)?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        ));
    }
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "owned by uid {}, not by the agent's (uid {me}): whoever owns it could put \
                 what the agent opens there",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{:o}", meta.mode() & 0o777),
            "the state directory was open to others: made 0700"
        );
    }
    Ok(dir)
}

/// What is at one of the store's names.
pub enum Found {
    Absent,
    /// A regular file (for the writer: the agent's, with one link): its status, from the fstat
    /// of an `O_PATH` handle (closed, which drops no lock).
    File(Stat),
    /// Anything else, said in a few words (`a symbolic link`, `a FIFO`, ...).
    Other(&'static str),
}

/// Who looks: the agent, which will write what it opens, or a reader (`history`, `check`, the
/// HTTP endpoint), which only needs a regular file it can read whoever made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Writer,
    Reader,
}

/// Looks at `path` without following it, opening a device or blocking.
pub fn look(path: &Path, by: By) -> io::Result<Found> {
    let handle = match rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Err(rustix::io::Errno::NOENT) => return Ok(Found::Absent),
        Err(e) => return Err(e.into()),
        Ok(fd) => fd,
    };
    let first = rustix::fs::fstat(&handle)?;
    if let Some(what) = not_plain(&first, by) {
        return Ok(Found::Other(what));
    }
    Ok(Found::File(first))
}

/// The first `n` bytes of the regular file [`look`] found at `path` (`looked`: its status),
/// opened for reading by name once more; `None` when that is another file (it was swapped
/// meanwhile). Only before this process opens the store: closing the descriptor drops the
/// process's locks on the file (module doc).
pub fn read_head(path: &Path, looked: &Stat, n: u64) -> io::Result<Option<Vec<u8>>> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let now = rustix::fs::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (looked.st_dev, looked.st_ino) {
        return Ok(None);
    }
    let mut head = Vec::with_capacity(n as usize);
    File::from(fd).take(n).read_to_end(&mut head)?;
    Ok(Some(head))
}

/// Why a file's status is not that of a file the agent made, if it is not (for a reader: not a
/// regular file).
fn not_plain(st: &rustix::fs::Stat, by: By) -> Option<&'static str> {
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => None,
        FileType::Symlink => Some("a symbolic link"),
        FileType::Fifo => Some("a FIFO"),
        FileType::CharacterDevice | FileType::BlockDevice => Some("a device"),
        FileType::Socket => Some("a socket"),
        FileType::Directory => Some("a directory"),
        FileType::Unknown => Some("not a regular file"),
    };
    what.or_else(|| {
        if by == By::Reader {
            None
        } else if st.st_nlink != 1 {
            Some("a file with other hard links")
        } else if st.st_uid != rustix::process::geteuid().as_raw() {
            Some("another user's file")
        } else {
            None
        }
    })
}

/// The first of the store's companions (`-wal`, `-shm`, `-journal`) that is not a plain file of
/// the agent's, and what it is.
pub fn odd_companion(path: &Path, by: By) -> io::Result<Option<(PathBuf, &'static str)>> {
    for suffix in COMPANIONS {
        let companion = with_suffix(path, suffix);
        if let Found::Other(what) = look(&companion, by)? {
            return Ok(Some((companion, what)));
        }
    }
    Ok(None)
}

/// Companions with no database beside them (the store absent or empty): they belong to no
/// store, and SQLite would replay a stale `-wal` into a new one. Only plain files are removed.
pub fn remove_orphans(path: &Path) {
    for suffix in COMPANIONS {
        let companion = with_suffix(path, suffix);
        if let Ok(Found::File(_)) = look(&companion, By::Writer) {
            let _ = fs::remove_file(&companion);
        }
    }
}

pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Renames the store and its companions to `<file>.<prefix><unix time>` (a later second where
/// that name is taken: nothing is ever renamed over), keeping the newest `keep` of that prefix.
/// A link is renamed, never followed; nothing is written.
pub fn set_aside(path: &Path, prefix: &str, keep: usize) -> io::Result<PathBuf> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A name none of whose files exists yet; then each is renamed without replacing anything
    // (a store's name may be empty while a companion is what is odd).
    let taken = |p: &Path| {
        [""].into_iter()
            .chain(COMPANIONS)
            .any(|s| fs::symlink_metadata(with_suffix(p, s)).is_ok())
    };
    let mut stamp = now;
    let mut aside = path.with_file_name(format!("{file}.{prefix}{stamp}"));
    while taken(&aside) && stamp < now + 1000 {
        stamp += 1;
        aside = path.with_file_name(format!("{file}.{prefix}{stamp}"));
    }
    for suffix in [""].into_iter().chain(COMPANIONS) {
        let from = with_suffix(path, suffix);
        match rustix::fs::renameat_with(
            CWD,
            &from,
            CWD,
            with_suffix(&aside, suffix),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) if suffix.is_empty() => return Err(e.into()),
            Err(e) => tracing::warn!(file = %from.display(), error = %e, "not moved aside"),
        }
    }
    if let Some(dir) = path.parent() {
        prune_aside(dir, &format!("{file}.{prefix}"), keep);
    }
    Ok(aside)
}

fn prune_aside(dir: &Path, prefix: &str, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut stamps: Vec<u64> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix(prefix)?.parse().ok())
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let excess = stamps.len().saturating_sub(keep);
    for stamp in &stamps[..excess] {
        for suffix in [""].into_iter().chain(COMPANIONS) {
            let _ = fs::remove_file(dir.join(format!("{prefix}{stamp}{suffix}")));
        }
    }
}

//! Where the tracepoints' ids and formats are read. Many hosts mount no tracefs at
//! `/sys/kernel/tracing` (a minimal init, a VM image), and a Pod sees only its own `/sys`; so,
//! in turn: the directory named outright; `<sys-root>/kernel/tracing` and `debug/tracing`; any
//! tracefs (or debugfs's `tracing/`) the agent's own or the host's mount table lists, the host's
//! reached through `<proc-root>/1/root`; else a tracefs of its own, mounted in a mount namespace
//! that only a short-lived thread of the agent holds (CAP_SYS_ADMIN): the ids and formats are
//! read there, and the mount goes with the thread, never seen by the host or left behind.
//! perf_event_open needs nothing of tracefs after that.

use std::io::{self, BufRead};
use std::path::{Path, PathBuf};

use super::sample::Formats;
use super::tracefs::{find, formats, HAS_SIGNAL};
use crate::procfs::mountinfo::parse_line;

/// Lines of a mount table read at most (a node with thousands of containers has long ones).
const MOUNT_LINES: usize = 200_000;

/// How the formats were had, for the start's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A tracefs already mounted there (named, under the sys root, or from a mount table).
    At(PathBuf),
    /// A private mount of the agent's own, gone with the thread that read it.
    Private,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::At(p) => write!(f, "tracefs at {}", p.display()),
            Source::Private => f.write_str("a private tracefs of its own, the host's unchanged"),
        }
    }
}

/// The formats, from the first place that has them; the error says every place tried.
pub fn locate(
    sys_root: &Path,
    explicit: Option<&Path>,
    proc_root: &Path,
) -> io::Result<(Formats, Source)> {
    if let Some(dir) = explicit {
        let dir = find(sys_root, Some(dir))?;
        return Ok((formats(&dir)?, Source::At(dir)));
    }
    if let Ok(dir) = find(sys_root, None) {
        return Ok((formats(&dir)?, Source::At(dir)));
    }
    if let Some(dir) = from_mount_tables(proc_root) {
        return Ok((formats(&dir)?, Source::At(dir)));
    }
    let targets = [sys_root.join("kernel/tracing"), std::env::temp_dir()];
    match private_mount(&targets) {
        Ok(f) => Ok((f, Source::Private)),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "no tracefs: none under {}/kernel/tracing or kernel/debug/tracing, none in the \
                 agent's or the host's mount table, and mounting one of its own failed ({e}; \
                 needs CAP_SYS_ADMIN, or mount it on the host: mount -t tracefs nodev \
                 /sys/kernel/tracing)",
                sys_root.display()
            ),
        )),
    }
}

/// A tracefs the agent's own mount table lists, else the host's (PID 1's, reached beneath its
/// root), that holds the tracepoints.
fn from_mount_tables(proc_root: &Path) -> Option<PathBuf> {
    let own = read_table(&proc_root.join("self/mountinfo"));
    let host = read_table(&proc_root.join("1/mountinfo"));
    let host_root = proc_root.join("1/root");
    let mine = tracing_dirs(&own).into_iter();
    let hosts = tracing_dirs(&host)
        .into_iter()
        .map(|p| beneath(&host_root, &p));
    mine.chain(hosts).find(|d| d.join(HAS_SIGNAL).exists())
}

fn read_table(path: &Path) -> String {
    let Ok(file) = std::fs::File::open(path) else {
        return String::new();
    };
    let mut out = String::new();
    for line in io::BufReader::new(file)
        .lines()
        .take(MOUNT_LINES)
        .map_while(Result::ok)
        .filter(|l| l.contains(" - tracefs ") || l.contains(" - debugfs "))
    {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Pure: the tracing directories a mount table offers: each tracefs mount, and `tracing/` of
/// each debugfs mount (the kernel mounts tracefs there on first access), tracefs first.
pub fn tracing_dirs(mountinfo: &str) -> Vec<PathBuf> {
    let entries: Vec<_> = mountinfo.lines().filter_map(parse_line).collect();
    let of = |t: &'static str| {
        entries
            .iter()
            .filter(move |e| e.fs_type == t && e.root == "/")
            .map(|e| PathBuf::from(&e.mount_point))
    };
    of("tracefs")
        .chain(of("debugfs").map(|p| p.join("tracing")))
        .collect()
}

/// `path` (absolute, in another mount namespace) beneath `root`.
fn beneath(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Mounts tracefs read-only on the first of `targets` that is a directory, in a mount namespace
/// of a thread's own (unshared from the agent's, every mount made private first so nothing
/// propagates back), reads the formats there and ends the thread: its namespace, and the mount,
/// go with it.
fn private_mount(targets: &[PathBuf]) -> io::Result<Formats> {
    use rustix::mount::{mount, mount_change, MountFlags, MountPropagationFlags};
    use rustix::thread::UnshareFlags;
    let targets = targets.to_vec();
    let read = move || -> io::Result<Formats> {
        // SAFETY: only the filesystem context and the mount namespace are unshared, for this
        // thread alone; no file descriptor table is (the one hazard of unshare).
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS | UnshareFlags::NEWNS) }?;
        mount_change(
            "/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )?;
        let target = targets
            .iter()
            .find(|t| t.is_dir())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no directory to mount on"))?;
        let flags =
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        mount("nodev", target, "tracefs", flags, None)?;
        formats(target)
    };
    std::thread::Builder::new()
        .name("tracefs".into())
        .spawn(read)?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the tracefs thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_table_offers_its_tracefs_then_debugfs_tracing() {
        let table = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
40 22 0:35 / /sys/kernel/debug rw,nosuid - debugfs debugfs rw
41 22 0:36 / /mnt/my\\040trace rw,nosuid - tracefs nodev rw
42 22 0:36 /instances/x /elsewhere rw - tracefs nodev rw
garbage line
";
        assert_eq!(
            tracing_dirs(table),
            [
                PathBuf::from("/mnt/my trace"),
                PathBuf::from("/sys/kernel/debug/tracing")
            ]
        );
        assert_eq!(
            beneath(
                Path::new("/host/proc/1/root"),
                Path::new("/sys/kernel/tracing")
            ),
            PathBuf::from("/host/proc/1/root/sys/kernel/tracing")
        );
    }
}

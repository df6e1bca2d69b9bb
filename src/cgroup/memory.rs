//! The memory cgroup a container's tmpfs pages are charged to: limit and headroom, v1 and v2.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::CWD;

use super::CgroupVersion;
use crate::procfs::kept::{beneath, DirId, KeptFiles};
use crate::procfs::kfile::FileReader;

/// A cgroup directory beneath one the caller holds open, and its identity when known: with
/// it, the directory's value files are kept open across scans ([`KeptFiles`]).
#[derive(Debug, Clone, Copy)]
pub struct OpenDir<'a> {
    pub fd: BorrowedFd<'a>,
    /// The cgroup's directory beneath `fd` (`""`: `fd` itself): the scan opens a directory
    /// only to list it, and reaches the rest by a path beneath the nearest one it opened.
    pub at: &'a str,
    pub id: Option<DirId>,
}

impl<'a> OpenDir<'a> {
    /// `file` of the cgroup, as a path beneath `fd`.
    fn file(&self, file: &str) -> PathBuf {
        beneath(self.at, file)
    }
}

/// The most a value file (a limit, a usage) is read of: one number on a line.
const VALUE_MAX: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReading {
    /// Lowest limit of this cgroup and its ancestors (excluding the hierarchy root).
    pub limit_bytes: Option<u64>,
    /// min over limited cgroups (self and ancestors) of limit - usage, saturating at 0.
    pub headroom_bytes: Option<u64>,
    /// shmem charged to this cgroup per its memory.stat.
    pub shmem_bytes: Option<u64>,
    /// The processes of this cgroup the kernel OOM-killed since it was made (`oom_kill` of
    /// memory.events, v1 memory.oom_control); None where the kernel does not count them.
    pub oom_kills: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemcgError {
    #[error("cgroup {0} is gone")]
    Gone(String),
    /// The cgroup's own files could not be read; `partial` is what its ancestors say.
    // The cause in the text, not as a source too (a chain printer would say it twice).
    #[error("reading {path}: {error}")]
    Io {
        path: String,
        error: io::Error,
        partial: MemoryReading,
    },
}

/// `oom_kill N` of memory.events (v2) or memory.oom_control (v1): kills of processes in this
/// cgroup (v2's `oom_group_kill` counts whole-group kills, each also an `oom_kill`).
pub fn parse_oom_kills(content: &str) -> Option<u64> {
    content.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

/// Values from here up are v1's "no limit" (PAGE_COUNTER_MAX rounded to pages).
const V1_NO_LIMIT: u64 = 1 << 62;

/// A limit in bytes; `None` for no limit: v2 writes `max`, v1 a value >= [`V1_NO_LIMIT`].
pub fn parse_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "max" {
        return None;
    }
    s.parse::<u64>().ok().filter(|&v| v < V1_NO_LIMIT)
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStat {
    pub shmem: Option<u64>,
    /// Anonymous memory: v2 `anon`, v1 `total_rss` (else `rss`).
    pub anon: Option<u64>,
    pub hierarchical_memory_limit: Option<u64>,
}

pub fn parse_memory_stat(content: &str) -> MemoryStat {
    let mut stat = MemoryStat::default();
    let mut total_shmem = None;
    let mut total_rss = None;
    for line in content.lines() {
        let mut parts = line.split_ascii_whitespace();
        // The key first: most of memory.stat's ~40 (v2) or ~70 (v1) lines are not wanted, and
        // their values need not be parsed.
        let Some(key) = parts.next() else { continue };
        if !matches!(
            key,
            "shmem" | "total_shmem" | "anon" | "rss" | "total_rss" | "hierarchical_memory_limit"
        ) {
            continue;
        }
        let Some(Ok(value)) = parts.next().map(str::parse::<u64>) else {
            continue;
        };
        match key {
            "shmem" => stat.shmem = Some(value),
            "total_shmem" => total_shmem = Some(value),
            "anon" | "rss" => stat.anon = Some(value),
            "total_rss" => total_rss = Some(value),
            // v1 writes its "no limit" sentinel here too.
            "hierarchical_memory_limit" => {
                stat.hierarchical_memory_limit = Some(value).filter(|&v| v < V1_NO_LIMIT)
            }
            _ => {}
        }
    }
    // v1's total_shmem includes child cgroups; prefer it over the cgroup's own.
    stat.shmem = total_shmem.or(stat.shmem);
    stat.anon = total_rss.or(stat.anon);
    stat
}

/// Usage (`memory.current`, v1 `memory.usage_in_bytes`): a byte count, `None` when garbage.
pub fn parse_usage(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

/// One cgroup's limit and usage as its files say; `None` where a file is missing or garbage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    pub limit: Option<u64>,
    pub usage: Option<u64>,
}

/// Folds a cgroup and its ancestors into the tightest bound: the lowest limit, and the lowest
/// headroom (limit - usage, saturating at 0) of the levels whose usage is known.
pub fn tightest(levels: impl IntoIterator<Item = Level>) -> MemoryReading {
    let mut reading = MemoryReading::default();
    for level in levels {
        let Some(limit) = level.limit else { continue };
        reading.limit_bytes = Some(reading.limit_bytes.map_or(limit, |l| l.min(limit)));
        if let Some(usage) = level.usage {
            let headroom = limit.saturating_sub(usage);
            reading.headroom_bytes =
                Some(reading.headroom_bytes.map_or(headroom, |h| h.min(headroom)));
        }
    }
    reading
}

/// Reads limits and usage under one hierarchy root, memoising ancestors within a scan so a
/// pod's cgroup is read once however many containers it has.
pub struct MemcgReader {
    root: PathBuf,
    version: CgroupVersion,
    memo: HashMap<String, Level>,
    files: FileReader,
    /// The limit and usage files of the cgroups read through their open directories, kept
    /// open across scans (`serve` reads them every interval).
    kept: KeptFiles,
    /// memory.stat's shmem is read only for whom it is reported (`check --json`).
    read_shmem: bool,
    /// The OOM kill counter is read only for whom it is told (`serve` without the kernel log).
    read_oom_kills: bool,
}

impl MemcgReader {
    pub fn new(hierarchy_root: PathBuf, version: CgroupVersion) -> Self {
        MemcgReader {
            root: hierarchy_root,
            version,
            memo: HashMap::new(),
            files: FileReader::default(),
            kept: KeptFiles::default(),
            read_shmem: true,
            read_oom_kills: false,
        }
    }

    /// Whether to read each container's OOM kill counter (one small file more per container).
    pub fn set_read_oom_kills(&mut self, on: bool) {
        self.read_oom_kills = on;
    }

    /// Whether to read memory.stat's shmem, the largest and dearest file per container: `serve`
    /// reports nothing from it, so it leaves it alone (one open, read and close fewer each).
    pub fn set_read_shmem(&mut self, on: bool) {
        self.read_shmem = on;
    }

    /// Forgets memoised ancestors: called at the start of each scan.
    pub fn start_scan(&mut self) {
        self.memo.clear();
    }

    /// Ends a scan: the files of the cgroups it did not read (gone) are closed.
    pub fn end_scan(&mut self) {
        self.kept.end_pass();
    }

    /// The cgroup at `rel_path` bounded by its ancestors. `open_dirs`: its directory and its
    /// parent's when the caller holds them open (the scan does), so their files are opened
    /// relative to them rather than by their full paths, and, with the directory's identity,
    /// kept open for the next scan.
    pub fn read_at(
        &mut self,
        rel_path: &str,
        open_dirs: Option<[OpenDir<'_>; 2]>,
    ) -> Result<MemoryReading, MemcgError> {
        let (leaf_dir, parent_dir) = match open_dirs {
            Some([leaf, parent]) => (Some(leaf), Some(parent)),
            None => (None, None),
        };
        let rel = Path::new(rel_path.trim_start_matches('/'));
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(MemcgError::Gone(rel_path.to_string()));
        }
        let leaf = self.root.join(rel);
        let leaf_key = memo_key(rel);
        let files = self.version.memory_files();
        let leaf_open = leaf_dir;
        // The leaf must exist: a missing leaf means the container is gone. An unreadable one
        // still has ancestors whose limits bound it.
        let mut leaf_error = None;
        match self.level(&leaf, leaf_open) {
            Ok(level) => self.memo.insert(leaf_key.clone(), level),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MemcgError::Gone(rel_path.to_string()))
            }
            Err(source) => {
                leaf_error = Some(source);
                self.memo.insert(leaf_key.clone(), Level::default())
            }
        };
        let mut reading = tightest(self.levels_up(&leaf_key, parent_dir));
        if self.read_shmem {
            reading.shmem_bytes =
                self.leaf_value(&leaf, leaf_open, files.stat, |s| parse_memory_stat(s).shmem);
        }
        if self.read_oom_kills {
            reading.oom_kills =
                self.leaf_value(&leaf, leaf_open, files.oom_events, parse_oom_kills);
        }
        match leaf_error {
            None => Ok(reading),
            Some(error) => Err(MemcgError::Io {
                path: leaf.join(files.limit).display().to_string(),
                error,
                partial: reading,
            }),
        }
    }

    /// The levels of the leaf (memoised already) and of its ancestors but the hierarchy root,
    /// which has no limit; each ancestor read once per scan. `parent_dir`: the leaf's parent,
    /// open.
    fn levels_up(&mut self, leaf_key: &str, parent_dir: Option<OpenDir<'_>>) -> Vec<Level> {
        let mut levels = Vec::with_capacity(8);
        let mut key = leaf_key;
        let mut depth = 0;
        while !key.is_empty() {
            let level = match self.memo.get(key) {
                Some(level) => *level,
                None => {
                    let dir = self.root.join(key.trim_start_matches('/'));
                    let fd = if depth == 1 { parent_dir } else { None };
                    let level = self.level(&dir, fd).unwrap_or_default();
                    self.memo.insert(key.to_string(), level);
                    level
                }
            };
            levels.push(level);
            key = &key[..key.rfind('/').unwrap_or(0)];
            depth += 1;
        }
        levels
    }

    /// One of the leaf's own files, parsed; None when it cannot be read or parsed.
    fn leaf_value<T>(
        &mut self,
        leaf: &Path,
        leaf_dir: Option<OpenDir<'_>>,
        file: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let bytes = match leaf_dir {
            Some(dir) => self.files.read(dir.fd, dir.file(file)),
            None => self.files.read(CWD, leaf.join(file)),
        };
        bytes
            .ok()
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .and_then(parse)
    }

    /// Limit and usage of one cgroup (`dir_fd`, when given, is `dir` opened). NotFound only when
    /// the cgroup itself is gone: a cgroup v2 directory whose parent does not delegate the
    /// memory controller has no memory files. Usage is read only under a limit, the only
    /// place it counts.
    fn level(&mut self, dir: &Path, dir_fd: Option<OpenDir<'_>>) -> io::Result<Level> {
        let files = self.version.memory_files();
        let limit = self.value(dir, dir_fd, files.limit, parse_limit)?;
        let usage = match limit {
            Some(_) => self.value(dir, dir_fd, files.usage, parse_usage)?,
            None => None,
        };
        Ok(Level { limit, usage })
    }

    /// One value file of `dir`, parsed; `Ok(None)` when the file is missing or garbage.
    fn value(
        &mut self,
        dir: &Path,
        dir_fd: Option<OpenDir<'_>>,
        file: &'static str,
        parse: fn(&str) -> Option<u64>,
    ) -> io::Result<Option<u64>> {
        let read = match dir_fd {
            // A value is a line: a read that fills the buffer is no value.
            Some(OpenDir {
                fd,
                at,
                id: Some(id),
            }) => self.kept.read_head((fd, at), id, file, VALUE_MAX, None),
            Some(dir @ OpenDir { id: None, .. }) => self.files.read(dir.fd, dir.file(file)),
            None => self.files.read(CWD, dir.join(file)),
        };
        match read {
            Ok(bytes) => std::str::from_utf8(bytes)
                .map(parse)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            // Checked after the failed read, so a cgroup removed meanwhile reads as gone.
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir.is_dir() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `/a/b/c`: the memo's key of the cgroup at `a/b/c`; its ancestors' keys are its prefixes.
fn memo_key(rel: &Path) -> String {
    let mut key = String::with_capacity(rel.as_os_str().len() + 1);
    for c in rel.components() {
        key.push('/');
        key.push_str(&c.as_os_str().to_string_lossy());
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/memcg/", $name))
        };
    }

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn oom_kills_are_counted_in_memory_events_and_v1_oom_control() {
        // Linux 6.x memory.events, and v1 memory.oom_control after a kill (this machine's).
        assert_eq!(
            parse_oom_kills("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n"),
            Some(2)
        );
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"),
            Some(1)
        );
        // Kernels before 4.13 have no counter; garbage is none.
        assert_eq!(parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
        assert_eq!(parse_oom_kills("oom_kill x\n"), None);
        assert_eq!(parse_oom_kills(""), None);
    }

    #[test]
    fn v2_writes_max_for_no_limit_and_v1_a_sentinel_near_i64_max() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit(fixture!("v1-unlimited.limit_in_bytes")), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("9223372036854775807\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(GIB));
        assert_eq!(parse_limit(" 536870912 "), Some(512 * MIB));
        assert_eq!(
            parse_limit(&format!("{}", (1u64 << 62) - 1)),
            Some((1 << 62) - 1)
        );
        assert_eq!(parse_limit("0\n"), Some(0));
    }

    #[test]
    fn garbage_limits_and_usage_read_as_unknown() {
        for garbage in [
            "",
            "\n",
            "-1\n",
            "max max\n",
            "1 2\n",
            "1G\n",
            "0x400\n",
            "\u{0}\u{1}",
        ] {
            assert_eq!(parse_limit(garbage), None, "{garbage:?}");
            assert_eq!(parse_usage(garbage), None, "{garbage:?}");
        }
        assert_eq!(parse_usage("18446744073709551616\n"), None);
    }

    #[test]
    fn usage_is_a_plain_byte_count_on_either_version() {
        assert_eq!(parse_usage(fixture!("v1.usage_in_bytes")), Some(325627904));
        assert_eq!(parse_usage("209715200\n"), Some(200 * MIB));
    }

    #[test]
    fn v2_memory_stat_shmem_is_not_confused_with_shmem_thp_or_file_mapped() {
        let stat = parse_memory_stat(fixture!("v2-container.memory.stat"));
        assert_eq!(
            stat,
            MemoryStat {
                shmem: Some(64 * MIB),
                anon: Some(4202496),
                hierarchical_memory_limit: None,
            }
        );
    }

    #[test]
    fn v1_memory_stat_of_a_container_reads_shmem_and_an_unlimited_hierarchy() {
        let stat = parse_memory_stat(fixture!("v1-leaf.memory.stat"));
        assert_eq!(stat.shmem, Some(0));
        assert_eq!(
            stat.hierarchical_memory_limit, None,
            "the no-limit sentinel"
        );
    }

    #[test]
    fn v1_total_shmem_counts_the_children_and_wins_over_the_cgroups_own() {
        // A pod cgroup: its containers' tmpfs pages are charged to them, not to the pod itself.
        let stat = parse_memory_stat(fixture!("v1-pod.memory.stat"));
        assert_eq!(stat.shmem, Some(64 * MIB));
        assert_eq!(stat.hierarchical_memory_limit, Some(GIB));
        let root = parse_memory_stat(fixture!("v1-root.memory.stat"));
        assert_eq!(root.shmem, Some(9084928));
        // Anonymous memory likewise: total_rss over rss; not anon_thp or rss_huge.
        assert_eq!(root.anon, Some(9998336));
        assert_eq!(stat.anon, Some(2101248));
    }

    #[test]
    fn garbage_memory_stat_lines_are_skipped() {
        let stat = parse_memory_stat(
            "shmem\nshmem x\nshmem -1\n\u{0}\u{0}\n\nhierarchical_memory_limit 4096 extra\n\
             total_shmem 18446744073709551616\n",
        );
        assert_eq!(stat.shmem, None);
        assert_eq!(stat.hierarchical_memory_limit, Some(4096));
        assert_eq!(parse_memory_stat(""), MemoryStat::default());
    }

    fn level(limit: Option<u64>, usage: Option<u64>) -> Level {
        Level { limit, usage }
    }

    #[test]
    fn the_lowest_limit_and_headroom_of_a_cgroup_and_its_ancestors_bound_it() {
        // kubepods (node allocatable), the pod, the container: the pod is nearly full.
        let r = tightest([
            level(None, Some(200 * MIB)),          // container: no limit of its own
            level(Some(GIB), Some(900 * MIB)),     // pod
            level(Some(16 * GIB), Some(10 * GIB)), // kubepods
        ]);
        assert_eq!(r.limit_bytes, Some(GIB));
        assert_eq!(r.headroom_bytes, Some(124 * MIB));
        // The lowest headroom need not be under the lowest limit.
        let r = tightest([
            level(Some(2 * GIB), Some(GIB)),
            level(Some(4 * GIB), Some(4 * GIB - 10 * MIB)),
        ]);
        assert_eq!(r.limit_bytes, Some(2 * GIB));
        assert_eq!(r.headroom_bytes, Some(10 * MIB));
    }

    #[test]
    fn usage_over_the_limit_leaves_no_headroom_and_unknown_usage_keeps_the_limit() {
        let r = tightest([level(Some(GIB), Some(GIB + 4096))]);
        assert_eq!(r.headroom_bytes, Some(0));
        let r = tightest([level(Some(GIB), None)]);
        assert_eq!((r.limit_bytes, r.headroom_bytes), (Some(GIB), None));
        assert_eq!(tightest([level(None, None)]), MemoryReading::default());
        assert_eq!(tightest([]), MemoryReading::default());
    }

    /// A memory cgroup directory under `root` with the files of `version`.
    fn cgroup(
        root: &Path,
        version: CgroupVersion,
        rel: &str,
        limit: &str,
        usage: &str,
        stat: &str,
    ) {
        let dir = root.join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        let files = version.memory_files();
        std::fs::write(dir.join(files.limit), limit).unwrap();
        std::fs::write(dir.join(files.usage), usage).unwrap();
        std::fs::write(dir.join(files.stat), stat).unwrap();
    }

    const POD_V2: &str = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b6c1a2e_7f3d_4c1b_9a2e_5d6f7a8b9c0d.slice";
    const CTR_V2: &str =
        "cri-containerd-3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a.scope";

    /// A v2 systemd node's tree: a 1 GiB Burstable pod using 900 MiB, its container unlimited
    /// with 64 MiB of shmem in its memory.stat.
    fn v2_systemd_pod(root: &Path) {
        let v2 = CgroupVersion::V2;
        cgroup(
            root,
            v2,
            "kubepods.slice",
            "16106127360\n",
            "8589934592\n",
            "",
        );
        cgroup(
            root,
            v2,
            "kubepods.slice/kubepods-burstable.slice",
            "max\n",
            "8589934592\n",
            "",
        );
        cgroup(root, v2, POD_V2, "1073741824\n", "943718400\n", "");
        let stat = fixture!("v2-container.memory.stat");
        cgroup(
            root,
            v2,
            &format!("{POD_V2}/{CTR_V2}"),
            "max\n",
            "73400320\n",
            stat,
        );
    }

    #[test]
    fn a_v2_systemd_container_is_bounded_by_its_pod_and_reports_its_shmem() {
        let dir = tempfile::tempdir().unwrap();
        v2_systemd_pod(dir.path());
        let mut reader = MemcgReader::new(dir.path().into(), CgroupVersion::V2);
        let r = reader
            .read_at(&format!("/{POD_V2}/{CTR_V2}"), None)
            .unwrap();
        assert_eq!(r.limit_bytes, Some(GIB));
        assert_eq!(r.headroom_bytes, Some(GIB - 900 * MIB));
        assert_eq!(r.shmem_bytes, Some(64 * MIB));
    }

    #[test]
    fn without_shmem_the_limits_are_the_same_and_no_shmem_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        v2_systemd_pod(dir.path());
        let mut reader = MemcgReader::new(dir.path().into(), CgroupVersion::V2);
        reader.set_read_shmem(false);
        let r = reader
            .read_at(&format!("/{POD_V2}/{CTR_V2}"), None)
            .unwrap();
        assert_eq!(r.limit_bytes, Some(GIB));
        assert_eq!(r.headroom_bytes, Some(GIB - 900 * MIB));
        assert_eq!(r.shmem_bytes, None);
    }

    #[test]
    fn a_v1_cgroupfs_container_reads_the_sentinel_as_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = CgroupVersion::V1;
        let root = dir.path();
        let unlimited = fixture!("v1-unlimited.limit_in_bytes");
        let pod = "kubepods/burstable/pod0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d";
        let ctr = format!("{pod}/3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a");
        cgroup(root, v1, "kubepods", unlimited, "8589934592\n", "");
        cgroup(
            root,
            v1,
            "kubepods/burstable",
            unlimited,
            "8589934592\n",
            "",
        );
        cgroup(
            root,
            v1,
            pod,
            "2147483648\n",
            "1073741824\n",
            fixture!("v1-pod.memory.stat"),
        );
        let usage = fixture!("v1.usage_in_bytes");
        cgroup(
            root,
            v1,
            &ctr,
            unlimited,
            usage,
            fixture!("v1-leaf.memory.stat"),
        );
        let r = MemcgReader::new(root.into(), v1)
            .read_at(&format!("/{ctr}"), None)
            .unwrap();
        assert_eq!(r.limit_bytes, Some(2 * GIB));
        assert_eq!(r.headroom_bytes, Some(GIB));
        assert_eq!(r.shmem_bytes, Some(0));
    }

    #[test]
    fn a_cgroup_without_memory_files_is_unlimited_not_gone() {
        // cgroup v2: a parent that does not delegate the memory controller leaves its children
        // without memory.max, memory.current and memory.stat.
        let dir = tempfile::tempdir().unwrap();
        let v2 = CgroupVersion::V2;
        cgroup(dir.path(), v2, "lab", "536870912\n", "104857600\n", "");
        std::fs::create_dir_all(dir.path().join("lab/job-7")).unwrap();
        let r = MemcgReader::new(dir.path().into(), v2)
            .read_at("/lab/job-7", None)
            .unwrap();
        assert_eq!(r.limit_bytes, Some(512 * MIB));
        assert_eq!(r.headroom_bytes, Some(412 * MIB));
        assert_eq!(r.shmem_bytes, None);
    }

    #[test]
    fn a_removed_cgroup_is_gone_and_so_is_a_path_that_climbs_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut reader = MemcgReader::new(dir.path().into(), CgroupVersion::V2);
        assert!(matches!(
            reader.read_at("/kubepods/gone", None),
            Err(MemcgError::Gone(_))
        ));
        assert!(matches!(
            reader.read_at("/../etc", None),
            Err(MemcgError::Gone(_))
        ));
    }

    #[test]
    fn garbage_in_a_cgroups_files_is_no_limit_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = CgroupVersion::V2;
        cgroup(dir.path(), v2, "a", "1073741824\n", "garbage\n", "");
        cgroup(dir.path(), v2, "a/b", "\u{0}\u{0}", "12\n", "\u{0}shmem\n");
        let r = MemcgReader::new(dir.path().into(), v2)
            .read_at("/a/b", None)
            .unwrap();
        // The parent's limit still counts; its headroom cannot be known.
        assert_eq!(r.limit_bytes, Some(GIB));
        assert_eq!(r.headroom_bytes, None);
        assert_eq!(r.shmem_bytes, None);
    }

    #[test]
    fn ancestors_are_read_once_per_scan() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = CgroupVersion::V2;
        let root = dir.path();
        cgroup(root, v2, "pod", "1073741824\n", "0\n", "");
        cgroup(root, v2, "pod/c1", "max\n", "0\n", "");
        cgroup(root, v2, "pod/c2", "max\n", "0\n", "");
        let mut reader = MemcgReader::new(root.into(), v2);
        assert_eq!(
            reader.read_at("/pod/c1", None).unwrap().limit_bytes,
            Some(GIB)
        );
        std::fs::write(root.join("pod/memory.max"), "536870912\n").unwrap();
        assert_eq!(
            reader.read_at("/pod/c2", None).unwrap().limit_bytes,
            Some(GIB),
            "memoised"
        );
        reader.start_scan();
        assert_eq!(
            reader.read_at("/pod/c2", None).unwrap().limit_bytes,
            Some(512 * MIB)
        );
    }
}

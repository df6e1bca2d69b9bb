//! Pure: what the kernel's OOM report says about a memory cgroup's kill. The report is many
//! records (mm/oom_kill.c `dump_header`, `__oom_kill_process`; mm/memcontrol.c
//! `mem_cgroup_print_oom_meminfo`), one line each:
//!
//! - `<comm> invoked oom-killer: gfp_mask=...` starts it;
//! - `memory: usage 65536kB, limit 65536kB, failcnt 86` (the cgroup at its limit);
//! - `Memory cgroup stats for <path>:`, then its memory.stat one key a line (`shmem`, v1's
//!   `rss` and `total_*`, v2's `anon`), until `Tasks state`;
//! - `oom-kill:constraint=...,oom_memcg=<path>,task_memcg=<path>,task=<comm>,pid=<pid>,...`;
//! - `Memory cgroup out of memory: Killed process <pid> (<comm>) total-vm:..kB, anon-rss:..kB,
//!   file-rss:..kB, shmem-rss:..kB, ...` ends it.
//!
//! Only kernel-facility records count: what a container prints, or writes to /dev/kmsg, never
//! does. The cgroup paths are the kernel's, so they name the container even when every process
//! in it is gone. Records of other CPUs may land between the lines: what is not in a line's
//! expected shape is passed over.
//!
//! Each line is read only at the start of its record, as the whole record: other records carry
//! text a process chooses past their start (a segfault's file name, up to 255 bytes with
//! newlines, `arch/x86/mm/fault.c` `show_signal_msg`), and the kernel's words a report line
//! starts with are longer than a comm (15 bytes), the only untrusted text that can come first.
//! The one record of many lines the kernel writes itself, memory.stat's dump (Linux 6.1 to 6.3:
//! `pr_info("%s", buf)`; 6.4 and later print it a record a line), is read line by line only
//! when the stats are due and every one of its lines is a stat.

use crate::kernel_log::record::leading_decimal as decimal_prefix;
use crate::kernel_log::KmsgRecord;

/// Stats lines read at most in one report: a cgroup's memory.stat has about 60 keys (v1 with
/// its `total_` twins about 70); past this, the rest is another report's or noise.
const MAX_STAT_LINES: usize = 200;

/// One OOM kill, as its report tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    /// The memory cgroup the killed task was in (`task_memcg`), else the one at its limit.
    pub memcg: String,
    /// The memory cgroup at its limit (`oom_memcg`); None for a system-wide OOM.
    pub oom_memcg: Option<String>,
    /// Host PID.
    pub pid: i32,
    pub comm: String,
    /// The limit and usage of the cgroup at its limit.
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// Its memory.stat: shared memory (/dev/shm and other tmpfs pages) and anonymous memory.
    pub shmem_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    /// The killed process's own resident memory, by kind (the `Killed process` line).
    pub anon_rss_bytes: Option<u64>,
    pub shmem_rss_bytes: Option<u64>,
}

/// The parts of a report read so far.
#[derive(Debug, Default, Clone)]
struct Partial {
    limit_bytes: Option<u64>,
    usage_bytes: Option<u64>,
    /// Stats lines still expected (0: not in the stats).
    stats_left: usize,
    stats: Stats,
    memcg: Option<String>,
    oom_memcg: Option<String>,
    task_pid: Option<i32>,
}

/// The memory.stat keys kept; v1 prints the cgroup's own and its hierarchy's (`total_`), the
/// hierarchy's is what the limit applies to.
#[derive(Debug, Default, Clone)]
struct Stats {
    shmem: Option<u64>,
    total_shmem: Option<u64>,
    /// v2 `anon`, v1 `rss`.
    anon: Option<u64>,
    total_rss: Option<u64>,
}

/// Reads the records of the kernel log in order and gives an [`OomKill`] at each report's end.
#[derive(Debug, Default, Clone)]
pub struct OomReports {
    partial: Option<Partial>,
}

impl OomReports {
    /// Whether a report began and has not ended: its first records are read, its kill not yet.
    pub fn in_report(&self) -> bool {
        self.partial.is_some()
    }

    pub fn feed(&mut self, record: &KmsgRecord) -> Option<OomKill> {
        if !record.is_kernel() {
            return None;
        }
        let message = record.message.trim();
        let p = self.partial.as_mut().filter(|p| p.stats_left > 0);
        match p {
            Some(p)
                if message.contains('\n') && message.lines().next().and_then(stat).is_some() =>
            {
                let lines: Vec<&str> = message.lines().map(str::trim).collect();
                if lines.iter().all(|l| stat(l).is_some()) {
                    for line in lines.iter().take(p.stats_left) {
                        p.stats.read(line);
                    }
                    p.stats_left = p.stats_left.saturating_sub(lines.len());
                }
                None
            }
            _ => self.line(message),
        }
    }

    /// One record, read as one report line; only its start is the kernel's words.
    fn line(&mut self, line: &str) -> Option<OomKill> {
        if invoked(line) {
            self.partial = Some(Partial::default());
            return None;
        }
        let p = self.partial.as_mut()?;
        if let Some(rest) = line.strip_prefix("memory: usage ") {
            // `65536kB, limit 65536kB, failcnt 86`, whole, or nothing of it
            if let Some((usage, limit)) = usage_and_limit(rest) {
                p.usage_bytes = Some(usage);
                p.limit_bytes = Some(limit);
            }
        } else if line.starts_with("Memory cgroup stats for ") {
            p.stats_left = MAX_STAT_LINES;
        } else if line.starts_with("Tasks state (") {
            p.stats_left = 0;
        } else if let Some(summary) = line.strip_prefix("oom-kill:constraint=") {
            p.stats_left = 0;
            p.summary(summary);
        } else if let Some(killed) = killed_process(line) {
            // A line that only starts like it (a comm `Killed process `) ends nothing.
            let kill = p.kill(killed);
            if kill.is_some() {
                self.partial = None;
            }
            return kill;
        } else if p.stats_left > 0 {
            p.stats_left -= 1;
            p.stats.read(line);
        }
        None
    }
}

/// `<comm> invoked oom-killer: gfp_mask=`: the kernel's words right after the comm (at most 15
/// characters; a byte not UTF-8 is one character once read), never further in.
fn invoked(record: &str) -> bool {
    record
        .find(" invoked oom-killer: gfp_mask=")
        .is_some_and(|i| record[..i].chars().count() <= COMM_MAX)
}

/// A comm's length at most (TASK_COMM_LEN less its NUL).
const COMM_MAX: usize = 15;

/// What follows `Killed process ` at a record's start, after the reason the kernel gives
/// (`__oom_kill_process`'s `message`; none before Linux 5.x).
fn killed_process(record: &str) -> Option<&str> {
    const WHY: [&str; 4] = [
        "Memory cgroup out of memory: ",
        "Out of memory: ",
        "Out of memory (oom_kill_allocating_task): ",
        "",
    ];
    WHY.iter()
        .find_map(|why| record.strip_prefix(why)?.strip_prefix("Killed process "))
}

/// `65536kB, limit 65536kB, failcnt 86` as (usage, limit) in bytes.
fn usage_and_limit(rest: &str) -> Option<(u64, u64)> {
    let (usage, rest) = decimal_prefix::<u64>(rest)?;
    let (limit, rest) = decimal_prefix::<u64>(rest.strip_prefix("kB, limit ")?)?;
    let (_, rest) = decimal_prefix::<u64>(rest.strip_prefix("kB, failcnt ")?)?;
    rest.is_empty()
        .then(|| (usage.saturating_mul(1024), limit.saturating_mul(1024)))
}

/// `key value`, a stat line of memory.stat: a key of lower-case letters, digits and `_`, a
/// whole number.
fn stat(line: &str) -> Option<(&str, u64)> {
    let (key, value) = line.split_once(' ')?;
    let key_ok = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    match decimal_prefix::<u64>(value)? {
        (value, "") if key_ok => Some((key, value)),
        _ => None,
    }
}

impl Partial {
    /// `CONSTRAINT_MEMCG,nodemask=...,cpuset=<name>,mems_allowed=...,oom_memcg=<path>,
    /// task_memcg=<path>,task=<comm>,pid=<pid>,uid=<uid>`: a cpuset's name and the comm are
    /// not the kernel's words, so the cgroups are read after the last `,mems_allowed=` and
    /// before the first `,task=`, and the PID after the last `,pid=`.
    fn summary(&mut self, summary: &str) {
        let (head, task) = summary.split_once(",task=").unwrap_or((summary, ""));
        let head = head
            .rsplit_once(",mems_allowed=")
            .map_or(head, |(_, after)| after);
        for field in head.split(',') {
            match field.split_once('=') {
                Some(("oom_memcg", v)) => self.oom_memcg = Some(v.to_owned()),
                Some(("task_memcg", v)) => self.memcg = Some(v.to_owned()),
                _ => {}
            }
        }
        self.task_pid = task
            .rsplit_once(",pid=")
            .and_then(|(_, v)| decimal_prefix::<i32>(v))
            .map(|(pid, _)| pid);
    }

    /// `4321 (python3) total-vm:80000kB, anon-rss:3072kB, file-rss:0kB, shmem-rss:1024kB, ...`
    fn kill(&self, killed: &str) -> Option<OomKill> {
        let (pid, rest) = decimal_prefix::<i32>(killed)?;
        let rest = rest.strip_prefix(" (")?;
        // A comm may hold `) `; the kernel's text after it starts with ` total-vm:`.
        let (comm, tail) = rest.rsplit_once(") total-vm:")?;
        // The summary, when there is one, must be about the same task.
        if self.task_pid.is_some_and(|p| p != pid) {
            return None;
        }
        let memcg = self.memcg.clone().or_else(|| self.oom_memcg.clone())?;
        Some(OomKill {
            memcg,
            oom_memcg: self.oom_memcg.clone(),
            pid,
            comm: comm.to_owned(),
            limit_bytes: self.limit_bytes,
            usage_bytes: self.usage_bytes,
            shmem_bytes: self.stats.total_shmem.or(self.stats.shmem),
            anon_bytes: self.stats.total_rss.or(self.stats.anon),
            anon_rss_bytes: after(tail, "anon-rss:").and_then(kib),
            shmem_rss_bytes: after(tail, "shmem-rss:").and_then(kib),
        })
    }
}

impl Stats {
    /// `key value`: only the keys kept, only a whole number.
    fn read(&mut self, line: &str) {
        let Some((key, value)) = stat(line) else {
            return;
        };
        let slot = match key {
            "shmem" => &mut self.shmem,
            "total_shmem" => &mut self.total_shmem,
            "anon" | "rss" => &mut self.anon,
            "total_rss" => &mut self.total_rss,
            _ => return,
        };
        slot.get_or_insert(value);
    }
}

/// What follows the first `pat` in `s`.
fn after<'a>(s: &'a str, pat: &str) -> Option<&'a str> {
    s.split_once(pat).map(|(_, rest)| rest)
}

/// `65536kB...` as bytes.
fn kib(s: &str) -> Option<u64> {
    let (n, rest) = decimal_prefix::<u64>(s)?;
    rest.starts_with("kB").then(|| n.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::kmsg::{self, records};
    use crate::kernel_log::parse_record;

    fn kills(content: &str) -> Vec<OomKill> {
        let mut reports = OomReports::default();
        records(content)
            .iter()
            .filter_map(|r| {
                reports.feed(&parse_record(r.as_bytes()).unwrap_or_else(|| panic!("{r}")))
            })
            .collect()
    }

    const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
    const POD_SLICE: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b6c1c55_3c0e_4a8e_9a51_2c1f3f6d7e80.slice";

    #[test]
    fn the_real_v1_report_of_a_tmpfs_filling_its_cgroup() {
        let memcg = format!(
            "/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/{}",
            "a".repeat(64)
        );
        assert_eq!(
            kills(kmsg::OOM_V1),
            [OomKill {
                memcg: memcg.clone(),
                oom_memcg: Some(memcg),
                pid: 5947,
                comm: "dd".into(),
                limit_bytes: Some(64 << 20),
                usage_bytes: Some(64 << 20),
                shmem_bytes: Some(65_654_784),
                anon_bytes: Some(1_163_264),
                anon_rss_bytes: Some(1024 << 10),
                shmem_rss_bytes: Some(0),
            }]
        );
    }

    #[test]
    fn v2_reports_name_the_task_cgroup_and_read_anon_and_shmem() {
        let task = format!("{POD_SLICE}/cri-containerd-{CID}.scope");
        let shm = kills(kmsg::OOM_V2_SHM);
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0].memcg, task);
        assert_eq!(shm[0].oom_memcg.as_deref(), Some(POD_SLICE));
        assert_eq!((shm[0].pid, shm[0].comm.as_str()), (4321, "python3"));
        assert_eq!(shm[0].limit_bytes, Some(128 << 20));
        // The NIC's line amid the stats is not a stat.
        assert_eq!(shm[0].shmem_bytes, Some(130_023_424));
        assert_eq!(shm[0].anon_bytes, Some(3_145_728));
        assert_eq!(shm[0].shmem_rss_bytes, Some(1024 << 10));

        let anon = kills(kmsg::OOM_V2_ANON);
        assert_eq!(anon.len(), 1);
        assert_eq!(anon[0].memcg, task);
        assert_eq!(anon[0].anon_bytes, Some(385_875_968));
        assert_eq!(anon[0].shmem_bytes, Some(81_920));
        assert_eq!(anon[0].usage_bytes, Some(384 << 20));
    }

    #[test]
    fn a_stats_dump_in_one_record_as_linux_6_1_prints_it() {
        let one = kills(kmsg::OOM_V2_ONE_RECORD);
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(one[0].shmem_bytes, Some(65_409_024));
        assert_eq!(one[0].anon_bytes, Some(1_142_784));
        assert_eq!(one[0].limit_bytes, Some(64 << 20));
    }

    #[test]
    fn user_space_cannot_forge_a_report() {
        let forged: String = records(kmsg::OOM_V1)
            .iter()
            .map(|r| {
                // Facility 1 (user): what a write to /dev/kmsg carries.
                let (prefix, rest) = r.split_once(',').unwrap();
                let level: u32 = prefix.parse().unwrap();
                format!("{},{rest}", 8 + level % 8)
            })
            .collect();
        assert!(kills(&forged).is_empty());
    }

    #[test]
    fn a_process_name_cannot_move_the_kill_to_another_cgroup_or_pid() {
        // A comm is 15 bytes of the process's choosing, printed amid the summary's fields.
        for comm in [",task_memcg=/x", ",pid=1,uid=0", ",oom_memcg=/y"] {
            let renamed: String = records(kmsg::OOM_V1)
                .iter()
                .map(|r| {
                    r.replace("task=dd,", &format!("task={comm},"))
                        .replace("(dd)", &format!("({comm})"))
                })
                .collect();
            let found = kills(&renamed);
            assert_eq!(found.len(), 1, "{comm}");
            assert!(
                found[0].memcg.starts_with("/kubepods/burstable/pod1111"),
                "{comm}"
            );
            assert_eq!((found[0].pid, found[0].comm.as_str()), (5947, comm));
        }
    }

    #[test]
    fn a_kill_without_its_report_or_for_another_task_is_none() {
        let lines: Vec<String> = records(kmsg::OOM_V1);
        let last = lines.last().unwrap();
        assert!(kills(last).is_empty(), "no report began");
        let other_task: String = lines
            .iter()
            .map(|r| r.replace("pid=5947,", "pid=5948,"))
            .collect();
        assert!(kills(&other_task).is_empty());
    }

    const VICTIM: &str = "/kubepods/burstable/pod99999999-2222-3333-4444-555555555555/\
                          bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// The segfault record of a binary whose file name holds a report's lines (issue 36): the
    /// kernel escapes the newlines, the reader undoes them.
    fn forged_segfault(comm: &str, name: &str) -> String {
        let escaped = name.replace('\n', "\\x0a");
        let comm = comm.replace('\n', "\\x0a");
        format!(
            "6,500,4904946500,-;{comm}[777]: segfault at 0 ip 0000000000401000 sp \
             00007ffc2b6c1f40 error 4 in {escaped}[401000,400000+1000]\n"
        )
    }

    /// OOM_V1's records with `extra` put just before its `oom-kill:` line, while a real
    /// report is being read.
    fn amid_v1(extra: &[String]) -> String {
        let mut out = String::new();
        for r in records(kmsg::OOM_V1) {
            if r.contains(";oom-kill:") {
                out.extend(extra.iter().cloned());
            }
            out.push_str(&r);
        }
        out
    }

    #[test]
    fn a_file_name_holding_a_report_is_no_kill() {
        let name = format!(
            "x\noom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,\
             oom_memcg={VICTIM},task_memcg={VICTIM},task=py,pid=42,uid=0\nMemory cgroup out of \
             memory: Killed process 42 (py) total-vm:80000kB, anon-rss:0kB, file-rss:0kB, \
             shmem-rss:60000kB"
        );
        let forged = forged_segfault("x", &name);
        // Alone, after a real report's start, and amid a real report.
        let start = records(kmsg::OOM_V1)[0].clone();
        assert!(kills(&forged).is_empty());
        assert!(kills(&format!("{start}{forged}")).is_empty());
        let real = kills(&amid_v1(&[forged]));
        assert_eq!(real.len(), 1);
        assert_eq!((real[0].pid, real[0].comm.as_str()), (5947, "dd"));
        assert!(!real[0].memcg.contains("pod9999"), "{:?}", real[0]);
    }

    #[test]
    fn a_comm_spelling_a_report_line_starts_no_line_of_it() {
        // No newline at all: the comm is the record's start, the file name what follows.
        let summary = forged_segfault(
            "oom-kill:,task_",
            &format!("oom-kill:,task_memcg={VICTIM},task=py,pid=5947"),
        );
        let killed = forged_segfault(
            "Killed process ",
            "Killed process 5947 (dd) total-vm:1kB, anon-rss:0kB, shmem-rss:60000kB",
        );
        let usage = forged_segfault("memory: usage ", "memory: usage 1kB, limit 1kB");
        let invoked = forged_segfault("a", "b invoked oom-killer: gfp_mask=0x0");
        let found = kills(&amid_v1(&[summary, killed, usage, invoked]));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].memcg.starts_with("/kubepods/burstable/pod1111"));
        assert_eq!(found[0].limit_bytes, Some(64 << 20));
        assert_eq!(found[0].shmem_rss_bytes, Some(0));
    }

    #[test]
    fn stats_are_never_taken_from_a_record_with_other_lines() {
        // A comm `shmem 1` and a newline, then a file name of stat lines, while the stats are
        // due: one line not a stat, and none is read.
        let mut recs = records(kmsg::OOM_V1);
        let at = recs
            .iter()
            .position(|r| r.contains("Memory cgroup stats for"))
            .unwrap();
        let forged = forged_segfault("shmem 1\n", "x\ntotal_shmem 1\ntotal_rss 999999999");
        recs.insert(at + 1, forged);
        let found = kills(&recs.concat());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].shmem_bytes, Some(65_654_784));
        assert_eq!(found[0].anon_bytes, Some(1_163_264));
    }

    #[test]
    fn a_victim_whose_comm_holds_a_newline_is_still_told() {
        let renamed: String = records(kmsg::OOM_V1)
            .iter()
            .map(|r| {
                r.replace("task=dd,", "task=d\\x0ad,")
                    .replace("(dd)", "(d\\x0ad)")
                    .replace(";dd invoked", ";d\\x0ad invoked")
            })
            .collect();
        let found = kills(&renamed);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].pid, found[0].comm.as_str()), (5947, "d\nd"));
    }

    /// A system-wide OOM: no cgroup at its limit, the kernel's reason `Out of memory`; a
    /// cpuset's name (a cgroup a container may name) spelling other cgroups is not read.
    #[test]
    fn a_system_wide_kill_and_a_cpuset_named_like_the_summary() {
        let task = format!("/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/{CID}");
        let report = format!(
            "4,1,1,-;x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n\
             6,2,2,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=a,task_memcg=\
             {VICTIM},oom_memcg={VICTIM},mems_allowed=0,mems_allowed=0,global_oom,task_memcg=\
             {task},task=x,pid=9,uid=0\n\
             3,3,3,-;Out of memory: Killed process 9 (x) total-vm:8kB, anon-rss:4kB, \
             file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:1000\n"
        );
        let found = kills(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].memcg.as_str(), found[0].oom_memcg.as_deref()),
            (task.as_str(), None)
        );
        assert_eq!((found[0].pid, found[0].anon_rss_bytes), (9, Some(4096)));
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = crate::fixtures::rng::Rng::new(0x00f1);
        let seeds: Vec<String> = [kmsg::OOM_V1, kmsg::OOM_V2_SHM, kmsg::OOM_V2_ANON]
            .iter()
            .flat_map(|c| records(c))
            .collect();
        let mut reports = OomReports::default();
        for _ in 0..20_000 {
            let seed = &seeds[rng.below(seeds.len())];
            let bytes = rng.mutate(seed.as_bytes());
            if let Some(record) = parse_record(&bytes) {
                let _ = reports.feed(&record);
            }
        }
    }
}

//! Where a line becomes a failure: a container's log line matched against the signatures, a
//! kernel record of a crash placed through its host PID, or the kernel's OOM report placed
//! through its cgroup path, -> [`Detected`].

use std::path::PathBuf;
use std::time::SystemTime;

use super::attribute::{pid_now, who_is_cgroup, who_is_pid, PidNow};
use super::context::{self, Window};
use super::crash::{Crash, Pieces};
use super::dataloader;
use super::oom::{OomKill, OomReports};
use super::signatures::Signatures;
use crate::host::NsId;
use crate::kernel_log::KmsgRecord;
use crate::logs::LogLine;
use crate::model::{
    printable, ContainerRef, Detected, FailureSource, FindingKind, MemorySource, MemorySplit,
};

/// Lines and kernel records in, failures out. A clone starts with the same state (a fresh one
/// made once is the cheap way to many: its automata are shared).
#[derive(Clone)]
pub struct Recogniser {
    pub(super) signatures: Signatures,
    proc_root: PathBuf,
    host_mnt: Option<NsId>,
    oom: OomReports,
    oom_shm_share: f64,
    /// Each container's last lines, for texts generic alone (`context.rs`).
    window: Window,
    /// Crash lines whose ` in <file>` piece came apart, waiting for it.
    pieces: Pieces,
}

impl Recogniser {
    /// Whether the kernel's OOM report being read has not ended yet.
    pub fn mid_report(&self) -> bool {
        self.oom.in_report()
    }

    /// `proc_root` and `host_mnt` place a host PID (`attribute.rs`); `oom_shm_share` is the
    /// share of the usage /dev/shm must reach for an OOM kill to be its ([`crate::model::SHM_OOM_SHARE`]).
    pub fn new(proc_root: PathBuf, host_mnt: Option<NsId>, oom_shm_share: f64) -> Recogniser {
        Recogniser {
            // One pass over each line: the rows' needles and the texts decided here.
            signatures: Signatures::with_candidates(
                &[&[dataloader::NEEDLE][..], context::NEEDLES].concat(),
            ),
            proc_root,
            host_mnt,
            oom: OomReports::default(),
            oom_shm_share,
            window: Window::default(),
            pieces: Pieces::default(),
        }
    }

    /// Whether a raw line may mean something here (asked before it is decoded): one pass of one
    /// automaton.
    pub fn is_candidate(&self, line: &[u8]) -> bool {
        self.signatures.is_candidate(line)
    }

    /// The same question, asked of a copy (its automata shared): so that a source can ask it
    /// while each line it keeps is handed to [`Recogniser::log_line`] as it is read.
    pub fn candidates(&self) -> Signatures {
        self.signatures.clone()
    }

    /// A container's line: only ever about that container.
    pub fn log_line(&mut self, line: &LogLine) -> Option<Detected> {
        let m = self.signatures.match_line(&line.text);
        let who = line.origin.clone();
        let Some(m) = m else {
            // PyTorch's word of a worker's SIGKILL: told only with the OOM kill it names.
            if let Some(word) = dataloader::parse(&line.text) {
                let kind = FindingKind::WorkloadOomKilled;
                let mut d = Detected::new(who, kind, line.at, FailureSource::Log, &line.text);
                d.worker_pids = word.pids;
                return Some(d);
            }
            // A generic line a recent line of the same container decides.
            let (kind, hint) = self.window.unmatched(&line.origin, &line.text, line.at)?;
            self.window.matched(&line.origin, line.at, false);
            let evidence = format!("{} (after: {hint})", line.text.trim());
            return Some(Detected::new(
                who,
                kind,
                line.at,
                FailureSource::Log,
                &evidence,
            ));
        };
        if !self.window.matched(&line.origin, line.at, m.guessed) {
            return None;
        }
        let (kind, at, span) = (m.kind, line.at, m.span.clone());
        let mut d = Detected::matched(who, kind, at, FailureSource::Log, &line.text, span);
        d.nccl_gpus = m.gpus;
        d.signature = m.named_from.is_none().then_some(m.signature);
        d.named_from = m.named_from;
        d.judged = m.judged;
        if m.kind == FindingKind::GpuCollectiveTimeout {
            d.hang = super::hang::parse::facts(m.signature, &line.text);
        }
        Some(d)
    }

    /// A kernel record: the end of an OOM report (every record is read in order for it), or a
    /// crash in a GPU library, placed through the crashing PID at once.
    pub fn kernel(&mut self, record: &KmsgRecord, at: SystemTime) -> Option<Detected> {
        if let Some(kill) = self.oom.feed(record) {
            let mut d = oom_killed(kill, record, at, self.oom_shm_share);
            // Read at once: the killed process's zombie lasts only until it is reaped.
            d.pid_in_container = d
                .pid
                .and_then(|pid| dataloader::pid_in_namespace(&self.proc_root, pid));
            return Some(d);
        }
        let Crash { comm, pid, library } = self.pieces.crash(record)?;
        let now = pid_now(&self.proc_root, pid, &comm, at);
        let who = match now {
            PidNow::Same => who_is_pid(&self.proc_root, pid, self.host_mnt),
            PidNow::Gone | PidNow::Taken => ContainerRef::default(),
        };
        let mut d = Detected::new(
            who,
            FindingKind::GpuJobCrashed,
            at,
            FailureSource::Kernel,
            &record.message,
        );
        d.pid = Some(pid);
        d.pid_taken = now == PidNow::Taken;
        if now == PidNow::Same {
            d.pid_start = crate::procfs::stat::start_ticks_of(&self.proc_root, pid);
        }
        // Untrusted (a comm, a file name): escaped once captured, as evidence is.
        d.comm = Some(printable(&comm));
        d.library = Some(printable(&library));
        Some(d)
    }
}

/// An OOM kill: the container its cgroup names, and whether /dev/shm pages were `share` of
/// what the cgroup held or more.
fn oom_killed(kill: OomKill, record: &KmsgRecord, at: SystemTime, share: f64) -> Detected {
    let memory = MemorySplit {
        limit_bytes: kill.limit_bytes,
        usage_bytes: kill.usage_bytes,
        shm_bytes: kill.shmem_bytes,
        anon_bytes: kill.anon_bytes,
        source: MemorySource::KernelLog,
    };
    let kind = if shm_share_at_least(&memory, share) {
        FindingKind::ShmOomKilled
    } else {
        FindingKind::WorkloadOomKilled
    };
    let mut d = Detected::new(
        who_is_cgroup(&kill.memcg),
        kind,
        at,
        FailureSource::Kernel,
        &record.message,
    );
    d.pid = Some(kill.pid);
    d.comm = Some(printable(&kill.comm));
    d.memory = Some(memory);
    d
}

/// Pure: /dev/shm pages at or above `share` of the usage (the limit, where the report gave no
/// usage).
pub fn shm_share_at_least(m: &MemorySplit, share: f64) -> bool {
    match (m.shm_bytes, m.usage_bytes.or(m.limit_bytes)) {
        (Some(shm), Some(total)) if total > 0 => shm as f64 >= share * total as f64,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::kmsg::{self, records};
    use crate::kernel_log::parse_record;
    use crate::model::SHM_OOM_SHARE;

    fn told(content: &str) -> Vec<Detected> {
        let mut r = Recogniser::new(PathBuf::from("/nonexistent"), None, SHM_OOM_SHARE);
        records(content)
            .iter()
            .filter_map(|rec| {
                r.kernel(
                    &parse_record(rec.as_bytes()).unwrap(),
                    SystemTime::UNIX_EPOCH,
                )
            })
            .collect()
    }

    #[test]
    fn a_pod_printing_another_pods_name_and_container_id_speaks_only_of_itself() {
        use crate::logs::LogLine;
        let mut r = Recogniser::new(PathBuf::from("/nonexistent"), None, SHM_OOM_SHARE);
        let victim = "b".repeat(64);
        let line = LogLine {
            origin: ContainerRef { namespace: Some("team-a".into()), pod: Some("noisy-0".into()), pod_uid: Some("aaaaaaaa-0000-4000-8000-000000000000".into()), container: Some("main".into()), container_id: None },
            at: SystemTime::UNIX_EPOCH,
            text: format!(
                "pod prod/payments-0 uid bbbbbbbb-0000-4000-8000-000000000000 container \
                 containerd://{victim} python3[1]: RuntimeError: unable to allocate shared memory(shm) \
                 for file </torch_1_1_0>: No space left on device (28)"
            ),
        };
        let d = r.log_line(&line).expect("a failure");
        assert_eq!(
            d.who,
            ContainerRef {
                namespace: Some("team-a".into()),
                pod: Some("noisy-0".into()),
                pod_uid: Some("aaaaaaaa-0000-4000-8000-000000000000".into()),
                container: Some("main".into()),
                container_id: None
            }
        );
        assert_eq!(d.pid, None, "a PID in a log line is no host PID");
    }

    #[test]
    fn oom_kills_are_dev_shm_failures_when_shm_was_most_of_the_usage() {
        let v1 = told(kmsg::OOM_V1);
        assert_eq!(v1.len(), 1);
        assert_eq!(v1[0].kind, FindingKind::ShmOomKilled);
        assert_eq!(
            v1[0].who,
            ContainerRef {
                pod_uid: Some("11111111-2222-3333-4444-555555555555".into()),
                container_id: Some("a".repeat(64)),
                ..ContainerRef::default()
            }
        );
        assert!(
            v1[0].evidence.contains("Killed process 5947 (dd)"),
            "{}",
            v1[0].evidence
        );
        assert_eq!(told(kmsg::OOM_V2_SHM)[0].kind, FindingKind::ShmOomKilled);
        let anon = told(kmsg::OOM_V2_ANON);
        assert_eq!(anon[0].kind, FindingKind::WorkloadOomKilled);
        assert_eq!(anon[0].pid, Some(77));
    }

    /// A comm and a file name with ESC, BEL, CSI (C1) and a newline, as /dev/kmsg escapes
    /// them: told, with every control character written out.
    #[test]
    fn a_crashs_comm_and_library_reach_no_one_raw() {
        let record = "6,9,1000,-;a\\x1b[2J\\x07\\x0ab[4242]: segfault at 0 ip 0000000000401000 \
                      sp 00007ffc2b6c1f40 error 4 in libnccl.so.2\\xc2\\x9b31m\\x0aOK\
                      [7f0000000000+1000]\n";
        let mut r = Recogniser::new(PathBuf::from("/nonexistent"), None, SHM_OOM_SHARE);
        let d = r
            .kernel(
                &parse_record(record.as_bytes()).unwrap(),
                SystemTime::UNIX_EPOCH,
            )
            .expect("a crash in a GPU library");
        assert_eq!(d.comm.as_deref(), Some("a\\x1b[2J\\x07\\x0ab"));
        assert_eq!(d.library.as_deref(), Some("libnccl.so.2\\x9b31m\\x0aOK"));
        assert!(!d.evidence.chars().any(char::is_control), "{}", d.evidence);
        // An OOM victim's comm too.
        let renamed = kmsg::OOM_V1.replace("(dd)", "(d\\x1b]0;x\\x07)");
        let oom = told(&renamed);
        assert_eq!(oom[0].comm.as_deref(), Some("d\\x1b]0;x\\x07"));
    }

    fn log(container: &str, secs: u64, text: &str) -> LogLine {
        LogLine {
            origin: ContainerRef {
                container_id: Some(container.repeat(64)),
                ..ContainerRef::default()
            },
            at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + secs),
            text: text.into(),
        }
    }

    #[test]
    fn nccls_create_line_without_errno_after_the_line_that_says_why_is_one_failure() {
        // NCCL 2.11 (src/include/shm.h): SYSCHECK's line, then shmOpen's summary line.
        let why = "node08:27106:27302 [0] include/shm.h:19 NCCL WARN Call to shm_open failed : \
                   Permission denied";
        let summary = "node08:27106:27302 [0] include/shm.h:48 NCCL WARN Error while creating \
                       shared memory segment nccl-shm-recv-b7948f403864987a-0-3-0 (size 4460544)";
        let mut r = Recogniser::new(PathBuf::from("/nonexistent"), None, SHM_OOM_SHARE);
        let a = r.log_line(&log("a", 0, why)).unwrap();
        assert_eq!(a.kind, FindingKind::ShmUnavailable);
        assert!(
            r.log_line(&log("a", 0, summary)).is_none(),
            "the same failure"
        );
        // Alone (another container, or long after), the summary is told: a full /dev/shm.
        let b = r.log_line(&log("b", 0, summary)).unwrap();
        assert_eq!(b.kind, FindingKind::ShmAllocationFailed);
        assert!(r.log_line(&log("a", 60, summary)).is_some());
    }

    #[test]
    fn the_share_that_makes_it_a_dev_shm_failure() {
        let m = |shm, usage, limit| MemorySplit {
            limit_bytes: limit,
            usage_bytes: usage,
            shm_bytes: shm,
            anon_bytes: None,
            source: MemorySource::KernelLog,
        };
        assert!(shm_share_at_least(
            &m(Some(50), Some(100), Some(100)),
            SHM_OOM_SHARE
        ));
        assert!(!shm_share_at_least(
            &m(Some(49), Some(100), Some(100)),
            SHM_OOM_SHARE
        ));
        assert!(
            shm_share_at_least(&m(Some(60), None, Some(100)), SHM_OOM_SHARE),
            "the limit when no usage"
        );
        assert!(
            !shm_share_at_least(&m(None, Some(100), Some(100)), SHM_OOM_SHARE),
            "unknown is not /dev/shm"
        );
        assert!(!shm_share_at_least(
            &m(Some(0), Some(0), None),
            SHM_OOM_SHARE
        ));
        assert!(
            shm_share_at_least(&m(Some(30), Some(100), None), 0.3),
            "the share is an option"
        );
    }
}

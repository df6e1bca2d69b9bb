//! A death the kernel's tracepoints told (`death_trace`) as an account, and its reading at the
//! moment lent to the other accounts of the same death (an exit status 135, PyTorch's line), so
//! that each is judged by what /dev/shm held when it died, not by the last scan.

use std::collections::VecDeque;
use std::time::SystemTime;

use super::attribute::who_of_cgroup_file;
use super::bus::shm_was_full;
use super::detect::shm_share_at_least;
use super::same::WINDOW;
use crate::model::{
    ContainerRef, DeathRules, Detected, FailureSource, FindingKind, MemorySource, MemorySplit,
    ShmReading, TracedCause, TracedDeath,
};

/// Traced readings kept for the accounts that follow at most.
const KEPT: usize = 256;

/// The account a traced death is: a SIGBUS fault judged later by its reading (`correlate`),
/// an OOM victim by its memory cgroup's split at the moment (else the kernel's RSS counts);
/// none for another fatal signal, which only places the kernel's word of the crash.
pub fn detected(t: &TracedDeath, rules: DeathRules) -> Option<Detected> {
    let who = t
        .cgroup_file
        .as_deref()
        .map_or(ContainerRef::default(), who_of_cgroup_file);
    let (kind, memory, evidence) = match &t.cause {
        TracedCause::BusFault { code } => (
            FindingKind::WorkloadBusError,
            t.memory,
            format!(
                "a page fault ({}) of {} (host PID {}), told by the kernel's signal:signal_generate",
                bus_code_name(*code),
                t.comm,
                t.pid
            ),
        ),
        TracedCause::OomVictim {
            anon_rss,
            file_rss,
            shmem_rss,
        } => {
            // The victim's own RSS counts stand in where its memory cgroup was not read.
            let (m, may_clear) = match t.memory {
                Some(m) => (m, t.read_in_time),
                None => {
                    let usage = anon_rss.zip(*shmem_rss);
                    let m = MemorySplit {
                        limit_bytes: None,
                        usage_bytes: usage.map(|(a, s)| a + s + file_rss.unwrap_or(0)),
                        shm_bytes: *shmem_rss,
                        anon_bytes: *anon_rss,
                        source: MemorySource::Tracepoint,
                    };
                    (m, false)
                }
            };
            let kind = if shm_share_at_least(&m, rules.oom_shm_share) {
                FindingKind::ShmOomKilled
            } else if may_clear {
                FindingKind::WorkloadOomKilled
            } else {
                // Its cgroup read after the victim let go of its files (what its death freed may
                // be gone), or only its RSS (the shared memory it mapped, not what /dev/shm held:
                // a `dd` into /dev/shm maps none): that can say /dev/shm, never "not /dev/shm".
                // The kernel log's report or the cgroup's OOM count tells this death.
                return None;
            };
            let evidence = format!(
                "OOM victim {} (host PID {}), from the kernel's oom:mark_victim",
                t.comm, t.pid
            );
            (kind, Some(m), evidence)
        }
        TracedCause::Fatal { .. } => return None,
    };
    let mut d = Detected::new(who, kind, t.at, FailureSource::Tracepoint, &evidence);
    d.pid = Some(t.pid);
    d.comm = Some(crate::model::printable(&t.comm)); // the process names itself
    d.memory = memory;
    // A reading after the process let go of its files may lack what its death freed: it stands
    // for the moment only where it says /dev/shm was full; else the scans around it judge.
    d.at_death = (t.reading.as_ref())
        .filter(|r| t.read_in_time || shm_was_full(Some(r), rules.bus_error_shm_ratio))
        .map(|r| Box::new(r.clone()));
    d.pid_start = t.start;
    Some(d)
}

/// SIGKILL on Linux.
const SIGKILL: i32 = 9;

/// How far apart the kernel's crash line and the fatal signal's tracepoint may be stamped (the
/// line is printed as the signal is sent; the kernel log's clock is converted).
const CRASH_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// Whose process a fatal signal went to, read at that moment.
struct Signalled {
    sig: i32,
    pid: i32,
    comm: String,
    at: SystemTime,
    who: ContainerRef,
    start: Option<u64>,
}

/// asm-generic/siginfo.h's names of SIGBUS's fault codes.
fn bus_code_name(code: i32) -> String {
    match code {
        1 => "BUS_ADRALN".into(),
        2 => "BUS_ADRERR".into(),
        3 => "BUS_OBJERR".into(),
        4 => "BUS_MCEERR_AR".into(),
        5 => "BUS_MCEERR_AO".into(),
        c => format!("code {c}"),
    }
}

/// The readings traced deaths carried lately, by container, and whose process each fatal
/// signal lately went to.
#[derive(Default)]
pub struct TracedReadings {
    kept: VecDeque<(String, Option<String>, SystemTime, ShmReading)>,
    placed: VecDeque<Signalled>,
}

impl TracedReadings {
    /// A fatal signal's process, as the tracepoint's moment read it.
    pub fn remember_place(&mut self, t: &TracedDeath) {
        let who = t
            .cgroup_file
            .as_deref()
            .map_or(ContainerRef::default(), who_of_cgroup_file);
        let TracedCause::Fatal { sig } = t.cause else {
            return;
        };
        self.placed.push_back(Signalled {
            sig,
            pid: t.pid,
            comm: crate::model::printable(&t.comm),
            at: t.at,
            who,
            start: t.start,
        });
        while self.placed.len() > KEPT {
            self.placed.pop_front();
        }
    }

    /// The kernel's word of a crash, placed by the fatal signal's tracepoint of the same PID
    /// and command nearest in time: the process that had the PID then, whichever has it now.
    /// A SIGKILL places no crash: another sends it (the previous holder of a PID killed moments
    /// before a crash under the same name is not the crasher), and the line is the fault's own.
    pub fn place(&self, d: &mut Detected) {
        if d.source != FailureSource::Kernel || d.kind != FindingKind::GpuJobCrashed {
            return;
        }
        let Some(pid) = d.pid else { return };
        let apart = |p: &Signalled| p.at.duration_since(d.at).unwrap_or_else(|e| e.duration());
        let found = self
            .placed
            .iter()
            .filter(|p| {
                p.pid == pid
                    && p.sig != SIGKILL
                    && d.comm.as_deref() == Some(p.comm.as_str())
                    && apart(p) <= CRASH_SLACK
            })
            .min_by_key(|p| apart(p));
        if let Some(p) = found {
            d.who = p.who.clone();
            d.pid_start = p.start;
            d.pid_taken = false;
        }
    }

    pub fn remember(&mut self, d: &Detected) {
        let (Some(r), Some((cid, uid))) = (&d.at_death, ids(&d.who)) else {
            return;
        };
        self.kept.push_back((
            cid.to_string(),
            uid.map(str::to_string),
            d.at,
            (**r).clone(),
        ));
        while self.kept.len() > KEPT {
            self.kept.pop_front();
        }
    }

    /// Lends `d` its container's traced reading within [`WINDOW`] of it, where it has none; a
    /// log line's Pod learns the container instance too, so that `same.rs` knows the line and
    /// the trace for one death even when no scan ever saw the container (it lived 1.5 s).
    pub fn lend(&self, d: &mut Detected) {
        if d.at_death.is_some() {
            return;
        }
        let found = self.kept.iter().rev().find(|(cid, uid, at, _)| {
            let near = at.duration_since(d.at).unwrap_or_else(|e| e.duration()) <= WINDOW;
            near && same_container(cid, uid.as_deref(), &d.who)
        });
        let Some((cid, _, _, r)) = found else { return };
        d.at_death = Some(Box::new(r.clone()));
        // A log line's Pod named no instance: the trace's is it.
        if d.who.pod_uid.is_some() && d.who.container_id.is_none() {
            d.who.container_id = Some(cid.clone());
        }
    }
}

/// Its container ID and, where known, its Pod's UID.
fn ids(who: &ContainerRef) -> Option<(&str, Option<&str>)> {
    let id = who.container_id.as_deref()?;
    Some((id, who.pod_uid.as_deref()))
}

/// By container ID; a log line's Pod names no instance, so its Pod UID must do (a Pod's other
/// containers' deaths are told by their own tracepoints, nearer in time).
fn same_container(cid: &str, uid: Option<&str>, who: &ContainerRef) -> bool {
    match (&who.container_id, &who.pod_uid) {
        (None, Some(pod_uid)) => uid == Some(pod_uid.as_str()),
        _ => ids(who).is_some_and(|(c, _)| crate::model::strip_runtime_prefix(c) == cid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const CID: &str = "3f2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

    fn share(oom_shm_share: f64) -> DeathRules {
        DeathRules {
            oom_shm_share,
            ..DeathRules::default()
        }
    }

    fn traced(cause: TracedCause, memory: Option<MemorySplit>) -> TracedDeath {
        TracedDeath {
            pid: 4242,
            comm: "python3".into(),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            cause,
            cgroup_file: Some(format!(
                "0::/kubepods/burstable/pod0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80/{CID}\n"
            )),
            reading: Some(crate::fixtures::shm_reading(CID, 64 << 20, 64 << 20)),
            memory,
            read_after: Duration::from_micros(80),
            read_in_time: true,
            start: Some(77),
        }
    }

    #[test]
    fn a_crash_line_is_placed_by_the_fatal_signal_of_its_pid_and_command_at_that_moment() {
        let mut readings = TracedReadings::default();
        // The PID's previous holder, killed a moment before, in another Pod.
        let mut killed = traced(TracedCause::Fatal { sig: 9 }, None);
        killed.cgroup_file = Some("0::/kubepods/podvictim/victim\n".into());
        killed.at -= Duration::from_millis(100);
        readings.remember_place(&killed);
        let t = traced(TracedCause::Fatal { sig: 11 }, None);
        assert_eq!(detected(&t, share(0.5)), None, "no failure alone");
        readings.remember_place(&t);
        // Read later: the PID is another Pod's process now (or no one's).
        let crash = |comm: &str, after: u64| {
            let mut d = Detected::new(
                ContainerRef::default(),
                FindingKind::GpuJobCrashed,
                t.at + Duration::from_millis(after),
                FailureSource::Kernel,
                "python3[4242]: segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2",
            );
            d.pid = Some(4242);
            d.comm = Some(comm.into());
            d.pid_taken = true;
            d
        };
        let mut d = crash("python3", 300);
        readings.place(&mut d);
        assert!(
            d.who.container_id.as_deref() == Some(CID) && d.who.pod.is_none(),
            "{:?}",
            d.who
        );
        assert_eq!((d.pid_start, d.pid_taken), (Some(77), false));
        // Another command, or seconds apart: not that process.
        for mut d in [crash("bash", 300), crash("python3", 5000)] {
            readings.place(&mut d);
            assert_eq!(d.who, ContainerRef::default());
        }
        // The SIGSEGV's moment unread (the process gone): the SIGKILL of the PID's previous
        // holder does not place it.
        let mut readings = TracedReadings::default();
        readings.remember_place(&killed);
        let mut d = crash("python3", 300);
        readings.place(&mut d);
        assert_eq!(d.who, ContainerRef::default());
    }

    /// Read after the process let go of its files, /dev/shm may lack what its death freed (a
    /// DataLoader worker's unlinked segments go with its files): such a reading says "full",
    /// never "not full".
    #[test]
    fn a_reading_after_the_process_let_go_of_its_files_can_say_full_never_not_full() {
        let bus = |used: u64, in_time: bool| {
            let mut t = traced(TracedCause::BusFault { code: 2 }, None);
            t.reading = Some(crate::fixtures::shm_reading(CID, 64 << 20, used << 20));
            t.read_in_time = in_time;
            detected(&t, DeathRules::default())
                .unwrap()
                .at_death
                .map(|r| r.used_bytes.unwrap() >> 20)
        };
        assert_eq!(bus(64, false), Some(64), "late, but full");
        assert_eq!(bus(10, false), None, "late and not full: the scans judge");
        assert_eq!(bus(10, true), Some(10), "in time: the moment's");
    }

    #[test]
    fn a_traced_fault_is_placed_and_carries_its_reading() {
        let d = detected(&traced(TracedCause::BusFault { code: 2 }, None), share(0.5)).unwrap();
        assert_eq!(d.source, FailureSource::Tracepoint);
        assert!(d.evidence.contains("BUS_ADRERR"), "{}", d.evidence);
        let ContainerRef {
            pod_uid,
            container_id: Some(container_id),
            ..
        } = &d.who
        else {
            panic!("{:?}", d.who)
        };
        assert_eq!(container_id, CID);
        assert_eq!(
            pod_uid.as_deref(),
            Some("0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80")
        );
        assert_eq!(d.at_death.as_ref().unwrap().used_bytes, Some(64 << 20));
    }

    #[test]
    fn an_oom_victim_is_judged_by_its_split_at_the_moment_or_the_kernels_rss() {
        let split = |shm| MemorySplit {
            limit_bytes: Some(1000),
            usage_bytes: Some(1000),
            shm_bytes: Some(shm),
            anon_bytes: Some(1000 - shm),
            source: MemorySource::Tracepoint,
        };
        let rss = TracedCause::OomVictim {
            anon_rss: Some(100),
            file_rss: Some(0),
            shmem_rss: Some(900),
        };
        assert_eq!(
            detected(&traced(rss.clone(), Some(split(800))), share(0.5))
                .unwrap()
                .kind,
            FindingKind::ShmOomKilled
        );
        assert_eq!(
            detected(&traced(rss.clone(), Some(split(100))), share(0.5))
                .unwrap()
                .kind,
            FindingKind::WorkloadOomKilled
        );
        let d = detected(&traced(rss, None), share(0.5)).unwrap();
        assert_eq!(
            (d.kind, d.memory.unwrap().usage_bytes),
            (FindingKind::ShmOomKilled, Some(1000))
        );
    }

    /// Read after the victim let go of its files, or from its RSS alone, an OOM kill can be
    /// told as /dev/shm's, never as the workload's: such a death is left to the kernel log's
    /// report and the cgroup's OOM count.
    #[test]
    fn a_late_or_rss_only_oom_reading_can_say_dev_shm_never_not_dev_shm() {
        let split = MemorySplit {
            limit_bytes: Some(1000),
            usage_bytes: Some(1000),
            shm_bytes: Some(0),
            anon_bytes: Some(1000),
            source: MemorySource::Tracepoint,
        };
        let rss = |shmem| TracedCause::OomVictim {
            anon_rss: Some(1000 - shmem),
            file_rss: Some(0),
            shmem_rss: Some(shmem),
        };
        let late = |cause, memory| {
            let mut t = traced(cause, memory);
            t.read_in_time = false;
            detected(&t, share(0.5)).map(|d| d.kind)
        };
        // A `dd` into /dev/shm maps none of it: its RSS shows no shared memory.
        assert_eq!(detected(&traced(rss(0), None), share(0.5)), None);
        assert_eq!(late(rss(0), Some(split)), None);
        assert_eq!(late(rss(900), None), Some(FindingKind::ShmOomKilled));
        let full = MemorySplit {
            shm_bytes: Some(900),
            anon_bytes: Some(100),
            ..split
        };
        assert_eq!(late(rss(0), Some(full)), Some(FindingKind::ShmOomKilled));
        assert_eq!(
            detected(&traced(rss(0), Some(split)), share(0.5)).map(|d| d.kind),
            Some(FindingKind::WorkloadOomKilled)
        );
    }

    #[test]
    fn the_reading_is_lent_to_the_same_containers_accounts_within_the_window() {
        let t = detected(&traced(TracedCause::BusFault { code: 2 }, None), share(0.5)).unwrap();
        let mut kept = TracedReadings::default();
        kept.remember(&t);
        let exit = |who: ContainerRef, secs: u64| {
            Detected::new(
                who,
                FindingKind::WorkloadBusError,
                t.at + Duration::from_secs(secs),
                FailureSource::PodStatus,
                "",
            )
        };
        let pod = |uid: &str, cid: Option<&str>| ContainerRef {
            namespace: Some("ns".into()),
            pod: Some("p".into()),
            pod_uid: Some(uid.into()),
            container: Some("c".into()),
            container_id: cid.map(str::to_string),
        };
        let uid = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
        let mut lent = exit(pod(uid, Some(&format!("containerd://{CID}"))), 2);
        kept.lend(&mut lent);
        assert!(lent.at_death.is_some(), "the exit status of that container");
        let mut line = exit(pod(uid, None), 1);
        kept.lend(&mut line);
        assert!(line.at_death.is_some(), "a line of that Pod");
        for mut other in [
            exit(pod(uid, Some("other")), 2),
            exit(pod("other-uid", None), 1),
            exit(pod(uid, None), 120),
        ] {
            kept.lend(&mut other);
            assert!(other.at_death.is_none(), "{:?}", other.who);
        }
    }

    #[test]
    fn a_traced_fault_its_exit_status_and_pytorchs_line_are_one_failure() {
        use crate::failures::pipeline::{Mode, Pipeline, Sources};
        use crate::kube::podresources::GpuHolders;
        use crate::model::{DeathRules, Exit};
        let settings = Sources {
            pod_log_root: None,
            docker_root: None,
            kmsg: None,
            proc_root: std::path::PathBuf::from("/nonexistent"),
            host_mnt: None,
            rules: DeathRules::default(),
        };
        let uid = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
        let pod = |cid: Option<String>| ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("fill-0".into()),
            pod_uid: Some(uid.into()),
            container: Some("fill".into()),
            container_id: cid,
        };
        let death = traced(TracedCause::BusFault { code: 2 }, None);
        let line = Detected::new(
            pod(None),
            FindingKind::ShmAllocationFailed,
            death.at + Duration::from_millis(3),
            FailureSource::Log,
            "RuntimeError: DataLoader worker (pid 3527) is killed by signal: Bus error.",
        );
        let mut exit = Detected::new(
            pod(Some(CID.to_string())),
            FindingKind::WorkloadBusError,
            death.at + Duration::from_secs(1),
            FailureSource::PodStatus,
            "",
        );
        exit.exit = Some(Exit {
            code: Some(135),
            signal: None,
            reason: Some("Error".into()),
        });
        let holders = GpuHolders::new();
        // In one round, and over three rounds as serve's follower gets them.
        let mut one = Pipeline::new(&settings, Mode::Follow);
        one.traced(&death);
        one.exits([line.clone(), exit.clone()]);
        let mut told = one.tell(None, None, &holders);
        let mut three = Pipeline::new(&settings, Mode::Follow);
        three.traced(&death);
        let mut rounds = three.tell(None, None, &holders);
        three.exits([line]);
        rounds.extend(three.tell(None, None, &holders));
        three.exits([exit]);
        rounds.extend(three.tell(None, None, &holders));
        for failures in [std::mem::take(&mut told), rounds] {
            let kinds: Vec<_> = failures.iter().map(|f| (f.kind, f.source)).collect();
            assert_eq!(
                kinds,
                [(FindingKind::ShmBusError, FailureSource::Tracepoint)]
            );
            assert!(
                failures[0].message.contains("with /dev/shm full"),
                "{}",
                failures[0].message
            );
        }
    }
}

//! Never twice: the follower run, checkpointed, "restarted" (a new follower from the checkpoint)
//! and fed the same log files and kernel records again plus new ones: every death once, those
//! from while it was down marked found late.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;

use super::*;
use crate::model::DeathRules;

const BUS: &str = "ERROR: Unexpected bus error encountered in worker. This might be caused by \
                   insufficient shared memory (shm).";

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// A CRI line stamped `at`.
fn cri(text: &str, at: SystemTime) -> String {
    let t = k8s_openapi::jiff::Timestamp::try_from(at).unwrap();
    format!("{} stderr F {text}\n", t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
}

/// A kernel record of a crash in libnccl.so.2 by host PID `pid`, `usec` after boot.
fn crash(seq: u64, usec: u64, pid: u32) -> String {
    format!(
        "6,{seq},{usec},-;python3[{pid}]: segfault at 0 ip 0 sp 0 error 4 in \
         libnccl.so.2[7f0000000000+1000]\n"
    )
}

struct Node {
    tmp: tempfile::TempDir,
}

impl Node {
    fn log(&self) -> std::path::PathBuf {
        self.tmp.path().join("pods/ml_trainer-0_u-1/trainer/0.log")
    }

    fn kmsg(&self) -> std::path::PathBuf {
        self.tmp.path().join("kmsg")
    }

    fn checkpoint(&self) -> std::path::PathBuf {
        self.tmp.path().join("checkpoint.json")
    }

    /// A follower of the node's log and kernel log, resuming from its checkpoint if saved.
    fn follower(&self) -> Follower {
        self.follower_after(false)
    }

    /// The same, the store saying the node rebooted since (or not).
    fn follower_after(&self, boot_changed: bool) -> Follower {
        let sources = Sources {
            pod_log_root: Some(self.tmp.path().join("pods")),
            docker_root: None,
            kmsg: Some(self.kmsg()),
            proc_root: "/proc".into(),
            host_mnt: None,
            rules: DeathRules::default(),
        };
        let (_tx, exits) = mpsc::channel();
        let f = Follow {
            pipeline: Pipeline::new(&sources, Mode::Follow),
            sources,
            snapshot: Arc::new(ArcSwapOption::empty()),
            cluster: None,
            exits,
            traced: None,
            stop: Arc::new(AtomicBool::new(false)),
            resume: Some(Resume {
                saved: std::fs::read(self.checkpoint())
                    .ok()
                    .and_then(|b| Checkpoint::from_stored(&serde_json::from_slice(&b).unwrap())),
                boot_changed,
                told: Vec::new(),
            }),
        };
        Follower::new(f)
    }
}

/// One poll's reading of the logs and the kernel log, and the telling after it.
fn read_and_tell(f: &mut Follower) {
    let candidates = f.f.pipeline.candidates();
    if let Some(logs) = f.logs.as_mut() {
        read_logs(logs, &candidates, &mut f.f.pipeline);
    }
    f.read_kernel_log();
    f.tell();
}

/// A few of serve's rounds: read, tell, hand on (the checkpoint kept as the store would).
/// What was told.
fn rounds(node: &Node, f: &mut Follower) -> Vec<Failure> {
    let told = std::cell::RefCell::new(Vec::new());
    let deliver = |x: Followed| {
        if let Followed::Told {
            failures,
            checkpoint,
        } = x
        {
            told.borrow_mut().extend(failures);
            if let Some(c) = checkpoint {
                std::fs::write(node.checkpoint(), c.to_stored().to_string()).unwrap();
            }
        }
        true
    };
    for _ in 0..3 {
        read_and_tell(f);
        // A checkpoint is due after telling, or every 2 s: the test's rounds are quicker.
        f.told = true;
        assert!(f.hand_on(&deliver));
    }
    told.into_inner()
}

/// (evidence's start, found late) of what was told.
fn said(told: &[Failure]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = told
        .iter()
        .map(|f| (f.evidence.chars().take(24).collect(), f.found_late))
        .collect();
    out.sort();
    out
}

#[test]
fn deaths_are_told_once_across_restarts_and_those_while_down_found_late() {
    let node = Node {
        tmp: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(node.log().parent().unwrap()).unwrap();
    let now = SystemTime::now();
    let hour_ago = now - Duration::from_secs(3600);
    append(&node.log(), &cri("epoch 1", hour_ago));
    append(&node.kmsg(), "6,1,1000,-;boot noise\n");

    // The first start: from the ends; a death after it is told, not late.
    let mut first = node.follower();
    append(&node.log(), &cri(BUS, now));
    let usec_now =
        u64::try_from(crate::procfs::uptime::since_boot(Path::new("/proc")).as_micros()).unwrap();
    append(&node.kmsg(), &crash(2, usec_now + 60_000_000, 101));
    let told = said(&rounds(&node, &mut first));
    assert_eq!(
        told,
        [
            ("ERROR: Unexpected bus er".to_string(), false),
            ("python3[101]: segfault a".to_string(), false)
        ]
    );
    assert!(node.checkpoint().exists());
    drop(first);

    // While it is down: a second death of each kind, written before the restart.
    append(
        &node.log(),
        &cri(&BUS.replace("worker", "worker 2"), hour_ago),
    );
    append(&node.kmsg(), &crash(3, 2_000_000, 202));
    let mut second = node.follower();
    // And one after.
    append(&node.kmsg(), &crash(4, usec_now + 120_000_000, 303));
    let told = said(&rounds(&node, &mut second));
    assert_eq!(
        told,
        [
            ("ERROR: Unexpected bus er".to_string(), true),
            ("python3[202]: segfault a".to_string(), true),
            ("python3[303]: segfault a".to_string(), false)
        ],
        "the first run's deaths not again, the new ones once"
    );
    drop(second);

    // A third start with nothing new: nothing told.
    let mut third = node.follower();
    assert_eq!(said(&rounds(&node, &mut third)), []);
}

#[test]
fn docker_exits_told_before_a_restart_are_not_told_again() {
    let exit = |id: &str, secs: u64| DockerExit {
        id: id.into(),
        name: "trainer".into(),
        exit_code: 135,
        oom_killed: false,
        finished_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        memory_limit: None,
        shm_size: None,
    };
    let mut first = DockerFollower::new("/nonexistent".into(), None);
    assert!(first.first_time(&exit("a", 10)));
    let mut c = Checkpoint::new(SystemTime::UNIX_EPOCH + Duration::from_secs(20));
    c.docker_told = first.told.iter().cloned().collect();
    let c: Checkpoint = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    let mut second = DockerFollower::new("/nonexistent".into(), Some(&c));
    assert_eq!(second.since, c.at, "records from the checkpoint on");
    assert!(!second.first_time(&exit("a", 10)));
    assert!(second.first_time(&exit("a", 30)), "its restart's death");
    assert!(second.first_time(&exit("b", 15)));
}

#[test]
fn an_oom_report_cut_by_a_restart_is_read_whole_after_it() {
    let node = Node {
        tmp: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(node.log().parent().unwrap()).unwrap();
    append(&node.kmsg(), "6,1,1000,-;boot noise\n");
    let memcg = "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/c1";
    let mut first = node.follower();
    // Records' times after the start (the first start saves "after now" for the kernel log).
    let t = u64::try_from(crate::procfs::uptime::since_boot(Path::new("/proc")).as_micros())
        .unwrap()
        + 60_000_000;
    append(
        &node.kmsg(),
        &format!(
            "4,2,{t},-;x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n\
             6,3,{t},-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=a,task_memcg=\
             {memcg},oom_memcg={memcg},mems_allowed=0,mems_allowed=0,global_oom,task_memcg=\
             {memcg},task=x,pid=9,uid=0\n"
        ),
    );
    assert_eq!(said(&rounds(&node, &mut first)), []);
    drop(first);
    append(
        &node.kmsg(),
        &format!(
            "3,4,{t},-;Out of memory: Killed process 9 (x) total-vm:8kB, anon-rss:4kB, \
             file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:1000\n"
        ),
    );
    let mut second = node.follower();
    let told = rounds(&node, &mut second);
    assert_eq!(told.len(), 1, "{told:#?}");
    // Its time is a minute ahead of now: told, not found late (the time decides that).
    assert!(told[0].kind.is_oom_kill(), "{told:#?}");
    drop(second);
    assert_eq!(said(&rounds(&node, &mut node.follower())), []);
}

#[test]
fn after_a_reboot_the_kernel_log_is_read_on_by_time_not_by_sequence() {
    let Some(boot) = crate::kernel_log::resume::boot_id(Path::new("/proc")) else {
        return; // no boot ID to match: the sequence number is never trusted anyway
    };
    let node = Node {
        tmp: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(node.log().parent().unwrap()).unwrap();
    let now = SystemTime::now();
    let usec_now =
        u64::try_from(crate::procfs::uptime::since_boot(Path::new("/proc")).as_micros()).unwrap();
    // A crash a second ago, numbered below the stored position of "this" boot.
    append(&node.kmsg(), &crash(5, usec_now - 1_000_000, 505));
    let mut c = Checkpoint::new(now - Duration::from_secs(60));
    c.kmsg = Some(KmsgCheckpoint {
        boot_id: boot,
        seq: Some(10),
        usec: usec_now,
        at: now - Duration::from_secs(60),
    });
    std::fs::write(node.checkpoint(), c.to_stored().to_string()).unwrap();
    // The same boot: read on after sequence 10, the crash is history.
    assert_eq!(said(&rounds(&node, &mut node.follower_after(false))), []);
    // The store says another boot: the ring's numbers began again; read on from its time.
    std::fs::write(node.checkpoint(), c.to_stored().to_string()).unwrap();
    let told = said(&rounds(&node, &mut node.follower_after(true)));
    assert_eq!(told, [("python3[505]: segfault a".to_string(), true)]);
}

/// One of serve's rounds: read, tell, hand on (a checkpoint kept as the store would); what was
/// handed on (failures' evidence starts, whether a checkpoint went with them).
fn one_round(node: &Node, f: &mut Follower) -> Vec<(Vec<String>, bool)> {
    let handed = std::cell::RefCell::new(Vec::new());
    let deliver = |x: Followed| {
        if let Followed::Told {
            failures,
            checkpoint,
        } = x
        {
            let said = failures
                .iter()
                .map(|f| f.evidence.chars().take(33).collect())
                .collect();
            handed.borrow_mut().push((said, checkpoint.is_some()));
            if let Some(c) = checkpoint {
                std::fs::write(node.checkpoint(), c.to_stored().to_string()).unwrap();
            }
        }
        true
    };
    read_and_tell(f);
    assert!(f.hand_on(&deliver));
    handed.into_inner()
}

#[test]
fn failures_told_while_an_oom_kill_is_held_go_with_a_checkpoint_held_before_it() {
    let node = Node {
        tmp: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(node.log().parent().unwrap()).unwrap();
    append(&node.log(), &cri("epoch 1", SystemTime::now()));
    append(&node.kmsg(), "6,1,1000,-;boot noise\n");
    let memcg = "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/c1";
    let t = u64::try_from(crate::procfs::uptime::since_boot(Path::new("/proc")).as_micros())
        .unwrap()
        + 60_000_000;
    let deaths = || {
        append(&node.log(), &cri(BUS, SystemTime::now()));
        append(
            &node.kmsg(),
            &format!(
                "4,2,{t},-;x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n\
                 6,3,{t},-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=a,\
                 task_memcg={memcg},oom_memcg={memcg},task=x,pid=9,uid=0\n\
                 3,4,{t},-;Out of memory: Killed process 9 (x) total-vm:8kB, anon-rss:4kB, \
                 file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:1000\n"
            ),
        );
    };
    // With a store: the first round's checkpoint (nothing told) goes alone.
    let mut f = node.follower();
    assert_eq!(one_round(&node, &mut f), [(vec![], true)]);
    deaths();
    let kmsg_seq = || {
        let stored = serde_json::from_slice(&std::fs::read(node.checkpoint()).unwrap()).unwrap();
        Checkpoint::from_stored(&stored).unwrap().kmsg.unwrap().seq
    };
    // The bus error is told at once, with a checkpoint past it that stays before the OOM kill
    // held a round...
    assert_eq!(one_round(&node, &mut f), [(vec![BUS[..33].into()], true)]);
    assert_eq!(
        kmsg_seq(),
        None,
        "where it started, before the kill's report"
    );
    // ...then the kill, with the checkpoint past it.
    let handed = one_round(&node, &mut f);
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert_eq!(handed[0].0.len(), 1, "{handed:?}");
    assert!(handed[0].1, "the checkpoint goes with it");
    assert_eq!(kmsg_seq(), Some(4), "past the report");
    drop(f);

    // Without a store: told at once, no checkpoint.
    std::fs::remove_file(node.checkpoint()).unwrap();
    let mut f = node.follower();
    f.saver = None;
    deaths();
    let handed = one_round(&node, &mut f);
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert_eq!((handed[0].0.len(), handed[0].1), (1, false), "{handed:?}");
}

/// The kernel's whole report of an OOM kill of PID `pid` in its own Pod, `usec` after boot,
/// numbered from `seq`.
fn oom_report(seq: u64, usec: u64, pid: u64) -> String {
    let memcg = format!("/kubepods/besteffort/pod11111111-2222-3333-4444-{pid:012}/c");
    format!(
        "4,{seq},{usec},-;x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n\
         6,{},{usec},-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=a,\
         task_memcg={memcg},oom_memcg={memcg},task=x,pid={pid},uid=0\n\
         3,{},{usec},-;Out of memory: Killed process {pid} (x) total-vm:8kB, anon-rss:4kB, \
         file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:1000\n",
        seq + 1,
        seq + 2,
    )
}

#[test]
fn a_stream_of_deaths_does_not_starve_checkpoints_and_a_restart_tells_each_once() {
    let node = Node {
        tmp: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(node.log().parent().unwrap()).unwrap();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    append(&node.log(), &cri("epoch 1", hour_ago));
    append(&node.kmsg(), "6,1,1000,-;boot noise\n");
    let usec_now =
        u64::try_from(crate::procfs::uptime::since_boot(Path::new("/proc")).as_micros()).unwrap();
    let mut f = node.follower();
    assert_eq!(one_round(&node, &mut f), [(vec![], true)]);
    // Every round a worker's bus error (told at once) and another Pod's OOM kill (held a round
    // for PyTorch's word): from the first death on, something is always pending. Deaths 70 s
    // apart, each its own.
    let mut told = Vec::new();
    let mut checkpoints = 0;
    for i in 0..8u64 {
        let at = hour_ago + Duration::from_secs(70 * i);
        append(
            &node.log(),
            &cri(&BUS.replace("worker", &format!("w{i}")), at),
        );
        let usec = usec_now + 60_000_000 + 70_000_000 * i;
        append(&node.kmsg(), &oom_report(2 + 3 * i, usec, 100 + i));
        for (said, checkpoint) in one_round(&node, &mut f) {
            told.extend(said);
            checkpoints += usize::from(checkpoint);
        }
        assert!(f.f.pipeline.has_pending(), "a kill held in round {i}");
    }
    assert_eq!(
        checkpoints, 8,
        "one with what each round told, pending or not"
    );
    // 8 bus errors and 7 kills told; the eighth kill pending when the agent stops.
    assert_eq!(told.len(), 15, "{told:?}");
    drop(f);

    // Without the store's told failures to tell a death read again from one told: the
    // positions alone must read again exactly the pending kill.
    let mut again = node.follower();
    let after = one_round(&node, &mut again);
    let after: Vec<String> = after.into_iter().flat_map(|(said, _)| said).collect();
    let more = one_round(&node, &mut again);
    let more: Vec<String> = more.into_iter().flat_map(|(said, _)| said).collect();
    assert_eq!(
        [after, more].concat(),
        ["Out of memory: Killed process 107"],
        "the pending kill once, nothing told before again"
    );
}

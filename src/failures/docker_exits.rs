//! Pure: Docker's record of a stopped container -> a death (`check` on a plain Docker host):
//! `OOMKilled` is an OOM kill, exit status 135 a SIGBUS. Exit 137 alone is a SIGKILL from
//! anyone (`docker kill`, `docker stop` after its timeout) and is not told.

use crate::docker_records::DockerExit;
use crate::model::{
    ContainerRef, Detected, Exit, FailureSource, FindingKind, MemorySource, MemorySplit,
};

/// The death Docker's record tells, if it is one of memory.
pub fn detected(e: &DockerExit) -> Option<Detected> {
    let exit = Exit {
        code: Some(e.exit_code),
        signal: None,
        reason: e.oom_killed.then(|| "OOMKilled".to_string()),
    };
    let kind = exit.death()?;
    let evidence = format!(
        "Docker's record of {}: State.OOMKilled {}, State.ExitCode {}, State.FinishedAt {}",
        e.name,
        e.oom_killed,
        e.exit_code,
        super::correlate::rfc3339(e.finished_at),
    );
    let who = ContainerRef::docker(&e.id, &e.name);
    let mut d = Detected::new(who, kind, e.finished_at, FailureSource::Docker, &evidence);
    if kind == FindingKind::WorkloadOomKilled {
        // No numbers in the record: judged by a reading where one exists (correlate.rs).
        d.memory = Some(MemorySplit {
            limit_bytes: e.memory_limit,
            usage_bytes: None,
            shm_bytes: None,
            anon_bytes: None,
            source: MemorySource::Docker,
        });
    }
    d.exit = Some(exit);
    Some(d)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn exit(code: i32, oom: bool) -> DockerExit {
        DockerExit {
            id: "e2888a78ea8c46876cf480733b34b668a9eeed624174dfb86252240ef8db30b3".into(),
            name: "oomk".into(),
            exit_code: code,
            oom_killed: oom,
            finished_at: UNIX_EPOCH + Duration::from_secs(1_795_000_000),
            memory_limit: Some(64 << 20),
            shm_size: Some(1 << 30),
        }
    }

    #[test]
    fn oomkilled_and_exit_135_are_deaths_and_a_plain_kill_is_not() {
        let oom = detected(&exit(137, true)).unwrap();
        assert_eq!(oom.kind, FindingKind::WorkloadOomKilled);
        assert_eq!(oom.source, FailureSource::Docker);
        assert_eq!(oom.memory.unwrap().limit_bytes, Some(64 << 20));
        assert_eq!(oom.memory.unwrap().source, MemorySource::Docker);
        assert_eq!(
            oom.evidence,
            "Docker's record of oomk: State.OOMKilled true, State.ExitCode 137, State.FinishedAt 2026-11-18T11:06:40Z"
        );
        let bus = detected(&exit(135, false)).unwrap();
        assert_eq!(bus.kind, FindingKind::WorkloadBusError);
        assert_eq!(bus.memory, None);
        assert_eq!(bus.exit.unwrap().describe(), "exit status 135 (SIGBUS)");
        for (code, oom) in [(137, false), (0, false), (1, false), (143, false)] {
            assert_eq!(detected(&exit(code, oom)), None, "{code}");
        }
    }
}

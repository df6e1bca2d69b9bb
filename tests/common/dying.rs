//! Containers that die for real in a Pod of their own, one of three ways, and the exit kubelet
//! records for each.

use std::path::Path;

use super::{Container, ContainerSpec};

/// PyTorch's DataLoader line for a bus error in a worker.
pub const BUS_LINE: &str = "ERROR: Unexpected bus error encountered in worker. This might be \
                            caused by insufficient shared memory (shm).";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// [`BUS_LINE`] in the container's CRI log, then exit 1.
    LogLine,
    /// The kernel OOM-kills the main process in its 64 MiB cgroup.
    OomKill,
    /// A real SIGBUS (a mapped file truncated under the process).
    SigBus,
}

pub const KINDS: [Kind; 3] = [Kind::LogLine, Kind::OomKill, Kind::SigBus];

impl Kind {
    /// kubelet's `terminated` exit code and reason for the death.
    pub fn kubelet_exit(self) -> (i32, &'static str) {
        match self {
            Kind::LogLine => (1, "Error"),
            Kind::OomKill => (137, "OOMKilled"),
            Kind::SigBus => (135, "Error"),
        }
    }
}

/// Where the container lives: its Pod and its own name and ID.
pub struct InPod<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub uid: &'a str,
    pub container: &'a str,
    pub id: &'a str,
}

/// Starts the container that dies as `kind`; a log line's CRI log goes where kubelet lays it
/// out under `log_root`; `python` is the host's (for the SIGBUS).
pub fn start(kind: Kind, at: &InPod, log_root: &Path, python: &Path) -> Container {
    match kind {
        Kind::LogLine => {
            let dir = log_root.join(format!(
                "{}_{}_{}/{}",
                at.namespace, at.pod, at.uid, at.container
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let script = format!("echo 'epoch 1: loss 0.42'; sleep 0.2; echo '{BUS_LINE}'; exit 1");
            Container::start(ContainerSpec {
                pod_uid: Some(at.uid.to_string()),
                id: Some(at.id.to_string()),
                args: vec!["sh".into(), "-c".into(), script],
                cri_log: Some(dir.join("0.log")),
                ..ContainerSpec::default()
            })
        }
        Kind::OomKill => super::oom::main_process_past_the_limit(at.uid, at.id),
        Kind::SigBus => super::crash::sigbus_container(at.uid, at.id, python),
    }
}

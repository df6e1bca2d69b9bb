//! Where a line becomes a failure: a container's log line matched against the signatures, or a
//! kernel record of a crash placed through its host PID, -> [`Detected`].

use std::path::PathBuf;
use std::time::SystemTime;

use super::attribute::who_is_pid;
use super::crash::{gpu_lib_crash, Crash};
use super::signatures::{LogFailure, Signatures};
use crate::host::NsId;
use crate::kernel_log::KmsgRecord;
use crate::logs::{LogLine, LogOrigin};
use crate::model::{cut, Detected, FailureSource, FindingKind, Who, EVIDENCE_MAX};

/// Lines and kernel records in, failures out.
pub struct Recogniser {
    pub(super) signatures: Signatures,
    proc_root: PathBuf,
    host_mnt: Option<NsId>,
}

impl Recogniser {
    /// `proc_root` and `host_mnt` place a host PID (`attribute.rs`).
    pub fn new(proc_root: PathBuf, host_mnt: Option<NsId>) -> Recogniser {
        Recogniser {
            signatures: Signatures::new(),
            proc_root,
            host_mnt,
        }
    }

    /// A container's line: only ever about that container.
    pub fn log_line(&self, line: &LogLine) -> Option<Detected> {
        let m = self.signatures.match_line(&line.text)?;
        let who = match &line.origin {
            LogOrigin::Pod {
                namespace,
                pod,
                uid,
                container,
            } => Who::Pod {
                namespace: namespace.clone(),
                pod: pod.clone(),
                uid: uid.clone(),
                container: container.clone(),
            },
            LogOrigin::Docker { id } => Who::Container {
                pod_uid: None,
                container_id: id.clone(),
            },
        };
        Some(Detected {
            who,
            kind: match m.kind {
                LogFailure::ShmAllocationFailed => FindingKind::ShmAllocationFailed,
                LogFailure::NcclP2pDisabled => FindingKind::NcclP2pDisabled,
            },
            at: line.at,
            source: FailureSource::Log,
            evidence: cut(line.text.trim(), EVIDENCE_MAX),
            pid: None,
            comm: None,
            library: None,
            nccl_gpus: m.gpus,
        })
    }

    /// A kernel record: a crash in a GPU library, placed through the crashing PID at once.
    pub fn kernel(&self, record: &KmsgRecord, at: SystemTime) -> Option<Detected> {
        let Crash { comm, pid, library } = gpu_lib_crash(record)?;
        Some(Detected {
            who: who_is_pid(&self.proc_root, pid, self.host_mnt),
            kind: FindingKind::GpuJobCrashed,
            at,
            source: FailureSource::Kernel,
            evidence: cut(record.message.trim(), EVIDENCE_MAX),
            pid: Some(pid),
            comm: Some(comm),
            library: Some(library),
            nccl_gpus: None,
        })
    }
}

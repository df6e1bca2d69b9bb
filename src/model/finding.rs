//! What a person should act on: a typed [`Finding`] (what kind, about what, how bad). The
//! words for it are `text`'s.

use std::fmt;

use serde::{Serialize, Serializer};

use super::{ContainerRef, ShmReading};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
}

/// Defines [`FindingKind`] and [`EventReason`] from one table, so a kind's names are written
/// once. Each row: the kind, its JSON name, its Event reason (`own`: the reason of the kind's
/// own name; another name: that reason; `none`: not an Event) and its usual severity. The
/// reasons no kind owns follow the kinds.
macro_rules! finding_kinds {
    (
        kinds {
            $(
                $(#[doc = $doc:literal])*
                $kind:ident = $json:literal, reason: $reason:ident, $severity:ident;
            )*
        }
        other_reasons { $($(#[doc = $other_doc:literal])* $other:ident,)* }
    ) => {
        /// The kinds of finding. The JSON name, the Kubernetes Event reason and the usual
        /// severity of each live in the one table below and nowhere else (CONTRACT.md lists
        /// them).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum FindingKind {
            $($(#[doc = $doc])* $kind,)*
        }

        impl FindingKind {
            /// The name in `check --json` (`findings[].kind`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(FindingKind::$kind => $json,)*
                }
            }

            /// The Kubernetes Event reason it is published under; None: not an Event.
            pub const fn event_reason(self) -> Option<EventReason> {
                match self {
                    $(FindingKind::$kind => finding_kinds!(@reason $kind $reason),)*
                }
            }

            /// How bad it usually is. GPU pair findings take the worst reason of their pairs
            /// instead (counter growth alone is a warning: the link still carries traffic).
            pub const fn default_severity(self) -> Severity {
                match self {
                    $(FindingKind::$kind => Severity::$severity,)*
                }
            }
        }

        finding_kinds!(@reasons [] [$($(#[doc = $other_doc])* $other)*] $($kind $reason)*);
    };

    (@reason $kind:ident own) => { Some(EventReason::$kind) };
    (@reason $kind:ident none) => { None };
    (@reason $kind:ident $reason:ident) => { Some(EventReason::$reason) };

    // EventReason: the kinds that own their reason, in table order, then the other reasons.
    (@reasons [$($own:ident)*] [$($(#[doc = $other_doc:literal])* $other:ident)*]) => {
        /// Kubernetes Event reasons (CONTRACT.md): each the name of the kind that owns it, or
        /// one of the reasons no kind owns. Every finding's reason comes from its kind.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum EventReason {
            $($own,)*
            $($(#[doc = $other_doc])* $other,)*
        }

        impl EventReason {
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(EventReason::$own => stringify!($own),)*
                    $(EventReason::$other => stringify!($other),)*
                }
            }

            /// The reason named `name` (as [`EventReason::as_str`] says it), if there is one.
            pub fn from_name(name: &str) -> Option<EventReason> {
                $(if name == stringify!($own) { return Some(EventReason::$own); })*
                $(if name == stringify!($other) { return Some(EventReason::$other); })*
                None
            }
        }
    };
    (@reasons [$($own:ident)*] $others:tt $kind:ident own $($rest:tt)*) => {
        finding_kinds!(@reasons [$($own)* $kind] $others $($rest)*);
    };
    (@reasons [$($own:ident)*] $others:tt $kind:ident $reason:ident $($rest:tt)*) => {
        finding_kinds!(@reasons [$($own)*] $others $($rest)*);
    };
}

finding_kinds! {
    kinds {
        /// /dev/shm at or above the warning ratio.
        ShmNearlyFull = "shm_nearly_full", reason: own, Warning;
        /// /dev/shm at or above the critical ratio.
        ShmExhausted = "shm_exhausted", reason: own, Critical;
        /// A GPU workload on the runtime's default 64 MiB /dev/shm.
        ShmRuntimeDefault = "shm_runtime_default", reason: own, Warning;
        /// A container's /dev/shm could not be measured (permission, I/O, a missing system call):
        /// unknown, which must not pass for healthy.
        // The agent's own trouble, counted in shmlink_scan_errors_total: not the Pod's.
        ShmUnmeasured = "shm_unmeasured", reason: none, Warning;
        /// `serve`'s tracepoints of deaths are off where `auto` asked for them (no tracefs it
        /// could find or mount, no CAP_PERFMON): a fast death is judged by the scans' readings.
        // The agent's own trouble, on the node: not an Event.
        DeathTraceOff = "death_trace_off", reason: none, Warning;
        /// NVML reports the GPU lost (fell off the bus).
        // A lost GPU takes its pairs' links down with it, so it is told as `GpuLinkDown`.
        GpuLost = "gpu_lost", reason: GpuLinkDown, Critical;
        /// An inactive link to another GPU, or all of a GPU's NVSwitch links inactive.
        GpuLinkDown = "gpu_link_down", reason: own, Critical;
        /// NVLink error counters growing where no pair was made to fail by them.
        GpuLinkErrors = "gpu_link_errors", reason: own, Warning;
        /// A pair (or a GPU's every pair) degraded: P2P lost or failing where its neighbours work,
        /// error counters over threshold, some NVSwitch links inactive.
        GpuPairDegraded = "gpu_pair_degraded", reason: GpuLinkDegraded, Critical;
        /// An XID error reported by NVML within the last `gpu::xid::XID_LASTS`.
        GpuXid = "gpu_xid", reason: own, Critical;
        /// The driver lists NVIDIA GPUs but NVML does not load.
        NvmlUnavailable = "nvml_unavailable", reason: own, Critical;
        /// A workload said it could not allocate shared memory (its own log).
        ShmAllocationFailed = "shm_allocation_failed", reason: own, Critical;
        /// The kernel says a process of the workload crashed in a GPU communication library.
        GpuJobCrashed = "gpu_job_crashed", reason: own, Critical;
        /// NCCL said P2P is disabled between NVLink-connected GPUs.
        NcclP2pDisabled = "nccl_p2p_disabled", reason: own, Warning;
        /// The driver lists more NVIDIA GPUs than NVML sees.
        GpuNotInNvml = "gpu_not_in_nvml", reason: own, Critical;
        /// NVML's recovery action for a GPU asks for a P2P drain, a GPU reset or a node reboot.
        GpuRecoveryAction = "gpu_recovery_action", reason: own, Critical;
        /// The GPU's NVSwitch fabric registration is not complete or failed, or the fabric reports
        /// degraded bandwidth or an unhealthy route.
        GpuFabricUnhealthy = "gpu_fabric_unhealthy", reason: own, Critical;
        /// A GPU's PCIe link is narrower than it and its slot allow, or slower while busy.
        GpuPcieDegraded = "gpu_pcie_degraded", reason: own, Warning;
        /// The IOMMU (AMD-Vi, Intel DMAR) blocked a DMA of the GPU: an IO page fault naming it.
        GpuIommuFault = "gpu_iommu_fault", reason: own, Critical;
        /// NVLinks of the GPU failed to train (the kernel log's XID 74 `failed to train link`,
        /// XID 136 `Link training failed`).
        GpuNvlinkTrainingFailed = "gpu_nvlink_training_failed", reason: own, Critical;
        /// An NVSwitch the GPU's NVLinks go to told a fatal SXID.
        GpuNvswitchFatal = "gpu_nvswitch_fatal", reason: own, Critical;
        /// AER errors counted on a GPU or a PCIe bridge above it lately.
        GpuPcieErrors = "gpu_pcie_errors", reason: own, Warning;
        /// ACS redirects peer-to-peer traffic on a PCIe bridge between two GPUs.
        PcieAcsEnabled = "pcie_acs_enabled", reason: own, Warning;
        /// The kernel OOM-killed a process of the container, and /dev/shm pages were most of the
        /// memory cgroup's usage.
        ShmOomKilled = "shm_oom_killed", reason: own, Critical;
        /// The kernel OOM-killed a process of the container for its own memory.
        WorkloadOomKilled = "workload_oom_killed", reason: own, Critical;
        /// A container died of SIGBUS (exit 135 / signal 7) with /dev/shm full or nearly full.
        ShmBusError = "shm_bus_error", reason: own, Critical;
        /// A container died of SIGBUS without /dev/shm being full.
        WorkloadBusError = "workload_bus_error", reason: own, Critical;
        /// A container died of SIGBUS and its /dev/shm was not read at the moment (no
        /// tracepoint's reading): neither /dev/shm nor the workload can be named.
        BusErrorUnmeasured = "bus_error_unmeasured", reason: own, Critical;
        /// kubelet evicted the Pod: its /dev/shm volume (a memory emptyDir) outgrew the volume's
        /// own `sizeLimit`.
        ShmEvicted = "shm_evicted", reason: own, Critical;
        /// A process could not open a shared-memory segment another made: they do not share a
        /// /dev/shm (or IPC namespace), or it was removed under them.
        ShmNotShared = "shm_not_shared", reason: own, Critical;
        /// No usable /dev/shm: missing, read-only, or POSIX shared memory not implemented there.
        ShmUnavailable = "shm_unavailable", reason: own, Critical;
        /// PyTorch's file-descriptor sharing ran out of file descriptors.
        FdLimitReached = "fd_limit_reached", reason: own, Critical;
        /// CUDA IPC between processes refused: pidfd_getfd without ptrace permission.
        CudaIpcDenied = "cuda_ipc_denied", reason: own, Critical;
        /// Multi-node NVLink without an IMEX channel in the container.
        ImexChannelMissing = "imex_channel_missing", reason: own, Critical;
        /// CUDA refused peer access between two GPUs.
        GpuPeerAccessRefused = "gpu_peer_access_refused", reason: own, Critical;
        /// CUDA ran out of peer mappings: a process mapped more peers than the driver allows
        /// (CUDA 711), a topology or NCCL setting, not a broken link.
        GpuTooManyPeers = "gpu_too_many_peers", reason: own, Critical;
        /// CUDA met an uncorrectable ECC error (CUDA 214): a bad GPU.
        GpuEccUncorrectable = "gpu_ecc_uncorrectable", reason: own, Critical;
        /// CUDA says the system is not yet initialized (CUDA 802): on NVSwitch systems the fabric
        /// manager is not running or the fabric not trained.
        GpuFabricNotReady = "gpu_fabric_not_ready", reason: own, Critical;
        /// Mapping GPU memory into another GPU's address space failed (CUDA 205), as NCCL's
        /// ncclMemAlloc grants its peers access.
        GpuPeerMappingFailed = "gpu_peer_mapping_failed", reason: own, Critical;
        /// The job's CUDA, HIP or NCCL output reports an uncorrectable NVLink error on its path
        /// (CUDA 220): a link of its GPUs, not its code.
        GpuNvlinkError = "gpu_nvlink_error", reason: own, Critical;
        /// A GPU peer-to-peer or IPC call on the job's path failed (NCCL's p2p transport,
        /// cudaIpc*/hipIpc*, a peer's memory imported, peer access enabled) with an error no
        /// more specific kind names.
        GpuP2pFailed = "gpu_p2p_failed", reason: own, Critical;
        /// CUDA IPC between processes that do not see the same devices (CUDA 101 on
        /// cudaIpcOpenMemHandle).
        CudaIpcInvalidDevice = "cuda_ipc_invalid_device", reason: own, Critical;
        /// RCCL says the kernel's IOMMU is not in passthrough mode: AMD GPUs' P2P can hang.
        IommuNotPassthrough = "iommu_not_passthrough", reason: own, Warning;
        /// NCCL could not set up NVLink SHARP (NVLS) multicast memory: the fabric manager or the
        /// NVSwitches.
        NvlsMulticastFailed = "nvls_multicast_failed", reason: own, Critical;
        /// NCCL's RAS says processes of the job are dead (unreachable).
        NcclRanksDead = "nccl_ranks_dead", reason: own, Critical;
        /// A collective hung until a watchdog ended the job (PyTorch's NCCL watchdog, XLA's
        /// rendezvous, Horovod's stall inspector).
        GpuCollectiveTimeout = "gpu_collective_timeout", reason: own, Critical;
        /// NCCL's own P2P check (NCCL_RUN_DIAGNOSTICS, 2.31+) found peer accesses between GPUs
        /// that failed verification: NCCL goes on, the job may hang or compute on bad data.
        NcclP2pCheckFailed = "nccl_p2p_check_failed", reason: own, Warning;
        /// The workload goes on with less shared memory than it wanted (Ray's object store in
        /// /tmp): slower, not dead.
        ShmFallback = "shm_fallback", reason: own, Warning;
        /// A young container's /dev/shm held files written before it started (a crashed run's
        /// segments in a Pod's memory emptyDir).
        ShmLeftoverSegments = "shm_leftover_segments", reason: own, Warning;
        /// An NVLink error counter that grew a little on most of the last days, steadily: a
        /// link wearing out, found before it fails.
        GpuLinkErrorsGrowing = "gpu_link_errors_growing", reason: own, Warning;
    }
    other_reasons {
        /// A degraded pair (`gpu_pair_degraded`).
        GpuLinkDegraded,
        /// A GPU link condition ended with no other left on its subject.
        GpuLinkRecovered,
        /// A DeviceTaintRule of the agent took a GPU out (made, or its effect changed).
        GpuDeviceTainted,
        /// A DeviceTaintRule of the agent was lifted: its GPU was healthy for the hold.
        GpuDeviceTaintLifted,
    }
}

impl FindingKind {
    /// A death by the OOM killer, of /dev/shm or of the workload's own memory.
    pub const fn is_oom_kill(self) -> bool {
        matches!(
            self,
            FindingKind::ShmOomKilled | FindingKind::WorkloadOomKilled
        )
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EventReason {
    /// A GPU link condition whose end, with no other link condition left on its subject, is a
    /// recovery.
    pub const fn is_link_failure(self) -> bool {
        matches!(
            self,
            EventReason::GpuLinkDegraded | EventReason::GpuLinkDown
        )
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finding is about. Events and Node conditions take pods and GPUs from here, never
/// from the text; the JSON `subject` is its [`Display`](fmt::Display).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    Container(Box<ContainerRef>),
    Gpu(u32),
    /// `gpu < peer_gpu`.
    GpuPair(u32, u32),
    /// One XID number on one GPU: each is its own condition.
    Xid {
        gpu: u32,
        xid: u64,
    },
    /// Every GPU of the node (a node-wide cause).
    AllGpus,
    Node,
}

impl Subject {
    pub fn container(r: &ShmReading) -> Subject {
        Subject::Container(Box::new(ContainerRef::of(r)))
    }

    /// The GPUs it is about; `all` lists the node's GPUs for [`Subject::AllGpus`].
    pub fn gpus(&self, all: impl IntoIterator<Item = u32>) -> Vec<u32> {
        match self {
            Subject::Gpu(g) | Subject::Xid { gpu: g, .. } => vec![*g],
            Subject::GpuPair(a, b) => vec![*a, *b],
            Subject::AllGpus => all.into_iter().collect(),
            Subject::Container(_) | Subject::Node => Vec::new(),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Container(c) => c.fmt(f),
            Subject::Gpu(g) | Subject::Xid { gpu: g, .. } => write!(f, "GPU {g}"),
            Subject::GpuPair(a, b) => write!(f, "GPU {a} <-> GPU {b}"),
            Subject::AllGpus => f.write_str("all GPUs"),
            Subject::Node => f.write_str("node"),
        }
    }
}

impl Serialize for Subject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Something a person should act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub kind: FindingKind,
    pub subject: Subject,
    pub message: String,
}

impl Finding {
    /// A finding at its kind's usual severity.
    pub fn new(kind: FindingKind, subject: Subject, message: String) -> Finding {
        Finding {
            severity: kind.default_severity(),
            kind,
            subject,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_read_as_before_and_name_their_gpus() {
        assert_eq!(Subject::Gpu(7).to_string(), "GPU 7");
        assert_eq!(Subject::GpuPair(0, 7).to_string(), "GPU 0 <-> GPU 7");
        assert_eq!(Subject::Xid { gpu: 3, xid: 79 }.to_string(), "GPU 3");
        assert_eq!(Subject::AllGpus.to_string(), "all GPUs");
        assert_eq!(Subject::Node.to_string(), "node");
        assert_eq!(Subject::Gpu(7).gpus(0..8), vec![7]);
        assert_eq!(Subject::GpuPair(0, 7).gpus(0..8), vec![0, 7]);
        assert_eq!(Subject::AllGpus.gpus(0..3), vec![0, 1, 2]);
        assert_eq!(Subject::Node.gpus(0..8), Vec::<u32>::new());
    }

    #[test]
    fn kinds_serialize_as_their_contract_names() {
        for kind in [
            FindingKind::ShmNearlyFull,
            FindingKind::DeathTraceOff,
            FindingKind::ShmExhausted,
            FindingKind::ShmRuntimeDefault,
            FindingKind::GpuLost,
            FindingKind::GpuLinkDown,
            FindingKind::GpuLinkErrors,
            FindingKind::GpuPairDegraded,
            FindingKind::GpuXid,
            FindingKind::NvmlUnavailable,
            FindingKind::ShmAllocationFailed,
            FindingKind::GpuJobCrashed,
            FindingKind::NcclP2pDisabled,
            FindingKind::GpuNotInNvml,
            FindingKind::GpuRecoveryAction,
            FindingKind::GpuFabricUnhealthy,
            FindingKind::ShmOomKilled,
            FindingKind::WorkloadOomKilled,
            FindingKind::ShmBusError,
            FindingKind::WorkloadBusError,
            FindingKind::BusErrorUnmeasured,
            FindingKind::ShmNotShared,
            FindingKind::ShmUnavailable,
            FindingKind::FdLimitReached,
            FindingKind::CudaIpcDenied,
            FindingKind::ImexChannelMissing,
            FindingKind::GpuPeerAccessRefused,
            FindingKind::GpuTooManyPeers,
            FindingKind::GpuEccUncorrectable,
            FindingKind::GpuFabricNotReady,
            FindingKind::GpuPeerMappingFailed,
            FindingKind::GpuNvlinkError,
            FindingKind::GpuP2pFailed,
            FindingKind::CudaIpcInvalidDevice,
            FindingKind::IommuNotPassthrough,
            FindingKind::NvlsMulticastFailed,
            FindingKind::NcclRanksDead,
            FindingKind::GpuCollectiveTimeout,
            FindingKind::NcclP2pCheckFailed,
            FindingKind::ShmFallback,
            FindingKind::ShmLeftoverSegments,
            FindingKind::GpuPcieDegraded,
            FindingKind::GpuIommuFault,
            FindingKind::GpuNvlinkTrainingFailed,
            FindingKind::GpuNvswitchFatal,
            FindingKind::GpuPcieErrors,
            FindingKind::PcieAcsEnabled,
        ] {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::json!(kind.as_str())
            );
        }
        assert_eq!(
            FindingKind::GpuLost.event_reason(),
            Some(EventReason::GpuLinkDown)
        );
        assert_eq!(
            FindingKind::NvmlUnavailable.event_reason(),
            Some(EventReason::NvmlUnavailable)
        );
    }
}

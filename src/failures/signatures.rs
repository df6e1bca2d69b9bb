//! Pure: which known failure a workload's log line reports. One [`Signature`] row per text
//! PyTorch, NCCL or libc prints; an Aho-Corasick automaton over every row's needle finds the
//! candidates in one pass over the line, so a line costs its length whatever the number of
//! rows, and only a line holding a needle is looked at further.

use std::cell::OnceCell;

use aho_corasick::AhoCorasick;
use serde::Serialize;

/// What a log line says killed (or is about to kill) the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFailure {
    /// A shared-memory segment (in /dev/shm) could not be allocated or grown.
    ShmAllocationFailed,
    /// NCCL refused to run because NVML says P2P is off between two NVLink-connected GPUs.
    NcclP2pDisabled,
    /// A segment another process made is not in this one's /dev/shm (not shared, or removed).
    ShmNotShared,
    /// No usable /dev/shm (missing, read-only, POSIX shared memory not implemented).
    ShmUnavailable,
    /// The file-descriptor limit, not /dev/shm (PyTorch's file_descriptor strategy).
    FdLimitReached,
    /// pidfd_getfd refused: CUDA IPC without ptrace permission.
    CudaIpcDenied,
    /// No IMEX channel for multi-node NVLink.
    ImexChannelMissing,
    /// CUDA refused peer access between two GPUs.
    GpuPeerAccessRefused,
    /// Less /dev/shm than wanted; the workload goes on, slower.
    ShmFallback,
}

/// A line that matched a signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMatch {
    pub kind: LogFailure,
    /// The matching row's [`Signature::id`].
    pub signature: &'static str,
    /// For [`LogFailure::NcclP2pDisabled`]: the two GPUs NCCL names, as NVML indices in the
    /// workload's own view (`nvmlDeviceGetIndex` inside its container, which sees only its
    /// GPUs), in the order NCCL printed them.
    pub gpus: Option<(u32, u32)>,
    /// The kind is the row's usual cause, not said by the line (no errno): told only when no
    /// line of the same container just said more (`context.rs`).
    pub guessed: bool,
}

/// One known text.
pub struct Signature {
    /// Stable name, reported in [`LogMatch::signature`].
    pub id: &'static str,
    pub kind: LogFailure,
    /// The literal the automaton looks for; case-sensitive, as the program prints it.
    pub needle: &'static str,
    /// A line as the program prints it (the tests match every one).
    pub fixture: &'static str,
    /// Where the text comes from.
    pub source: &'static str,
}

// Ids of rows that need more than their needle (see `verify`).
const TORCH_SHM_WRITE: &str = "torch-shm-write";
const NCCL_P2P_DISABLED: &str = "nccl-p2p-disabled-nvlink";
const ENOSPC_DEV_SHM: &str = "enospc-dev-shm";
const ENOSPC_DEV_SHM_GO: &str = "enospc-dev-shm-go";
const ENOSPC_CODE_DEV_SHM: &str = "enospc-code-dev-shm";
const EROFS_DEV_SHM: &str = "erofs-dev-shm";
const TORCH_OPEN_SHM: &str = "torch-open-shm";
const TORCH_UNLINK: &str = "torch-unlink-shm";
const NCCL_SHM_CREATE: &str = "nccl-shm-create";
const NCCL_SHM_ATTACH: &str = "nccl-shm-attach";
const NCCL_SHM_OPEN: &str = "nccl-shm-open";
const NCCL_SHM_FILE: &str = "nccl-shm-file";
const NCCL_SHM_UNLINK: &str = "nccl-shm-unlink";
const TRITON_SHM_INIT: &str = "triton-shm-init";
const POSTGRES_DSM_RESIZE: &str = "postgres-dsm-resize";
const POSTGRES_DSM_OPEN: &str = "postgres-dsm-open";
const CHROMIUM_SHM_CREATE: &str = "chromium-shm-create";
const RAYLET_SHM_CAP: &str = "raylet-shm-cap";
const TRITON_SHM_GROW: &str = "triton-shm-grow";
const SEMAPHORE_TRACKER: &str = "python-semaphore-tracker-enosys";

/// Every known text. The order is the priority when one line matches several rows: specific
/// texts first, the generic ENOSPC last.
pub const SIGNATURES: &[Signature] = &[
    Signature {
        id: "torch-shm-fallocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "unable to allocate shared memory(shm) for file",
        fixture: "RuntimeError: unable to allocate shared memory(shm) for file \
                  </torch_13_2001593316_0>: No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp: posix_fallocate of a shared-memory \
                 tensor's segment failed",
    },
    Signature {
        id: TORCH_SHM_WRITE,
        kind: LogFailure::ShmAllocationFailed,
        needle: "unable to write to file ",
        fixture: "RuntimeError: unable to write to file </torch_18692_1954506624>: \
                  No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp (TH/THAllocator.cpp before): writing \
                 the last byte of a shared-memory segment failed; only /torch_* segments count",
    },
    Signature {
        id: "torch-worker-sigbus",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Unexpected bus error encountered in worker",
        fixture: "ERROR: Unexpected bus error encountered in worker. This might be caused by \
                  insufficient shared memory (shm).",
        source: "PyTorch torch/csrc/DataLoader.cpp: the DataLoader worker's SIGBUS handler",
    },
    Signature {
        id: "torch-dataloader-sigbus",
        kind: LogFailure::ShmAllocationFailed,
        needle: "dataloader's workers are out of shared memory",
        fixture: "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. \
                  It is possible that dataloader's workers are out of shared memory. Please try \
                  to raise your shared memory limit.",
        source: "PyTorch torch/csrc/DataLoader.cpp: the main process sees a worker killed by \
                 SIGBUS",
    },
    Signature {
        id: "torch-dataloader-sigbus-old",
        kind: LogFailure::ShmAllocationFailed,
        needle: "is killed by signal: Bus error",
        fixture: "RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error.",
        source: "PyTorch 1.0-1.2 torch/csrc/DataLoader.cpp: the same, before the hint about \
                 shared memory was added (PR #25730): a DataLoader worker's SIGBUS",
    },
    Signature {
        id: NCCL_SHM_CREATE,
        kind: LogFailure::ShmAllocationFailed,
        needle: "Error while creating shared memory segment",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while creating \
                  shared memory segment /dev/shm/nccl-Y7jXhK (size 9637888)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen (src/include/shm.h shmOpen before): a \
                 failure to create a segment; 2.22+ append the errno: EACCES, EROFS, ENOENT \
                 are no /dev/shm to write to (shm_unavailable), the rest a full one",
    },
    Signature {
        id: NCCL_SHM_ATTACH,
        kind: LogFailure::ShmNotShared,
        needle: "Error while attaching to shared memory segment",
        fixture: "node-1:2211:2268 [1] misc/shmutils.cc:155 NCCL WARN Error while attaching to \
                  shared memory segment /dev/shm/nccl-hFp3Ea (size 9637888), error: No such file \
                  or directory (2)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen, 2.22+: the peer's segment is not in this \
                 /dev/shm. `(size 0)` or an empty name is NCCL's cuMem host mismatch \
                 (NVIDIA/nccl#2190, NCCL_CUMEM_HOST_ENABLE=0), not ours; without an errno \
                 (before 2.22) the cause is not said",
    },
    Signature {
        id: NCCL_SHM_OPEN,
        kind: LogFailure::ShmUnavailable,
        needle: "Call to shm_open failed",
        fixture: "b6b4ab0e7b5d:31:71 [0] include/shm.h:19 NCCL WARN Call to shm_open failed : \
                  Permission denied",
        source: "NCCL src/include/shm.h shmSetup (2.11 and before): SYSCHECKVAL of shm_open; by \
                 errno",
    },
    Signature {
        id: NCCL_SHM_FILE,
        kind: LogFailure::ShmUnavailable,
        needle: "failed to create shared memory file",
        fixture: "gpu-3:12:40 [0] misc/shmutils.cc:89 NCCL WARN Error: failed to create shared \
                  memory file 0x7f3a2c0b9e10, error Read-only file system (30)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen (2.23+): mkstemp in /dev/shm failed; by \
                 errno",
    },
    Signature {
        id: NCCL_SHM_UNLINK,
        kind: LogFailure::ShmNotShared,
        needle: "NCCL WARN unlink shared memory ",
        fixture: "node-000:8639:8745 [0] misc/shmutils.cc:54 NCCL WARN unlink shared memory \
                  /dev/shm/nccl-d5rTd0 failed, error: No such file or directory",
        source: "NCCL src/misc/shmutils.cc ncclShmUnlink (2.16+; docs, troubleshooting): the \
                 segment was removed under the job (systemd-logind RemoveIPC, a cleaner)",
    },
    Signature {
        id: "nccl-shm-extend",
        kind: LogFailure::ShmAllocationFailed,
        needle: "failed to extend /dev/shm/",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend \
                  /dev/shm/nccl-Y7jXhK to 9637892 bytes",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen: fallocate of a new segment failed",
    },
    Signature {
        id: "nccl-posix-fallocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Call to posix_fallocate failed",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate \
                  failed : No space left on device",
        source: "NCCL src/include/shm.h (older releases): SYSCHECK's warning when \
                 posix_fallocate of a segment fails",
    },
    Signature {
        id: "nccl-shm-unable-allocate",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Unable to allocate shared memory (",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:26 NCCL WARN Unable to allocate shared \
                  memory (4263936 bytes) : No space left on device",
        source: "NCCL src/include/shm.h (older releases): shm_allocate's warning",
    },
    Signature {
        id: TORCH_OPEN_SHM,
        kind: LogFailure::FdLimitReached,
        needle: "unable to open shared memory object ",
        fixture: "RuntimeError: unable to open shared memory object </torch_2186_1497540467_57> \
                  in read-write mode: Too many open files (24)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp: shm_open of a shared tensor failed; the \
                 errno (1.12+) says why: EMFILE the descriptor limit, ENOENT a segment gone or \
                 in another /dev/shm, EACCES/EROFS no /dev/shm to use; without one, not said",
    },
    Signature {
        id: "torch-fd-limit",
        kind: LogFailure::FdLimitReached,
        needle: "Too many open files. Communication with the workers is no longer possible",
        fixture: "RuntimeError: Too many open files. Communication with the workers is no longer \
                  possible. Please increase the limit using `ulimit -n` in the shell or change \
                  the sharing strategy by calling \
                  `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning \
                  of your code",
        source: "PyTorch torch/utils/data/dataloader.py _try_get_data: EMFILE while the \
                 file_descriptor strategy passes tensors",
    },
    Signature {
        id: "python-ancdata",
        kind: LogFailure::FdLimitReached,
        needle: "received 0 items of ancdata",
        fixture: "RuntimeError: received 0 items of ancdata",
        source: "CPython Lib/multiprocessing/reduction.py recvfds: the descriptor sent over \
                 SCM_RIGHTS was dropped at the receiver's RLIMIT_NOFILE (PyTorch's \
                 file_descriptor strategy)",
    },
    Signature {
        id: TORCH_UNLINK,
        kind: LogFailure::ShmNotShared,
        needle: "could not unlink the shared memory file",
        fixture: "RuntimeError: could not unlink the shared memory file /torch_10386_3413375536 \
                  : No such file or directory (2)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp close/unlink: the segment was already \
                 gone (systemd-logind RemoveIPC, a cleaner, another /dev/shm); another errno is \
                 not ours",
    },
    Signature {
        id: "torch-pidfd-getfd",
        kind: LogFailure::CudaIpcDenied,
        needle: "pidfd_getfd: Operation not permitted",
        fixture: "RuntimeError: pidfd_getfd: Operation not permitted",
        source: "PyTorch c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::fromShared: a CUDA \
                 tensor of an expandable_segments allocator shared between processes needs \
                 ptrace permission over the sender",
    },
    Signature {
        id: "torch-pidfd-open",
        kind: LogFailure::CudaIpcDenied,
        needle: "pidfd_open:Operation not permitted",
        fixture: "RuntimeError: pidfd_open:Operation not permitted",
        source: "PyTorch c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::fromShared: \
                 pidfd_open refused (a seccomp profile)",
    },
    Signature {
        id: "python-sem-open",
        kind: LogFailure::ShmUnavailable,
        needle: "lacks a functioning sem_open implementation",
        fixture: "ImportError: This platform lacks a functioning sem_open implementation, \
                  therefore, the required synchronization primitives needed will not function, \
                  see issue 3770.",
        source: "CPython Lib/multiprocessing/synchronize.py (and loky's copy): no POSIX \
                 semaphores, no /dev/shm",
    },
    Signature {
        id: SEMAPHORE_TRACKER,
        kind: LogFailure::ShmUnavailable,
        needle: "semaphore_tracker: ",
        fixture: "loky/backend/semaphore_tracker.py:174: UserWarning: semaphore_tracker: \
                  '/loky-1-Au1xgY': [Errno 38] ENOSYS",
        source: "CPython 3.7 Lib/multiprocessing/semaphore_tracker.py and old loky: unlinking a \
                 semaphore failed with ENOSYS: no POSIX semaphores (no /dev/shm)",
    },
    Signature {
        id: "python-psm-attach",
        kind: LogFailure::ShmNotShared,
        needle: "No such file or directory: '/psm_",
        fixture: "FileNotFoundError: [Errno 2] No such file or directory: '/psm_9a1f0c2e'",
        source: "CPython Lib/multiprocessing/shared_memory.py SharedMemory(name=...): the block \
                 another process made is not in this /dev/shm (unlinked, or another container)",
    },
    Signature {
        id: "vllm-shm-space",
        kind: LogFailure::ShmAllocationFailed,
        needle: "Insufficient space in /dev/shm:",
        fixture: "RuntimeError: Insufficient space in /dev/shm: 240 MiB required, 64 MiB free.",
        source: "vLLM vllm/distributed/device_communicators/shm_broadcast.py \
                 check_shm_free_space (PR #48879; the text as quoted in PR #50606)",
    },
    Signature {
        id: "ray-object-store-size",
        kind: LogFailure::ShmAllocationFailed,
        needle: "exceeds /dev/shm size",
        fixture: "ValueError: The configured object store size (64.0 GB) exceeds /dev/shm size \
                  (33.67 GB). This will harm performance. Consider deleting files in /dev/shm or \
                  increasing its size with --shm-size in Docker. To ignore this warning, set \
                  RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1.",
        source: "Ray python/ray/_private/services.py determine_plasma_store_config: ray.init \
                 refuses an object store larger than /dev/shm",
    },
    Signature {
        id: "ray-object-store-capacity",
        kind: LogFailure::ShmAllocationFailed,
        needle: "exceeds the capacity of /dev/shm",
        fixture: "ValueError: The configured object store size exceeds the capacity of /dev/shm. \
                  This will harm performance. To proceed regardless of this warning, you can set \
                  RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1.",
        source: "Ray 1.2-1.3 python/ray/_private/services.py: the same refusal, older words",
    },
    Signature {
        id: "ray-object-store-tmp",
        kind: LogFailure::ShmFallback,
        needle: "instead of /dev/shm because /dev/shm has only",
        fixture: "WARNING services.py:1826 -- WARNING: The object store is using /tmp instead of \
                  /dev/shm because /dev/shm has only 67108864 bytes available. This will harm \
                  performance!",
        source: "Ray python/ray/_private/services.py determine_plasma_store_config: the object \
                 store falls back to /tmp (a warning; the job runs, slower)",
    },
    Signature {
        id: RAYLET_SHM_CAP,
        kind: LogFailure::ShmFallback,
        needle: "System memory request exceeds memory available in",
        fixture: "[2026-01-12 10:01:02,345 W 811 811] (raylet) store_runner.cc:83: System memory \
                  request exceeds memory available in /dev/shm. The request is for 2000000000 \
                  bytes, and the amount available is 60397977 bytes.",
        source: "Ray src/ray/object_manager/plasma/store_runner.cc: the plasma store is capped \
                 to what /dev/shm holds (a warning)",
    },
    Signature {
        id: "ray-shm-free-up",
        kind: LogFailure::ShmFallback,
        needle: "You may be able to free up space by deleting files in /dev/shm",
        fixture: "You may be able to free up space by deleting files in /dev/shm. If you are \
                  inside a Docker container, you may need to pass an argument with the flag \
                  '--shm-size' to 'docker run'.",
        source:
            "Ray services.py and store_runner.cc: the second line of both warnings that /dev/shm \
                 is smaller than the object store (the store goes to /tmp or is capped)",
    },
    Signature {
        id: TRITON_SHM_INIT,
        kind: LogFailure::ShmAllocationFailed,
        needle: "Unable to initialize shared memory key '",
        fixture: "UNAVAILABLE: Internal: Unable to initialize shared memory key \
                  'triton_python_backend_shm_region_1' to requested size (67108864 bytes). If \
                  you are running Triton inside docker, use '--shm-size' flag to control the \
                  shared memory region size. Each Python backend model instance requires at \
                  least 64MBs of shared memory. Error: No space left on device",
        source: "Triton python_backend src/shm_manager.cc SharedMemoryManager: by the errno it \
                 ends with (ENOSPC full, ENOENT no /dev/shm)",
    },
    Signature {
        id: TRITON_SHM_GROW,
        kind: LogFailure::ShmAllocationFailed,
        needle: "Failed to increase the shared memory pool size",
        fixture: "Failed to increase the shared memory pool size for key \
                  'triton_python_backend_shm_region_2' to 134217728 bytes. If you are running \
                  Triton inside docker, use '--shm-size' flag to control the shared memory \
                  region size. Error: No space left on device",
        source: "Triton python_backend src/shm_manager.cc GrowIfNeeded",
    },
    Signature {
        id: "triton-shm-run-out",
        kind: LogFailure::ShmAllocationFailed,
        needle: "because it run out of shared memory",
        fixture: "Failed to initialize the model instance add_sub_0 because it run out of shared \
                  memory. Increase the shared memory size to fix this error.",
        source: "Triton python_backend (2021) src/python.cc",
    },
    Signature {
        id: "triton-shm-region-open",
        kind: LogFailure::ShmNotShared,
        needle: "Unable to open shared memory region: '",
        fixture: "tritonclient.utils.InferenceServerException: [StatusCode.INTERNAL] Unable to \
                  open shared memory region: '/input_simple'",
        source: "Triton server src/shared_memory_manager.cc OpenSharedMemoryRegion: the client's \
                 region is not in the server's /dev/shm",
    },
    Signature {
        id: POSTGRES_DSM_RESIZE,
        kind: LogFailure::ShmAllocationFailed,
        needle: "could not resize shared memory segment",
        fixture: "ERROR:  could not resize shared memory segment \"/PostgreSQL.1136341590\" to \
                  3158016 bytes: No space left on device",
        source: "PostgreSQL src/backend/storage/ipc/dsm_impl.c dsm_impl_posix: posix_fallocate \
                 of a dynamic shared memory segment in /dev/shm; ENOSPC only",
    },
    Signature {
        id: POSTGRES_DSM_OPEN,
        kind: LogFailure::ShmNotShared,
        needle: "could not open shared memory segment",
        fixture: "FATAL:  could not open shared memory segment \"/PostgreSQL.241200488\": No such \
                  file or directory",
        source: "PostgreSQL src/backend/storage/ipc/dsm_impl.c dsm_impl_posix: the segment is \
                 gone (systemd-logind RemoveIPC, /dev/shm emptied or not shared); ENOENT only",
    },
    Signature {
        id: "chromium-discardable",
        kind: LogFailure::ShmFallback,
        needle: "Less than 64MB of free space in temporary directory for shared memory files",
        fixture: "[1:1:0311/101502.123:WARNING:discardable_shared_memory_manager.cc(197)] Less \
                  than 64MB of free space in temporary directory for shared memory files: 60",
        source: "Chromium components/discardable_memory/service/\
                 discardable_shared_memory_manager.cc GetDefaultMaxBytes (a warning)",
    },
    Signature {
        id: CHROMIUM_SHM_CREATE,
        kind: LogFailure::ShmUnavailable,
        needle: "Creating shared memory in ",
        fixture: "[7:7:0131/235140.910186:ERROR:platform_shared_memory_region_posix.cc(217)] \
                  Creating shared memory in /dev/shm/.org.chromium.Chromium.x7kIrq failed: No \
                  such file or directory (2)",
        source: "Chromium base/memory/platform_shared_memory_region_posix.cc Create: only in \
                 /dev/shm; by errno (ENOENT, EACCES, EROFS: no /dev/shm; ENOSPC: full)",
    },
    Signature {
        id: "chromium-shm-access",
        kind: LogFailure::ShmUnavailable,
        needle: "Unable to access(W_OK|X_OK) /dev/shm",
        fixture: "[7:7:0131/235140.910202:ERROR:platform_shared_memory_region_posix.cc(222)] \
                  Unable to access(W_OK|X_OK) /dev/shm: Permission denied (13)",
        source: "Chromium base/memory/platform_shared_memory_region_posix.cc Create",
    },
    Signature {
        id: "nccl-peer-with-device",
        kind: LogFailure::GpuPeerAccessRefused,
        needle: "failed to peer with device",
        fixture: "node-2:3127:3180 [1] transport/p2p.cc:118 NCCL WARN failed to peer with device \
                  0(=3000): 217 peer access is not supported between these two devices",
        source: "NCCL src/transport/p2p.cc p2pMap: cudaDeviceEnablePeerAccess failed",
    },
    Signature {
        id: "nccl-peer-access",
        kind: LogFailure::GpuPeerAccessRefused,
        needle: "peer access is not supported between these two devices",
        fixture: "node-2:3127:3180 [0] transport/p2p.cc:273 NCCL WARN failed to open CUDA IPC \
                  handle : 217 peer access is not supported between these two devices",
        source: "CUDA's text for cudaErrorPeerAccessUnsupported (217), as NCCL src/transport/\
                 p2p.cc and shm.cc and CUDA programs print it",
    },
    Signature {
        id: "nccl-mnnvl-imex",
        kind: LogFailure::ImexChannelMissing,
        needle: "Check the IMEX",
        fixture: "gb200-07:4021:4102 [0] mnnvl.cc:90 NCCL WARN MNNVL (cliqueSize 72) is \
                  available but not working on this system. Check the IMEX channel \
                  configuration (/dev/nvidia-caps-imex-channels). Set NCCL_MNNVL_ENABLE=0 to \
                  ignore this issue.",
        source: "NCCL src/mnnvl.cc ncclMnnvlCheck (2.25+): FABRIC handles do not work: no IMEX \
                 channel in the container, or its service down",
    },
    Signature {
        id: "nccl-mnnvl-unsupported",
        kind: LogFailure::ImexChannelMissing,
        needle: "MNNVL is not supported on this system",
        fixture: "gb200-07:4021:4102 [0] init.cc:1115 NCCL WARN MNNVL is not supported on this \
                  system",
        source: "NCCL src/init.cc initTransportsRank (2.20-2.24) with NCCL_MNNVL_ENABLE=1",
    },
    Signature {
        id: NCCL_P2P_DISABLED,
        kind: LogFailure::NcclP2pDisabled,
        needle: "P2P is disabled between NVLINK connected GPUs",
        fixture: "node-000:8639:8745 [1] graph/paths.cc:314 NCCL WARN P2P is disabled between \
                  NVLINK connected GPUs 1 and 3. This should not be the case given their \
                  connectivity, and is probably due to a hardware issue. If you still want to \
                  proceed, you can set NCCL_IGNORE_DISABLED_P2P=1.",
        source: "NCCL src/graph/paths.cc ncclTopoCheckP2p: NVML says P2P is not OK between two \
                 NVLink-connected GPUs (NVML indices); NCCL then fails with an unhandled CUDA \
                 error",
    },
    Signature {
        id: ENOSPC_DEV_SHM,
        kind: LogFailure::ShmAllocationFailed,
        needle: "No space left on device",
        fixture: "OSError: [Errno 28] No space left on device: '/dev/shm/psm_4a1b2c3d'",
        source: "strerror(ENOSPC) (glibc, Python's OSError) on a line that names /dev/shm; \
                 about any other path it is no shm fact",
    },
    Signature {
        id: EROFS_DEV_SHM,
        kind: LogFailure::ShmUnavailable,
        needle: "Read-only file system",
        fixture: "OSError: [Errno 30] Read-only file system: '/dev/shm/sem.mp-8fd2a1'",
        source: "strerror(EROFS) on a line that names /dev/shm: it cannot be written",
    },
    Signature {
        id: ENOSPC_CODE_DEV_SHM,
        kind: LogFailure::ShmAllocationFailed,
        needle: "failed with error code 28",
        fixture: "[PARENT ERROR] write to file /dev/shm/libfuzzer_core_17 failed with error code \
                  28",
        source: "ENOSPC by number (28) on a line that names /dev/shm",
    },
    Signature {
        id: ENOSPC_DEV_SHM_GO,
        kind: LogFailure::ShmAllocationFailed,
        needle: "no space left on device",
        fixture: "Error: write /dev/shm/cache/shard-0007: no space left on device",
        source: "Go's text for ENOSPC (syscall.Errno), lower-case, on a line that names /dev/shm",
    },
];

/// The matcher over [`SIGNATURES`], built once and shared.
#[derive(Debug, Clone)]
pub struct Signatures {
    needles: AhoCorasick,
    /// The same needles, leftmost-first: `is_match` with a SIMD prefilter, which overlapping
    /// search does without. Most lines hold no needle and stop here.
    any: AhoCorasick,
}

impl Default for Signatures {
    fn default() -> Self {
        Self::new()
    }
}

impl Signatures {
    pub fn new() -> Self {
        Self::with_candidates(&[])
    }

    /// Also wanting, in the same one pass, the lines that hold one of `more`: texts that are no
    /// row's but that the recogniser decides from their neighbours (`context.rs`, `worker.rs`).
    pub fn with_candidates(more: &[&str]) -> Self {
        // The needles are this file's constants and the callers': a build error is a bug the
        // tests catch, never a consequence of input.
        let needles = AhoCorasick::new(SIGNATURES.iter().map(|s| s.needle))
            .expect("the signature needles build an automaton");
        let any = AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostFirst)
            .build(
                SIGNATURES
                    .iter()
                    .map(|s| s.needle)
                    .chain(more.iter().copied()),
            )
            .expect("the signature needles build an automaton");
        Signatures { needles, any }
    }

    /// Whether the line holds any signature's needle (or one of the extra candidates): the
    /// cheap first look, on raw bytes (a
    /// log's line before its lossy UTF-8 conversion; no needle holds a byte that the conversion
    /// or Docker's JSON escaping would change).
    pub fn is_candidate(&self, line: &[u8]) -> bool {
        self.any.is_match(line)
    }

    /// The failure `line` reports, if any. Of several rows that match, the first in
    /// [`SIGNATURES`] wins.
    pub fn match_line(&self, line: &str) -> Option<LogMatch> {
        if !self.any.is_match(line) {
            return None;
        }
        let mut best: Option<(usize, LogMatch)> = None;
        // Looked for once per line, however many ENOSPC needles it holds.
        let names_shm = OnceCell::new();
        // Overlapping: a needle inside another's match must still be seen (each is verified
        // on its own, and a lookalike of one must not hide another).
        for m in self.needles.find_overlapping_iter(line) {
            let row = m.pattern().as_usize();
            if best.as_ref().is_some_and(|(b, _)| *b <= row) {
                continue;
            }
            let Some(sig) = SIGNATURES.get(row) else {
                continue;
            };
            if let Some((kind, gpus)) = verify(sig, line, m.end(), &names_shm) {
                let guessed =
                    sig.id == NCCL_SHM_CREATE && line.get(m.end()..).and_then(errno).is_none();
                best = Some((
                    row,
                    LogMatch {
                        kind,
                        signature: sig.id,
                        gpus,
                        guessed,
                    },
                ));
            }
        }
        best.map(|(_, m)| m)
    }
}

/// Checks beyond the needle, which ends at `end`: `None` if the line only looks like the text,
/// else its kind (the row's, or what the errno it names says) and the GPUs it names (for the
/// P2P row). `names_shm` caches whether the line names /dev/shm.
fn verify(
    sig: &Signature,
    line: &str,
    end: usize,
    names_shm: &OnceCell<bool>,
) -> Option<(LogFailure, Option<(u32, u32)>)> {
    let rest = line.get(end..)?;
    let on_shm = || *names_shm.get_or_init(|| line.contains("/dev/shm"));
    let kind = match sig.id {
        // Docker's json-file driver writes `<` as \u003c.
        TORCH_SHM_WRITE => {
            (rest.starts_with("</torch_") || rest.starts_with("\\u003c/torch_")).then_some(sig.kind)
        }
        NCCL_P2P_DISABLED => return gpu_pair(rest).map(|g| (sig.kind, Some(g))),
        ENOSPC_DEV_SHM | ENOSPC_DEV_SHM_GO | ENOSPC_CODE_DEV_SHM | EROFS_DEV_SHM => {
            on_shm().then_some(sig.kind)
        }
        // Only the errnos that say which; an old line without one says nothing sure.
        TORCH_OPEN_SHM => match errno(rest)? {
            Errno::NoFiles => Some(LogFailure::FdLimitReached),
            Errno::NoEntry => Some(LogFailure::ShmNotShared),
            Errno::NoSpace => Some(LogFailure::ShmAllocationFailed),
            Errno::Denied | Errno::ReadOnly => Some(LogFailure::ShmUnavailable),
        },
        TORCH_UNLINK => match errno(rest) {
            None | Some(Errno::NoEntry) => Some(sig.kind),
            Some(_) => None,
        },
        NCCL_SHM_CREATE | TRITON_SHM_INIT | CHROMIUM_SHM_CREATE | NCCL_SHM_OPEN | NCCL_SHM_FILE => {
            if sig.id == CHROMIUM_SHM_CREATE && !rest.starts_with("/dev/shm/") {
                return None;
            }
            match errno(rest) {
                Some(Errno::NoSpace) => Some(LogFailure::ShmAllocationFailed),
                Some(Errno::Denied | Errno::ReadOnly | Errno::NoEntry) => {
                    Some(LogFailure::ShmUnavailable)
                }
                Some(Errno::NoFiles) => Some(LogFailure::FdLimitReached),
                // NCCL's create line before 2.22 names no errno: a full /dev/shm is its usual
                // cause (the lines before it say which call failed).
                None if sig.id == NCCL_SHM_CREATE => Some(sig.kind),
                None => None,
            }
        }
        // `(size 0)` or no name: NCCL's cuMem host mismatch, not a /dev/shm matter.
        NCCL_SHM_ATTACH => (errno(rest) == Some(Errno::NoEntry)
            && !rest.contains("(size 0)")
            && !rest.trim_start().starts_with("/dev/shm/nccl- "))
        .then_some(sig.kind),
        NCCL_SHM_UNLINK => rest
            .contains("failed, error: No such file or directory")
            .then_some(sig.kind),
        POSTGRES_DSM_RESIZE => (errno(rest) == Some(Errno::NoSpace)).then_some(sig.kind),
        POSTGRES_DSM_OPEN => (errno(rest) == Some(Errno::NoEntry)).then_some(sig.kind),
        RAYLET_SHM_CAP => rest.starts_with(" /dev/shm").then_some(sig.kind),
        SEMAPHORE_TRACKER => {
            (rest.contains("ENOSYS") || rest.contains("[Errno 38]")).then_some(sig.kind)
        }
        // Triton appends the error it met: only ENOSPC (or none said) is a full /dev/shm.
        TRITON_SHM_GROW => match rest.rsplit_once("Error: ") {
            Some((_, error)) => error
                .trim()
                .starts_with("No space left on device")
                .then_some(sig.kind),
            None => Some(sig.kind),
        },
        _ => Some(sig.kind),
    }?;
    Some((kind, None))
}

/// The errnos that decide a row's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Errno {
    NoSpace,
    NoEntry,
    NoFiles,
    Denied,
    ReadOnly,
}

/// The errno a line's rest names by its text (glibc's strerror, as every program here prints
/// it), the first of them.
fn errno(rest: &str) -> Option<Errno> {
    const TEXTS: [(&str, Errno); 5] = [
        ("No space left on device", Errno::NoSpace),
        ("No such file or directory", Errno::NoEntry),
        ("Too many open files", Errno::NoFiles),
        ("Permission denied", Errno::Denied),
        ("Read-only file system", Errno::ReadOnly),
    ];
    TEXTS
        .iter()
        .filter_map(|(text, e)| rest.find(text).map(|at| (at, *e)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, e)| e)
}

/// ` <a> and <b>` at the start of `rest`.
fn gpu_pair(rest: &str) -> Option<(u32, u32)> {
    let rest = rest.strip_prefix(' ')?;
    let (a, rest) = leading_number(rest)?;
    let rest = rest.strip_prefix(" and ")?;
    let (b, _) = leading_number(rest)?;
    Some((a, b))
}

/// The decimal number `s` starts with, and what follows it.
fn leading_number(s: &str) -> Option<(u32, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n = s.get(..digits)?.parse().ok()?;
    Some((n, &s[digits..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/logs/", $name))
        };
    }

    /// The fixture files' lines that are not comments or blank.
    fn lines(content: &str) -> impl Iterator<Item = &str> {
        content
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    }

    fn kind(line: &str) -> Option<LogFailure> {
        Signatures::new().match_line(line).map(|m| m.kind)
    }

    #[test]
    fn every_signature_matches_its_own_fixture() {
        let sigs = Signatures::new();
        for sig in SIGNATURES {
            let m = sigs.match_line(sig.fixture);
            assert_eq!(m.as_ref().map(|m| m.signature), Some(sig.id), "{}", sig.id);
            assert_eq!(m.map(|m| m.kind), Some(sig.kind), "{}", sig.id);
            assert!(sig.fixture.contains(sig.needle), "{}", sig.id);
        }
    }

    #[test]
    fn the_contract_lists_every_row() {
        let contract = include_str!("../../docs/CONTRACT.md");
        for sig in SIGNATURES {
            assert!(
                contract.contains(&format!("| `{}` |", sig.id)),
                "docs/CONTRACT.md, \"What a log line must say\", has no row {}",
                sig.id
            );
        }
    }

    #[test]
    fn ids_and_needles_are_unique_and_every_row_is_documented() {
        let mut ids: Vec<_> = SIGNATURES.iter().map(|s| s.id).collect();
        let mut needles: Vec<_> = SIGNATURES.iter().map(|s| s.needle).collect();
        ids.sort_unstable();
        ids.dedup();
        needles.sort_unstable();
        needles.dedup();
        assert_eq!(ids.len(), SIGNATURES.len());
        assert_eq!(needles.len(), SIGNATURES.len());
        assert!(SIGNATURES
            .iter()
            .all(|s| !s.needle.is_empty() && !s.source.is_empty()));
    }

    #[test]
    fn pytorch_texts_are_shm_allocation_failures() {
        let sigs = Signatures::new();
        let mut seen = Vec::new();
        for line in lines(fixture!("pytorch.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(m.kind, LogFailure::ShmAllocationFailed, "{line}");
            assert_eq!(m.gpus, None);
            seen.push(m.signature);
        }
        for id in [
            "torch-shm-fallocate",
            "torch-shm-write",
            "torch-worker-sigbus",
            "torch-dataloader-sigbus",
        ] {
            assert!(seen.contains(&id), "{id}");
        }
    }

    #[test]
    fn nccl_shm_texts_are_shm_allocation_failures() {
        let sigs = Signatures::new();
        let mut seen = Vec::new();
        for line in lines(fixture!("nccl-shm.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!(m.kind, LogFailure::ShmAllocationFailed, "{line}");
            seen.push(m.signature);
        }
        for id in [
            "nccl-shm-create",
            "nccl-shm-extend",
            "nccl-posix-fallocate",
            "nccl-shm-unable-allocate",
        ] {
            assert!(seen.contains(&id), "{id}");
        }
    }

    #[test]
    fn nccl_p2p_disabled_names_both_gpus_in_order() {
        let sigs = Signatures::new();
        let got: Vec<_> = lines(fixture!("nccl-p2p.log"))
            .map(|l| sigs.match_line(l).and_then(|m| m.gpus))
            .collect();
        assert_eq!(
            got,
            [Some((1, 3)), Some((5, 4)), Some((1, 0)), Some((7, 6))]
        );
    }

    #[test]
    fn enospc_counts_only_when_the_line_names_dev_shm() {
        let sigs = Signatures::new();
        for line in lines(fixture!("enospc.log")) {
            let m = sigs.match_line(line).unwrap_or_else(|| panic!("{line}"));
            assert!(m.signature.starts_with("enospc-dev-shm"), "{line}");
        }
        assert_eq!(
            kind("OSError: [Errno 28] No space left on device: '/data/checkpoints/step_1000.pt'"),
            None
        );
    }

    #[test]
    fn lookalikes_match_nothing() {
        let sigs = Signatures::new();
        for line in lines(fixture!("lookalikes.log")) {
            assert_eq!(sigs.match_line(line), None, "{line}");
        }
    }

    #[test]
    fn a_specific_text_wins_over_the_generic_enospc_on_the_same_line() {
        let m = Signatures::new()
            .match_line(
                "NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9637892 bytes, error: \
                 No space left on device (28)",
            )
            .unwrap();
        assert_eq!(m.signature, "nccl-shm-extend");
    }

    #[test]
    fn a_lookalike_needle_does_not_hide_a_real_one_later_on_the_line() {
        // The P2P needle without GPUs first, then a real shm failure.
        let m = Signatures::new()
            .match_line(
                "grep 'P2P is disabled between NVLINK connected GPUs' && echo 'Error while \
                 creating shared memory segment /dev/shm/nccl-a (size 1)'",
            )
            .unwrap();
        assert_eq!(m.signature, "nccl-shm-create");
        // And the same P2P text twice: the second names the GPUs.
        let m = Signatures::new()
            .match_line(
                "P2P is disabled between NVLINK connected GPUs: P2P is disabled between NVLINK \
                 connected GPUs 2 and 6.",
            )
            .unwrap();
        assert_eq!(m.gpus, Some((2, 6)));
    }

    #[test]
    fn a_long_line_costs_its_length_not_its_needles_times_its_length() {
        // 4.6 MB of ENOSPC about another path: each occurrence would rescan the line for
        // /dev/shm were the answer not kept.
        let line = "No space left on device: /data ".repeat(150_000);
        assert_eq!(Signatures::new().match_line(&line), None);
        let line = format!("{line} /dev/shm");
        assert_eq!(
            Signatures::new().match_line(&line).map(|m| m.signature),
            Some("enospc-dev-shm")
        );
    }

    #[test]
    fn needles_are_plain_ascii_that_no_log_format_rewrites() {
        // The tailer asks `is_candidate` of raw bytes: a Docker entry's JSON-escaped text
        // (Go escapes `"`, `\`, `<`, `>`, `&` and control bytes) or a line before its lossy
        // UTF-8 conversion. A needle of other printable ASCII reads the same in both.
        for sig in SIGNATURES {
            assert!(
                sig.needle
                    .bytes()
                    .all(|b| (b' '..=b'~').contains(&b) && !b"\"\\<>&".contains(&b)),
                "{}: {:?}",
                sig.id,
                sig.needle
            );
        }
        let sigs = Signatures::new();
        for sig in SIGNATURES {
            assert!(sigs.is_candidate(sig.fixture.as_bytes()), "{}", sig.id);
        }
        assert!(!sigs.is_candidate(b"step 10 loss 0.1 \xff\xfe"));
    }

    #[test]
    fn docker_json_logs_escape_the_angle_bracket() {
        let line = r#"{"log":"RuntimeError: unable to write to file \u003c/torch_18692_1954506624\u003e: No space left on device (28)\n","stream":"stderr","time":"2024-05-01T10:00:00Z"}"#;
        assert_eq!(kind(line), Some(LogFailure::ShmAllocationFailed));
    }

    #[test]
    fn gpu_numbers_that_do_not_fit_are_no_match() {
        assert_eq!(
            kind("P2P is disabled between NVLINK connected GPUs 99999999999 and 1."),
            None
        );
        assert_eq!(gpu_pair(" 0 and 7."), Some((0, 7)));
        assert_eq!(gpu_pair(" 0 and x"), None);
        assert_eq!(gpu_pair("0 and 7"), None);
    }

    #[test]
    fn kinds_serialize_in_snake_case() {
        assert_eq!(
            serde_json::to_string(&LogFailure::ShmAllocationFailed).unwrap(),
            "\"shm_allocation_failed\""
        );
        assert_eq!(
            serde_json::to_string(&LogFailure::NcclP2pDisabled).unwrap(),
            "\"nccl_p2p_disabled\""
        );
    }

    #[test]
    fn garbage_never_panics() {
        let sigs = Signatures::new();
        let mut rng = crate::fixtures::rng::Rng::new(0x5eed);
        let seeds: Vec<&str> = SIGNATURES.iter().map(|s| s.fixture).collect();
        for _ in 0..20_000 {
            let seed = rng.below(seeds.len());
            let line = rng.mutate(seeds[seed].as_bytes());
            let _ = sigs.match_line(&String::from_utf8_lossy(&line));
        }
        for seed in &seeds {
            for cut in 0..=seed.len() {
                if let Some(prefix) = seed.get(..cut) {
                    let _ = sigs.match_line(prefix);
                }
            }
        }
    }
}

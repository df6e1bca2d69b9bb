//! The rows: every known text, with a line as the program prints it and where it comes from
//! (its source file, or the report it was read in). The order is the priority when one line
//! matches several rows: specific texts first, the generic ENOSPC last.

use super::Signature;
use crate::model::FindingKind;

// Ids of rows that need more than their needle (see `verify`).
pub(super) const TORCH_SHM_WRITE: &str = "torch-shm-write";
pub(super) const NCCL_P2P_DISABLED: &str = "nccl-p2p-disabled-nvlink";
pub(super) const ENOSPC_DEV_SHM: &str = "enospc-dev-shm";
pub(super) const ENOSPC_DEV_SHM_GO: &str = "enospc-dev-shm-go";
pub(super) const ENOSPC_CODE_DEV_SHM: &str = "enospc-code-dev-shm";
pub(super) const EROFS_DEV_SHM: &str = "erofs-dev-shm";
pub(super) const TORCH_OPEN_SHM: &str = "torch-open-shm";
pub(super) const TORCH_UNLINK: &str = "torch-unlink-shm";
pub(super) const NCCL_SHM_CREATE: &str = "nccl-shm-create";
pub(super) const NCCL_SHM_ATTACH: &str = "nccl-shm-attach";
pub(super) const NCCL_SHM_OPEN: &str = "nccl-shm-open";
pub(super) const NCCL_SHM_FILE: &str = "nccl-shm-file";
pub(super) const NCCL_SHM_UNLINK: &str = "nccl-shm-unlink";
pub(super) const TRITON_SHM_INIT: &str = "triton-shm-init";
pub(super) const POSTGRES_DSM_RESIZE: &str = "postgres-dsm-resize";
pub(super) const POSTGRES_DSM_OPEN: &str = "postgres-dsm-open";
pub(super) const CHROMIUM_SHM_CREATE: &str = "chromium-shm-create";
pub(super) const RAYLET_SHM_CAP: &str = "raylet-shm-cap";
pub(super) const TRITON_SHM_GROW: &str = "triton-shm-grow";
pub(super) const SEMAPHORE_TRACKER: &str = "python-semaphore-tracker-enosys";
pub(super) const SHELL_BUS_ERROR: &str = "shell-bus-error";
pub(super) const DEEPSPEED_EXIT_SIGBUS: &str = "deepspeed-exit-sigbus";
pub(super) const CHROMIUM_OOM: &str = "chromium-out-of-memory";
pub(super) const PUPPETEER_PAGE_CRASHED: &str = "puppeteer-page-crashed";
pub(super) const UCX_POSIX_NO_SPACE: &str = "ucx-posix-no-space";

/// Rows whose line names a fault but not its cause: told only when the container's /dev/shm
/// was full then (`correlate`), as the row's kind; else nothing, so help text that says "Bus
/// error" and faults of other causes stay quiet.
pub(super) const JUDGED: &[&str] = &[
    "python-faulthandler-sigbus",
    "gdb-sigbus",
    "ucx-sigbus",
    "abseil-sigbus",
    "go-sigbus",
    "envoy-sigbus",
    "torch-spawn-sigbus",
    "torch-elastic-sigbus",
    DEEPSPEED_EXIT_SIGBUS,
    SHELL_BUS_ERROR,
    CHROMIUM_OOM,
    PUPPETEER_PAGE_CRASHED,
    "chromedriver-page-crash",
    "sglang-scheduler-sigbus",
];

/// The /dev/shm texts that say their cause: first of all rows (`SIGNATURES`).
pub(super) const SHM: &[Signature] = &[
    Signature {
        id: "torch-shm-fallocate",
        kind: FindingKind::ShmAllocationFailed,
        needle: "unable to allocate shared memory(shm) for file",
        fixture: "RuntimeError: unable to allocate shared memory(shm) for file \
                  </torch_13_2001593316_0>: No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp: posix_fallocate of a shared-memory \
                 tensor's segment failed",
    },
    Signature {
        id: TORCH_SHM_WRITE,
        kind: FindingKind::ShmAllocationFailed,
        needle: "unable to write to file ",
        fixture: "RuntimeError: unable to write to file </torch_18692_1954506624>: \
                  No space left on device (28)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp (TH/THAllocator.cpp before): writing \
                 the last byte of a shared-memory segment failed; only /torch_* segments count",
    },
    Signature {
        id: "torch-worker-sigbus",
        kind: FindingKind::ShmAllocationFailed,
        needle: "Unexpected bus error encountered in worker",
        fixture: "ERROR: Unexpected bus error encountered in worker. This might be caused by \
                  insufficient shared memory (shm).",
        source: "PyTorch torch/csrc/DataLoader.cpp: the DataLoader worker's SIGBUS handler",
    },
    Signature {
        id: "torch-dataloader-sigbus",
        kind: FindingKind::ShmAllocationFailed,
        needle: "dataloader's workers are out of shared memory",
        fixture: "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. \
                  It is possible that dataloader's workers are out of shared memory. Please try \
                  to raise your shared memory limit.",
        source: "PyTorch torch/csrc/DataLoader.cpp: the main process sees a worker killed by \
                 SIGBUS",
    },
    Signature {
        id: "torch-dataloader-sigbus-old",
        kind: FindingKind::ShmAllocationFailed,
        needle: "is killed by signal: Bus error",
        fixture: "RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error.",
        source: "PyTorch 1.0-1.2 torch/csrc/DataLoader.cpp: the same, before the hint about \
                 shared memory was added (PR #25730): a DataLoader worker's SIGBUS",
    },
    Signature {
        id: NCCL_SHM_CREATE,
        kind: FindingKind::ShmAllocationFailed,
        needle: "Error while creating shared memory segment",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while creating \
                  shared memory segment /dev/shm/nccl-Y7jXhK (size 9637888)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen (src/include/shm.h shmOpen before): a \
                 failure to create a segment; 2.22+ append the errno: EACCES, EROFS, ENOENT \
                 are no /dev/shm to write to (shm_unavailable), the rest a full one",
    },
    Signature {
        id: NCCL_SHM_ATTACH,
        kind: FindingKind::ShmNotShared,
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
        kind: FindingKind::ShmUnavailable,
        needle: "Call to shm_open failed",
        fixture: "b6b4ab0e7b5d:31:71 [0] include/shm.h:19 NCCL WARN Call to shm_open failed : \
                  Permission denied",
        source: "NCCL src/include/shm.h shmSetup (2.11 and before): SYSCHECKVAL of shm_open; by \
                 errno",
    },
    Signature {
        id: NCCL_SHM_FILE,
        kind: FindingKind::ShmUnavailable,
        needle: "failed to create shared memory file",
        fixture: "gpu-3:12:40 [0] misc/shmutils.cc:89 NCCL WARN Error: failed to create shared \
                  memory file 0x7f3a2c0b9e10, error Read-only file system (30)",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen (2.23+): mkstemp in /dev/shm failed; by \
                 errno",
    },
    Signature {
        id: NCCL_SHM_UNLINK,
        kind: FindingKind::ShmNotShared,
        needle: "NCCL WARN unlink shared memory ",
        fixture: "node-000:8639:8745 [0] misc/shmutils.cc:54 NCCL WARN unlink shared memory \
                  /dev/shm/nccl-d5rTd0 failed, error: No such file or directory",
        source: "NCCL src/misc/shmutils.cc ncclShmUnlink (2.16+; docs, troubleshooting): the \
                 segment was removed under the job (systemd-logind RemoveIPC, a cleaner)",
    },
    Signature {
        id: "nccl-shm-extend",
        kind: FindingKind::ShmAllocationFailed,
        needle: "failed to extend /dev/shm/",
        fixture: "3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend \
                  /dev/shm/nccl-Y7jXhK to 9637892 bytes",
        source: "NCCL src/misc/shmutils.cc ncclShmOpen: fallocate of a new segment failed",
    },
    Signature {
        id: "nccl-posix-fallocate",
        kind: FindingKind::ShmAllocationFailed,
        needle: "Call to posix_fallocate failed",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate \
                  failed : No space left on device",
        source: "NCCL src/include/shm.h (older releases): SYSCHECK's warning when \
                 posix_fallocate of a segment fails",
    },
    Signature {
        id: "nccl-shm-unable-allocate",
        kind: FindingKind::ShmAllocationFailed,
        needle: "Unable to allocate shared memory (",
        fixture: "4e9a7654171e:8639:8745 [0] include/shm.h:26 NCCL WARN Unable to allocate shared \
                  memory (4263936 bytes) : No space left on device",
        source: "NCCL src/include/shm.h (older releases): shm_allocate's warning",
    },
    Signature {
        id: TORCH_OPEN_SHM,
        kind: FindingKind::FdLimitReached,
        needle: "unable to open shared memory object ",
        fixture: "RuntimeError: unable to open shared memory object </torch_2186_1497540467_57> \
                  in read-write mode: Too many open files (24)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp: shm_open of a shared tensor failed; the \
                 errno (1.12+) says why: EMFILE the descriptor limit, ENOENT a segment gone or \
                 in another /dev/shm, EACCES/EROFS no /dev/shm to use; without one, not said",
    },
    Signature {
        id: "torch-fd-limit",
        kind: FindingKind::FdLimitReached,
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
        kind: FindingKind::FdLimitReached,
        needle: "received 0 items of ancdata",
        fixture: "RuntimeError: received 0 items of ancdata",
        source: "CPython Lib/multiprocessing/reduction.py recvfds: the descriptor sent over \
                 SCM_RIGHTS was dropped at the receiver's RLIMIT_NOFILE (PyTorch's \
                 file_descriptor strategy)",
    },
    Signature {
        id: TORCH_UNLINK,
        kind: FindingKind::ShmNotShared,
        needle: "could not unlink the shared memory file",
        fixture: "RuntimeError: could not unlink the shared memory file /torch_10386_3413375536 \
                  : No such file or directory (2)",
        source: "PyTorch aten/src/ATen/MapAllocator.cpp close/unlink: the segment was already \
                 gone (systemd-logind RemoveIPC, a cleaner, another /dev/shm); another errno is \
                 not ours",
    },
    Signature {
        id: "torch-pidfd-getfd",
        kind: FindingKind::CudaIpcDenied,
        needle: "pidfd_getfd: Operation not permitted",
        fixture: "RuntimeError: pidfd_getfd: Operation not permitted",
        source: "PyTorch c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::fromShared: a CUDA \
                 tensor of an expandable_segments allocator shared between processes needs \
                 ptrace permission over the sender",
    },
    Signature {
        id: "torch-pidfd-open",
        kind: FindingKind::CudaIpcDenied,
        needle: "pidfd_open:Operation not permitted",
        fixture: "RuntimeError: pidfd_open:Operation not permitted",
        source: "PyTorch c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::fromShared: \
                 pidfd_open refused (a seccomp profile)",
    },
    Signature {
        id: "python-sem-open",
        kind: FindingKind::ShmUnavailable,
        needle: "lacks a functioning sem_open implementation",
        fixture: "ImportError: This platform lacks a functioning sem_open implementation, \
                  therefore, the required synchronization primitives needed will not function, \
                  see issue 3770.",
        source: "CPython Lib/multiprocessing/synchronize.py (and loky's copy): no POSIX \
                 semaphores, no /dev/shm",
    },
    Signature {
        id: SEMAPHORE_TRACKER,
        kind: FindingKind::ShmUnavailable,
        needle: "semaphore_tracker: ",
        fixture: "loky/backend/semaphore_tracker.py:174: UserWarning: semaphore_tracker: \
                  '/loky-1-Au1xgY': [Errno 38] ENOSYS",
        source: "CPython 3.7 Lib/multiprocessing/semaphore_tracker.py and old loky: unlinking a \
                 semaphore failed with ENOSYS: no POSIX semaphores (no /dev/shm)",
    },
    Signature {
        id: "python-psm-attach",
        kind: FindingKind::ShmNotShared,
        needle: "No such file or directory: '/psm_",
        fixture: "FileNotFoundError: [Errno 2] No such file or directory: '/psm_9a1f0c2e'",
        source: "CPython Lib/multiprocessing/shared_memory.py SharedMemory(name=...): the block \
                 another process made is not in this /dev/shm (unlinked, or another container)",
    },
    Signature {
        id: "vllm-shm-space",
        kind: FindingKind::ShmAllocationFailed,
        needle: "Insufficient space in /dev/shm:",
        fixture: "RuntimeError: Insufficient space in /dev/shm: 240 MiB required, 64 MiB free.",
        source: "vLLM vllm/distributed/device_communicators/shm_broadcast.py \
                 check_shm_free_space (PR #48879; the text as quoted in PR #50606)",
    },
    Signature {
        id: "ray-object-store-size",
        kind: FindingKind::ShmAllocationFailed,
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
        kind: FindingKind::ShmAllocationFailed,
        needle: "exceeds the capacity of /dev/shm",
        fixture: "ValueError: The configured object store size exceeds the capacity of /dev/shm. \
                  This will harm performance. To proceed regardless of this warning, you can set \
                  RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1.",
        source: "Ray 1.2-1.3 python/ray/_private/services.py: the same refusal, older words",
    },
    Signature {
        id: "ray-object-store-tmp",
        kind: FindingKind::ShmFallback,
        needle: "instead of /dev/shm because /dev/shm has only",
        fixture: "WARNING services.py:1826 -- WARNING: The object store is using /tmp instead of \
                  /dev/shm because /dev/shm has only 67108864 bytes available. This will harm \
                  performance!",
        source: "Ray python/ray/_private/services.py determine_plasma_store_config: the object \
                 store falls back to /tmp (a warning; the job runs, slower)",
    },
    Signature {
        id: RAYLET_SHM_CAP,
        kind: FindingKind::ShmFallback,
        needle: "System memory request exceeds memory available in",
        fixture: "[2026-01-12 10:01:02,345 W 811 811] (raylet) store_runner.cc:83: System memory \
                  request exceeds memory available in /dev/shm. The request is for 2000000000 \
                  bytes, and the amount available is 60397977 bytes.",
        source: "Ray src/ray/object_manager/plasma/store_runner.cc: the plasma store is capped \
                 to what /dev/shm holds (a warning)",
    },
    Signature {
        id: "ray-shm-free-up",
        kind: FindingKind::ShmFallback,
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
        kind: FindingKind::ShmAllocationFailed,
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
        kind: FindingKind::ShmAllocationFailed,
        needle: "Failed to increase the shared memory pool size",
        fixture: "Failed to increase the shared memory pool size for key \
                  'triton_python_backend_shm_region_2' to 134217728 bytes. If you are running \
                  Triton inside docker, use '--shm-size' flag to control the shared memory \
                  region size. Error: No space left on device",
        source: "Triton python_backend src/shm_manager.cc GrowIfNeeded",
    },
    Signature {
        id: "triton-shm-run-out",
        kind: FindingKind::ShmAllocationFailed,
        needle: "because it run out of shared memory",
        fixture: "Failed to initialize the model instance add_sub_0 because it run out of shared \
                  memory. Increase the shared memory size to fix this error.",
        source: "Triton python_backend (2021) src/python.cc",
    },
    Signature {
        id: "triton-shm-region-open",
        kind: FindingKind::ShmNotShared,
        needle: "Unable to open shared memory region: '",
        fixture: "tritonclient.utils.InferenceServerException: [StatusCode.INTERNAL] Unable to \
                  open shared memory region: '/input_simple'",
        source: "Triton server src/shared_memory_manager.cc OpenSharedMemoryRegion: the client's \
                 region is not in the server's /dev/shm",
    },
    Signature {
        id: POSTGRES_DSM_RESIZE,
        kind: FindingKind::ShmAllocationFailed,
        needle: "could not resize shared memory segment",
        fixture: "ERROR:  could not resize shared memory segment \"/PostgreSQL.1136341590\" to \
                  3158016 bytes: No space left on device",
        source: "PostgreSQL src/backend/storage/ipc/dsm_impl.c dsm_impl_posix: posix_fallocate \
                 of a dynamic shared memory segment in /dev/shm; ENOSPC only",
    },
    Signature {
        id: POSTGRES_DSM_OPEN,
        kind: FindingKind::ShmNotShared,
        needle: "could not open shared memory segment",
        fixture: "FATAL:  could not open shared memory segment \"/PostgreSQL.241200488\": No such \
                  file or directory",
        source: "PostgreSQL src/backend/storage/ipc/dsm_impl.c dsm_impl_posix: the segment is \
                 gone (systemd-logind RemoveIPC, /dev/shm emptied or not shared); ENOENT only",
    },
    Signature {
        id: "chromium-discardable",
        kind: FindingKind::ShmFallback,
        needle: "Less than 64MB of free space in temporary directory for shared memory files",
        fixture: "[1:1:0311/101502.123:WARNING:discardable_shared_memory_manager.cc(197)] Less \
                  than 64MB of free space in temporary directory for shared memory files: 60",
        source: "Chromium components/discardable_memory/service/\
                 discardable_shared_memory_manager.cc GetDefaultMaxBytes (a warning)",
    },
    Signature {
        id: CHROMIUM_SHM_CREATE,
        kind: FindingKind::ShmUnavailable,
        needle: "Creating shared memory in ",
        fixture: "[7:7:0131/235140.910186:ERROR:platform_shared_memory_region_posix.cc(217)] \
                  Creating shared memory in /dev/shm/.org.chromium.Chromium.x7kIrq failed: No \
                  such file or directory (2)",
        source: "Chromium base/memory/platform_shared_memory_region_posix.cc Create: only in \
                 /dev/shm; by errno (ENOENT, EACCES, EROFS: no /dev/shm; ENOSPC: full)",
    },
    Signature {
        id: "chromium-shm-access",
        kind: FindingKind::ShmUnavailable,
        needle: "Unable to access(W_OK|X_OK) /dev/shm",
        fixture: "[7:7:0131/235140.910202:ERROR:platform_shared_memory_region_posix.cc(222)] \
                  Unable to access(W_OK|X_OK) /dev/shm: Permission denied (13)",
        source: "Chromium base/memory/platform_shared_memory_region_posix.cc Create",
    },
    Signature {
        id: UCX_POSIX_NO_SPACE,
        kind: FindingKind::ShmAllocationFailed,
        needle: "Not enough memory to write total of ",
        fixture: "[1700000000.123456] [gpu-3:4242:0]       mm_posix.c:206  UCX  ERROR Not enough \
                  memory to write total of 4292720 bytes. Please check that /dev/shm or the \
                  directory you specified has more available memory.",
        source: "UCX src/uct/sm/mm/posix/mm_posix.c uct_posix_test_mem (1.9+): writing its \
                 segment failed with ENOSPC; only the line that names /dev/shm",
    },
];

/// The generic texts (an errno on a line that names /dev/shm), then the judged rows: after every
/// specific row, so that any row that says the cause wins on its line.
pub(super) const GENERIC: &[Signature] = &[
    Signature {
        id: ENOSPC_DEV_SHM,
        kind: FindingKind::ShmAllocationFailed,
        needle: "No space left on device",
        fixture: "OSError: [Errno 28] No space left on device: '/dev/shm/psm_4a1b2c3d'",
        source: "strerror(ENOSPC) (glibc, Python's OSError) on a line that names /dev/shm; \
                 about any other path it is no shm fact",
    },
    Signature {
        id: EROFS_DEV_SHM,
        kind: FindingKind::ShmUnavailable,
        needle: "Read-only file system",
        fixture: "OSError: [Errno 30] Read-only file system: '/dev/shm/sem.mp-8fd2a1'",
        source: "strerror(EROFS) on a line that names /dev/shm: it cannot be written",
    },
    Signature {
        id: ENOSPC_CODE_DEV_SHM,
        kind: FindingKind::ShmAllocationFailed,
        needle: "failed with error code 28",
        fixture: "[PARENT ERROR] write to file /dev/shm/libfuzzer_core_17 failed with error code \
                  28",
        source: "ENOSPC by number (28) on a line that names /dev/shm",
    },
    Signature {
        id: ENOSPC_DEV_SHM_GO,
        kind: FindingKind::ShmAllocationFailed,
        needle: "no space left on device",
        fixture: "Error: write /dev/shm/cache/shard-0007: no space left on device",
        source: "Go's text for ENOSPC (syscall.Errno), lower-case, on a line that names /dev/shm",
    },
    // Judged rows (`JUDGED`): last, so that any row that says the cause wins on its line.
    Signature {
        id: "python-faulthandler-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "Fatal Python error: Bus error",
        fixture: "(RayWorker pid=3554640) Fatal Python error: Bus error",
        source: "CPython Modules/faulthandler.c: the fatal-signal handler's line for SIGBUS \
                 (vllm-project/vllm#859)",
    },
    Signature {
        id: "gdb-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "signal SIGBUS, Bus error",
        fixture: "Thread 787 \"imagenet_fake_d\" received signal SIGBUS, Bus error.",
        source: "gdb's stop and core-file lines (`received signal`, `terminated with signal`) \
                 (NVIDIA/JAX-Toolbox#183)",
    },
    Signature {
        id: "ucx-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "Caught signal 7 (Bus error",
        fixture: "[8d6bf97c3bf4:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical \
                  address)",
        source: "UCX src/ucs/debug/debug.c: its fault handler, loaded by MPI and NCCL's UCX \
                 plugin (msr-fiddle/pipedream#76)",
    },
    Signature {
        id: "abseil-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "*** SIGBUS received at time=",
        fixture: "(RayWorker pid=3554640) *** SIGBUS received at time=1692931519 on cpu 133 ***",
        source: "Abseil absl/debugging/failure_signal_handler.cc, as Ray and TensorFlow print \
                 it (vllm-project/vllm#859)",
    },
    Signature {
        id: "go-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "[signal SIGBUS: bus error",
        fixture: "[signal SIGBUS: bus error code=0x2 addr=0x7f3a1c000000 pc=0x46a2f1]",
        source: "Go src/runtime/panic.go and signal_unix.go: a fault in mapped memory",
    },
    Signature {
        id: "envoy-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "Caught Bus error, suspect faulting address",
        fixture: "Caught Bus error, suspect faulting address 0x7fdbf98e2028",
        source: "Envoy source/server/signal_action.cc: its stats in /dev/shm for hot restart \
                 (envoyproxy/envoy#4235)",
    },
    Signature {
        id: "torch-spawn-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "terminated with signal SIGBUS",
        fixture: "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated \
                  with signal SIGBUS",
        source: "PyTorch torch/multiprocessing/spawn.py ProcessContext.join (KdaiP/StableTTS#11)",
    },
    Signature {
        id: "torch-elastic-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "Signal 7 (SIGBUS) received by PID",
        fixture: "  traceback : Signal 7 (SIGBUS) received by PID 10",
        source: "PyTorch torch/distributed/elastic/multiprocessing/errors/__init__.py \
                 ProcessFailure: torchrun's root-cause table for a rank killed by SIGBUS",
    },
    Signature {
        id: DEEPSPEED_EXIT_SIGBUS,
        kind: FindingKind::ShmBusError,
        needle: "exits with return code = -7",
        fixture: "[2023-08-02 16:31:05,466] [ERROR] [launch.py:321:sigkill_handler] \
                  ['/usr/bin/python3', '-u', 'main.py', '--local_rank=0'] exits with return \
                  code = -7",
        source: "DeepSpeed deepspeed/launcher/launch.py sigkill_handler: a rank ended by signal \
                 7 (SIGBUS); -70 and the like are not",
    },
    Signature {
        id: SHELL_BUS_ERROR,
        kind: FindingKind::ShmBusError,
        needle: "Bus error",
        fixture: "/entrypoint.sh: line 12:  4242 Bus error               (core dumped) python \
                  train.py",
        source: "bash jobs.c, dash and busybox ash: a child killed by SIGBUS (strsignal's \
                 text); only the shell's shapes (`Bus error` alone, `(core dumped)` after it, \
                 a job line's PID before it) (namhyung/uftrace#371)",
    },
    Signature {
        id: CHROMIUM_OOM,
        kind: FindingKind::ShmAllocationFailed,
        needle: "Out of memory. size=",
        fixture: "[778:7:0131/235140.910186:FATAL:memory.cc(22)] Out of memory. size=524288",
        source: "Chromium base/process/memory.cc TerminateBecauseOutOfMemory: a shared-memory \
                 allocation failing in a full /dev/shm ends here too; only its FATAL:memory \
                 line (stephen-fox/chrome-docker#8)",
    },
    Signature {
        id: PUPPETEER_PAGE_CRASHED,
        kind: FindingKind::ShmAllocationFailed,
        needle: "Error: Page crashed!",
        fixture: "(node:7) UnhandledPromiseRejectionWarning: Unhandled promise rejection \
                  (rejection id: 1): Error: Page crashed!",
        source: "Puppeteer src/common/Page.ts: the renderer died; a full /dev/shm is the known \
                 cause in containers (puppeteer/puppeteer#831)",
    },
    Signature {
        id: "chromedriver-page-crash",
        kind: FindingKind::ShmAllocationFailed,
        needle: "session deleted because of page crash",
        fixture: "selenium.common.exceptions.WebDriverException: Message: unknown error: session \
                  deleted because of page crash",
        source: "ChromeDriver chrome/test/chromedriver (kTabCrashed): the renderer died under \
                 Selenium; a full /dev/shm is the known cause in containers \
                 (SeleniumHQ/docker-selenium#589, elgalu/docker-selenium#20)",
    },
    Signature {
        id: "sglang-scheduler-sigbus",
        kind: FindingKind::ShmBusError,
        needle: "scheduler died during initialization (exit code: -7)",
        fixture: "RuntimeError: Rank 0 scheduler died during initialization (exit code: -7). If \
                  exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T \
                  | grep -i oom` to check.",
        source: "sglang python/sglang/srt/entrypoints/engine.py _scheduler_died_error: a \
                 scheduler process ended by signal 7 (SIGBUS) while it started",
    },
];

//! The GPU rows: what CUDA, NCCL and RCCL print when GPUs fail a job, each a kind with its own
//! fix. CUDA's texts are its error strings (cudaGetErrorString / cuGetErrorString: the same
//! words for a cudaError_t and the CUresult of the same number), as NCCL prints them (`Cuda
//! failure 711 '...'` from CUCHECK, `Cuda failure '...'` from CUDACHECK), as PyTorch does
//! (`CUDA error: ...`) and TensorFlow (`CUDA_ERROR_...: ...`).

use super::table::NCCL_P2P_DISABLED;
use super::Signature;
use crate::failures::hang::parse::{
    HOROVOD_STALL, HOROVOD_STALL_NEEDLE, TORCH_WATCHDOG, TORCH_WATCHDOG_NEEDLE,
    TORCH_WATCHDOG_STUCK, TORCH_WATCHDOG_STUCK_NEEDLE, XLA_TERMINATION, XLA_TERMINATION_NEEDLE,
};
use crate::failures::nccl_diag::{
    NCCL_DIAG_P2P, NCCL_DIAG_P2P_NEEDLE, NCCL_RAS_PEER_DEAD, NCCL_RAS_PEER_DEAD_NEEDLE,
};
use crate::model::FindingKind;

// Ids of rows that need more than their needle (see `verify`).
pub(super) const CUDA_TOO_MANY_PEERS: &str = "cuda-too-many-peers";
pub(super) const CUDA_TOO_MANY_PEERS_NAME: &str = "cuda-too-many-peers-name";
pub(super) const CU_TOO_MANY_PEERS: &str = "cuda-too-many-peers-cu-name";
pub(super) const CUDA_ECC: &str = "cuda-ecc-uncorrectable";
pub(super) const CUDA_NOT_READY: &str = "cuda-system-not-ready";
pub(super) const CUDA_NOT_READY_NAME: &str = "cuda-system-not-ready-name";
pub(super) const CUDA_MAP_FAILED: &str = "cuda-map-buffer-failed";
pub(super) const CUDA_MAP_FAILED_NAME: &str = "cuda-map-buffer-failed-name";
pub(super) const CUDA_IPC_INVALID_DEVICE: &str = "cuda-ipc-invalid-device";
pub(super) const NCCL_NVLS_CUDA: &str = "nccl-nvls-cuda-failure";
pub(super) const RCCL_IOMMU: &str = "rccl-iommu-not-pt";

/// The rows that a quote, a search or a retry of the text must not set off (`said_as_failure`).
pub(super) const SAID: &[&str] = &[
    CUDA_TOO_MANY_PEERS,
    CUDA_TOO_MANY_PEERS_NAME,
    CU_TOO_MANY_PEERS,
    CUDA_ECC,
    CUDA_NOT_READY,
    CUDA_NOT_READY_NAME,
    CUDA_MAP_FAILED,
    CUDA_MAP_FAILED_NAME,
    CUDA_IPC_INVALID_DEVICE,
    "nccl-nvls-bind",
    NCCL_NVLS_CUDA,
    RCCL_IOMMU,
];

/// The GPU rows, between the /dev/shm texts and the generic ones. Of two rows on one line the
/// first wins: CUDA 802 inside NCCL's NVLS line is the fabric manager's, said more precisely.
pub(super) const GPU: &[Signature] = &[
    Signature {
        id: CUDA_TOO_MANY_PEERS,
        kind: FindingKind::GpuTooManyPeers,
        needle: "peer mapping resources exhausted",
        fixture: "[2025-06-20 02:14:03] node-7:33207:33207 [0] allocator.cc:79 NCCL WARN Cuda \
                  failure 711 'peer mapping resources exhausted'",
        source: "CUDA's string for cudaErrorTooManyPeers / CUDA_ERROR_TOO_MANY_PEERS (711): a \
                 device mapped more peers than the driver allows (eight); NCCL ncclMemAlloc \
                 (cuMemSetAccess for each peer; src/init.cc 2.19-2.26, src/allocator.cc 2.27+) \
                 and CUDA programs that enable peer access between every pair",
    },
    Signature {
        id: CUDA_TOO_MANY_PEERS_NAME,
        kind: FindingKind::GpuTooManyPeers,
        needle: "cudaErrorTooManyPeers",
        fixture: "CUDA error at p2pBandwidthLatencyTest.cu:212 code=711(cudaErrorTooManyPeers) \
                  \"cudaDeviceEnablePeerAccess(j, 0)\"",
        source: "CUDA's enum name for 711, as cuda-samples' checkCudaErrors prints it (without \
                 the string)",
    },
    Signature {
        id: CU_TOO_MANY_PEERS,
        kind: FindingKind::GpuTooManyPeers,
        needle: "CUDA_ERROR_TOO_MANY_PEERS",
        fixture: "W tensorflow/core/common_runtime/gpu/gpu_device.cc:918] Unable to enable peer \
                  access between device ordinals 9 and 8, status: Internal: failed to enable \
                  peer access from 0x8270570 to 0x7ba7860: CUDA_ERROR_TOO_MANY_PEERS",
        source: "CUDA's CUresult name for 711, as TensorFlow's StreamExecutor prints it (alone \
                 before its string was added)",
    },
    Signature {
        id: CUDA_ECC,
        kind: FindingKind::GpuEccUncorrectable,
        needle: "uncorrectable ECC error encountered",
        fixture: "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with \
                  exception: CUDA error: uncorrectable ECC error encountered",
        source: "CUDA's string for cudaErrorECCUncorrectable / CUDA_ERROR_ECC_UNCORRECTABLE \
                 (214), as PyTorch (c10/cuda/CUDAException.cpp, and ProcessGroupNCCL's \
                 watchdog quoting it), NCCL and TensorFlow print it",
    },
    Signature {
        id: CUDA_NOT_READY,
        kind: FindingKind::GpuFabricNotReady,
        needle: "system not yet initialized",
        fixture: "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). \
                  Did you run some cuda functions before calling NumCudaDevices() that might \
                  have already set an error? Error 802: system not yet initialized",
        source: "CUDA's string for cudaErrorSystemNotReady / CUDA_ERROR_SYSTEM_NOT_READY (802): \
                 on NVSwitch systems the fabric manager is not running or has not trained the \
                 fabric; PyTorch c10/cuda/CUDAFunctions.cpp, NCCL CUCHECK, cuMulticastBindMem",
    },
    Signature {
        id: CUDA_NOT_READY_NAME,
        kind: FindingKind::GpuFabricNotReady,
        needle: "cudaErrorSystemNotReady",
        fixture: "CUDA error at bandwidthTest.cu:256 code=802(cudaErrorSystemNotReady) \
                  \"cudaSetDevice(currentDevice)\"",
        source: "CUDA's enum name for 802, as cuda-samples' checkCudaErrors prints it",
    },
    Signature {
        id: "nccl-nvls-bind",
        kind: FindingKind::NvlsMulticastFailed,
        needle: "Failed to bind NVLink SHARP (NVLS) Multicast memory",
        fixture: "[2026-06-23 15:45:07] gpu-7:420:437 [5] transport/nvls.cc:379 (nvlsAllocateMem) \
                  NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 \
                  : CUDA error 401 'the operation cannot be performed in the present state'.",
        source: "NCCL src/transport/nvls.cc nvlsAllocateMem (2.27+): cuMulticastBindMem failed; \
                 NCCL says the fabric manager or the NVSwitches",
    },
    Signature {
        id: NCCL_NVLS_CUDA,
        kind: FindingKind::NvlsMulticastFailed,
        needle: "/nvls.cc:",
        fixture: "[2025-07-21 19:05:29] node004:27907:27907 [1] transport/nvls.cc:254 NCCL WARN \
                  Cuda failure 401 'the operation cannot be performed in the present state'",
        source: "NCCL src/transport/nvls.cc (2.17+): a CUCHECK of cuMulticastCreate, \
                 cuMulticastAddDevice or cuMulticastBindMem failed; only its WARN",
    },
    Signature {
        id: CUDA_MAP_FAILED,
        kind: FindingKind::GpuPeerMappingFailed,
        needle: "mapping of buffer object failed",
        fixture: "[2026-08-24 17:57:25] gpu-1:2274:2274 [0] allocator.cc:89 (ncclMemAlloc) NCCL \
                  WARN Cuda failure 205 'mapping of buffer object failed'",
        source: "CUDA's string for cudaErrorMapBufferObjectFailed / CUDA_ERROR_MAP_FAILED (205) \
                 from NCCL ncclMemAlloc (src/init.cc, src/allocator.cc 2.27+: cuMemMap, \
                 cuMemSetAccess for each peer that can access it) or cudaDeviceEnablePeerAccess; only with NCCL or peer \
                 access on the line (graphics interop fails with it too)",
    },
    Signature {
        id: CUDA_MAP_FAILED_NAME,
        kind: FindingKind::GpuPeerMappingFailed,
        needle: "cudaErrorMapBufferObjectFailed",
        fixture: "CUDA error at simpleP2P.cu:126 code=205(cudaErrorMapBufferObjectFailed) \
                  \"cudaDeviceEnablePeerAccess(gpuid[1], 0)\"",
        source: "CUDA's enum name for 205, as cuda-samples print it; only with peer access",
    },
    Signature {
        id: CUDA_IPC_INVALID_DEVICE,
        kind: FindingKind::CudaIpcInvalidDevice,
        needle: "invalid device ordinal",
        fixture: "node-2:3127:3180 [0] transport/p2p.cc:273 NCCL WARN failed to open CUDA IPC \
                  handle : 101 invalid device ordinal",
        source: "CUDA's string for cudaErrorInvalidDevice (101) on cudaIpcOpenMemHandle (NCCL \
                 src/transport/p2p.cc, programs that name the call): the memory is on a device \
                 this process does not see. Alone it is any wrong device number: not told",
    },
    Signature {
        id: RCCL_IOMMU,
        kind: FindingKind::IommuNotPassthrough,
        needle: "from kernel command line which can lead to system instablity or hang",
        fixture: "gpu-node:1234:1234 [0] init.cc:163 NCCL WARN Missing \"iommu=pt\" from kernel \
                  command line which can lead to system instablity or hang!",
        source: "RCCL src/init.cc (its spelling): /proc/cmdline lacks iommu=pt on an AMD GPU \
                 host, where P2P through a translating IOMMU can hang",
    },
    Signature {
        id: "nccl-ras-dead",
        kind: FindingKind::NcclRanksDead,
        needle: "considered dead (unreachable via the RAS network)",
        fixture: "  2 job processes are considered dead (unreachable via the RAS network)",
        source: "NCCL src/ras/client_support.cc (2.24+): the ncclras client's report of \
                 processes of the job no RAS peer can reach (`1 job process is`, `2 job \
                 processes are`)",
    },
    Signature {
        id: NCCL_RAS_PEER_DEAD,
        kind: FindingKind::NcclRanksDead,
        needle: NCCL_RAS_PEER_DEAD_NEEDLE,
        fixture: "[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 \
                  managing GPU 1",
        source: "NCCL src/ras/client_support.cc (2.29+): the ncclras client's monitor mode \
                 (`ncclras -m`), an event of the RAS network declaring a process dead, as text \
                 or JSON (`\"event\": \"PEER_DEAD\"`)",
    },
    Signature {
        id: NCCL_DIAG_P2P,
        kind: FindingKind::NcclP2pCheckFailed,
        needle: NCCL_DIAG_P2P_NEEDLE,
        fixture: "node0:24563 NCCL DIAG [INFO] p2p: write mismatch srcRank=0 srcCudaDev=0 \
                  srcNvmlDev=5 dstRank=1 dstCudaDev=1 dstNvmlDev=7 path=NVL \
                  handle=CUMEM_POSIX_FD expected=0x00000000d1a60100 got=0x0000000000000000 \
                  verify=0x0000000000000000; check the single-node NVLink topology",
        source: "NCCL src/diagnostics/p2p.cc (2.31+, NCCL_RUN_DIAGNOSTICS=1): the P2P check's \
                 failed edge (srcNvmlDev, dstNvmlDev) or its partial summary (`only 52/56 \
                 GPU-to-GPU peer accesses passed verification`)",
    },
    Signature {
        id: TORCH_WATCHDOG,
        kind: FindingKind::GpuCollectiveTimeout,
        needle: TORCH_WATCHDOG_NEEDLE,
        fixture: "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog \
                  caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, \
                  NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 \
                  milliseconds before timing out.",
        source: "PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (1.7+): the NCCL \
                 watchdog's timeout, `WorkNCCL(...)` as its operator<< prints it (1.7 OpType and \
                 TensorShape, 1.8 SeqNum, 1.13 NumelIn/NumelOut), `ran for N milliseconds`; \
                 then the process aborts (SIGABRT). Only with `WorkNCCL(` right after the text \
                 (`failures/hang/parse.rs`)",
    },
    Signature {
        id: TORCH_WATCHDOG_STUCK,
        kind: FindingKind::GpuCollectiveTimeout,
        needle: TORCH_WATCHDOG_STUCK_NEEDLE,
        fixture: "[rank25]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 25] [PG 0 Rank 25] \
                  ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress \
                  in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API \
                  hang blocking the watchdog",
        source: "PyTorch ProcessGroupNCCL.cpp's heartbeat monitor (2.2+, TORCH_NCCL_HEARTBEAT_\
                 TIMEOUT_SEC): the watchdog itself hung in a NCCL or CUDA call; the process is \
                 then killed",
    },
    Signature {
        id: XLA_TERMINATION,
        kind: FindingKind::GpuCollectiveTimeout,
        needle: XLA_TERMINATION_NEEDLE,
        fixture: "E0625 12:01:02.000000 1234 nccl_utils.cc:318] Termination timeout of 30 seconds \
                  exceeded. Exiting to ensure a consistent program state.",
        source: "XLA xla/service/gpu/nccl_utils.cc, later xla/service/rendezvous.cc (JAX, \
                 TensorFlow): a collective's rendezvous waited past \
                 --xla_gpu_nccl_termination_timeout_seconds; exit 42",
    },
    Signature {
        id: HOROVOD_STALL,
        kind: FindingKind::GpuCollectiveTimeout,
        needle: HOROVOD_STALL_NEEDLE,
        fixture: "[2021-02-02 21:19:07.345988: E horovod/common/stall_inspector.cc:117] One or \
                  more rank (marked by \"!\") is stalled for longer than 300 seconds. Will \
                  shutdown.",
        source: "Horovod horovod/common/stall_inspector.cc with HOROVOD_STALL_SHUTDOWN_TIME_\
                 SECONDS: ranks never submitted a collective's tensors; Horovod shuts down",
    },
    Signature {
        id: "nccl-peer-with-device",
        kind: FindingKind::GpuPeerAccessRefused,
        needle: "failed to peer with device",
        fixture: "node-2:3127:3180 [1] transport/p2p.cc:118 NCCL WARN failed to peer with device \
                  0(=3000): 217 peer access is not supported between these two devices",
        source: "NCCL src/transport/p2p.cc p2pMap: cudaDeviceEnablePeerAccess failed",
    },
    Signature {
        id: "nccl-peer-access",
        kind: FindingKind::GpuPeerAccessRefused,
        needle: "peer access is not supported between these two devices",
        fixture: "node-2:3127:3180 [0] transport/p2p.cc:273 NCCL WARN failed to open CUDA IPC \
                  handle : 217 peer access is not supported between these two devices",
        source: "CUDA's text for cudaErrorPeerAccessUnsupported (217), as NCCL src/transport/\
                 p2p.cc and shm.cc and CUDA programs print it",
    },
    Signature {
        id: "nccl-mnnvl-imex",
        kind: FindingKind::ImexChannelMissing,
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
        kind: FindingKind::ImexChannelMissing,
        needle: "MNNVL is not supported on this system",
        fixture: "gb200-07:4021:4102 [0] init.cc:1115 NCCL WARN MNNVL is not supported on this \
                  system",
        source: "NCCL src/init.cc initTransportsRank (2.20-2.24) with NCCL_MNNVL_ENABLE=1",
    },
    Signature {
        id: NCCL_P2P_DISABLED,
        kind: FindingKind::NcclP2pDisabled,
        needle: "P2P is disabled between NVLINK connected GPUs",
        fixture: "node-000:8639:8745 [1] graph/paths.cc:314 NCCL WARN P2P is disabled between \
                  NVLINK connected GPUs 1 and 3. This should not be the case given their \
                  connectivity, and is probably due to a hardware issue. If you still want to \
                  proceed, you can set NCCL_IGNORE_DISABLED_P2P=1.",
        source: "NCCL src/graph/paths.cc ncclTopoCheckP2p: NVML says P2P is not OK between two \
                 NVLink-connected GPUs (NVML indices); NCCL then fails with an unhandled CUDA \
                 error",
    },
];

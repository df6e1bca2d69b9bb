//! The fact tier against lines written from the programs' own sources (each names the file that
//! prints it), then the traps: what must stay quiet.

use super::*;
use FindingKind::*;

fn kind(line: &str) -> Option<FindingKind> {
    recognise(line).map(|(k, _)| k)
}

fn named(line: &str) -> String {
    recognise(line)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| panic!("nothing named: {line}"))
}

#[test]
fn nccls_transports_failing_a_gpu_call() {
    for (line, want) in [
        // src/transport/p2p.cc (CUDACHECK of cudaIpcOpenMemHandle / cuMemImportFromShareable).
        (
            "node-1:1:2 [0] transport/p2p.cc:1129 NCCL WARN Cuda failure 1 'invalid argument'",
            GpuP2pFailed,
        ),
        // NCCL 2.2-2.3 src/transport/p2p.cu: the old grammar and numbering.
        (
            "host:95772:95782 [0] transport/p2p.cu:526 WARN failed to open CUDA IPC handle : \
             11 invalid argument",
            GpuP2pFailed,
        ),
        // 101 in the p2p transport is cudaIpcOpenMemHandle of memory on a GPU not seen.
        (
            "node:1:2 [0] transport/p2p.cc:275 NCCL WARN Cuda failure 101 'invalid device ordinal'",
            CudaIpcInvalidDevice,
        ),
        (
            "node:1:2 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'mapping of buffer object \
             failed'",
            GpuPeerMappingFailed,
        ),
        // src/transport/nvls.cc CUCHECK, with a number only.
        (
            "node:1:2 [1] transport/nvls.cc:254 NCCL WARN Cuda failure 801",
            NvlsMulticastFailed,
        ),
        // src/include/cudawrap.h CUCHECK: the name is the cause wherever it is met.
        (
            "node:1:2 [3] enqueue.cc:1 NCCL WARN Cuda failure 220 'uncorrectable NVLink error \
             detected during the execution'",
            GpuNvlinkError,
        ),
        // RCCL: hipified NCCL, the same words, HIP's errors.
        (
            "node [0] /app/rccl/src/transport/p2p.cc:256 NCCL WARN Cuda failure \
             'hipErrorInvalidValue'",
            GpuP2pFailed,
        ),
    ] {
        assert_eq!(kind(line), Some(want), "{line}");
    }
    assert_eq!(
        named("node-1:1:2 [3] transport/p2p.cc:1 NCCL WARN cudaIpcOpenMemHandle failed : invalid argument"),
        "CUDA error 1 (cudaErrorInvalidValue) on cudaIpcOpenMemHandle in NCCL's \
         transport/p2p.cc, device 3 of the process"
    );
}

#[test]
fn cuda_and_hip_errors_by_their_names() {
    for (line, want) in [
        // PyTorch c10/cuda/CUDAException.cpp: `CUDA error: ` and cudaGetErrorString.
        (
            "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
            GpuNvlinkError,
        ),
        // cuda-samples helper_cuda.h checkCudaErrors: `code=%d(%s)` with the enum's name.
        (
            "CUDA error at simpleP2P.cu:126 code=220(cudaErrorNvlinkUncorrectable) \"f()\"",
            GpuNvlinkError,
        ),
        // TensorFlow stream_executor: the CUresult's name.
        (
            "W gpu_device.cc:918] Unable to enable peer access between device ordinals 1 and 0, \
             status: Internal: failed to enable peer access from 0x1 to 0x2: \
             CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            GpuPeerAccessRefused,
        ),
        // HIP (hip_runtime_api.h names), PyTorch on ROCm.
        (
            "RuntimeError: hipErrorPeerAccessUnsupported",
            GpuPeerAccessRefused,
        ),
        (
            "RuntimeError: HIP error: uncorrectable ECC error encountered",
            GpuEccUncorrectable,
        ),
        // CuPy cupy_backends/cuda/api/runtime.pyx: `<name>: <words>`.
        (
            "cupy.cuda.runtime.CUDARuntimeError: cudaErrorTooManyPeers: peer mapping resources \
             exhausted",
            GpuTooManyPeers,
        ),
        // A cuda-samples file about P2P: its peer mapping.
        (
            "Cuda failure p2pBandwidthLatencyTest.cu:189: 'mapping of buffer object failed'",
            GpuPeerMappingFailed,
        ),
        // Any CUDA error on an IPC call: the IPC path.
        (
            "RuntimeError: cudaIpcOpenMemHandle failed: invalid resource handle",
            GpuP2pFailed,
        ),
        (
            "cuCtxEnablePeerAccess failed: operation not supported",
            GpuP2pFailed,
        ),
        (
            "cuMulticastBindMem failed: CUDA_ERROR_ILLEGAL_STATE",
            NvlsMulticastFailed,
        ),
        // UCX src/uct/cuda/cuda_ipc: `%s() failed: %s` of the driver's call and string.
        (
            "[1700000000.1] [gpu-3:42:0] cuda_ipc_cache.c:1 UCX ERROR cuIpcOpenMemHandle(&d, \
             key->ph) failed: invalid device context",
            GpuP2pFailed,
        ),
        // Open MPI opal/mca/common/cuda: the call, then its return value on a line of its own.
        (
            "  cuIpcOpenMemHandle return value:   217",
            GpuPeerAccessRefused,
        ),
    ] {
        assert_eq!(kind(line), Some(want), "{line}");
    }
}

#[test]
fn dev_shm_by_errno_words_and_signal() {
    for (line, want) in [
        // CPython Objects/exceptions.c OSError: `[Errno N] strerror: 'filename'`.
        (
            "OSError: [Errno 28] No space left on device: '/dev/shm/torch_123'",
            ShmAllocationFailed,
        ),
        (
            "OSError: [Errno 30] Read-only file system: '/dev/shm/sem.mp-1'",
            ShmUnavailable,
        ),
        (
            "ERROR: shm_open(O_CREAT) /dev/shm/x failed: Permission denied",
            ShmUnavailable,
        ),
        (
            "FileNotFoundError: [Errno 2] No such file or directory: '/psm_9a1f'",
            ShmNotShared,
        ),
        (
            "OSError: [Errno 24] Too many open files: '/dev/shm/torch_1_2'",
            FdLimitReached,
        ),
        // PostgreSQL dsm_impl.c: a dynamic segment's errno (another errno than the row's).
        (
            "ERROR:  could not create shared memory segment \"/PostgreSQL.1\": Read-only file \
             system",
            ShmUnavailable,
        ),
        // Go's os package: `write <path>: <lower-case strerror>`.
        (
            "panic: write /dev/shm/cache/x: no space left on device",
            ShmAllocationFailed,
        ),
        // A create that finds no /dev/shm.
        (
            "ERROR: shm_open failed creating segment: No such file or directory",
            ShmUnavailable,
        ),
        // PaddlePaddle python/paddle/io/dataloader/worker.py: its DataLoader's SIGBUS words.
        (
            "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be caused \
             by insufficient shared memory (shm), please check whether use_shared_memory is set",
            ShmAllocationFailed,
        ),
        // Open MPI's btl/vader show_help: a backing file under /dev/shm without its space.
        (
            "It appears as if there is not enough space for /dev/shm/vader_segment.node.0 (the \
             shared-memory backing file).",
            ShmAllocationFailed,
        ),
        // A DataLoader's words: its workers' batches are in /dev/shm.
        (
            "RuntimeError: DataLoader worker exited: insufficient shared memory",
            ShmAllocationFailed,
        ),
        // Intel PSM (psm_ep.c) through Open MPI.
        (
            "Unable to allocate shared memory for intra-node messaging. Delete stale shared \
             memory files in /dev/shm.",
            ShmAllocationFailed,
        ),
    ] {
        assert_eq!(kind(line), Some(want), "{line}");
    }
    assert_eq!(
        named("OSError: [Errno 28] No space left on device: '/dev/shm/torch_123'"),
        "errno 28 (ENOSPC) on /dev/shm/torch_123 in Python's OSError"
    );
    assert_eq!(
        named(
            "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be caused \
             by insufficient shared memory (shm)"
        ),
        "signal 7 (SIGBUS) with \"insufficient shared memory (shm)\" in its log line"
    );
}

#[test]
fn traps_stay_quiet() {
    for line in [
        // Help text, advice, documentation.
        "Tip: OSError: [Errno 28] No space left on device on /dev/shm means it is full",
        "If you see `CUDA error: uncorrectable NVLink error detected during the execution`, \
         drain the node",
        "Please note that PyTorch uses shared memory to share data between processes, so the \
         default shared memory segment size is not enough",
        "  --shm-size  Size of /dev/shm, e.g. insufficient shared memory (shm) for DataLoaders",
        "Why do I get OSError: [Errno 28] No space left on device in /dev/shm?",
        "$ grep 'Cuda failure' nccl.log | grep transport/p2p.cc",
        // NCCL's INFO: a call it ignores and goes on from (CUDACHECKIGNORE), its return trail.
        "node:1:2 [0] NCCL INFO transport/p2p.cc:1 Cuda failure 'invalid argument'",
        "node:1:2 [0] NCCL INFO transport/p2p.cc:409 -> 1",
        // Retries that succeeded, fallbacks.
        "cudaIpcOpenMemHandle failed: invalid argument, retrying (1/3)",
        "UserWarning: [Errno 28] No space left on device.  joblib will operate in serial mode",
        "NCCL WARN NVLS multicast Cuda failure 801 'operation not supported', falling back to \
         the ring",
        // The GPU's own memory, the program's kernels, a benign answer.
        "RuntimeError: CUDA error: out of memory",
        "node:1:2 [0] transport/p2p.cc:1 NCCL WARN Cuda failure 'out of memory'",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "CUDA error: device-side assert triggered",
        "cudaDeviceEnablePeerAccess failed: peer access is already enabled",
        "RuntimeError: CUDA error: invalid device ordinal",
        // A handle of the process's own memory (src/transport/p2p.cc 2.12-2.26,
        // p2pProxyRegister; RCCL's hipified copy): its allocation, not the path.
        "gpu-3:11:40 [2] transport/p2p.cc:221 NCCL WARN cudaIpcGetMemHandle failed : operation \
         not supported",
        // Triton's CUDA shared memory API: a client's handle, no path call of the job's own.
        "error: Unable to init infer data manager: failed to register CUDA shared memory region \
         'output_0': failed to open CUDA IPC handle: invalid argument",
        // A warning of a check before anything was allocated, a Python warning.
        "WARNING: /dev/shm has not enough shared memory for the cache, consider --shm-size",
        "UserWarning: Not enough shared memory in /dev/shm for the prefetch buffers",
        // A person quoting the words.
        "- sem_open() calls fail with \"Function not implemented\".",
        // Network errors, the host's shared memory transport registering memory.
        "node:1:2 [0] transport/net_ib.cc:1 NCCL WARN NET/IB : Got completion with error 12",
        "node:1:2 [0] transport/net.cc:291 NCCL WARN Cuda failure 'invalid argument'",
        "node:1:2 [0] include/shm.h:46 WARN failed to register host buffer 0x7f : invalid argument",
        "node:1:2 [0] include/alloc.h:102 NCCL WARN Cuda failure 1 'invalid argument'",
        // SysV shared memory and PostgreSQL's lock table are not /dev/shm.
        "FATAL:  could not create shared memory segment: No space left on device",
        "ERROR:  out of shared memory",
        // Another server's segment, opened: not a /dev/shm missing.
        "FATAL:  could not open shared memory segment \"/PostgreSQL.1804289383\": Permission \
         denied",
        // An errno about another path; a fault without its cause.
        "OSError: [Errno 28] No space left on device: '/data/ckpt/step_1000.pt'",
        "Bus error at (/paddle/paddle/fluid/imperative/data_loader.cc:165)",
        "Fatal Python error: Bus error",
        // No failure said.
        "shm_open: /dev/shm has 64 MiB, 60 MiB free",
        "Checking /dev/shm: No space left on device is what a full tmpfs says",
        "cudaErrorPeerAccessUnsupported = 217",
    ] {
        assert_eq!(recognise(line).map(|(k, _)| k), None, "{line}");
    }
}

#[test]
fn the_span_is_the_part_of_the_line_the_facts_came_from() {
    let line = "2026-01-01 [rank0]: OSError: [Errno 28] No space left on device: '/dev/shm/x' \
                (while saving)";
    let (_, n) = recognise(line).unwrap();
    assert_eq!(
        &line[n.span.0..n.span.1],
        "[Errno 28] No space left on device: '/dev/shm/x"
    );
}

#[test]
fn needles_are_plain_ascii_that_no_log_format_rewrites() {
    // As the rows' (signatures' test): the tailer asks raw bytes, Docker's JSON-escaped ones too.
    for n in NEEDLES {
        assert!(
            n.bytes()
                .all(|b| (b' '..=b'~').contains(&b) && !b"\"\\<>&".contains(&b)),
            "{n:?}"
        );
    }
}

#[test]
fn every_needle_is_in_the_lines_it_admits() {
    // Each test line above that names something holds a needle: the prefilter lets it through.
    let ac = aho_corasick::AhoCorasick::new(NEEDLES).unwrap();
    for line in [
        "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
        "host:1:2 [0] transport/p2p.cu:526 WARN failed to open CUDA IPC handle : 11 invalid argument",
        "panic: write /dev/shm/cache/x: no space left on device",
        "RuntimeError: hipErrorPeerAccessUnsupported",
        "cuCtxEnablePeerAccess failed: operation not supported",
        "Unable to allocate shared memory for intra-node messaging.",
    ] {
        assert!(ac.is_match(line), "{line}");
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = crate::fixtures::rng::Rng::new(0xfac7);
    let seeds = [
        "node:1:2 [3] transport/p2p.cc:1 NCCL WARN cudaIpcOpenMemHandle failed : invalid argument",
        "OSError: [Errno 28] No space left on device: '/dev/shm/torch_123'",
        "ERROR: Unexpected BUS error in DataLoader worker. insufficient shared memory (shm)",
        "CUDA error at x.cu:1 code=220(cudaErrorNvlinkUncorrectable) \"f()\" 0000:29:00.0",
        "Cuda failure p2p.cu:189: 'mapping of buffer object failed' é ü 日本",
    ];
    for _ in 0..20_000 {
        let seed = seeds[rng.below(seeds.len())];
        let line = rng.mutate(seed.as_bytes());
        let _ = recognise(&String::from_utf8_lossy(&line));
    }
    for seed in seeds {
        for cut in 0..=seed.len() {
            if let Some(prefix) = seed.get(..cut) {
                let _ = recognise(prefix);
            }
        }
    }
}

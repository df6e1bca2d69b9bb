//! What a workload said when something other than a full /dev/shm failed its IPC: a segment
//! its peers cannot see, no /dev/shm at all, the file-descriptor limit, a refused CUDA IPC, a
//! missing IMEX channel, a GPU pair refusing peer access, or a fallback that costs speed. Each
//! its cause and the fix a person types for where it runs (`Runtime`: a Pod spec, Docker's
//! flags, or words any runtime takes).

use super::Runtime;

/// `shm_not_shared`: a segment another process made is not in this one's /dev/shm.
pub fn shm_not_shared(who: &str, at: &str, evidence: &str, runtime: Runtime) -> String {
    let fix = match runtime {
        Runtime::Pod => {
            "run the processes that exchange it in one container, or mount the same emptyDir \
         (medium: Memory) at /dev/shm in every container of the Pod that takes part; between \
         Pods there is no shared /dev/shm: NCCL_SHM_DISABLE=1 makes NCCL use the network"
        }
        Runtime::Docker => {
            "docker run --ipc=shareable for the first container and --ipc=container:<first> for \
         the others (or --ipc=host for all); NCCL_SHM_DISABLE=1 makes NCCL use the network"
        }
        Runtime::Other => {
            "give the processes that exchange it one IPC namespace and /dev/shm (one container, or \
         the runtime's shared-IPC option); NCCL_SHM_DISABLE=1 makes NCCL use the network"
        }
    };
    format!(
        "container {who} could not open a shared-memory segment another process made, at {at}: \
         {evidence}. The processes that exchange it do not share a /dev/shm (or an IPC \
         namespace), or the segment was removed under them: this is not /dev/shm running out. \
         Fix: {fix}."
    )
}

/// `shm_unavailable`: no writable tmpfs at /dev/shm.
pub fn shm_unavailable(who: &str, at: &str, evidence: &str, runtime: Runtime) -> String {
    let fix = match runtime {
        Runtime::Pod => {
        "mount an emptyDir with medium: Memory at /dev/shm (a sandbox or image without one, or a \
         read-only mount there, leaves none)"
    }
        Runtime::Docker => {
        "do not mount /dev/shm read-only or over it; docker run --shm-size=1g (or --ipc=host), \
         never --ipc=none"
    }
        Runtime::Other => "mount a writable tmpfs at /dev/shm in the container (size 1 GiB or more), or share the \
         host's IPC namespace",
    };
    format!(
        "container {who} has no usable /dev/shm at {at}: {evidence}. POSIX shared memory and \
         semaphores (Python's multiprocessing locks and shared_memory, PostgreSQL, Chromium) \
         need a writable tmpfs at /dev/shm. Fix: {fix}."
    )
}

/// `fd_limit_reached`: PyTorch's file_descriptor sharing strategy ran out of descriptors.
pub fn fd_limit_reached(who: &str, at: &str, evidence: &str) -> String {
    format!(
        "container {who} ran out of file descriptors at {at}: {evidence}. PyTorch's default \
         sharing strategy (file_descriptor) keeps a descriptor open for every tensor in flight \
         between processes: the open-files limit ran out, not /dev/shm. Fix: raise the limit \
         (ulimit -n 65536 before the program starts; the runtime's default is often 1024 soft), \
         or call torch.multiprocessing.set_sharing_strategy('file_system') at the start of the \
         program."
    )
}

/// `cuda_ipc_denied`: pidfd_getfd refused (no ptrace permission over the peer process).
pub fn cuda_ipc_denied(who: &str, at: &str, evidence: &str, runtime: Runtime) -> String {
    let cap = match runtime {
        Runtime::Pod => "add SYS_PTRACE to the container's securityContext.capabilities.add",
        Runtime::Docker => "docker run --cap-add SYS_PTRACE",
        Runtime::Other => "give the container CAP_SYS_PTRACE",
    };
    format!(
        "container {who}: CUDA IPC between its processes was refused at {at}: {evidence}. NCCL \
         (2.19 and later, cuMem) passes GPU memory handles between processes as file \
         descriptors with pidfd_getfd, which needs ptrace permission over the peer \
         (CAP_SYS_PTRACE, or kernel.yama.ptrace_scope allowing it). Fix: {cap}, or set \
         NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, no descriptors passed)."
    )
}

/// `imex_channel_missing`: multi-node NVLink without an IMEX channel in the container.
pub fn imex_channel_missing(who: &str, at: &str, evidence: &str, runtime: Runtime) -> String {
    let fix = match runtime {
        Runtime::Pod => {
            "give the Pod an IMEX channel (NVIDIA's DRA driver: a ComputeDomain and the resource \
         claim it makes)"
        }
        Runtime::Docker => {
            "run nvidia-imex on the nodes and give the container the channel \
         (--device /dev/nvidia-caps-imex-channels/channel0)"
        }
        Runtime::Other => {
            "run nvidia-imex on the nodes and give the container an IMEX channel device \
         (/dev/nvidia-caps-imex-channels/channel0)"
        }
    };
    format!(
        "container {who} could not import GPU memory over multi-node NVLink at {at}: {evidence}. \
         Such memory is shared through an IMEX channel (/dev/nvidia-caps-imex-channels/channelN) \
         the container does not have, or whose IMEX service is not running. Fix: {fix}; or keep \
         the job within one node's NVLink with NCCL_MNNVL_ENABLE=0."
    )
}

/// `gpu_peer_access_refused`: CUDA says two GPUs cannot reach each other's memory.
pub fn gpu_peer_access_refused(
    who: &str,
    at: &str,
    evidence: &str,
    gpus: &super::failures::JobGpus<'_>,
) -> String {
    let mut out =
        format!("CUDA in {who} refused peer access between two of its GPUs at {at}: {evidence}");
    out.push_str(&super::failures::gpu_context(gpus));
    out.push_str(
        " Until the pair is fixed, NCCL_P2P_DISABLE=1 lets the job run through host memory \
         (slower); shmlink probe tells which pair refuses.",
    );
    out
}

/// `shm_fallback`: the workload goes on with less shared memory than it wanted (slower).
pub fn shm_fallback(who: &str, at: &str, evidence: &str, runtime: Runtime) -> String {
    let fix = match runtime {
        Runtime::Pod => {
        "mount an emptyDir with medium: Memory at /dev/shm with a sizeLimit above what it asks \
         for, and raise the memory limit by as much"
    }
        Runtime::Docker => {
        "docker run --shm-size larger than what it asks for (or --ipc=host)"
    }
        Runtime::Other => "mount a tmpfs at /dev/shm in the container larger than what it asks for, with a memory \
         limit that has room for it",
    };
    format!(
        "container {who} runs with less shared memory than it wanted, since {at}: {evidence}. \
         It goes on, slower (Ray's object store in /tmp, a smaller shared cache). Fix: {fix}."
    )
}

//! Why a workload died: what it said, what its /dev/shm and GPUs were then, and the fix.

use super::{pair_status, Runtime, SHM_FIX_KUBERNETES};
use crate::model::{
    prefix_within, GpusFrom, MemorySource, MemorySplit, PairStatus, PairThen, ShmThen, Suspect,
};
use crate::units::{docker_size, human_bytes, k8s_quantity};

/// `shm_allocation_failed`: what the workload said, its /dev/shm then, and a concrete fix.
/// `runtime`: where it runs (the fix is a Pod spec, Docker's flags, or any runtime's words).
pub fn shm_allocation_failed(
    who: &str,
    at: &str,
    evidence: &str,
    shm: Option<&ShmThen>,
    runtime: Runtime,
    browser: bool,
) -> String {
    let mut out = format!("container {who} could not allocate shared memory at {at}: {evidence}");
    // Chromium's own switch: its shared-memory files go to /tmp, whatever /dev/shm holds.
    let browser_fix = if browser {
        " Or start Chromium with --disable-dev-shm-usage (Puppeteer: args: \
         ['--disable-dev-shm-usage']): it then keeps these files in /tmp."
    } else {
        ""
    };
    let Some(s) = shm else {
        out.push_str(&format!(
            ". Its /dev/shm was not measured before it died; give it a larger one: {}.{browser_fix}",
            match runtime {
                Runtime::Pod => format!("in Kubernetes {SHM_FIX_KUBERNETES}"),
                Runtime::Docker => "docker run --shm-size (or --ipc=host)".to_string(),
                Runtime::Other => "a larger tmpfs at /dev/shm in the container".to_string(),
            }
        ));
        return out;
    };
    let size = s.size_bytes.map_or("no size limit".into(), human_bytes);
    let what = if s.host_ipc {
        "the host's /dev/shm (host IPC)"
    } else if s.runtime_default {
        "the container runtime's default 64 MiB tmpfs"
    } else {
        "its own tmpfs"
    };
    out.push_str(&format!(
        ". Its /dev/shm then: {what}, {size}, {} used, peak {} since the scan before{}.",
        s.used_bytes.map_or("?".into(), human_bytes),
        s.peak_bytes.map_or("?".into(), human_bytes),
        s.memory_limit_bytes.map_or(String::new(), |m| format!(
            ", memory limit {}",
            human_bytes(m)
        )),
    ));
    // At least double what it had, and never under 1 GiB: the failing request is not in the
    // message, and the next batch is as large as the last.
    let want = s
        .size_bytes
        .unwrap_or(0)
        .max(s.peak_bytes.unwrap_or(0))
        .saturating_mul(2)
        .max(1 << 30);
    out.push_str(&match runtime {
        Runtime::Pod => format!(
            " Fix: mount an emptyDir with medium: Memory and sizeLimit: {} at /dev/shm, and raise \
             the container's memory limit by as much (tmpfs pages count against it).",
            k8s_quantity(want)
        ),
        Runtime::Docker => format!(
            " Fix: docker run --shm-size={} (or --ipc=host); tmpfs pages count against --memory.",
            docker_size(want)
        ),
        Runtime::Other => format!(
            " Fix: mount a tmpfs of {} at /dev/shm in the container, with a memory limit that has \
             room for it (tmpfs pages count against it).",
            human_bytes(want)
        ),
    });
    out.push_str(browser_fix);
    out
}

/// How a failure names a process no scan placed in a container.
pub const UNKNOWN_PROCESS: &str = "an unknown process";

/// `gpu_job_crashed`: the kernel's word, and whether the Pod's GPU pairs point at the hardware.
pub fn gpu_job_crashed(
    who: &str,
    at: &str,
    comm: &str,
    pid: Option<i32>,
    library: &str,
    gpus: &JobGpus<'_>,
) -> String {
    let pid = pid.map_or(String::new(), |p| format!(" (host PID {p})"));
    let of = if who == UNKNOWN_PROCESS {
        " in no known container".to_string()
    } else {
        format!(" of {who}")
    };
    let mut out = format!("process {comm}{pid}{of} crashed in {library} at {at}");
    out.push_str(&gpu_context(gpus));
    out
}

/// `nccl_p2p_disabled`: NCCL's GPUs are its CUDA device numbers in the process.
pub fn nccl_p2p_disabled(
    who: &str,
    at: &str,
    nccl: Option<(u32, u32)>,
    gpus: &JobGpus<'_>,
) -> String {
    let between = nccl.map_or(String::new(), |(a, b)| {
        format!(" between GPUs {a} and {b} (as the container numbers them)")
    });
    let mut out = format!(
        "NCCL in {who} says P2P is disabled{between} although they are NVLink-connected, at \
         {at}: traffic falls back to slower paths or the job fails"
    );
    out.push_str(&gpu_context(gpus));
    out
}

/// The facts a failure was named from when no exact text of a program matched its line: said
/// so a wrong call can be seen (and the fact tier fixed).
pub fn named_from(facts: &str) -> String {
    format!(" Named from: {facts}.")
}

/// The GPUs a failed job used and what the pair judge said of the pairs among them.
pub struct JobGpus<'a> {
    /// NVML indices, lowest first.
    pub gpus: &'a [u32],
    pub from: Option<GpusFrom>,
    pub pairs: &'a [PairThen],
    /// The GPUs among them the pair judge blames (else the ends of their failing pairs).
    pub culprits: &'a [u32],
    /// The GPUs of the node the pair judge blames (not "either end"), said when the job's own
    /// GPUs are not known.
    pub node_culprits: &'a [Suspect],
    /// Their recent ECC XIDs and fabric state (`gpu_failures.rs`).
    pub evidence: super::GpuEvidence,
    /// A hang's collective and what their links did over its window (`hang.rs`).
    pub hang: Option<&'a crate::model::Hang>,
}

/// `GPU 5`, `GPUs 5 and 7`, `GPUs 1, 5 and 7`.
pub(super) fn gpus_named(gpus: &[u32]) -> String {
    let n: Vec<String> = gpus.iter().map(u32::to_string).collect();
    match gpus {
        [] => "no GPU".into(),
        [_] => format!("GPU {}", n[0]),
        _ => format!("GPUs {}", super::and_list(&n)),
    }
}

/// ". It was using GPUs 5 and 7; pair 5-7 has been down since ... (...): the hardware, not
/// your code. ...", or that all pairs among them are healthy.
pub(super) fn gpu_context(job: &JobGpus<'_>) -> String {
    let gpus = job.gpus;
    if gpus.is_empty() {
        let mut out = String::from(
            ". The GPUs it used are not known (NVML listed no process of it, and no kubelet \
             pod-resources answer)",
        );
        out.push_str(&node_culprits(job.node_culprits));
        out.push('.');
        return out;
    }
    let list = gpus_named(gpus);
    let used = match job.from {
        Some(GpusFrom::Process) => format!(" while using {list}"),
        Some(GpusFrom::Container) => format!("; its container was using {list}"),
        _ => format!("; its Pod holds {list}"),
    };
    let bad: Vec<&PairThen> = job
        .pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .collect();
    if bad.is_empty() {
        let healthy = if gpus.len() < 2 {
            String::new()
        } else if job.pairs.is_empty() {
            "; the pairs among them were not judged (no NVML)".into()
        } else {
            format!(
                "; all pairs among GPUs {} are healthy",
                gpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return format!(
            "{used}{healthy}: look at the job itself (NCCL_DEBUG=INFO, the stack of the crash)."
        );
    }
    let parts = bad
        .iter()
        .map(|p| {
            let since = p
                .since
                .as_deref()
                .map_or(String::new(), |t| format!(" since {t}"));
            format!(
                "pair {}-{} has been {}{since} ({})",
                p.gpu,
                p.peer_gpu,
                pair_status(p.status),
                p.reasons.join("; ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let resets = job
        .culprits
        .iter()
        .map(|g| format!("`nvidia-smi -r -i {g}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{used}; {parts}: the hardware, not your code. Drain the node, then reset {} ({resets}) \
         or replace it; until then keep jobs off that pair.",
        gpus_named(job.culprits)
    )
}

/// `; but GPU 7 on this node fails with its peers (...): if the job used it, ...`: what the
/// pair judge blames on the node, for a crash whose own GPUs are not known.
fn node_culprits(suspects: &[Suspect]) -> String {
    if suspects.is_empty() {
        return String::new();
    }
    let gpus: Vec<u32> = suspects.iter().map(|s| s.gpu).collect();
    let named = gpus_named(&gpus);
    let why: Vec<&str> = suspects
        .iter()
        .filter_map(|s| s.reasons.first())
        .take(2)
        .map(|r| prefix_within(r.as_str(), 120))
        .collect();
    let resets: Vec<String> = gpus
        .iter()
        .map(|g| format!("`nvidia-smi -r -i {g}`"))
        .collect();
    format!(
        "; but {named} on this node {} its GPU pairs ({}): if the job used {}, that is the \
         likely cause (drain the node, then reset it: {})",
        if gpus.len() == 1 {
            "fails in"
        } else {
            "fail in"
        },
        why.join("; "),
        if gpus.len() == 1 { "it" } else { "one of them" },
        resets.join(", "),
    )
}

/// What a workload said of its own death, after the kill's message.
pub fn told_by_workload(line: &str) -> String {
    format!(" The workload told it too: {line}")
}

/// `shm_oom_killed`: the kernel OOM-killed a process, and /dev/shm pages were most of what its
/// memory cgroup held: the split, and the fix that keeps /dev/shm from outgrowing the limit.
pub fn shm_oom_killed(
    who: &str,
    at: &str,
    comm: &str,
    pid: Option<i32>,
    m: &MemorySplit,
    runtime: Runtime,
) -> String {
    let fix = match runtime {
        Runtime::Pod => {
            "raise the container's memory limit by the /dev/shm emptyDir's sizeLimit, or lower \
             sizeLimit below the memory the workload leaves free, so that /dev/shm fills (and \
             says so) before memory runs out"
        }
        Runtime::Docker => {
            "give docker run --memory room for --shm-size (the limit at least the shm size plus \
             what the workload itself needs), or lower --shm-size"
        }
        Runtime::Other => {
            "raise the container's memory limit by /dev/shm's size, or make /dev/shm smaller \
             than the memory the workload leaves free, so that /dev/shm fills (and says so) \
             before memory runs out"
        }
    };
    format!(
        "container {who}: the kernel OOM-killed {} at {at}{}, and /dev/shm was what filled it: \
         /dev/shm held {} of the {}{}. tmpfs pages count \
         against the memory limit, so a /dev/shm larger than the room the limit leaves turns a \
         full /dev/shm into an OOM kill. Fix: {fix}.{}",
        comm_and_pid(comm, pid),
        oom_scope(m),
        bytes_or_unknown(m.shm_bytes),
        limit_words(m),
        m.anon_bytes.map_or(String::new(), |a| format!(
            "; the processes' own memory {}",
            human_bytes(a)
        )),
        counted_by(m),
    )
}

/// `workload_oom_killed`: an OOM kill of the workload's own memory, so nobody chases /dev/shm.
pub fn workload_oom_killed(
    who: &str,
    at: &str,
    comm: &str,
    pid: Option<i32>,
    m: &MemorySplit,
) -> String {
    let split = match m.source {
        MemorySource::KernelLog | MemorySource::Tracepoint => format!(
            "for the workload's own memory: {} of the {} was its processes' own, /dev/shm held {}",
            bytes_or_unknown(m.anon_bytes),
            limit_words(m),
            bytes_or_unknown(m.shm_bytes),
        ),
        // Read after the kill, the killed process's memory is gone: only /dev/shm's is telling.
        MemorySource::MemoryCgroup => format!(
            "and /dev/shm was not what filled the memory: just after the kill it held {} of the {}",
            bytes_or_unknown(m.shm_bytes),
            limit_words(m),
        ),
        MemorySource::PodStatus | MemorySource::Docker => match m.shm_bytes {
            // A reading before the kill: a /dev/shm filled after it would not show.
            Some(shm) => {
                return format!(
                    "container {who}: the kernel OOM-killed {} at {at}, at its {}; /dev/shm was \
                     not what filled the memory as far as was measured: at its last reading \
                     before the kill it held {}, and one filled after that reading would not \
                     show. Lower what the workload holds (DataLoader workers, prefetch, batch \
                     size) or raise the memory limit; if it writes to /dev/shm, leave the limit \
                     room for /dev/shm's size.{}",
                    comm_and_pid(comm, pid),
                    limit_words(m),
                    human_bytes(shm),
                    counted_by(m),
                );
            }
            None => {
                // Nothing says what filled it: say so rather than blame the workload.
                return format!(
                    "container {who}: the kernel OOM-killed {} at {at}, at its {}; what filled \
                     the memory is not known: its /dev/shm was not measured before it died. If \
                     it uses /dev/shm (a DataLoader, NCCL), make sure the memory limit leaves \
                     room for /dev/shm's size; else lower what the workload holds or raise the \
                     memory limit.{}",
                    comm_and_pid(comm, pid),
                    limit_words(m),
                    counted_by(m),
                );
            }
        },
    };
    format!(
        "container {who}: the kernel OOM-killed {} at {at}{}, {split}. Not /dev/shm: lower what \
         the workload holds (DataLoader workers, prefetch, batch size) or raise the memory limit.{}",
        comm_and_pid(comm, pid),
        oom_scope(m),
        counted_by(m),
    )
}

/// Where the numbers come from, when not the kernel's report of the kill itself.
fn counted_by(m: &MemorySplit) -> &'static str {
    match m.source {
        MemorySource::KernelLog => "",
        MemorySource::Tracepoint => {
            " (Read the moment the kernel chose it, from its memory cgroup: the kernel's \
             oom:mark_victim tracepoint.)"
        }
        MemorySource::MemoryCgroup => {
            " (Counted by the container's memory cgroup; its memory as read just after the \
             kill, not at it.)"
        }
        MemorySource::PodStatus => {
            " (Told by the Pod's status, OOMKilled; /dev/shm as the last scan before the kill \
             read it, not at the kill: the kernel log has the split at the moment.)"
        }
        MemorySource::Docker => {
            " (Told by Docker's record, OOMKilled; the kernel's report of the kill was not \
             found in the kernel log.)"
        }
    }
}

/// Added to a failure's message (and Event) when it happened while the agent was down.
pub const FOUND_LATE: &str =
    " (Found when the agent started again: it happened while it was down.)";

/// `shm_bus_error`: the container died of SIGBUS with /dev/shm full or nearly: the process
/// touched shared-memory pages the tmpfs had no room for. `exit`: how it ended, as its
/// runtime says, starting with SIGBUS (said once).
pub fn shm_bus_error(who: &str, at: &str, exit: &str, shm: &ShmThen, runtime: Runtime) -> String {
    let size = shm.size_bytes.map_or("no size limit".into(), human_bytes);
    let peak = shm.peak_bytes.or(shm.used_bytes);
    let want = shm
        .size_bytes
        .unwrap_or(0)
        .max(peak.unwrap_or(0))
        .saturating_mul(2)
        .max(1 << 30);
    let fix = shm_fix(want, runtime);
    format!(
        "container {who} died of a bus error ({exit}) at {at}, with /dev/shm full: its \
         /dev/shm ({}{size}) peaked at {} before it died. A process that maps more shared memory \
         than the tmpfs has room for (ftruncate reserves nothing) gets SIGBUS when it touches \
         the pages past the end. Fix: {fix}.",
        if shm.runtime_default {
            "the container runtime's default, "
        } else {
            ""
        },
        peak.map_or("?".into(), human_bytes),
    )
}

/// The fix of a /dev/shm too small for the workload: `want` bytes of it, where it runs.
fn shm_fix(want: u64, runtime: Runtime) -> String {
    match runtime {
        Runtime::Pod => format!(
            "mount an emptyDir with medium: Memory and sizeLimit: {} at /dev/shm, and raise the \
             container's memory limit by as much (tmpfs pages count against it)",
            k8s_quantity(want)
        ),
        Runtime::Docker => format!(
            "docker run --shm-size={} (and --memory with room for it), or --ipc=host",
            docker_size(want)
        ),
        Runtime::Other => format!(
            "mount a tmpfs of {} at /dev/shm in the container, with a memory limit that has room \
             for it (tmpfs pages count against it)",
            human_bytes(want)
        ),
    }
}

/// How long before (or after) a death a reading was taken: `5 s before it died`.
pub fn reading_age(died: std::time::SystemTime, read: std::time::SystemTime) -> String {
    match died.duration_since(read) {
        Ok(d) => format!("{} s before it died", d.as_secs()),
        Err(e) => format!("{} s after it died", e.duration().as_secs()),
    }
}

/// `bus_error_unmeasured`: a SIGBUS death whose /dev/shm was not read at the moment: neither
/// cause can be named, so it says what is known (the last reading and its age, the runtime's
/// 64 MiB default) and the fix of each.
pub fn bus_error_unmeasured(
    who: &str,
    at: &str,
    exit: &str,
    shm: Option<&ShmThen>,
    age: Option<&str>,
    runtime: Runtime,
) -> String {
    let then = match shm {
        Some(s) => format!(
            "its last reading{}: {} used of {}{}",
            age.map_or(String::new(), |a| format!(" ({a})")),
            s.used_bytes.map_or("?".into(), human_bytes),
            s.size_bytes.map_or("no size limit".into(), human_bytes),
            s.peak_bytes
                .map_or(String::new(), |p| format!(", peak {}", human_bytes(p))),
        ),
        None => "it was never measured (it ran between two scans, or only its record was read)"
            .to_string(),
    };
    let default = if shm.is_some_and(|s| s.runtime_default) {
        " It ran on the container runtime's default 64 MiB /dev/shm, which one DataLoader \
         batch or NCCL's buffers fill in a moment."
    } else {
        ""
    };
    let want = shm
        .and_then(|s| s.size_bytes)
        .unwrap_or(0)
        .saturating_mul(2)
        .max(1 << 30);
    format!(
        "container {who} died of a bus error ({exit}) at {at}; its /dev/shm was not read at \
         that moment, so whether it ran out is not known ({then}).{default} If it maps /dev/shm \
         (a DataLoader, NCCL, multiprocessing.shared_memory): {}. Else a bus error is a \
         memory-mapped file truncated under the process or a fault in native code: its last log \
         lines and a core dump say which. The moment is read where serve's death trace is on \
         (shmlink_death_trace_up 1).",
        shm_fix(want, runtime)
    )
}

/// `workload_bus_error`: a SIGBUS death whose /dev/shm was read at the moment and was not
/// full: said with what was known, so nobody chases /dev/shm without cause.
pub fn workload_bus_error(who: &str, at: &str, exit: &str, shm: Option<&ShmThen>) -> String {
    let then = match shm {
        Some(s) if s.host_ipc => format!(
            "it used the host's /dev/shm (host IPC), {} used at the last reading",
            s.peak_bytes
                .or(s.used_bytes)
                .map_or("?".into(), human_bytes)
        ),
        Some(s) => format!(
            "its /dev/shm, read the moment it died, was not full: it peaked at {} of {}",
            s.peak_bytes
                .or(s.used_bytes)
                .map_or("?".into(), human_bytes),
            s.size_bytes.map_or("no size limit".into(), human_bytes),
        ),
        None => "its /dev/shm was not measured before it died (it ran between two scans, or \
                 `check` read only its record)"
            .to_string(),
    };
    let unmeasured = if shm.is_none() {
        " If it maps /dev/shm (a DataLoader, NCCL, multiprocessing.shared_memory), give it a \
         larger one and watch it with shmlink serve."
    } else {
        ""
    };
    format!(
        "container {who} died of a bus error ({exit}) at {at}; {then}. Not /dev/shm \
         running out, as far as was measured: a bus error is also a memory-mapped file truncated \
         under the process, or a fault in native code; its last log lines and a core dump say \
         which.{unmeasured}"
    )
}

fn comm_and_pid(comm: &str, pid: Option<i32>) -> String {
    match pid {
        Some(pid) => format!("{comm} (host PID {pid})"),
        None => comm.to_string(),
    }
}

/// `, its memory cgroup at 64.0 MiB of 64.0 MiB`: the usage when the report gave one.
fn oom_scope(m: &MemorySplit) -> String {
    match (m.usage_bytes, m.limit_bytes) {
        (Some(usage), Some(limit)) => format!(
            ", its memory cgroup at {} of {}",
            human_bytes(usage),
            human_bytes(limit)
        ),
        _ => String::new(),
    }
}

/// `64.0 MiB memory limit`, or `memory` where the limit is unknown.
fn limit_words(m: &MemorySplit) -> String {
    m.limit_bytes.map_or("memory".to_string(), |l| {
        format!("{} memory limit", human_bytes(l))
    })
}

fn bytes_or_unknown(b: Option<u64>) -> String {
    b.map_or("an unknown amount".into(), human_bytes)
}

/// `check`'s line for the kernel-log deaths of processes outside any known container that are
/// too old to print in full.
pub fn older_deaths_elsewhere(n: usize, newest_ago: &str) -> String {
    let (deaths, them) = if n == 1 {
        ("death", "it")
    } else {
        ("deaths", "them")
    };
    format!(
        "{n} older kernel-log {deaths} of other processes (the newest {newest_ago}): \
         `check --json` lists {them}."
    )
}

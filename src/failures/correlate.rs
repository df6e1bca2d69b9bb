//! Pure: a detected failure + what the last scan knew -> the failure as a person is told it.

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::bus::{self, shm_was_full};
use super::detect::shm_share_at_least;
use super::recent::RecentReadings;
use crate::kube::podresources::GpuHolders;
use crate::kube::pods::PodIndex;
use crate::model::{
    ContainerRef, Crasher, DeathRules, Detected, Failure, FailureSource, GpusFrom, MemorySplit,
    PairStatus, PairThen, ShmThen, Stamp,
};
use crate::model::{Finding, FindingKind, Subject};
use crate::model::{ShmReading, Snapshot};
use crate::shm::status::on_runtime_default;
use crate::text;

/// What the agent knew when the failure was told.
#[derive(Clone, Copy)]
pub struct Known<'a> {
    /// The last scan before it.
    pub snapshot: Option<&'a Snapshot>,
    pub pods: Option<&'a PodIndex>,
    pub holders: &'a GpuHolders,
    /// How deaths of memory are judged where the source left it to the last reading.
    pub rules: DeathRules,
    /// The scans kept of each container, for its /dev/shm around a death's moment.
    pub recent: Option<&'a RecentReadings>,
}

/// The failure with its container's names, its /dev/shm then, its Pod's GPUs and their pairs;
/// `None` for a line told only with a full /dev/shm ([`Detected::judged`]) when it was not.
pub fn correlate(d: &Detected, known: Known<'_>) -> Option<Failure> {
    let mut id = identity(placed(d, known.snapshot), known.pods);
    let scanned = known.snapshot.and_then(|s| reading_of(&id, &s.shm));
    if let Some(r) = scanned {
        id.fill_from(r);
    }
    let around = around_the_moment(d, scanned, known.recent);
    let scanned = around.as_ref().or(scanned);
    // The moment's reading, else the scan's of the container, else its Pod's sandbox /dev/shm.
    let at_death = at_death(d, scanned);
    let reading = at_death
        .as_ref()
        .or(scanned)
        .or_else(|| known.snapshot.and_then(|s| pod_shm_of(&id, s)));
    if d.judged && !shm_was_full(reading, known.rules.bus_error_shm_ratio) {
        return None;
    }
    let shm = reading.map(shm_then);
    let (gpus, gpus_from) = gpus_used(d, &id, known);
    let hang = (d.hang.as_ref()).map(|f| super::hang::judged(f, d.at, &gpus, known.snapshot));
    let gpu_pairs = pairs_among(&gpus, known.snapshot);
    let culprits = culprits_among(&gpus, &gpu_pairs, known.snapshot);
    let node_culprits = node_culprits(known.snapshot);
    let job = text::JobGpus {
        gpus: &gpus,
        from: gpus_from,
        pairs: &gpu_pairs,
        culprits: &culprits,
        node_culprits: &node_culprits,
        evidence: super::gpu_evidence::gpu_evidence(&gpus, known.snapshot),
        hang: hang.as_ref(),
    };
    let (kind, memory) = judged(d, reading, at_death.is_some(), known.rules);
    let runtime = runtime_of(d, &id, reading);
    // When the scan read it, for a reading not the moment's.
    let read_at = (known.snapshot.and_then(|s| s.taken_at)).filter(|_| at_death.is_none());
    let (shm, memory) = (shm.as_ref(), memory.as_ref());
    let then = Then {
        shm,
        memory,
        read_at,
    };
    let mut message = message(d, kind, &id, runtime, &then, &job);
    let facts = d.named_from.as_ref().map(ToString::to_string);
    message.push_str(&facts.as_deref().map(text::named_from).unwrap_or_default());
    // The fact tier's facts, else a hang's (its message says them already).
    let named_from = facts.or_else(|| d.hang.as_ref().map(crate::model::HangFacts::named_from));
    let gpu_links =
        crate::links::jobs::gpu_links(id.container_id.as_deref(), &gpus, known.snapshot);
    message.push_str(&crate::links::jobs::said(
        gpu_links.as_ref(),
        hang.is_some(),
        &gpus,
        known.snapshot,
    ));
    let image = image_of(&id, reading, known.pods);
    Some(Failure {
        placed: id,
        image,
        kind,
        at: Stamp(d.at),
        source: d.source,
        evidence: d.evidence.clone(),
        pid: d.pid,
        shm: shm.cloned(),
        gpus,
        gpus_from,
        gpu_pairs,
        gpu_links,
        memory: memory.cloned(),
        pid_in_container: d.pid_in_container,
        told_by_workload: None,
        named_from,
        worker_pids: d.worker_pids.clone(),
        message,
        hang,
        found_late: false,
    })
}

/// A death of memory judged by `reading` (`at_moment`: the moment's); any other failure as
/// detected.
fn judged(
    d: &Detected,
    reading: Option<&ShmReading>,
    at_moment: bool,
    rules: DeathRules,
) -> (FindingKind, Option<MemorySplit>) {
    match d.kind {
        FindingKind::ShmBusError
        | FindingKind::WorkloadBusError
        | FindingKind::BusErrorUnmeasured => {
            bus::judged(d, reading, at_moment, rules.bus_error_shm_ratio)
        }
        _ => oom_judged_with_reading(d, reading, rules.oom_shm_share),
    }
}

/// A reading as a failure tells it.
fn shm_then(r: &ShmReading) -> ShmThen {
    ShmThen {
        size_bytes: r.size_bytes,
        used_bytes: r.used_bytes,
        peak_bytes: r.used_peak_bytes.or(r.used_bytes),
        memory_limit_bytes: r.memory_limit_bytes,
        runtime_default: on_runtime_default(r),
        host_ipc: r.host_ipc,
    }
}

/// The container's image: Docker's record (the reading's), else its Pod's spec.
fn image_of(id: &ContainerRef, r: Option<&ShmReading>, pods: Option<&PodIndex>) -> Option<String> {
    let spec = || pods?.image_of(id.pod_uid.as_deref()?, id.container.as_deref()?);
    r.and_then(|r| r.image.clone())
        .or_else(|| spec().map(str::to_string))
}

/// The GPUs the node's blame names as culprits by more than being at either end of a pair.
fn node_culprits(snapshot: Option<&Snapshot>) -> Vec<crate::model::Suspect> {
    snapshot
        .map(|s| s.gpu_blame.culprits().cloned().collect())
        .unwrap_or_default()
}

/// The pairs among the job's GPUs, as the last scan judged them.
fn pairs_among(gpus: &[u32], snapshot: Option<&Snapshot>) -> Vec<PairThen> {
    let Some(s) = snapshot else {
        return Vec::new();
    };
    s.gpu_pairs
        .iter()
        .filter(|p| gpus.contains(&p.gpu) && gpus.contains(&p.peer_gpu))
        .map(|p| PairThen {
            gpu: p.gpu,
            peer_gpu: p.peer_gpu,
            status: p.status,
            reasons: p.reasons.iter().map(ToString::to_string).collect(),
            since: p.since.map(rfc3339),
        })
        .collect()
}

/// What was known of the container when it died: its /dev/shm and memory, and when the scan
/// that read it ran (none when the reading is the moment's).
struct Then<'a> {
    shm: Option<&'a ShmThen>,
    memory: Option<&'a MemorySplit>,
    read_at: Option<SystemTime>,
}

/// What a person is told of the failure, judged `kind`: the words are `text`'s.
fn message(
    d: &Detected,
    kind: FindingKind,
    id: &ContainerRef,
    runtime: text::Runtime,
    then: &Then<'_>,
    job: &text::JobGpus<'_>,
) -> String {
    let (shm, memory) = (then.shm, then.memory);
    let at = rfc3339(d.at);
    let who = name(id);
    // The line is quoted into a sentence that ends with its own full stop.
    let said = text::said(&d.evidence);
    match kind {
        FindingKind::GpuJobCrashed => text::gpu_job_crashed(
            &who,
            &at,
            d.comm.as_deref().unwrap_or("?"),
            d.pid,
            d.library.as_deref().unwrap_or("a GPU library"),
            job,
        ),
        FindingKind::NcclP2pDisabled => text::nccl_p2p_disabled(&who, &at, d.nccl_gpus, job),
        FindingKind::ShmOomKilled | FindingKind::WorkloadOomKilled => {
            // A runtime's record names no process: the one it runs, whose end ended it.
            let comm = d.comm.as_deref().unwrap_or(match d.source {
                FailureSource::PodStatus | FailureSource::Docker => "its main process",
                _ => "a process",
            });
            match (memory, kind) {
                (Some(m), FindingKind::ShmOomKilled) => {
                    text::shm_oom_killed(&who, &at, comm, d.pid, m, runtime)
                }
                (Some(m), _) => text::workload_oom_killed(&who, &at, comm, d.pid, m),
                (None, _) => d.evidence.clone(),
            }
        }
        FindingKind::ShmBusError
        | FindingKind::WorkloadBusError
        | FindingKind::BusErrorUnmeasured => bus_message(d, kind, (&who, &at), then, runtime),
        FindingKind::ShmNotShared => text::shm_not_shared(&who, &at, said, runtime),
        FindingKind::ShmUnavailable => text::shm_unavailable(&who, &at, said, runtime),
        FindingKind::FdLimitReached => text::fd_limit_reached(&who, &at, said),
        FindingKind::CudaIpcDenied => text::cuda_ipc_denied(&who, &at, said, runtime),
        FindingKind::ImexChannelMissing => text::imex_channel_missing(&who, &at, said, runtime),
        FindingKind::GpuPeerAccessRefused => text::gpu_peer_access_refused(&who, &at, said, job),
        FindingKind::ShmFallback => text::shm_fallback(&who, &at, said, runtime),
        FindingKind::ShmEvicted => text::shm_evicted(
            &who,
            &at,
            crate::kube::evicted::parse_message(&d.evidence),
            shm,
        ),
        k if text::in_gpu_words(k) => text::gpu_failure(k, (&who, &at, said), d.nccl_gpus, job),
        _ => text::shm_allocation_failed(
            &who,
            &at,
            said,
            shm,
            runtime,
            d.signature.is_some_and(super::signatures::is_browser),
        ),
    }
}

/// A SIGBUS death's words, by its judged kind.
fn bus_message(
    d: &Detected,
    kind: FindingKind,
    (who, at): (&str, &str),
    then: &Then<'_>,
    runtime: text::Runtime,
) -> String {
    let exit = bus::exit_words(d);
    match (kind, then.shm) {
        (FindingKind::ShmBusError, Some(s)) => text::shm_bus_error(who, at, &exit, s, runtime),
        (FindingKind::WorkloadBusError, shm) => text::workload_bus_error(who, at, &exit, shm),
        (_, shm) => {
            let age = then.read_at.map(|r| text::reading_age(d.at, r));
            text::bus_error_unmeasured(who, at, &exit, shm, age.as_deref(), runtime)
        }
    }
}

/// Where the container runs, for its fix: a Pod when anything names one (its UID in the cgroup
/// path is enough: kubelet made it), Docker when Docker told it or its cgroup is Docker's, else
/// a bare runtime (runc, containerd without Kubernetes).
fn runtime_of(d: &Detected, id: &ContainerRef, reading: Option<&ShmReading>) -> text::Runtime {
    use crate::cgroup::path::{parse_cgroup_path, Runtime as Cgroup};
    if id.pod.is_some() || id.pod_uid.is_some() {
        return text::Runtime::Pod;
    }
    // A reading with an image has Docker's record (the scan names Docker's containers so).
    let docker_cgroup = reading.is_some_and(|r| {
        r.image.is_some()
            || parse_cgroup_path(&r.cgroup).is_some_and(|c| c.runtime == Cgroup::Docker)
    });
    if d.who.is_named_outside_pods() || d.source == FailureSource::Docker || docker_cgroup {
        text::Runtime::Docker
    } else {
        text::Runtime::Other
    }
}

/// A line told only with /dev/shm full ([`Detected::judged`]) is judged by the peak the scans
/// around its moment saw (`RecentReadings::peak_around`; a line's time is the runtime's, to the
/// nanosecond), not by the last scan alone, which may have found /dev/shm freed since: the
/// scan's reading with that peak, where the scans are kept. Other accounts keep the last scan's
/// (`None`): a status stamped to the whole second has no moment finer than it.
fn around_the_moment(
    d: &Detected,
    scanned: Option<&ShmReading>,
    recent: Option<&RecentReadings>,
) -> Option<ShmReading> {
    let r = scanned.filter(|_| d.judged)?;
    let peak = recent?.peak_around(&r.container_id, d.at)?;
    Some(ShmReading {
        used_peak_bytes: Some(peak),
        ..r.clone()
    })
}

/// The reading taken the moment the kernel told the death (`failures::traced`), with the
/// scan's names and image: the numbers judged by are the moment's, not the last scan's.
fn at_death(d: &Detected, scanned: Option<&ShmReading>) -> Option<ShmReading> {
    let now = d.at_death.as_deref()?;
    let Some(scan) = scanned else {
        return Some(now.clone());
    };
    Some(ShmReading {
        size_bytes: now.size_bytes,
        used_bytes: now.used_bytes,
        available_bytes: now.available_bytes,
        used_peak_bytes: now.used_bytes.max(scan.used_peak_bytes),
        memory_limit_bytes: now.memory_limit_bytes.or(scan.memory_limit_bytes),
        memory_shmem_bytes: now.memory_shmem_bytes,
        ..scan.clone()
    })
}

/// An OOM kill whose report said nothing of shmem (a system-wide OOM has no cgroup stats) is
/// judged by the scan's last reading of the container's own /dev/shm instead, never blamed on
/// the workload for want of a number; every other failure is as detected.
fn oom_judged_with_reading(
    d: &Detected,
    reading: Option<&ShmReading>,
    share: f64,
) -> (FindingKind, Option<MemorySplit>) {
    let oom = matches!(
        d.kind,
        FindingKind::ShmOomKilled | FindingKind::WorkloadOomKilled
    );
    let Some(mut m) = d.memory.filter(|m| oom && m.shm_bytes.is_none()) else {
        return (d.kind, d.memory);
    };
    m.shm_bytes = reading
        .filter(|r| !r.host_ipc)
        .and_then(|r| r.used_peak_bytes.or(r.used_bytes));
    // A runtime's record (kubelet's, Docker's) gives no numbers: the limit as last read.
    m.limit_bytes = m
        .limit_bytes
        .or_else(|| reading.and_then(|r| r.memory_limit_bytes));
    let kind = if shm_share_at_least(&m, share) {
        FindingKind::ShmOomKilled
    } else {
        FindingKind::WorkloadOomKilled
    };
    (kind, Some(m))
}

/// The finding `check` reports for a failure: about its container, or the node when the
/// kernel's process could not be placed.
pub fn finding(f: &Failure) -> Finding {
    let subject = if f.placed.is_outside_containers() {
        Subject::Node
    } else {
        Subject::Container(Box::new(f.placed.clone()))
    };
    Finding::new(f.kind, subject, f.message.clone())
}

/// How the message names the container.
fn name(id: &ContainerRef) -> String {
    id.name()
        .unwrap_or_else(|| text::UNKNOWN_PROCESS.to_string())
}

/// How much later than the scan that found a container gone its process's crash may be stamped
/// (the kernel's clock and the wall clock differ).
const GONE_SLACK: std::time::Duration = std::time::Duration::from_secs(1);

/// A crashed process that was gone before `/proc/PID/cgroup` could be read: the container the
/// last scan measured through that very PID (a container's main process), if any. Not when a
/// later process has the PID: the scan may have measured that one.
fn placed(d: &Detected, snapshot: Option<&Snapshot>) -> ContainerRef {
    match (d.pid, snapshot) {
        (Some(pid), Some(s)) if d.who.is_outside_containers() && !d.pid_taken => {
            // A gone container's process cannot crash after a scan found it gone: a later crash
            // with its PID is another process's (reused).
            let not_before_gone = |r: &&crate::model::ShmReading| {
                s.gone_since
                    .get(&r.container_id)
                    .is_none_or(|g| d.at <= *g + GONE_SLACK)
            };
            if let Some(r) = s.shm.iter().filter(not_before_gone).find(|r| r.pid == pid) {
                return ContainerRef::by_id(&r.container_id, r.pod_uid.clone());
            }
            // A GPU process gone before the kernel's line was read: where NVML saw it, if NVML's
            // process of that PID was the crasher (a later one may have had the PID).
            crasher(d)
                .and_then(|c| s.gpu_users.container_of_crasher(&c))
                .cloned()
                .unwrap_or_default()
        }
        _ => d.who.clone(),
    }
}

/// The process a kernel line names, as NVML's history is asked of it: only where its start is
/// known (read with the line, or at the fatal signal's moment by the death trace). A command
/// alone is a guess another Pod's process can make true, by taking the PID of one NVML listed
/// and crashing under the same name: such a crash is told unplaced, without GPUs.
fn crasher(d: &Detected) -> Option<Crasher<'_>> {
    Some(Crasher {
        pid: u32::try_from(d.pid?).ok()?,
        comm: d.comm.as_deref(),
        start: Some(d.pid_start?),
        at: d.at,
    })
}

/// The GPUs the failed process used: NVML's lists of it, else of its container, else the
/// GPUs the kubelet says its Pod holds.
fn gpus_used(d: &Detected, id: &ContainerRef, known: Known<'_>) -> (Vec<u32>, Option<GpusFrom>) {
    let Some(s) = known.snapshot else {
        return (Vec::new(), None);
    };
    let users = &s.gpu_users;
    if let Some(c) = crasher(d).filter(|_| !d.pid_taken) {
        let gpus = users.gpus_of_crasher(&c);
        if !gpus.is_empty() {
            return (gpus, Some(GpusFrom::Process));
        }
    }
    if let Some(cid) = &id.container_id {
        let gpus = users.gpus_of_container(cid);
        if !gpus.is_empty() {
            return (gpus, Some(GpusFrom::Container));
        }
    }
    if let (Some(ns), Some(pod)) = (&id.namespace, &id.pod) {
        let gpus = held_gpus(ns, pod, known.holders, s);
        if !gpus.is_empty() {
            return (gpus, Some(GpusFrom::PodResources));
        }
    }
    (Vec::new(), None)
}

/// Of the job's GPUs, those the pair judge blames; else the ends of its failing pairs.
fn culprits_among(gpus: &[u32], pairs: &[PairThen], snapshot: Option<&Snapshot>) -> Vec<u32> {
    let failing = pairs
        .iter()
        .filter(|p| p.status != PairStatus::Ok)
        .map(|p| (p.gpu, p.peer_gpu));
    crate::gpu::blame::among(snapshot.map(|s| &s.gpu_blame), gpus, failing)
}

/// The source's container with the Pod cache's names: a log directory's name is whatever its
/// writer chose, the Pod cache's for a known UID is the API server's; a container the source
/// named only by ID is named by the Pod's status.
fn identity(who: ContainerRef, pods: Option<&PodIndex>) -> ContainerRef {
    let mut id = who;
    let meta = pods
        .zip(id.pod_uid.as_deref())
        .and_then(|(p, u)| p.by_uid(u));
    if let Some(m) = meta {
        id.namespace = Some(m.namespace.clone());
        id.pod = Some(m.name.clone());
        if id.container.is_none() {
            id.container = (id.container_id.as_ref()).and_then(|c| m.containers.get(c).cloned());
        }
    }
    id
}

/// The scan's reading of that container: by ID, else by Pod and container name, else the
/// Pod's fullest /dev/shm.
fn reading_of<'a>(id: &ContainerRef, shm: &'a [ShmReading]) -> Option<&'a ShmReading> {
    if let Some(cid) = &id.container_id {
        if let Some(r) = shm.iter().find(|r| &r.container_id == cid) {
            return Some(r);
        }
    }
    let uid = id.pod_uid.as_deref()?;
    let of_pod = || {
        shm.iter()
            .filter(move |r| r.pod_uid.as_deref() == Some(uid))
    };
    if let Some(name) = &id.container {
        if let Some(r) = of_pod().find(|r| r.container.as_deref() == Some(name)) {
            return Some(r);
        }
    }
    of_pod().max_by(|a, b| {
        a.fullness()
            .unwrap_or(0.0)
            .total_cmp(&b.fullness().unwrap_or(0.0))
    })
}

/// The Pod's sandbox /dev/shm (on the host, shared by its containers, outliving them): what a
/// death is judged with when no container of the Pod was measured, e.g. the dead one alone.
fn pod_shm_of<'a>(id: &ContainerRef, s: &'a Snapshot) -> Option<&'a ShmReading> {
    let uid = id.pod_uid.as_deref()?;
    s.sandbox_shm
        .iter()
        .find(|r| r.pod_uid.as_deref() == Some(uid))
}

/// NVML indices of the GPUs the kubelet says the Pod holds (device plugins name them by UUID
/// or by index).
fn held_gpus(namespace: &str, pod: &str, holders: &GpuHolders, s: &Snapshot) -> Vec<u32> {
    let mut out = BTreeSet::new();
    for (device, held_by) in holders {
        if !held_by.iter().any(|(n, p)| n == namespace && p == pod) {
            continue;
        }
        if let Some(g) = s.gpus.iter().find(|g| &g.uuid == device) {
            out.insert(g.index);
        } else if let Ok(i) = device.parse::<u32>() {
            out.insert(i);
        }
    }
    out.into_iter().collect()
}

pub use crate::model::rfc3339;

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::fixtures;
    use crate::model::FailureSource;
    use crate::model::PairStatus;

    const UID: &str = "0b6c1c55-3c0e-4a8e-9a51-2c1f3f6d7e80";
    const MIB: u64 = 1 << 20;

    fn detected(kind: FindingKind, who: ContainerRef) -> Detected {
        Detected::new(
            who,
            kind,
            UNIX_EPOCH + Duration::from_secs(1_795_000_000),
            FailureSource::Log,
            "RuntimeError: unable to allocate shared memory(shm) for file </torch_13_1_0>: No space left on device (28)",
        )
    }

    fn trainer() -> ContainerRef {
        ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("trainer-0".into()),
            pod_uid: Some(UID.into()),
            container: Some("trainer".into()),
            container_id: None,
        }
    }

    fn board(pairs: &[(u32, u32, PairStatus)]) -> Snapshot {
        let r = fixtures::shm_reading("aaaa", 64 * MIB, 40 * MIB);
        let mut r = fixtures::in_pod(r, "ml", "trainer-0", UID, "trainer");
        r.used_peak_bytes = Some(63 * MIB);
        let mut s = fixtures::scanned("node-a", vec![r], None);
        s.gpus = (0..8).map(fixtures::gpu_reading).collect();
        s.gpu_pairs = pairs
            .iter()
            .map(|&(gpu, peer_gpu, status)| fixtures::pair(gpu, peer_gpu, status))
            .collect();
        s
    }

    fn holders() -> GpuHolders {
        GpuHolders::from([
            ("GPU-6".to_string(), vec![("ml".into(), "trainer-0".into())]),
            ("GPU-7".to_string(), vec![("ml".into(), "trainer-0".into())]),
        ])
    }

    /// Issue 50: five deaths no exact text matched, named by the fact tier through the
    /// recogniser and told with the facts they were named from (messages printed for the
    /// issue's note: `cargo test --lib the_fact_tiers -- --nocapture`).
    #[test]
    fn the_fact_tiers_messages_name_their_facts() {
        use crate::logs::LogLine;
        let mut r = super::super::detect::Recogniser::new(
            "/nonexistent".into(),
            None,
            crate::model::SHM_OOM_SHARE,
        );
        let s = board(&[(6, 7, PairStatus::Ok)]);
        let origin = ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("trainer-0".into()),
            pod_uid: Some(UID.into()),
            container: Some("trainer".into()),
            container_id: None,
        };
        for (line, kind, facts) in [
            (
                "OSError: [Errno 24] Too many open files: '/dev/shm/torch_4242_1'",
                FindingKind::FdLimitReached,
                "errno 24 (EMFILE) on /dev/shm/torch_4242_1 in Python's OSError",
            ),
            (
                "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be \
                 caused by insufficient shared memory (shm), please check whether \
                 use_shared_memory is set and storage space in /dev/shm is enough",
                FindingKind::ShmAllocationFailed,
                "signal 7 (SIGBUS) with \"insufficient shared memory (shm)\" on /dev/shm in its log \
                 line",
            ),
            (
                "RuntimeError: CUDA error: uncorrectable NVLink error detected during the \
                 execution",
                FindingKind::GpuNvlinkError,
                "CUDA error 220 (cudaErrorNvlinkUncorrectable) in Python's RuntimeError",
            ),
            (
                "node-1:77:80 [3] transport/p2p.cc:1129 NCCL WARN Cuda failure 1 'invalid \
                 argument'",
                FindingKind::GpuP2pFailed,
                "CUDA error 1 (cudaErrorInvalidValue) in NCCL's transport/p2p.cc, device 3 of \
                 the process",
            ),
            (
                "2026-01-01 10:00:00.000 UTC [340] ERROR:  could not create shared memory \
                 segment \"/PostgreSQL.1767612635\": Read-only file system",
                FindingKind::ShmUnavailable,
                "errno 30 (EROFS) on /PostgreSQL.1767612635 in PostgreSQL's ERROR",
            ),
        ] {
            let line = LogLine {
                origin: origin.clone(),
                at: UNIX_EPOCH + Duration::from_secs(1_795_000_000),
                text: line.into(),
            };
            let d = r.log_line(&line).expect(&line.text);
            let known = Known {
                snapshot: Some(&s),
                pods: None,
                holders: &holders(),
                rules: DeathRules::default(),
                recent: None,
            };
            let f = correlate(&d, known).unwrap();
            assert_eq!((f.kind, f.named_from.as_deref()), (kind, Some(facts)));
            assert!(
                f.message.contains(&format!("Named from: {facts}.")),
                "{}",
                f.message
            );
            assert_eq!(d.signature, None, "no row's");
            println!("{}\n", f.message);
        }
        // A row's match names no facts.
        let d = detected(FindingKind::ShmAllocationFailed, trainer());
        assert_eq!(
            correlate(
                &d,
                Known {
                    snapshot: Some(&s),
                    pods: None,
                    holders: &holders(),
                    rules: DeathRules::default(),
                    recent: None,
                }
            )
            .unwrap()
            .named_from,
            None
        );
    }

    /// Issue 37: the fix is the runtime's: a Pod's by its UID alone (a runc container in a
    /// kubelet cgroup with the API off), Docker's for Docker's, else words any runtime takes.
    #[test]
    fn the_fix_matches_the_runtime_a_pod_by_uid_docker_or_a_bare_container() {
        let cid = "c".repeat(64);
        let tell = |kind, who: ContainerRef, snapshot: Option<&Snapshot>| {
            correlate(
                &detected(kind, who),
                Known {
                    snapshot,
                    pods: None,
                    holders: &GpuHolders::new(),
                    rules: DeathRules::default(),
                    recent: None,
                },
            )
            .unwrap()
            .message
        };
        let kind = FindingKind::ShmAllocationFailed;
        let container = |pod_uid: Option<&str>| ContainerRef {
            pod_uid: pod_uid.map(str::to_string),
            container_id: Some(cid.clone()),
            ..ContainerRef::default()
        };
        let by_uid = tell(kind, container(Some(UID)), None);
        assert!(
            by_uid.contains("emptyDir") && !by_uid.contains("docker"),
            "{by_uid}"
        );
        let bare = tell(kind, container(None), None);
        assert!(
            bare.contains("give it a larger one: a larger tmpfs at /dev/shm in the container")
                && !bare.contains("docker")
                && !bare.contains("emptyDir"),
            "{bare}"
        );
        let gone = ContainerRef {
            container: Some("asr".into()),
            container_id: Some(cid.clone()),
            ..ContainerRef::default()
        };
        assert!(tell(kind, gone, None).contains("docker run --shm-size"));
        // Measured: Docker's record named it (its image), or nothing did.
        let mut r = fixtures::shm_reading(&cid, 64 * MIB, 64 * MIB);
        let s = fixtures::scanned("node-a", vec![r.clone()], None);
        let bare = tell(FindingKind::ShmOomKilled, container(None), Some(&s));
        assert!(
            !bare.contains("docker") && !bare.contains("emptyDir"),
            "{bare}"
        );
        r.image = Some("pytorch/pytorch:2.5.1".into());
        let s = fixtures::scanned("node-a", vec![r], None);
        let docker = tell(kind, container(None), Some(&s));
        assert!(docker.contains("Fix: docker run --shm-size=1g"), "{docker}");
    }

    #[test]
    fn a_log_directory_named_for_another_pod_is_told_by_the_pod_caches_name_for_its_uid() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": UID},
            "spec": {"containers": [{"name": "trainer"}]}
        }))
        .unwrap();
        let pods = PodIndex::new([&pod]);
        // Someone with write access to the log directories named this one for another Pod.
        let forged = ContainerRef {
            namespace: Some("prod".into()),
            pod: Some("payments-0".into()),
            pod_uid: Some(UID.into()),
            container: Some("trainer".into()),
            container_id: None,
        };
        let told = |pods| {
            correlate(
                &detected(FindingKind::ShmAllocationFailed, forged.clone()),
                Known {
                    snapshot: None,
                    pods,
                    holders: &GpuHolders::new(),
                    rules: DeathRules::default(),
                    recent: None,
                },
            )
            .expect("told")
        };
        let f = told(Some(&pods));
        assert_eq!(
            (f.placed.namespace.as_deref(), f.placed.pod.as_deref()),
            (Some("ml"), Some("trainer-0"))
        );
        assert!(f.message.contains("ml/trainer-0/trainer"), "{}", f.message);
        assert!(!f.message.contains("payments"), "{}", f.message);
        // A UID the cache does not know: the path's word is all there is.
        let f = told(None);
        assert_eq!(f.placed.pod.as_deref(), Some("payments-0"));
    }

    #[test]
    fn an_shm_failure_tells_the_dev_shm_then_and_a_concrete_fix() {
        let s = board(&[]);
        let f = correlate(
            &detected(FindingKind::ShmAllocationFailed, trainer()),
            Known {
                snapshot: Some(&s),
                pods: None,
                holders: &GpuHolders::new(),
                rules: DeathRules::default(),
                recent: None,
            },
        )
        .expect("told");
        assert_eq!(
            f.placed.container_id.as_deref(),
            Some("aaaa"),
            "found by its Pod"
        );
        assert_eq!(f.at.to_string(), "2026-11-18T11:06:40Z");
        let shm = f.shm.as_ref().expect("its /dev/shm then");
        assert!(shm.runtime_default);
        assert_eq!(shm.peak_bytes, Some(63 * MIB));
        for part in [
            "container ml/trainer-0/trainer could not allocate shared memory at 2026-11-18T11:06:40Z",
            "the container runtime's default 64 MiB tmpfs",
            "peak 63.0 MiB",
            "sizeLimit: 1Gi",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        assert_eq!(finding(&f).subject.to_string(), "ml/trainer-0/trainer");
    }

    #[test]
    fn a_crash_after_its_pids_container_was_found_gone_is_not_placed_there() {
        let no_pods = GpuHolders::new();
        let mut s = board(&[]);
        s.shm[0].pid = 4242;
        let mut d = detected(FindingKind::GpuJobCrashed, ContainerRef::default());
        d.source = FailureSource::Kernel;
        d.pid = Some(4242);
        d.comm = Some("python".into());
        d.library = Some("libnccl.so.2".into());
        let placed_in = |s: &Snapshot| {
            let known = Known {
                snapshot: Some(s),
                pods: None,
                holders: &no_pods,
                rules: DeathRules::default(),
                recent: None,
            };
            correlate(&d, known).expect("told").placed.container_id
        };
        // In the last scan, or found gone only after the crash: the container measured through
        // that PID.
        assert_eq!(placed_in(&s), Some("aaaa".into()));
        s.gone_since.insert("aaaa".into(), d.at);
        assert_eq!(placed_in(&s), Some("aaaa".into()));
        // Found gone seconds before the crash: a later process had the PID (issue 36).
        s.gone_since
            .insert("aaaa".into(), d.at - Duration::from_secs(5));
        assert_eq!(placed_in(&s), None);
    }

    #[test]
    fn a_crash_on_a_degraded_pair_blames_the_hardware_and_on_healthy_ones_the_job() {
        let known = |s| Known {
            snapshot: Some(s),
            pods: None,
            holders: Box::leak(Box::new(holders())),
            rules: DeathRules::default(),
            recent: None,
        };
        let mut d = detected(
            FindingKind::GpuJobCrashed,
            ContainerRef {
                pod_uid: Some(UID.into()),
                container_id: Some("aaaa".into()),
                ..ContainerRef::default()
            },
        );
        d.source = FailureSource::Kernel;
        d.pid = Some(4242);
        d.comm = Some("python3".into());
        d.library = Some("libnccl.so.2".into());
        let bad = board(&[(5, 6, PairStatus::Degraded), (6, 7, PairStatus::Degraded)]);
        let f = correlate(&d, known(&bad)).expect("told");
        assert_eq!(f.gpus, vec![6, 7]);
        assert_eq!(f.gpu_pairs.len(), 1, "only the pairs its own GPUs make");
        assert!(
            f.message.contains("crashed in libnccl.so.2"),
            "{}",
            f.message
        );
        assert!(
            f.message
                .contains("its Pod holds GPUs 6 and 7; pair 6-7 has been degraded")
                && f.message.contains("the hardware, not your code")
                && f.message.contains("reset GPUs 6 and 7"),
            "{}",
            f.message
        );
        let good = board(&[(6, 7, PairStatus::Ok)]);
        let f = correlate(&d, known(&good)).expect("told");
        assert!(
            f.message.contains("all pairs among GPUs 6, 7 are healthy"),
            "{}",
            f.message
        );
    }

    #[test]
    fn an_oom_kill_says_what_the_memory_was_and_whether_it_was_dev_shm() {
        use crate::model::{MemorySource, MemorySplit};
        let split = |shm: u64, anon: u64| MemorySplit {
            limit_bytes: Some(64 * MIB),
            usage_bytes: Some(64 * MIB),
            shm_bytes: Some(shm),
            anon_bytes: Some(anon),
            source: MemorySource::KernelLog,
        };
        let no_pods = GpuHolders::new();
        let known = Known {
            snapshot: None,
            pods: None,
            holders: &no_pods,
            rules: DeathRules::default(),
            recent: None,
        };
        let mut d = detected(FindingKind::ShmOomKilled, trainer());
        d.source = FailureSource::Kernel;
        d.pid = Some(5947);
        d.comm = Some("dd".into());
        d.memory = Some(split(65_654_784, 1_163_264));
        let f = correlate(&d, known).expect("told");
        assert_eq!(f.memory, d.memory);
        assert_eq!(
            (f.placed.namespace.as_deref(), f.placed.pod.as_deref()),
            (Some("ml"), Some("trainer-0"))
        );
        for part in [
            "the kernel OOM-killed dd (host PID 5947)",
            "/dev/shm held 62.6 MiB of the 64.0 MiB memory limit; the processes' own memory 1.1 MiB",
            "raise the container's memory limit by the /dev/shm emptyDir's sizeLimit",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        let mut d = detected(FindingKind::WorkloadOomKilled, trainer());
        d.pid = Some(77);
        d.comm = Some("pt_main_thread".into());
        d.memory = Some(split(80 * 1024, 60 * MIB));
        let f = correlate(&d, known).expect("told");
        for part in [
            "for the workload's own memory: 60.0 MiB of the 64.0 MiB memory limit",
            "/dev/shm held 80.0 KiB. Not /dev/shm",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        // A report without shmem (a system-wide OOM): the scan's /dev/shm reading judges, and
        // a full one is not blamed on the workload.
        let mut r = fixtures::in_pod(
            fixtures::shm_reading("cid", 64 * MIB, 60 * MIB),
            "ml",
            "trainer-0",
            UID,
            "trainer",
        );
        r.memory_limit_bytes = Some(64 * MIB);
        let s = fixtures::scanned("node", vec![r], None);
        let mut unknown = split(0, 4 * MIB);
        unknown.shm_bytes = None;
        d.memory = Some(unknown);
        d.kind = FindingKind::WorkloadOomKilled;
        let with_reading = Known {
            snapshot: Some(&s),
            ..known
        };
        let g = correlate(&d, with_reading).expect("told");
        assert_eq!(g.kind, FindingKind::ShmOomKilled, "{}", g.message);
        assert_eq!(g.memory.unwrap().shm_bytes, Some(60 * MIB));
        let g = correlate(&d, known).expect("told");
        assert_eq!(
            g.kind,
            FindingKind::WorkloadOomKilled,
            "no reading, nothing to go by"
        );
        // The JSON carries the split only for memory deaths.
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["memory"]["shm_bytes"], 80 * 1024);
        assert_eq!(json["memory"]["source"], "kernel_log");
        d.memory = None;
        d.kind = FindingKind::ShmAllocationFailed;
        assert!(serde_json::to_value(correlate(&d, known).expect("told"))
            .unwrap()
            .get("memory")
            .is_none());
    }

    #[test]
    fn a_sigbus_death_is_dev_shms_only_when_it_was_full_at_its_last_reading_or_peak() {
        use crate::model::{Exit, MemorySource};
        let no_pods = GpuHolders::new();
        let mut d = detected(
            FindingKind::WorkloadBusError,
            ContainerRef {
                namespace: Some("ml".into()),
                pod: Some("trainer-0".into()),
                pod_uid: Some(UID.into()),
                container: Some("trainer".into()),
                container_id: Some("dead".into()),
            },
        );
        d.source = FailureSource::PodStatus;
        d.exit = Some(Exit {
            code: Some(135),
            signal: None,
            reason: Some("Error".into()),
        });
        let told = |d: &Detected, peak: u64| {
            let mut r = fixtures::shm_reading("dead", 64 * MIB, 10 * MIB);
            r.used_peak_bytes = Some(peak);
            r.memory_limit_bytes = Some(256 * MIB);
            let mut s = fixtures::scanned("node", vec![r], None);
            s.taken_at = Some(d.at - Duration::from_secs(4));
            correlate(
                d,
                Known {
                    snapshot: Some(&s),
                    pods: None,
                    holders: &no_pods,
                    rules: DeathRules::default(),
                    recent: None,
                },
            )
            .expect("told")
        };
        // 0.9 of the 64 MiB is 57.6 MiB.
        let full = told(&d, 58 * MIB);
        assert_eq!(full.kind, FindingKind::ShmBusError, "{}", full.message);
        let m = full.memory.unwrap();
        assert_eq!(
            (m.shm_bytes, m.limit_bytes, m.source),
            (Some(58 * MIB), Some(256 * MIB), MemorySource::PodStatus)
        );
        assert!(
            full.message
                .contains("died of a bus error (SIGBUS, exit status 135) at "),
            "{}",
            full.message
        );
        // Half full at a scan: not the workload's without a reading at the moment.
        let half = told(&d, 32 * MIB);
        assert_eq!(
            half.kind,
            FindingKind::BusErrorUnmeasured,
            "{}",
            half.message
        );
        assert!(
            half.message.contains(
                "its /dev/shm was not read at that moment, so whether it ran out is not known \
                 (its last reading (4 s before it died): 10.0 MiB used of 64.0 MiB, peak 32.0 MiB)"
            ),
            "{}",
            half.message
        );
        assert!(half.message.contains("sizeLimit: 1Gi"), "{}", half.message);
        // Read at the moment, half full: the workload's.
        let mut moment = fixtures::shm_reading("dead", 64 * MIB, 32 * MIB);
        moment.memory_limit_bytes = Some(256 * MIB);
        d.at_death = Some(Box::new(moment));
        let half = told(&d, 10 * MIB);
        assert_eq!(half.kind, FindingKind::WorkloadBusError, "{}", half.message);
        assert!(
            half.message.contains(
                "its /dev/shm, read the moment it died, was not full: it peaked at 32.0 MiB of \
                 64.0 MiB"
            ),
            "{}",
            half.message
        );
        d.at_death = None;
        // Never measured: not blamed on /dev/shm, and said so.
        let unmeasured = correlate(
            &d,
            Known {
                snapshot: None,
                pods: None,
                holders: &no_pods,
                rules: DeathRules::default(),
                recent: None,
            },
        )
        .expect("told");
        assert_eq!(unmeasured.kind, FindingKind::BusErrorUnmeasured);
        assert!(
            unmeasured.message.contains("it was never measured"),
            "{}",
            unmeasured.message
        );
        assert_eq!(unmeasured.placed.container_id.as_deref(), Some("dead"));
        let json = serde_json::to_value(&unmeasured).unwrap();
        assert_eq!(json["source"], "pod_status");
        assert_eq!(json["memory"]["source"], "pod_status");
        assert!(json["memory"]["shm_bytes"].is_null());
    }

    #[test]
    fn a_gone_process_is_placed_and_its_gpus_named_from_nvmls_lists_with_the_blamed_gpu() {
        use crate::model::{Blame, Suspect, SuspectBy};
        use std::collections::BTreeSet;
        let mut s = board(&[
            (5, 7, PairStatus::Down),
            (6, 7, PairStatus::Down),
            (5, 6, PairStatus::Ok),
        ]);
        let since =
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        for p in &mut s.gpu_pairs {
            if p.status != PairStatus::Ok {
                p.since = Some(since);
            }
        }
        s.gpu_blame = Blame {
            suspects: vec![Suspect {
                gpu: 7,
                bad_pairs: 2,
                by: SuspectBy::MostPairs,
                reasons: Vec::new(),
            }],
            node_wide: false,
        };
        // NVML listed PID 4242 of container aaaa on GPUs 5 and 7 before it crashed; its /proc
        // entry is gone, so the kernel's line could not be placed.
        s.gpu_users.seen(
            4242,
            Some(1),
            Some("python3"),
            BTreeSet::from([5, 7]),
            since,
            || Some(ContainerRef::by_id("aaaa", Some(UID.into()))),
        );
        let mut d = detected(FindingKind::GpuJobCrashed, ContainerRef::default());
        d.source = FailureSource::Kernel;
        d.pid = Some(4242);
        d.comm = Some("python3".into());
        d.library = Some("libnccl.so.2".into());
        let known = Known {
            snapshot: Some(&s),
            pods: None,
            holders: &GpuHolders::new(),
            rules: DeathRules::default(),
            recent: None,
        };
        // Its start unknown (reaped before the line was read, no death trace): its command
        // alone is a guess another Pod's process could make true. Unplaced, without GPUs.
        let f = correlate(&d, known).expect("told");
        assert_eq!(f.placed.container_id, None, "{}", f.message);
        assert!(f.gpus.is_empty(), "{}", f.message);
        // Its start read at the moment (the death trace): NVML's own process.
        d.pid_start = Some(1);
        let f = correlate(&d, known).expect("told");
        assert_eq!(f.placed.container_id.as_deref(), Some("aaaa"));
        assert_eq!(
            f.placed.pod.as_deref(),
            Some("trainer-0"),
            "named by its reading"
        );
        assert_eq!(
            (f.gpus.clone(), f.gpus_from),
            (vec![5, 7], Some(GpusFrom::Process))
        );
        for part in [
            "crashed in libnccl.so.2 at 2026-11-18T11:06:40Z while using GPUs 5 and 7; pair \
             5-7 has been down since 2026-11-18T",
            "the hardware, not your code. Drain the node, then reset GPU 7 (`nvidia-smi -r -i 7`)",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        assert!(!f.message.contains("-r -i 5"), "{}", f.message);
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["gpus_from"], "process");
        assert!(json["gpu_pairs"][0]["since"].as_str().is_some());

        // Read long after, with PID 4242 now a later process's: neither NVML's lists of the
        // PID nor a reading through it place the crash.
        let mut taken = d.clone();
        taken.pid_taken = true;
        let f = correlate(&taken, known).expect("told");
        assert_eq!(f.placed.container_id, None, "{}", f.message);
        assert!(f.gpus.is_empty());

        // Issue 36: another process got PID 4242, crashed and was reaped. Its command, or its
        // start where it was read, is not NVML's process's: neither placed nor its GPUs.
        let mut other = d.clone();
        other.comm = Some("bash".into());
        other.pid_start = None;
        let mut later = d.clone();
        later.pid_start = Some(2);
        for reused in [other, later] {
            let f = correlate(&reused, known).expect("told");
            assert_eq!(f.placed.container_id, None, "{}", f.message);
            assert!(
                f.gpus.is_empty() && !f.message.contains("GPUs 5"),
                "{}",
                f.message
            );
        }
        let mut same = d.clone();
        same.pid_start = Some(1);
        assert_eq!(correlate(&same, known).expect("told").gpus, vec![5, 7]);

        // Another process of the same container, never listed: its container's GPUs.
        d.pid = Some(5151);
        d.who = ContainerRef {
            pod_uid: Some(UID.into()),
            container_id: Some("aaaa".into()),
            ..ContainerRef::default()
        };
        let f = correlate(&d, known).expect("told");
        assert_eq!(
            (f.gpus.clone(), f.gpus_from),
            (vec![5, 7], Some(GpusFrom::Container))
        );
        assert!(
            f.message.contains("its container was using GPUs 5 and 7"),
            "{}",
            f.message
        );
    }

    #[test]
    fn a_gpu_failure_in_the_jobs_words_names_the_gpu_nvml_has_evidence_against() {
        use crate::model::{FabricInfo, FabricState, Finding, Subject};
        let mut s = board(&[]);
        s.nvml_up = true;
        // An ECC XID on the job's GPU 7 and on GPU 2, which the job does not hold.
        for gpu in [7, 2] {
            s.findings.push(Finding::new(
                FindingKind::GpuXid,
                Subject::Xid { gpu, xid: 48 },
                String::new(),
            ));
        }
        s.gpus[6].fabric = Some(FabricInfo {
            state: FabricState::NotStarted,
            status: "success".into(),
            degraded_bandwidth: None,
            route_unhealthy: None,
            cluster_uuid: None,
            clique_id: None,
        });
        let holders = holders();
        let known = Known {
            snapshot: Some(&s),
            pods: None,
            holders: &holders,
            rules: DeathRules::default(),
            recent: None,
        };
        let mut d = detected(FindingKind::GpuEccUncorrectable, trainer());
        d.evidence = "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated \
                      with exception: CUDA error: uncorrectable ECC error encountered"
            .into();
        let f = correlate(&d, known).expect("told");
        assert_eq!(f.kind, FindingKind::GpuEccUncorrectable);
        assert_eq!(f.gpus, vec![6, 7]);
        for part in [
            "its Pod holds GPUs 6 and 7",
            "The bad one: GPU 7 (GPU 7: XID 48, Double Bit ECC Error)",
            "`nvidia-smi -r -i 7`",
        ] {
            assert!(f.message.contains(part), "{part:?} not in {}", f.message);
        }
        assert!(!f.message.contains("GPU 2"), "{}", f.message);

        let mut d = detected(FindingKind::GpuFabricNotReady, trainer());
        d.evidence = "Error 802: system not yet initialized".into();
        let f = correlate(&d, known).expect("told");
        assert!(
            f.message
                .contains("NVML agrees: GPU 6: its fabric registration has not started"),
            "{}",
            f.message
        );
        // Without NVML nothing is claimed of the GPUs.
        let mut blind = s.clone();
        blind.nvml_up = false;
        let known = Known {
            snapshot: Some(&blind),
            ..known
        };
        let f = correlate(&d, known).expect("told");
        assert!(f.message.contains("not known (no NVML)"), "{}", f.message);
    }

    #[test]
    fn a_line_that_names_a_fault_but_not_its_cause_is_told_only_with_dev_shm_full() {
        use crate::failures::signatures::Signatures;
        let no_pods = GpuHolders::new();
        let who = ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("trainer-0".into()),
            pod_uid: Some(UID.into()),
            container: Some("trainer".into()),
            container_id: Some("dead".into()),
        };
        let signatures = Signatures::new();
        let of_line = |line: &str| {
            let m = signatures.match_line(line).expect(line);
            let mut d = detected(m.kind, who.clone());
            d.source = FailureSource::Log;
            d.evidence = line.into();
            d.signature = Some(m.signature);
            d.judged = m.judged;
            d
        };
        let told = |d: &Detected, peak: Option<u64>| {
            let readings = peak.map(|peak| {
                let mut r = fixtures::shm_reading("dead", 64 * MIB, 10 * MIB);
                r.used_peak_bytes = Some(peak);
                fixtures::scanned("node", vec![r], None)
            });
            correlate(
                d,
                Known {
                    snapshot: readings.as_ref(),
                    pods: None,
                    holders: &no_pods,
                    rules: DeathRules::default(),
                    recent: None,
                },
            )
        };
        let shell = of_line("/entrypoint.sh: line 12:  4242 Bus error  (core dumped) python x.py");
        assert!(shell.judged);
        let full = told(&shell, Some(63 * MIB)).expect("full: told");
        assert_eq!(full.kind, FindingKind::ShmBusError);
        assert!(
            full.message
                .contains("its log said \"/entrypoint.sh: line 12:")
                && full.message.contains("peaked at 63.0 MiB"),
            "{}",
            full.message
        );
        // Not full, or never measured: a bus error of some other cause, or no death at all.
        assert_eq!(told(&shell, Some(20 * MIB)), None);
        assert_eq!(told(&shell, None), None);

        let chromium =
            of_line("[778:7:0131/235140.910186:FATAL:memory.cc(22)] Out of memory. size=524288");
        let full = told(&chromium, Some(64 * MIB)).expect("full: told");
        assert_eq!(full.kind, FindingKind::ShmAllocationFailed);
        assert!(
            full.message.contains("--disable-dev-shm-usage"),
            "{}",
            full.message
        );
        assert_eq!(told(&chromium, Some(MIB)), None);

        // A line that says the cause is told whatever the reading.
        let torch = of_line("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).");
        assert!(!torch.judged);
        assert!(told(&torch, Some(MIB)).is_some() && told(&torch, None).is_some());
        assert!(!told(&torch, None)
            .unwrap()
            .message
            .contains("--disable-dev-shm-usage"));
    }

    #[test]
    fn an_unplaced_process_is_the_nodes_finding() {
        let f = correlate(
            &detected(FindingKind::GpuJobCrashed, ContainerRef::default()),
            Known {
                snapshot: None,
                pods: None,
                holders: &GpuHolders::new(),
                rules: DeathRules::default(),
                recent: None,
            },
        )
        .expect("told");
        assert_eq!(finding(&f).subject, Subject::Node);
        assert!(
            f.message
                .starts_with("process ? in no known container crashed in a GPU library at "),
            "{}",
            f.message
        );
    }

    /// Issue 37: a crash whose GPUs are not known still says the GPU the pair judge blames on
    /// this node.
    #[test]
    fn a_crash_with_its_gpus_unknown_names_the_nodes_culprit_gpu() {
        use crate::model::{Blame, Suspect, SuspectBy};
        let mut d = detected(FindingKind::GpuJobCrashed, ContainerRef::default());
        (d.comm, d.pid, d.library) = (
            Some("python".into()),
            Some(20114),
            Some("libnccl.so.2".into()),
        );
        let mut s = board(&[]);
        let tell = |s: &Snapshot| {
            correlate(
                &d,
                Known {
                    snapshot: Some(s),
                    pods: None,
                    holders: &GpuHolders::new(),
                    rules: DeathRules::default(),
                    recent: None,
                },
            )
            .expect("told")
            .message
        };
        let alone = tell(&s);
        assert!(
            alone.ends_with("no kubelet pod-resources answer)."),
            "{alone}"
        );
        s.gpu_blame = Blame {
            suspects: vec![Suspect {
                gpu: 7,
                bad_pairs: 7,
                by: SuspectBy::FailsWithAll,
                reasons: vec![crate::model::PairReason::new(
                    crate::model::ReasonKind::SwitchLinksDown,
                    crate::model::Weight::Down,
                    "all 18 NVSwitch links of GPU 7 are inactive".into(),
                )
                .naming(&[7])],
            }],
            node_wide: false,
        };
        let m = tell(&s);
        assert!(
            m.starts_with(
                "process python (host PID 20114) in no known container crashed in libnccl.so.2"
            ),
            "{m}"
        );
        assert!(
            m.contains(
                "no kubelet pod-resources answer); but GPU 7 on this node fails in its GPU pairs \
                 (all 18 NVSwitch links of GPU 7 are inactive): if the job used it, that is the \
                 likely cause (drain the node, then reset it: `nvidia-smi -r -i 7`)."
            ),
            "{m}"
        );
        // "Either end" of pairs that share no GPU names no culprit.
        s.gpu_blame.suspects[0].by = SuspectBy::EitherEnd;
        assert_eq!(tell(&s), alone);
    }

    #[test]
    fn a_death_whose_container_is_gone_is_judged_with_its_pods_sandbox_dev_shm() {
        use crate::model::Exit;
        let mut d = detected(
            FindingKind::WorkloadBusError,
            ContainerRef {
                namespace: Some("ml".into()),
                pod: Some("trainer-0".into()),
                pod_uid: Some(UID.into()),
                container: Some("trainer".into()),
                container_id: Some("dead".into()),
            },
        );
        d.source = FailureSource::PodStatus;
        d.exit = Some(Exit {
            code: Some(135),
            signal: None,
            reason: Some("Error".into()),
        });
        // No container of the Pod measured; its sandbox's /dev/shm full of what the dead wrote.
        let sandbox = fixtures::shm_reading("sandbox", 64 * MIB, 64 * MIB);
        let mut sandbox = fixtures::in_pod(sandbox, "ml", "trainer-0", UID, "x");
        sandbox.container = None;
        let mut s = fixtures::scanned("node", Vec::new(), None);
        s.sandbox_shm = vec![sandbox];
        let no_pods = GpuHolders::new();
        let known = |s: &Snapshot| {
            let k = Known {
                snapshot: Some(s),
                pods: None,
                holders: &no_pods,
                rules: DeathRules::default(),
                recent: None,
            };
            correlate(&d, k).expect("told")
        };
        let told = known(&s);
        assert_eq!(told.kind, FindingKind::ShmBusError, "{}", told.message);
        assert_eq!(told.shm.as_ref().and_then(|s| s.used_bytes), Some(64 * MIB));
        assert_eq!(
            told.placed.container_id.as_deref(),
            Some("dead"),
            "not the sandbox's"
        );
        // Another Pod's sandbox is not this one's.
        s.sandbox_shm[0].pod_uid = Some("another".into());
        let told = known(&s);
        assert_eq!(
            told.kind,
            FindingKind::BusErrorUnmeasured,
            "{}",
            told.message
        );
    }
}

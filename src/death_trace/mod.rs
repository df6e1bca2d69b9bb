//! The moment of death, from the kernel's tracepoints: `signal:signal_generate` (the fatal
//! signals SIGBUS, SIGSEGV, SIGABRT and SIGKILL, filtered in the kernel; SIGBUS's `code` tells a
//! page fault from a `kill`; the others only place a crash the kernel log tells) and
//! `oom:mark_victim`.
//! When one fires, the reader thread reads the dying process's /dev/shm and memory cgroup at
//! once (`moment.rs`), while its mounts still stand, and hands the [`TracedDeath`] on; the
//! failure pipeline judges the death by that reading instead of the last scan's.
//!
//! Read with `perf_event_open` (PERF_TYPE_TRACEPOINT, one event per CPU, an mmap'd ring woken
//! by poll): it needs CAP_PERFMON (or CAP_SYS_ADMIN) and read access to tracefs's ids, and
//! leaves no state in tracefs that a crash could leave behind (an ftrace instance would).
//! The ABI comes from `perf-event-open-sys` (the system call, `perf_event_attr`, the ioctls and
//! the ring's header, generated from the kernel's headers). `perf-event2` was not taken: its
//! `Sampler` is built for hardware and software counters and names no tracepoint by id, and
//! what it would save is the ring reading (`ring.rs`, ~100 lines); the raw tracepoint record is
//! ours to decode either way, by the running kernel's format file (`format.rs`), never by
//! assumed offsets.

mod format;
mod locate;
mod moment;
mod ring;
mod sample;
mod tracefs;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cgroup::CgroupVersion;
use crate::model::{TracedDeath, FATAL_SIGNALS, SIGBUS};
use moment::MomentReader;
use ring::Ring;
use sample::{is_fault_code, parse_record, Event, Formats, Record};

pub use sample::is_fault_code as is_bus_fault_code;

/// How long one wait for an event lasts before the stop flag is looked at.
const WAIT: Duration = Duration::from_millis(200);

/// Where to look, and the roots the moment is read under.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    pub sys_root: PathBuf,
    /// A tracefs mount named outright (else found under `sys_root`).
    pub tracefs: Option<PathBuf>,
    pub proc_root: PathBuf,
    /// The memory cgroup hierarchy and its version.
    pub hierarchy: Option<(PathBuf, CgroupVersion)>,
    /// The host's mount namespace (its processes are no container's).
    pub host_mnt: Option<crate::host::NsId>,
}

/// Why the tracepoints could not be opened: what a person does about it.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{0}")]
    Tracefs(io::Error),
    #[error(
        "perf_event_open: {0} (needs CAP_PERFMON or CAP_SYS_ADMIN, a kernel with \
             CONFIG_PERF_EVENTS, and no seccomp profile refusing it)"
    )]
    Perf(io::Error),
}

/// Counts the reader keeps.
#[derive(Debug, Default)]
pub struct TraceCounts {
    /// Deaths handed on.
    pub deaths: AtomicU64,
    /// SIGBUS from a `kill` (no fault): not deaths of memory.
    pub kills: AtomicU64,
    /// Events the rings had no room for.
    pub lost: AtomicU64,
}

/// The running reader; it stops when `stop` is set or `deliver` says the other side is gone.
pub struct Tracer {
    pub counts: Arc<TraceCounts>,
    pub handle: JoinHandle<()>,
    /// Where the tracepoints' formats were read.
    pub source: locate::Source,
}

/// Opens both tracepoints on every online CPU and starts the reader thread; every death goes
/// to `deliver`, with its reading.
pub fn start<F>(
    settings: &TraceSettings,
    deliver: F,
    stop: Arc<AtomicBool>,
) -> Result<Tracer, Refused>
where
    F: Fn(TracedDeath) -> bool + Send + 'static,
{
    let (formats, source) = locate::locate(
        &settings.sys_root,
        settings.tracefs.as_deref(),
        &settings.proc_root,
    )
    .map_err(Refused::Tracefs)?;
    let cpus = tracefs::online_cpus(&settings.sys_root)
        .or_else(|_| tracefs::online_cpus(std::path::Path::new("/sys")))
        .map_err(Refused::Tracefs)?;
    let filter = FATAL_SIGNALS
        .iter()
        .map(|s| format!("sig == {s}"))
        .collect::<Vec<_>>()
        .join(" || ");
    let mut rings = Vec::with_capacity(cpus.len() * 2);
    for &cpu in &cpus {
        rings.push(Ring::open(formats.signal_id, cpu, Some(&filter)).map_err(Refused::Perf)?);
        rings.push(Ring::open(formats.victim_id, cpu, None).map_err(Refused::Perf)?);
    }
    let counts = Arc::new(TraceCounts::default());
    let reader = Reader {
        rings,
        formats,
        moment: MomentReader::new(
            settings.proc_root.clone(),
            settings.hierarchy.clone(),
            settings.host_mnt,
        ),
        counts: counts.clone(),
        lost_told: false,
    };
    let handle = std::thread::Builder::new()
        .name("death-trace".into())
        .spawn(move || reader.run(&deliver, &stop))
        .map_err(Refused::Perf)?;
    Ok(Tracer {
        counts,
        handle,
        source,
    })
}

/// The reading races the dying process's exit: on a node whose CPUs are busy, a reader that waits
/// its turn for one comes after the process is gone. It asks for a higher priority (nice -10,
/// which needs CAP_SYS_NICE; the agent has it as root); without it, it runs as it is.
fn hurry() {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), -10) {
        tracing::debug!("death trace: the reader keeps its priority ({e})");
    }
}

struct Reader {
    rings: Vec<Ring>,
    formats: Formats,
    moment: MomentReader,
    counts: Arc<TraceCounts>,
    lost_told: bool,
}

impl Reader {
    fn run(mut self, deliver: &dyn Fn(TracedDeath) -> bool, stop: &AtomicBool) {
        hurry();
        let mut events = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            self.wait();
            for ring in &mut self.rings {
                let (formats, counts) = (&self.formats, &self.counts);
                ring.drain(|rec| match parse_record(rec) {
                    Some(Record::Sample { time_ns, raw }) => {
                        if let Some(e) = formats.event(raw) {
                            events.push((e, time_ns));
                        }
                    }
                    Some(Record::Lost(n)) => {
                        counts.lost.fetch_add(n, Ordering::Relaxed);
                    }
                    _ => {}
                });
            }
            // The oldest first: each read as soon as the ring gave it.
            events.sort_by_key(|(_, t)| *t);
            for (event, time_ns) in events.drain(..) {
                if !self.wanted(&event) {
                    continue;
                }
                let death = self.moment.read(event, time_ns);
                self.counts.deaths.fetch_add(1, Ordering::Relaxed);
                if !deliver(death) {
                    return;
                }
            }
            self.tell_lost();
        }
    }

    /// A SIGBUS from a fault, another fatal signal (to place a crash), or an OOM victim; a
    /// `kill -BUS` is counted, not told.
    fn wanted(&self, event: &Event) -> bool {
        match event {
            Event::Signal { sig, code, .. } if *sig == SIGBUS && is_fault_code(*code) => true,
            Event::Signal { sig, .. } if *sig != SIGBUS => true,
            Event::Signal { code, pid, .. } => {
                self.counts.kills.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    pid,
                    code,
                    "SIGBUS sent by a process (kill), not a fault: not told"
                );
                false
            }
            Event::Victim { .. } => true,
        }
    }

    fn wait(&self) {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds: Vec<PollFd<'_>> = self
            .rings
            .iter()
            .map(|r| PollFd::from_borrowed_fd(r.fd(), PollFlags::IN))
            .collect();
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: WAIT.as_nanos() as _,
        };
        // EINTR and the like: the loop looks at the rings anyway.
        let _ = poll(&mut fds, Some(&timeout));
    }

    fn tell_lost(&mut self) {
        let lost = self.counts.lost.load(Ordering::Relaxed);
        if lost > 0 && !self.lost_told {
            self.lost_told = true;
            tracing::warn!(
                "death trace: {lost} tracepoint events were lost (a storm of SIGBUS faster than \
                 they are read); those deaths are judged by the scans' readings"
            );
        }
    }
}

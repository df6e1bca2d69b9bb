//! The highest /dev/shm usage between two scans, sampled faster for the containers that matter.
//!
//! A DataLoader can fill /dev/shm and die within a second, between two scans. A thread samples
//! the few containers the scan marks (half full, or growing) every `period` and keeps each one's
//! highest usage until the next scan takes it. Each sample opens /dev/shm the scan's way (beneath
//! the container's root, no symlinks, under the same deadline) and closes it before sleeping: an
//! open handle would keep the mount busy and make kubelet's unmount of a finished Pod fail. As
//! the scan, it asks only a tmpfs: the first sample of a container looks its mount's type up in
//! mountinfo, later ones check the mount is still that one (a container that swaps its /dev/shm
//! for a FUSE that never answers is dropped, not waited on).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::deadline::Measurer;
use super::mounts::shm_line;
use super::statfs::{self, MountKey, OpenShmError};
use super::trusted::{open_shm, Trusted};
use crate::procfs::kfile::FileReader;

/// A floor on the period: a zero period would spin a core.
const MIN_PERIOD: Duration = Duration::from_millis(10);
/// How many distinct problems are logged at warn; the rest go to debug.
const MAX_LOGGED: usize = 1_000;

/// A container to sample: the ID its peak is reported under and one of its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakTarget {
    pub container_id: String,
    pub pid: i32,
}

/// How long after a container's process started it is watched whatever it uses: a job that just
/// started is when a DataLoader or `multiprocessing.shared_memory` fills /dev/shm from nothing
/// and dies within a second.
pub const YOUNG: Duration = Duration::from_secs(60);
/// Young containers watched at most at once (a node starting hundreds of Pods); the rest are
/// watched when they use something.
pub const MAX_YOUNG: usize = 64;

/// Pure: whether a container is worth sampling between scans: `young` (see [`YOUNG`]), at or
/// above half of its effective limit (used + available), or grown since the previous scan.
///
/// A container the previous scan did not see (`None`) counts as grown from nothing when it
/// uses anything. An old container with nothing used is never worth watching, even with
/// nothing available.
pub fn worth_watching(previous_used: Option<u64>, used: u64, available: u64, young: bool) -> bool {
    // used >= (used + available) / 2, without the overflowing sum.
    let half_full = used >= available;
    let grown = used > previous_used.unwrap_or(0);
    young || used > 0 && (half_full || grown)
}

/// What the caller and the thread share.
struct Shared {
    state: Mutex<State>,
    /// Signalled on a new watch set and on stop.
    wake: Condvar,
    errors: AtomicU64,
}

#[derive(Default)]
struct State {
    targets: Vec<PeakTarget>,
    /// Bumped by every `watch`, so the thread notices a new set even when it is equal.
    generation: u64,
    peaks: HashMap<String, u64>,
    stop: bool,
}

impl Shared {
    /// The state, even after a panic elsewhere: peaks are plain numbers, never half-written.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Samples the watched containers' /dev/shm on a thread of its own ("shm-peak").
pub struct PeakSampler {
    proc_root: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    /// Samples the watched containers' /dev/shm every `period` (e.g. 200 ms) through
    /// `<proc_root>/<pid>/root`.
    pub fn start(proc_root: PathBuf, period: Duration) -> PeakSampler {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            errors: AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new().name("shm-peak".into()).spawn({
            let shared = shared.clone();
            let proc_root = proc_root.clone();
            move || Worker::new(proc_root, shared).run(period.max(MIN_PERIOD))
        });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(e) => {
                // Peaks are a refinement of the scan: without them the scan still reports.
                tracing::warn!("not sampling /dev/shm peaks between scans: {e}");
                None
            }
        };
        PeakSampler {
            proc_root,
            shared,
            thread,
        }
    }

    /// The proc root it samples through.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Replaces the watched set (an empty set idles the thread).
    pub fn watch(&self, targets: Vec<PeakTarget>) {
        let mut state = self.shared.lock();
        state.targets = targets;
        state.generation = state.generation.wrapping_add(1);
        drop(state);
        self.shared.wake.notify_all();
    }

    /// The highest used bytes seen per container ID since the previous call, then forgets them.
    pub fn take_peaks(&self) -> HashMap<String, u64> {
        std::mem::take(&mut self.shared.lock().peaks)
    }

    /// Samples that failed for a reason other than the process or its /dev/shm being gone.
    pub fn errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Relaxed)
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A target as the thread holds it, with the tmpfs mount its first sample measured.
struct Watched {
    target: PeakTarget,
    mount: Option<MountKey>,
}

/// The thread's side: the current set, and which problems were logged.
struct Worker {
    proc_root: PathBuf,
    shared: Arc<Shared>,
    watched: Vec<Watched>,
    /// The tmpfs mount found per PID, kept across sets, so mountinfo is read once per container.
    known: HashMap<i32, MountKey>,
    measurer: Measurer,
    files: FileReader,
    /// The root and /dev mounts found trusted to look in, per PID.
    trusted: HashMap<i32, Trusted>,
    logged: HashSet<String>,
}

/// One sample's outcome for one target.
enum Sample {
    Used {
        bytes: u64,
        mount: Option<MountKey>,
    },
    /// The process or its /dev/shm mount is gone, or it has no usage to read: stop sampling it.
    Gone,
}

impl Worker {
    fn new(proc_root: PathBuf, shared: Arc<Shared>) -> Self {
        Worker {
            proc_root,
            shared,
            watched: Vec::new(),
            known: HashMap::new(),
            measurer: Measurer::default(),
            files: FileReader::default(),
            trusted: HashMap::new(),
            logged: HashSet::new(),
        }
    }

    fn run(mut self, period: Duration) {
        let mut seen = None;
        loop {
            // Take a new set if there is one; idle while there is nothing to sample.
            {
                let shared = self.shared.clone();
                let mut state = shared.lock();
                loop {
                    if state.stop {
                        return;
                    }
                    if seen != Some(state.generation) {
                        seen = Some(state.generation);
                        let targets = state.targets.clone();
                        self.take_set(&targets);
                    }
                    if !self.watched.is_empty() {
                        break;
                    }
                    state = shared
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
            // The I/O runs without the lock, so `watch` and `take_peaks` never wait on it.
            let samples = self.sample_all();
            let mut state = self.shared.lock();
            for (id, bytes) in samples {
                let peak = state.peaks.entry(id).or_insert(0);
                *peak = (*peak).max(bytes);
            }
            // A set given while sampling ends the sleep at once, as does one given during it.
            let (state, _) = self
                .shared
                .wake
                .wait_timeout_while(state, period, |s| !s.stop && Some(s.generation) == seen)
                .unwrap_or_else(PoisonError::into_inner);
            drop(state);
        }
    }

    /// A new watched set, each with the tmpfs its PID was last found on.
    fn take_set(&mut self, targets: &[PeakTarget]) {
        self.known
            .retain(|pid, _| targets.iter().any(|t| t.pid == *pid));
        self.trusted
            .retain(|pid, _| targets.iter().any(|t| t.pid == *pid));
        self.watched = targets
            .iter()
            .map(|t| Watched {
                target: t.clone(),
                mount: self.known.get(&t.pid).copied(),
            })
            .collect();
    }

    /// One sample of every watched container; the ones that are gone are dropped from the set.
    fn sample_all(&mut self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(self.watched.len());
        let mut watched = std::mem::take(&mut self.watched);
        watched.retain_mut(|w| match self.sample(&w.target, w.mount) {
            // Another mount than the first sample's: the PID now belongs to another process
            // (reused), or /dev/shm was replaced. Either way it is not the container watched.
            Sample::Used { mount, .. }
                if w.mount.is_some() && mount.is_some() && w.mount != mount =>
            {
                false
            }
            Sample::Used { bytes, mount } => {
                w.mount = w.mount.or(mount);
                if let Some(key) = w.mount {
                    self.known.insert(w.target.pid, key);
                }
                out.push((w.target.container_id.clone(), bytes));
                true
            }
            Sample::Gone => false,
        });
        self.watched = watched;
        out
    }

    /// Opens, measures and closes one container's /dev/shm. An error drops the target until the
    /// next `watch`, so a lasting fault counts once per scan, not once per sample.
    fn sample(&mut self, target: &PeakTarget, tmpfs: Option<MountKey>) -> Sample {
        let measured = self.measure(target.pid, tmpfs);
        match measured {
            Ok(Some((bytes, mount))) => Sample::Used { bytes, mount },
            // Moving: the container's mounts changed while read (set up or torn down); the
            // next watch tries again.
            Ok(None) | Err(OpenShmError::Absent(_) | OpenShmError::Moving(_)) => Sample::Gone,
            Err(e) => {
                self.shared.errors.fetch_add(1, Ordering::Relaxed);
                let key = format!("{} {}", target.container_id, e);
                if self.logged.len() < MAX_LOGGED && self.logged.insert(key) {
                    tracing::warn!(
                        container_id = %target.container_id,
                        pid = target.pid,
                        "sampling /dev/shm: {e}"
                    );
                } else {
                    tracing::debug!(container_id = %target.container_id, "sampling /dev/shm: {e}");
                }
                Sample::Gone
            }
        }
    }
}

impl Worker {
    /// Used bytes of the process's /dev/shm and its mount ID, as the scan computes them; `None`
    /// when nothing is mounted there, it is not a tmpfs (never asked), it is another mount than
    /// the tmpfs `tmpfs` the first sample found, or it has no size to count against. Both
    /// handles are closed on return.
    fn measure(
        &mut self,
        pid: i32,
        tmpfs: Option<MountKey>,
    ) -> Result<Option<(u64, Option<MountKey>)>, OpenShmError> {
        let root = statfs::open_container_root(&self.proc_root, pid)?;
        let mountinfo = self.proc_root.join(pid.to_string()).join("mountinfo");
        let trusted = self.trusted.entry(pid).or_default();
        let walked = open_shm(
            &mut self.measurer,
            &mut self.files,
            &mountinfo,
            root,
            trusted,
        );
        let (shm, id) = match walked {
            Ok(answer) => answer?,
            Err(why) => {
                let e = std::io::Error::other(format!("opening /dev/shm did not finish: {why:?}"));
                return Err(OpenShmError::Io(e));
            }
        };
        if id.is_mount_root == Some(false) {
            // A plain directory on the root file system: the scan reports it as not mounted.
            return Ok(None);
        }
        match tmpfs {
            Some(known) if known == id.key() => {}
            // Not the mount the first sample measured: the caller drops the target.
            Some(_) => return Ok(Some((0, Some(id.key())))),
            None => {
                let (entry, _) =
                    shm_line(&mut self.files, &mountinfo, id.mount_id).map_err(statfs::classify)?;
                if !entry.is_some_and(|e| statfs::is_measured_type(&e.fs_type)) {
                    return Ok(None);
                }
            }
        }
        let stat = statfs::measure_tmpfs(&shm, id).map_err(OpenShmError::Io)?;
        drop(shm);
        Ok(stat.used_bytes().map(|used| (used, Some(id.key()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn worth_watching_table() {
        const GI: u64 = 1 << 30;
        let cases: &[(Option<u64>, u64, u64, bool, &str)] = &[
            (Some(GI), GI, 3 * GI, false, "steady at a quarter"),
            (Some(GI), 2 * GI, 2 * GI, true, "exactly half"),
            (Some(3 * GI), 3 * GI, GI, true, "steady above half"),
            (Some(GI), GI + 1, 10 * GI, true, "grown by a byte"),
            (Some(2 * GI), GI, 10 * GI, false, "shrunk"),
            (
                None,
                GI,
                10 * GI,
                true,
                "new since the previous scan, using some",
            ),
            (None, 0, 10 * GI, false, "new and empty"),
            (Some(0), 0, 0, false, "nothing used, nothing available"),
            (Some(GI), GI, 0, true, "full"),
            (
                Some(u64::MAX),
                u64::MAX,
                u64::MAX,
                true,
                "no overflow at the top",
            ),
            (Some(1), 1, u64::MAX, false, "tiny under a huge limit"),
        ];
        for &(previous, used, available, want, why) in cases {
            assert_eq!(
                worth_watching(previous, used, available, false),
                want,
                "{why}"
            );
            assert!(
                worth_watching(previous, used, available, true),
                "{why}, young"
            );
        }
    }

    /// A file of `len` bytes in /dev/shm, removed on drop (even when an assertion fails).
    struct ShmFile(PathBuf);

    impl ShmFile {
        fn create(len: usize) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let path = PathBuf::from(format!(
                "/dev/shm/shmlink-peak-test-{}-{nanos}",
                std::process::id()
            ));
            // Written, not truncated to size: tmpfs counts the pages actually allocated.
            std::fs::write(&path, vec![0xA5u8; len]).unwrap();
            ShmFile(path)
        }
    }

    impl Drop for ShmFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn me() -> PeakTarget {
        PeakTarget {
            container_id: "self".into(),
            pid: std::process::id() as i32,
        }
    }

    /// Takes peaks until `pred` holds for ours, for at most five seconds.
    fn wait_for(sampler: &PeakSampler, pred: impl Fn(u64) -> bool) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(30));
            if let Some(&peak) = sampler.take_peaks().get("self") {
                if pred(peak) {
                    return Some(peak);
                }
            }
        }
        None
    }

    /// Whether some descriptor of this process is on /dev/shm (or a file in it).
    fn fds_on_dev_shm() -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| p == "/dev/shm" || p.starts_with("/dev/shm/"))
            .collect()
    }

    #[test]
    fn peaks_follow_the_processs_dev_shm_and_start_a_new_window_when_taken() {
        const LEN: u64 = 32 << 20;
        let sampler = PeakSampler::start("/proc".into(), Duration::from_millis(20));
        sampler.watch(vec![me()]);
        let file = ShmFile::create(LEN as usize);
        let high = wait_for(&sampler, |peak| peak >= LEN).expect("a peak with the file");
        drop(file);
        // Windows taken after the deletion no longer hold the file's pages.
        let low = wait_for(&sampler, |peak| peak + LEN / 2 <= high);
        assert!(
            low.is_some(),
            "the peak stayed at {high} after the file went"
        );
        assert_eq!(sampler.errors(), 0);
    }

    #[test]
    fn no_descriptor_on_dev_shm_is_held_between_samples() {
        let sampler = PeakSampler::start("/proc".into(), Duration::from_millis(200));
        sampler.watch(vec![me()]);
        assert!(wait_for(&sampler, |_| true).is_some(), "no sample taken");
        // A held handle shows on every look during the long sleeps; a descriptor another test
        // opens for a moment does not, so one clean look is enough.
        let mut last = Vec::new();
        for _ in 0..20 {
            last = fds_on_dev_shm();
            if last.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(7));
        }
        assert!(last.is_empty(), "descriptors on /dev/shm: {last:?}");
        // And still sampling afterwards.
        assert!(wait_for(&sampler, |_| true).is_some());
    }

    #[test]
    fn a_vanished_process_is_dropped_without_an_error() {
        let sampler = PeakSampler::start("/proc".into(), Duration::from_millis(20));
        let gone = PeakTarget {
            container_id: "gone".into(),
            pid: 999_999_999,
        };
        sampler.watch(vec![gone, me()]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut peaks = HashMap::new();
        while !peaks.contains_key("self") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(30));
            peaks = sampler.take_peaks();
        }
        assert!(
            peaks.contains_key("self"),
            "the live process is still sampled"
        );
        assert!(!peaks.contains_key("gone"));
        assert_eq!(sampler.errors(), 0);
    }

    #[test]
    fn an_empty_set_idles_and_drop_stops_the_thread() {
        let sampler = PeakSampler::start("/proc".into(), Duration::ZERO);
        sampler.watch(vec![me()]);
        assert!(wait_for(&sampler, |_| true).is_some());
        sampler.watch(Vec::new());
        std::thread::sleep(Duration::from_millis(50));
        sampler.take_peaks();
        std::thread::sleep(Duration::from_millis(50));
        assert!(sampler.take_peaks().is_empty());
        let started = Instant::now();
        drop(sampler);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

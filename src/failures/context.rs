//! A short window of each container's recent lines, for texts that are generic alone and
//! specific together:
//!
//! - Python prints `[Errno 38] Function not implemented` (or EACCES, ENOENT) for many calls;
//!   after the traceback line that makes a semaphore (`_multiprocessing.SemLock(`) it says that
//!   POSIX semaphores have no /dev/shm: `shm_unavailable`, told with the line that decided; its
//!   `[Errno 28] No space left on device` there is a full /dev/shm: `shm_allocation_failed`.
//! - PyTorch prints `CUDA error: invalid device ordinal` for any device number a process does
//!   not have; after the traceback line that opens another process's CUDA tensor
//!   (`rebuild_cuda_tensor`, `_new_shared_cuda(`: cudaIpcOpenMemHandle) it is CUDA IPC between
//!   processes that do not see the same GPUs: `cuda_ipc_invalid_device`.
//! - NCCL up to 2.11 prints `Error while creating shared memory segment` without an errno; a
//!   full /dev/shm is its usual cause, but when a line of the same container just said which
//!   call failed and why (told already), it is the same failure, not a second one.
//!
//! Pure apart from its memory: what each container said in the last [`WINDOW`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::model::ContainerRef;
use crate::model::FindingKind;

/// How far back a line of the same container still decides.
pub const WINDOW: Duration = Duration::from_secs(5);
/// Containers remembered at most (then forgotten all at once: a window is seconds long).
const ORIGINS: usize = 4096;
/// Bytes kept of a hint line.
const HINT_MAX: usize = 256;

/// Lines that say nothing alone but decide the next ones: each hint, and the generic lines it
/// decides with what they then are.
type Rule = (
    &'static [&'static str],
    &'static [(&'static str, FindingKind)],
);
const RULES: &[Rule] = &[
    (
        &["_multiprocessing.SemLock("],
        &[
            (
                "[Errno 38] Function not implemented",
                FindingKind::ShmUnavailable,
            ),
            ("[Errno 13] Permission denied", FindingKind::ShmUnavailable),
            (
                "[Errno 2] No such file or directory",
                FindingKind::ShmUnavailable,
            ),
            // sem_open's file in /dev/shm could not be made: a full /dev/shm (cpython#93253).
            (
                "[Errno 28] No space left on device",
                FindingKind::ShmAllocationFailed,
            ),
        ],
    ),
    (
        &["rebuild_cuda_tensor", "_new_shared_cuda("],
        &[("invalid device ordinal", FindingKind::CudaIpcInvalidDevice)],
    ),
];

/// What a hint or a line a hint decides holds: the recogniser's filter looks for these.
pub const NEEDLES: &[&str] = &[
    "SemLock(",
    "[Errno ",
    "rebuild_cuda_tensor",
    "_new_shared_cuda(",
];

#[derive(Default, Clone)]
struct Recent {
    /// The last hint: its line, when, and which rule it is of.
    hint: Option<(String, SystemTime, usize)>,
    failure: Option<SystemTime>,
}

#[derive(Default, Clone)]
pub struct Window {
    recent: HashMap<ContainerRef, Recent>,
}

fn within(earlier: SystemTime, at: SystemTime) -> bool {
    at.duration_since(earlier).is_ok_and(|d| d <= WINDOW)
}

impl Window {
    fn of(&mut self, origin: &ContainerRef) -> &mut Recent {
        if self.recent.len() >= ORIGINS && !self.recent.contains_key(origin) {
            self.recent.clear();
        }
        self.recent.entry(origin.clone()).or_default()
    }

    /// A line no row matched: a hint is remembered; a generic line after one is what the hint
    /// decides, told with the hint (the line that decided).
    pub fn unmatched(
        &mut self,
        origin: &ContainerRef,
        text: &str,
        at: SystemTime,
    ) -> Option<(FindingKind, String)> {
        if let Some(rule) = RULES
            .iter()
            .position(|(hints, _)| hints.iter().any(|h| text.contains(h)))
        {
            let hint = crate::model::cut(text.trim(), HINT_MAX);
            self.of(origin).hint = Some((hint, at, rule));
            return None;
        }
        let recent = self.recent.get_mut(origin)?;
        let (_, decided) = RULES.get(recent.hint.as_ref()?.2)?;
        let (_, kind) = decided.iter().find(|(needle, _)| text.contains(needle))?;
        let (hint, when, _) = recent.hint.take()?;
        within(when, at).then_some((*kind, hint))
    }

    /// A failure a row matched: whether it is to be told. A row's guess (`guessed`: a text
    /// without the errno that would say why) shortly after another failure of the same
    /// container is that failure again.
    pub fn matched(&mut self, origin: &ContainerRef, at: SystemTime, guessed: bool) -> bool {
        let recent = self.of(origin);
        let again = guessed && recent.failure.is_some_and(|f| within(f, at));
        recent.failure = Some(at);
        !again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(c: &str) -> ContainerRef {
        ContainerRef {
            namespace: Some("ml".into()),
            pod: Some("p".into()),
            pod_uid: Some("u".into()),
            container: Some(c.into()),
            container_id: None,
        }
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    const SEMLOCK: &str = "    sl = self._semlock = _multiprocessing.SemLock(";
    const ENOSYS: &str = "OSError: [Errno 38] Function not implemented";

    #[test]
    fn a_semaphores_traceback_decides_the_errno_after_it() {
        let mut w = Window::default();
        for line in [SEMLOCK, ENOSYS] {
            assert!(NEEDLES.iter().any(|n| line.contains(n)), "{line}");
        }
        assert_eq!(w.unmatched(&pod("a"), SEMLOCK, t(0)), None);
        assert_eq!(
            w.unmatched(&pod("a"), ENOSYS, t(1)),
            Some((FindingKind::ShmUnavailable, SEMLOCK.trim().to_string()))
        );
        // Used once: the same errno again says nothing.
        assert_eq!(w.unmatched(&pod("a"), ENOSYS, t(2)), None);
    }

    #[test]
    fn opening_a_cuda_tensor_decides_an_invalid_device_ordinal_and_nothing_else() {
        const REBUILD: &str = "    storage = storage_cls._new_shared_cuda(";
        const ORDINAL: &str = "RuntimeError: CUDA error: invalid device ordinal";
        let mut w = Window::default();
        assert_eq!(w.unmatched(&pod("a"), ORDINAL, t(0)), None, "alone");
        assert_eq!(w.unmatched(&pod("a"), REBUILD, t(0)), None);
        // Its hint decides no errno of the semaphore's rule.
        assert_eq!(w.unmatched(&pod("a"), ENOSYS, t(1)), None);
        assert_eq!(
            w.unmatched(&pod("a"), ORDINAL, t(1)),
            Some((
                FindingKind::CudaIpcInvalidDevice,
                REBUILD.trim().to_string()
            ))
        );
        // Nor does the semaphore's hint decide a device number.
        w.unmatched(&pod("a"), SEMLOCK, t(2));
        assert_eq!(w.unmatched(&pod("a"), ORDINAL, t(3)), None);
    }

    #[test]
    fn the_errno_alone_another_containers_hint_or_an_old_one_decide_nothing() {
        let mut w = Window::default();
        assert_eq!(w.unmatched(&pod("a"), ENOSYS, t(0)), None, "alone");
        w.unmatched(&pod("a"), SEMLOCK, t(0));
        assert_eq!(
            w.unmatched(&pod("b"), ENOSYS, t(1)),
            None,
            "another container"
        );
        assert_eq!(
            w.unmatched(&pod("a"), ENOSYS, t(60)),
            None,
            "a minute later"
        );
    }

    #[test]
    fn a_guess_right_after_a_failure_of_the_same_container_is_that_failure() {
        let mut w = Window::default();
        assert!(w.matched(&pod("a"), t(0), false));
        assert!(!w.matched(&pod("a"), t(1), true), "the same failure");
        assert!(w.matched(&pod("b"), t(1), true), "another container's");
        assert!(w.matched(&pod("a"), t(30), true), "later: its own");
        assert!(
            w.matched(&pod("a"), t(31), false),
            "specific texts are always told"
        );
    }
}

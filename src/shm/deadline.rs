//! /dev/shm opened and identified where a deadline can end the wait: the second line of
//! defence. The first is that nothing here asks the file system at /dev/shm anything (an
//! `O_PATH` open and a statx that does not sync, see [`statfs`]); statfs itself runs only
//! after mountinfo says tmpfs. The walk to /dev/shm looks only in local file systems
//! (`super::trusted`), which a slow disk can still slow: each step runs on a worker thread and
//! the scan thread waits at most [`DEADLINE`] for each answer. A worker that does not answer in
//! time is left behind, stuck in the kernel, the container is not asked again, and the next
//! look gets a new worker. At most [`MAX_STUCK`] are left behind: a hung FUSE leaves none (it is
//! never looked in), so only a stalled local disk counts against it. Nothing waits for the
//! workers at exit.

use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::statfs::{self, Identity, OpenShmError};

/// How long opening one /dev/shm may take: a walk through local directories takes microseconds.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Workers left stuck at most; past it, no more are started (every measurement is refused).
pub const MAX_STUCK: usize = 16;

type Answer = Result<(OwnedFd, Identity), OpenShmError>;
type Job = (OwnedFd, Step, Sender<Answer>);

/// What a worker opens beneath the handle it is given.
#[derive(Debug)]
enum Step {
    /// A path, by openat2 or the fallback walk (a Pod sandbox's /dev/shm, a host path).
    Beneath(String),
    /// One component, with its mount told ([`statfs::open_child`]): a container's walk.
    Child(&'static str),
}

/// Why there is no measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// The file system did not answer within the deadline.
    Hung,
    /// Too many workers are stuck already: not tried.
    TooManyStuck,
}

#[derive(Debug)]
pub struct Measurer {
    worker: Option<Sender<Job>>,
    stuck: usize,
    deadline: Duration,
}

impl Default for Measurer {
    fn default() -> Self {
        Measurer::new(DEADLINE)
    }
}

impl Measurer {
    pub fn new(deadline: Duration) -> Measurer {
        Measurer {
            worker: None,
            stuck: 0,
            deadline,
        }
    }

    /// Opens `rel` beneath `root` and tells its mount, within the deadline (a Pod sandbox's
    /// /dev/shm is at a path of the host's).
    pub fn open_and_identify_at(&mut self, root: OwnedFd, rel: &str) -> Result<Answer, Unanswered> {
        self.run(root, Step::Beneath(rel.to_string()))
    }

    /// Opens the one component `name` in `dir` and tells its mount, within the deadline.
    pub fn open_child(&mut self, dir: OwnedFd, name: &'static str) -> Result<Answer, Unanswered> {
        self.run(dir, Step::Child(name))
    }

    fn run(&mut self, dir: OwnedFd, step: Step) -> Result<Answer, Unanswered> {
        if self.stuck >= MAX_STUCK {
            return Err(Unanswered::TooManyStuck);
        }
        let (reply, answer) = mpsc::channel();
        let sent = match &self.worker {
            Some(w) => w.send((dir, step, reply)).map_err(|e| e.0),
            None => Err((dir, step, reply)),
        };
        if let Err(job) = sent {
            // No worker yet, or it ended: a new one.
            let w = spawn();
            if w.send(job).is_err() {
                return Err(Unanswered::Hung);
            }
            self.worker = Some(w);
        }
        wait(&answer, self.deadline).inspect_err(|_| {
            // That worker is stuck in the call: leave it, the next job gets a new one.
            self.worker = None;
            self.stuck += 1;
        })
    }

    /// Workers left stuck so far.
    pub fn stuck(&self) -> usize {
        self.stuck
    }
}

fn wait(answer: &Receiver<Answer>, deadline: Duration) -> Result<Answer, Unanswered> {
    match answer.recv_timeout(deadline) {
        Ok(a) => Ok(a),
        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Err(Unanswered::Hung),
    }
}

fn spawn() -> Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("shm-open".into())
        .spawn(move || {
            for (dir, step, reply) in rx {
                let answer = match step {
                    Step::Beneath(rel) => statfs::open_beneath(&dir, &rel).and_then(|fd| {
                        let id = statfs::identify(&fd).map_err(OpenShmError::Io)?;
                        Ok((fd, id))
                    }),
                    Step::Child(name) => statfs::open_child(&dir, name),
                };
                if reply.send(answer).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("starting a /dev/shm measuring thread: {e}");
    }
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{Mode, OFlags};

    fn root(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_dev_shm_is_identified_through_the_worker() {
        let mut m = Measurer::default();
        let answer = m
            .open_and_identify_at(root(std::path::Path::new("/")), "dev/shm")
            .unwrap();
        let (_, id) = answer.unwrap();
        assert_eq!(id.is_mount_root, Some(true), "the host's /dev/shm");
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            m.open_and_identify_at(root(dir.path()), "dev/shm").unwrap(),
            Err(OpenShmError::Absent(_))
        ));
        assert_eq!(m.stuck(), 0);
    }

    #[test]
    fn a_worker_that_does_not_answer_in_time_is_left_and_the_next_job_gets_another() {
        // A zero deadline: the answer is almost never there in time. A worker can still answer
        // before the zero wait looks (the waiter was preempted): such a call leaves none behind,
        // so ask until MAX_STUCK are; each that is not answered says Hung and leaves one.
        let mut m = Measurer::new(Duration::ZERO);
        let slash = || root(std::path::Path::new("/"));
        for _ in 0..100 * MAX_STUCK {
            if m.stuck() == MAX_STUCK {
                break;
            }
            let before = m.stuck();
            match m.open_and_identify_at(slash(), "dev/shm") {
                Err(e) => assert_eq!((e, m.stuck()), (Unanswered::Hung, before + 1)),
                Ok(_) => assert_eq!(m.stuck(), before),
            }
        }
        assert_eq!(m.stuck(), MAX_STUCK);
        assert_eq!(
            m.open_and_identify_at(slash(), "dev/shm").err(),
            Some(Unanswered::TooManyStuck)
        );
    }
}

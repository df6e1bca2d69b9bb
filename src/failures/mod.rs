//! Why a workload died, one way down: a source (`logs`, `kernel_log`) gives a line; here it
//! becomes a failure and is told with what was known then.
//!
//! - `signatures/` (pure): what a container's log line means (`table.rs`: the texts of PyTorch,
//!   NCCL, CPython, vLLM, Ray, Triton, PostgreSQL, Chromium, libc; `mod.rs`: the matcher);
//! - `crash.rs` (pure): what a kernel record means (a process crashed in a GPU library);
//! - `context.rs` (pure): a window of each container's last lines, for texts generic alone;
//! - `detect.rs`: a line or record -> [`Detected`](crate::model::Detected): kind, evidence and
//!   whose it is as far as the source says (`attribute.rs`: a host PID through its cgroup);
//! - `correlate.rs` (pure): + the container's /dev/shm then, its Pod, its GPUs and their pairs
//!   -> [`Failure`](crate::model::Failure), with the message (`findings::text`);
//! - `docker_deaths.rs` (pure): Docker's record of a stopped container -> a death (`check`);
//! - `recent.rs`: the containers seen in the last minute (the dying one is often gone);
//! - `worker.rs` (pure): PyTorch's word that a DataLoader worker was killed, tied to the kill;
//! - `same.rs`: one death told by two sources (the kernel and kubelet) is told once;
//! - `ledger.rs`: `serve`'s recent failures and counts per container and kind;
//! - `tell.rs`: `serve`'s scan thread tells them (correlates, logs, counts);
//! - `watch.rs`: `serve`'s thread that follows the sources, and `check`'s read-back.
//!
//! XIDs in the kernel log are the GPUs' concern: `gpu::xid::kernel`.

pub mod attribute;
pub mod context;
pub mod correlate;
pub mod crash;
pub mod detect;
pub mod docker_deaths;
pub mod ledger;
pub mod memcg;
pub mod oom;
pub mod recent;
pub mod same;
pub mod signatures;
pub mod tell;
pub mod watch;
pub mod worker;

pub use signatures::{LogMatch, Signature, Signatures, SIGNATURES};

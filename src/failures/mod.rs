//! Why a workload died, one way down for `check` and `serve` alike: every source's account goes
//! into one [`Pipeline`] (`pipeline.rs`), which alone recognises, places, merges one death's
//! accounts and judges them.
//!
//! - `pipeline.rs`: the [`Pipeline`] and the [`Sources`] it is fed from;
//! - `sources.rs`: the feeding: `serve`'s follower thread, `check`'s read-back;
//! - recognising (pure): `signatures/` (a container's log line: `table.rs` the texts of PyTorch,
//!   NCCL, CPython, vLLM, Ray, Triton, PostgreSQL, Chromium, libc; `mod.rs` the matcher),
//!   `crash.rs` (a kernel record of a crash in a GPU library), `oom.rs` (the kernel's OOM
//!   report), `context.rs` (a window of each container's last lines, for texts generic alone),
//!   `dataloader.rs` (PyTorch's word that a DataLoader worker was killed), `docker_exits.rs`
//!   (Docker's record of a stopped container), `oom_counters.rs` (the memory cgroups' OOM kill
//!   counters); `facts/` (the tier beneath the signatures: a line no row matched, read for
//!   its facts by the grammar of the programs that print failures, decided by one table);
//!   `detect.rs` turns a line or record into a
//!   [`Detected`](crate::model::Detected), placed as far as the source says (`attribute.rs`: a
//!   host PID through its cgroup);
//! - `traced.rs`: a death the kernel's tracepoints told (`death_trace`), and its reading at the
//!   moment lent to the other accounts of that death;
//! - merging: `same.rs` (one death told by two sources is told once), `recent.rs` (the
//!   containers seen in the last minute: the dying one is often gone);
//! - judging and wording (pure): `bus.rs` (a SIGBUS death: /dev/shm's, the workload's, or
//!   unmeasured without a reading at the moment), `correlate.rs`: + the container's /dev/shm then, its Pod, its
//!   GPUs and their pairs -> [`Failure`](crate::model::Failure), with the message;
//! - `hang/`: a collective that hung until a watchdog ended the job: the line's facts and what
//!   the job's links did over the hang's window;
//! - `ledger.rs`: what `serve` keeps and says of the failures told (recent, counts, its log).
//!
//! XIDs in the kernel log are the GPUs' concern: `gpu::xid::kernel`.

pub mod attribute;
mod bus;
pub mod checkpoint;
pub mod context;
pub mod correlate;
pub mod crash;
pub mod dataloader;
pub mod detect;
pub mod docker_exits;
pub mod facts;
mod gpu_evidence;
pub mod hang;
pub mod ledger;
pub mod nccl_diag;
pub mod oom;
pub mod oom_counters;
pub mod pipeline;
pub mod recent;
pub mod same;
pub mod signatures;
pub mod sources;
pub mod traced;

pub use pipeline::{Mode, Pipeline, Sources};
pub use signatures::{LogMatch, Signature, Signatures, FACTS, SIGNATURES};

//! Why a workload died: what its own log and the kernel said, attributed to its container and
//! told with what was known then (its /dev/shm, the GPUs its Pod held and their pairs).
//!
//! - `failures::` (signatures, kernel log) recognises the lines;
//! - `attribute.rs` says whose they are (log path, host PID through /proc/PID/cgroup);
//! - `correlate.rs` (pure) adds what the last scan knew and writes the message;
//! - `watch.rs` is `serve`'s thread that follows the sources and wakes the scan thread;
//!   `check` reads the same sources back over `--since` (`collect`).

pub mod attribute;
pub mod correlate;
pub mod ledger;
pub mod watch;

//! The end-to-end tests against real runc containers, the kernel log and the agent's servers on
//! this host. One binary, each file a module named as its file (`cargo test --test
//! e2e_containers shm::`). Its tests run at once in one process: a test that judges the whole
//! host takes it alone (tests/common/host.rs), and a child's peak RSS is its own
//! (tests/common/binary.rs), whatever the size of this process.

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/admit_tls.rs"]
mod admit_tls;

mod admit;
mod agree;
mod blind;
mod bounded;
mod deaths;
mod enosys;
mod evicted;
mod failures;
mod floods;
mod forged_kernel;
mod gpu_users;
mod gpu_words;
mod hang;
mod hostile;
mod hung_shm;
mod ipc;
mod job_links;
mod kube;
mod latency;
mod long_log;
mod nested_cgroup;
mod oom;
mod pid_reuse;
mod preflight;
mod privilege;
mod prometheus;
mod readiness;
mod serve;
mod shm;
mod soak;
mod state;

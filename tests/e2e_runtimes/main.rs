//! The end-to-end tests against real container runtimes: a private Docker engine and a private
//! containerd (tests/common/docker.rs, containerd.rs), each started once per test. One binary,
//! each file a module named as its file (`cargo test --test e2e_runtimes docker::`).

#[path = "../common/mod.rs"]
mod common;

mod containerd;
mod death_trace;
mod docker;
mod resume;

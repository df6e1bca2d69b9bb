//! The integration tests that make no container, one
//! binary (linked once, not once per file): each file a module, named as its file was
//! (`cargo test --test it field_corpus::`). The end-to-end tests (tests/e2e_*.rs) stay binaries
//! of their own: each scans the whole host and measures its children, which other files' tests
//! in the same process would disturb.

#[path = "../common/mod.rs"]
mod common;

mod admission_pods;
mod admit_dra;
mod cli_words;
mod discovery;
mod field_corpus;
mod http;
mod kube_api;
mod kube_conditions;
mod kube_device_taint;
mod link_trend;
mod podresources;
mod promtext;
mod secrets;
mod state_attacks;
mod state_store;

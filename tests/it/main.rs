//! The integration tests that make no container, one
//! binary (linked once, not once per file): each file a module, named as its file was
//! (`cargo test --test it field_corpus::`). The end-to-end tests are three binaries more
//! (tests/e2e_gpu/, e2e_runtimes/, e2e_containers/) and tests/e2e_chaos.rs, which
//! scripts/test.sh runs alone; nvml_binding.rs loads the fake NVML into its own process.

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
mod logging;
mod podresources;
mod promtext;
mod secrets;
mod state_attacks;
mod state_store;

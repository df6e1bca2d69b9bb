//! The integration tests, one binary (linked once, not once per file): each file a module,
//! named as its file was (`cargo test --test it e2e_hang::`).

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/admit_tls.rs"]
mod admit_tls;

mod admission_pods;
mod admit_dra;
mod cli_words;
mod discovery;
mod e2e_admit;
mod e2e_agree;
mod e2e_blind;
mod e2e_bounded;
mod e2e_chaos;
mod e2e_conditions;
mod e2e_containerd;
mod e2e_death_trace;
mod e2e_deaths;
mod e2e_device_taint;
mod e2e_docker;
mod e2e_enosys;
mod e2e_evicted;
mod e2e_failures;
mod e2e_fleet;
mod e2e_floods;
mod e2e_forged;
mod e2e_forged_kernel;
mod e2e_forged_xid;
mod e2e_golden_metrics;
mod e2e_gpu;
mod e2e_gpu_users;
mod e2e_gpu_words;
mod e2e_hang;
mod e2e_hostile;
mod e2e_hung_shm;
mod e2e_ipc;
mod e2e_job_links;
mod e2e_kube;
mod e2e_latency;
mod e2e_long_log;
mod e2e_nested_cgroup;
mod e2e_oom;
mod e2e_pcie;
mod e2e_pid_reuse;
mod e2e_preflight;
mod e2e_privilege;
mod e2e_probe;
mod e2e_prometheus;
mod e2e_readiness;
mod e2e_resume;
mod e2e_resume_holds;
mod e2e_serve;
mod e2e_shm;
mod e2e_soak;
mod e2e_state;
mod e2e_xid_agree;
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

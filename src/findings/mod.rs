//! The words and the /dev/shm decisions: `text.rs` writes every sentence a person reads about a
//! condition, once; `shm.rs` decides how full is full for one container's /dev/shm. The typed
//! [`Finding`](crate::model::Finding) itself is in `model`; GPU findings are decided in
//! `gpu::pairs` and `gpu::xid`, worded here.

pub mod changes;
pub mod shm;
pub mod text;

pub use shm::{
    evaluate_shm, on_runtime_default, shm_findings, BadThresholds, Thresholds, SHM_CRITICAL_RATIO,
    SHM_WARN_RATIO,
};

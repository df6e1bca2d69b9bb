//! Kubernetes Events (`events.k8s.io/v1`) for what a scan found.
//!
//! [`EventPlanner`] (`planner.rs`) is pure: each scan's findings in, the Events to publish out.
//! A condition (one reason on one subject: a Pod, or the Node for one GPU finding) gets one
//! Event when it begins; while it lasts, a heartbeat updates that Event's series; when it ends it
//! is forgotten, so a recurrence is a new Event. Levels are separate reasons (ShmNearlyFull,
//! ShmExhausted; GpuLinkDegraded, GpuLinkDown), so a change of severity is a new Event too. The
//! reason comes from the finding's kind, the Pods and GPUs from its typed subject, the note is
//! its message (`text`).
//!
//! [`EventQueue`] (`publisher.rs`) carries them to a task that publishes them, one call at a
//! time, rate-limited, retried with backoff while the API server is away. What waits is kept in
//! `pending.rs` (pure): repeats of one Event merge into one series update, objects take turns so
//! a Pod failing a hundred times a second cannot crowd out other Pods' or the Node's Events, an
//! `Ended` needs no call and is never dropped, and when full a waiting series update makes room
//! for a new Event before a new Event is dropped (either counted). kube's `Recorder` is not
//! used: its series key ignores the note and has no place for the GPU a Node Event is about, so
//! two GPUs failing on one node would collapse into one series that keeps the first GPU's note.
//! Names are fixed per occurrence, so a create retried after a lost answer meets 409 Conflict
//! instead of making a duplicate. Every source of Events takes its IDs and names from one
//! [`EventIds`] (`ids.rs`), so none can collide with another's.

mod ids;
mod pending;
mod planner;
mod publisher;

use k8s_openapi::api::core::v1::ObjectReference;

pub use ids::EventIds;
pub use planner::{EventPlanner, OpenSeries, Resend};
pub use publisher::{spawn_publisher, EventQueue, PublishSettings};

pub use super::podresources::GpuHolders;
use crate::model::EventReason;

/// The state store's key of the open failure series (written with the failures told).
pub const SERIES_KEY: &str = "event_series";
/// The state store's key of the series counts the API server confirmed, by Event name.
pub const CONFIRMED_KEY: &str = "event_confirmed";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// One Event to create, or the next occurrence of one already created (same `id`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventSpec {
    /// One occurrence of one condition; its heartbeats share it.
    pub id: u64,
    /// The Event's object name, fixed for the occurrence.
    pub name: String,
    pub regarding: ObjectReference,
    pub reason: EventReason,
    pub type_: EventType,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventMsg {
    Publish(Box<EventSpec>),
    /// The condition is over: its Event will not be updated again.
    Ended(u64),
}

pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests;

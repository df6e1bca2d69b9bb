//! One container reference, from where a source learns whose it is to the Event: a log file's
//! path, the kernel's cgroup, Docker's record, kubelet's Pod status, the death trace's moment
//! and NVML's process each fill what they know; `failures::correlate` fills the rest (the Pod
//! cache, the scan's reading); `failures[]`, the store, `same`'s matching, the failure counter,
//! the scan's findings and the Events all read the same value.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{short_id, ShmReading};

/// Each part where known: a log path names a Pod's container but not its instance, the kernel
/// a cgroup's container ID (and Pod UID), Docker's record an ID and a name, a scan all of it.
/// Nothing known ([`ContainerRef::default`]) is the one other case: a host process, or one
/// gone before it could be placed. Flattened into `failures[]` (its fields are the entry's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerRef {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    pub container: Option<String>,
    pub container_id: Option<String>,
}

impl ContainerRef {
    /// A Pod's container by its names (a log path, a Pod status); the instance where known.
    pub fn in_pod(
        namespace: &str,
        pod: &str,
        uid: &str,
        container: &str,
        container_id: Option<String>,
    ) -> ContainerRef {
        ContainerRef {
            namespace: Some(namespace.into()),
            pod: Some(pod.into()),
            pod_uid: Some(uid.into()),
            container: Some(container.into()),
            container_id,
        }
    }

    /// A container by ID (a Docker log's path; a cgroup's, with kubelet's Pod UID in it).
    pub fn by_id(container_id: &str, pod_uid: Option<String>) -> ContainerRef {
        ContainerRef {
            pod_uid,
            container_id: Some(container_id.into()),
            ..ContainerRef::default()
        }
    }

    /// A Docker container by its record: its ID and its `--name` (it may be gone).
    pub fn docker(container_id: &str, name: &str) -> ContainerRef {
        ContainerRef {
            container: Some(name.into()),
            ..ContainerRef::by_id(container_id, None)
        }
    }

    /// As a scan found it.
    pub fn of(r: &ShmReading) -> ContainerRef {
        ContainerRef {
            namespace: r.namespace.clone(),
            pod: r.pod.clone(),
            pod_uid: r.pod_uid.clone(),
            container: r.container.clone(),
            container_id: Some(r.container_id.clone()),
        }
    }

    /// The scan's reading names what the source did not (the Pod cache, Docker's record).
    pub fn fill_from(&mut self, r: &ShmReading) {
        let fill = |part: &mut Option<String>, from: &Option<String>| {
            if part.is_none() {
                part.clone_from(from);
            }
        };
        fill(&mut self.namespace, &r.namespace);
        fill(&mut self.pod, &r.pod);
        fill(&mut self.pod_uid, &r.pod_uid);
        fill(&mut self.container, &r.container);
        if self.container_id.is_none() {
            self.container_id = Some(r.container_id.clone());
        }
    }

    /// A container ID or a Pod UID names it: the source or a scan placed it in a container.
    pub fn is_placed(&self) -> bool {
        self.container_id.is_some() || self.pod_uid.is_some()
    }

    /// No scan placed it in a container: a process the kernel named (a host process, or one
    /// gone before it could be placed).
    pub fn is_outside_containers(&self) -> bool {
        self.container_id.is_none() && self.pod_uid.is_none() && self.pod.is_none()
    }

    /// Named by its runtime but in no Pod: only Docker names a container so (`--name`).
    pub fn is_named_outside_pods(&self) -> bool {
        self.container.is_some() && self.pod_uid.is_none() && self.pod.is_none()
    }

    /// The ID, "" where unknown (a metric's label).
    pub fn id_or_empty(&self) -> &str {
        self.container_id.as_deref().unwrap_or("")
    }

    /// How a message names the container: `namespace/pod/container`, `namespace/pod`, the
    /// container's name, its short ID; None for none of them.
    pub fn name(&self) -> Option<String> {
        match (
            &self.namespace,
            &self.pod,
            &self.container,
            &self.container_id,
        ) {
            (Some(ns), Some(pod), Some(c), _) => Some(format!("{ns}/{pod}/{c}")),
            (Some(ns), Some(pod), None, _) => Some(format!("{ns}/{pod}")),
            (_, _, Some(c), _) => Some(c.clone()),
            (_, _, None, Some(id)) => Some(short_id(id).to_string()),
            _ => None,
        }
    }

    /// The container's own name, else its short ID: how a note about its Pod names it.
    pub fn short_name(&self) -> &str {
        self.container
            .as_deref()
            .unwrap_or_else(|| short_id(self.id_or_empty()))
    }
}

/// A finding's subject: `namespace/pod/container` when known, else the pod UID or container ID.
impl fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = short_id(self.id_or_empty());
        match (&self.namespace, &self.pod) {
            (Some(ns), Some(pod)) => match &self.container {
                Some(c) => write!(f, "{ns}/{pod}/{c}"),
                None => write!(f, "{ns}/{pod}"),
            },
            _ => match (&self.pod_uid, &self.container) {
                (Some(uid), _) => write!(f, "pod {uid} container {id}"),
                // A plain Docker container, by the name Docker knows it by.
                (None, Some(name)) => write!(f, "container {name}"),
                (None, None) => write!(f, "container {id}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FindingKind;

    /// Flattened, its parts are `failures[]`'s own fields, in their place and order.
    #[test]
    fn a_failure_is_written_and_read_with_its_container_fields_as_before() {
        let mut f = crate::fixtures::failure(FindingKind::ShmBusError, "ml", "trainer-0", "u-1");
        f.placed.container_id = Some("c0ffee".into());
        let json = serde_json::to_string(&f).unwrap();
        assert!(
            json.starts_with(
                r#"{"namespace":"ml","pod":"trainer-0","pod_uid":"u-1","container":"trainer","container_id":"c0ffee","image":null,"kind":"shm_bus_error","at":"2026-11-23T10:15:02Z","#
            ),
            "{json}"
        );
        assert!(!json.contains("placed"), "{json}");
        let back: crate::model::Failure = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f);
        // A host process: every part null, and read back as none.
        f.placed = ContainerRef::default();
        let json = serde_json::to_value(&f).unwrap();
        for part in ["namespace", "pod", "pod_uid", "container", "container_id"] {
            assert!(json[part].is_null(), "{part}: {json}");
        }
        let back: crate::model::Failure = serde_json::from_value(json).unwrap();
        assert!(back.placed.is_outside_containers() && !back.placed.is_placed());
    }

    #[test]
    fn the_scan_names_what_the_source_did_not_and_the_message_names_the_most_it_knows() {
        let mut p = ContainerRef {
            pod_uid: Some("u-1".into()),
            container: Some("trainer".into()),
            ..ContainerRef::default()
        };
        assert_eq!(p.name().as_deref(), Some("trainer"));
        let mut r = crate::fixtures::shm_reading("c0ffee0123456789", 64 << 20, 0);
        r.namespace = Some("ml".into());
        r.pod = Some("trainer-0".into());
        r.pod_uid = Some("u-other".into());
        r.container = Some("other".into());
        p.fill_from(&r);
        assert_eq!(p.pod_uid.as_deref(), Some("u-1"), "the source's own stands");
        assert_eq!(p.container.as_deref(), Some("trainer"));
        assert_eq!(p.container_id.as_deref(), Some("c0ffee0123456789"));
        assert_eq!(p.name().as_deref(), Some("ml/trainer-0/trainer"));
        assert_eq!(p.id_or_empty(), "c0ffee0123456789");
        let by_id = ContainerRef {
            container_id: Some("c0ffee0123456789".into()),
            ..ContainerRef::default()
        };
        assert_eq!(by_id.name().as_deref(), Some("c0ffee012345"));
        assert_eq!(ContainerRef::default().name(), None);
        assert_eq!(ContainerRef::default().id_or_empty(), "");
    }
}

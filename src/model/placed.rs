//! A failure's container as far as it is known: one type from correlate (which fills it from
//! the source's `Who`, the Pod cache and the scan's reading) through `failures[]`, the store,
//! `same`'s matching and the failure counter to the Event, where it becomes a [`ContainerRef`].

use serde::{Deserialize, Serialize};

use super::{short_id, ContainerRef, ShmReading};

/// Each part where known: a log path names a Pod's container but not its instance, the kernel
/// a cgroup's container ID, Docker's record an ID and a name, a host process nothing.
/// Flattened into `failures[]` (its fields are the entry's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placed {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    pub container: Option<String>,
    pub container_id: Option<String>,
}

impl Placed {
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

    /// As findings and the failure counter name a container (an unknown ID empty).
    pub fn to_ref(&self) -> ContainerRef {
        ContainerRef {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            pod_uid: self.pod_uid.clone(),
            container: self.container.clone(),
            container_id: self.container_id.clone().unwrap_or_default(),
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
        f.placed = Placed::default();
        let json = serde_json::to_value(&f).unwrap();
        for part in ["namespace", "pod", "pod_uid", "container", "container_id"] {
            assert!(json[part].is_null(), "{part}: {json}");
        }
        let back: crate::model::Failure = serde_json::from_value(json).unwrap();
        assert!(back.placed.is_outside_containers() && !back.placed.is_placed());
    }

    #[test]
    fn the_scan_names_what_the_source_did_not_and_the_message_names_the_most_it_knows() {
        let mut p = Placed {
            pod_uid: Some("u-1".into()),
            container: Some("trainer".into()),
            ..Placed::default()
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
        assert_eq!(p.to_ref().container_id, "c0ffee0123456789");
        let by_id = Placed {
            container_id: Some("c0ffee0123456789".into()),
            ..Placed::default()
        };
        assert_eq!(by_id.name().as_deref(), Some("c0ffee012345"));
        assert_eq!(Placed::default().name(), None);
        assert_eq!(Placed::default().to_ref().container_id, "");
    }
}

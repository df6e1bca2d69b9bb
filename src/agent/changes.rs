//! Pure: which findings began and which ended since the last scan, for `serve` without
//! Kubernetes, which says each in its log as an Event would (a plain GPU server's operator
//! reads the journal, not Events).

use std::collections::BTreeMap;

use crate::model::{Finding, FindingKind};

/// The findings of the last scan, by kind and subject.
#[derive(Debug, Default)]
pub struct FindingChanges {
    active: BTreeMap<(FindingKind, String), Finding>,
}

/// What one scan changed.
#[derive(Debug, Default, PartialEq)]
pub struct Changed {
    /// New since the last scan (a kind and subject not there before).
    pub began: Vec<Finding>,
    /// Gone since the last scan, as they were last said.
    pub ended: Vec<Finding>,
}

impl FindingChanges {
    pub fn update(&mut self, findings: &[Finding]) -> Changed {
        let mut now: BTreeMap<(FindingKind, String), Finding> = BTreeMap::new();
        for f in findings {
            now.entry((f.kind, f.subject.to_string()))
                .or_insert_with(|| f.clone());
        }
        let began = now
            .iter()
            .filter(|(k, _)| !self.active.contains_key(*k))
            .map(|(_, f)| f.clone())
            .collect();
        let ended = std::mem::take(&mut self.active)
            .into_iter()
            .filter(|(k, _)| !now.contains_key(k))
            .map(|(_, f)| f)
            .collect();
        self.active = now;
        Changed { began, ended }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Subject;

    fn f(kind: FindingKind, gpu: u32, message: &str) -> Finding {
        Finding::new(kind, Subject::Gpu(gpu), message.into())
    }

    #[test]
    fn a_finding_begins_once_lasts_quietly_and_ends_once() {
        let mut c = FindingChanges::default();
        let down = f(
            FindingKind::GpuLinkDown,
            7,
            "GPU 7 fails with every other GPU",
        );
        let changed = c.update(std::slice::from_ref(&down));
        assert_eq!(changed.began, vec![down.clone()]);
        assert!(changed.ended.is_empty());
        // Still there, its words a little different: no news.
        let again = f(
            FindingKind::GpuLinkDown,
            7,
            "GPU 7 fails with every other GPU (2)",
        );
        assert_eq!(c.update(std::slice::from_ref(&again)), Changed::default());
        // Another GPU's: began; GPU 7's gone: ended, as last said.
        let other = f(FindingKind::GpuLinkErrors, 2, "NVLink errors on GPU 2");
        let changed = c.update(std::slice::from_ref(&other));
        assert_eq!(changed.began, vec![other]);
        assert_eq!(changed.ended, vec![again]);
        assert_eq!(c.update(&[]).ended.len(), 1);
        assert_eq!(c.update(&[]), Changed::default());
    }
}

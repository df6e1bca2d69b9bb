//! `--taint-on-gpu-fault`: a NoSchedule taint of our own while `GpuFault` is True, for
//! schedulers that read taints and not conditions. Only the taint with our key is ever added or
//! removed; the rest of the list is written back as it was read, under the Node's
//! resourceVersion (a taint list is replaced whole by any patch, so a concurrent change must
//! make ours fail and retry, not be overwritten).

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

/// The taint's key (its effect is NoSchedule, it has no value).
use crate::kube::NODE_TAINT_KEY as TAINT_KEY;
const EFFECT: &str = "NoSchedule";

/// Pure: the taints with ours present (`on`) or absent; None when they already are.
pub fn with_taint(taints: &[Taint], on: bool) -> Option<Vec<Taint>> {
    let ours = |t: &Taint| t.key == TAINT_KEY && t.effect == EFFECT;
    if taints.iter().any(ours) == on {
        return None;
    }
    let mut out: Vec<Taint> = taints.iter().filter(|t| !ours(t)).cloned().collect();
    if on {
        out.push(Taint {
            key: TAINT_KEY.into(),
            effect: EFFECT.into(),
            ..Taint::default()
        });
    }
    Some(out)
}

/// Sets or removes our taint; a conflicting concurrent write is retried a few times.
pub async fn reconcile(api: &Api<Node>, node: &str, on: bool) -> Result<(), kube::Error> {
    let mut tries = 0;
    loop {
        let current = api.get(node).await?;
        let taints = current
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let Some(next) = with_taint(&taints, on) else {
            return Ok(());
        };
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": next},
        });
        let params = PatchParams {
            field_manager: Some("shmlink".into()),
            ..PatchParams::default()
        };
        match api.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    #[test]
    fn only_our_taint_is_added_or_removed() {
        let others = vec![
            taint("nvidia.com/gpu", "NoSchedule"),
            taint(TAINT_KEY, "NoExecute"),
        ];
        let on = with_taint(&others, true).expect("added");
        assert_eq!(on.len(), 3);
        assert_eq!(on[..2], others[..]);
        assert_eq!(on[2], taint(TAINT_KEY, "NoSchedule"));
        assert_eq!(with_taint(&on, true), None, "already there");
        assert_eq!(with_taint(&on, false), Some(others.clone()));
        assert_eq!(with_taint(&others, false), None, "not ours to remove");
    }
}

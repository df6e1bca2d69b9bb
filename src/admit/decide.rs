//! Pure: one Pod, one decision: what /dev/shm its containers get, as a JSON Patch (mutate) or
//! as warnings (warn). A container is short where preflight would say so (`view`), and the
//! patch gives exactly what makes preflight pass.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use serde_json::{json, Value};

use super::pod::{self, Container, Role};
use super::view::{is_short, shm_short, view_of, PodNeed};
use super::{Mode, Outcome};
use crate::preflight::need::{gpu_default_bytes, need, NeedSpec};
use crate::units::{k8s_quantity, k8s_quantity_exact, parse_quantity_bytes, MIB};

/// What the webhook does to one Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// RFC 6902, paths into the Pod as it came (empty unless mutated).
    pub patch: Vec<PatchOperation>,
    /// For the user who created the Pod (kubectl prints them).
    pub warnings: Vec<String>,
    /// One line for the log.
    pub summary: String,
}

impl Decision {
    /// Nothing changed and nothing to say.
    pub fn quiet(outcome: Outcome, summary: impl Into<String>) -> Decision {
        Decision {
            outcome,
            patch: Vec::new(),
            warnings: Vec::new(),
            summary: summary.into(),
        }
    }
}

/// The size the Pod's /dev/shm gets: its bytes and the text written into the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Size {
    pub bytes: u64,
    pub text: String,
}

/// The size: the annotation when set and valid (its own text), else what a `shmlink preflight`
/// the Pod runs asks for (`--min-shm`, the sizing helper), else the GPU default for the Pod's
/// largest GPU count. An invalid annotation is a warning.
pub fn size(pod: &Value, warnings: &mut Vec<String>) -> Size {
    size_for(pod, &PodNeed::of(pod), warnings)
}

fn size_for(pod: &Value, need_of: &PodNeed, warnings: &mut Vec<String>) -> Size {
    let gpus = need_of.gpus.min(1 << 16) as usize;
    // What a preflight the Pod runs will ask for (the annotation, read below, overrides it).
    let bytes = match need_of.spec {
        NeedSpec::Unspecified => gpu_default_bytes(gpus),
        spec => need(spec, gpus).map_or(gpu_default_bytes(gpus), |n| {
            n.bytes.div_ceil(MIB).max(1) * MIB
        }),
    };
    let computed = Size {
        bytes,
        text: k8s_quantity(bytes),
    };
    let Some(text) = pod::annotation(pod, pod::SIZE_ANNOTATION) else {
        return computed;
    };
    match parse_quantity_bytes(text) {
        Ok(bytes) if bytes > 0 => Size {
            bytes,
            text: text.to_string(),
        },
        Ok(_) => {
            warnings.push(bad_annotation(text, "zero", &computed.text));
            computed
        }
        Err(e) => {
            warnings.push(bad_annotation(text, e.why, &computed.text));
            computed
        }
    }
}

fn bad_annotation(text: &str, why: &str, used: &str) -> String {
    let shown: String = text.chars().take(64).collect();
    format!(
        "shmlink: annotation {}: {shown:?} is not a Kubernetes quantity of bytes ({why}); using {used}",
        pod::SIZE_ANNOTATION
    )
}

/// The decision for `pod` in `mode`.
pub fn decide(pod: &Value, mode: Mode) -> Decision {
    if mode == Mode::Off {
        return Decision::quiet(Outcome::OptedOut, "mode off");
    }
    if pod::annotation(pod, pod::ADMISSION_ANNOTATION) == Some("off") {
        return Decision::quiet(Outcome::OptedOut, "annotation shmlink.io/admission: off");
    }
    if pod::host_ipc(pod) {
        return Decision::quiet(Outcome::HostIpc, "hostIPC: the node's /dev/shm");
    }
    let all = pod::containers(pod);
    let targets = targets(pod, &all);
    if targets.is_empty() {
        return Decision::quiet(Outcome::NoGpu, "no container uses GPUs");
    }
    if pod::volume(pod, pod::VOLUME).is_some() {
        return Decision::quiet(Outcome::Fit, "already has shmlink-dshm (reinvocation)");
    }
    let mut warnings = Vec::new();
    let need = PodNeed::of(pod);
    let size = size_for(pod, &need, &mut warnings);
    let mut short = Vec::new();
    for c in targets {
        let view = view_of(pod, &c, &need);
        if !is_short(&view) {
            continue;
        }
        match pod::shm_mount(c.value) {
            Some(mount) => warnings.extend(existing_short(pod, &c, mount, &size, shm_short(&view))),
            None => short.push(c),
        }
    }
    if short.is_empty() {
        let outcome = if warnings.is_empty() {
            Outcome::Fit
        } else {
            Outcome::Warned
        };
        let summary = format!("{} warning(s), nothing to add", warnings.len());
        return Decision {
            outcome,
            patch: Vec::new(),
            warnings,
            summary,
        };
    }
    let names = short.iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
    match mode {
        Mode::Mutate => {
            let (patch, added) = mutate(pod, &short, &size);
            warnings.extend(added);
            let summary = format!("mounted {} at /dev/shm in {names}", size.text);
            Decision {
                outcome: Outcome::Mutated,
                patch,
                warnings,
                summary,
            }
        }
        _ => {
            warnings.extend(short.iter().map(|c| warn_text(c, &size)));
            let summary = format!("warned: {names} without {} at /dev/shm", size.text);
            Decision {
                outcome: Outcome::Warned,
                patch: Vec::new(),
                warnings,
                summary,
            }
        }
    }
}

/// The containers that should see the Pod's /dev/shm: GPU containers (regular, sidecar or
/// init); plain init containers that run `shmlink preflight` (they must see what the container
/// they check for will); with the size annotation and no GPU container, every regular one.
fn targets<'a>(pod: &Value, all: &[Container<'a>]) -> Vec<Container<'a>> {
    let uses_gpus = all.iter().any(|c| pod::gpus(c.value) > 0);
    let annotated = pod::annotation(pod, pod::SIZE_ANNOTATION).is_some();
    if !uses_gpus && !annotated {
        return Vec::new();
    }
    all.iter()
        .filter(|c| {
            pod::gpus(c.value) > 0
                || (c.role == Role::Init && pod::runs_preflight(c.value))
                || (!uses_gpus && c.role == Role::Regular)
        })
        .copied()
        .collect()
}

/// The warning (either mode) for a container whose own /dev/shm mount preflight finds short:
/// the webhook never replaces a mount the user made.
fn existing_short(
    pod: &Value,
    c: &Container<'_>,
    mount: &Value,
    size: &Size,
    tmpfs_short: bool,
) -> Option<String> {
    let name = mount.get("name").and_then(Value::as_str).unwrap_or("");
    let limit = pod::volume(pod, name).and_then(pod::memory_empty_dir_limit)?;
    let what = if tmpfs_short {
        format!(
            "its emptyDir {name:?} at /dev/shm has sizeLimit {}, below the {} it needs: raise sizeLimit to {}",
            limit.unwrap_or("(none)"),
            size.text,
            size.text
        )
    } else {
        format!(
            "its memory limit leaves less than the {} its emptyDir {name:?} at /dev/shm needs",
            size.text
        )
    };
    Some(format!(
        "shmlink: container {:?} uses GPUs; {what} and add {} to its memory limit",
        c.name, size.text
    ))
}

/// Warn mode's text for a container on the runtime's /dev/shm (the ValidatingAdmissionPolicy
/// prints the same for GPU containers).
pub fn warn_text(c: &Container<'_>, size: &Size) -> String {
    let s = &size.text;
    if pod::gpus(c.value) > 0 {
        format!(
            "shmlink: container {:?} uses GPUs and gets the runtime's 64Mi /dev/shm: DataLoader workers die with \"Bus error\", NCCL fails. Fix: mount an emptyDir (medium: Memory, sizeLimit: {s}) at /dev/shm and add {s} to its memory limit",
            c.name
        )
    } else {
        format!(
            "shmlink: container {:?} gets the runtime's 64Mi /dev/shm, less than the {s} this Pod needs. Fix: mount an emptyDir (medium: Memory, sizeLimit: {s}) at /dev/shm and add {s} to its memory limit",
            c.name
        )
    }
}

/// The patch and its warnings: the volume once, a mount and a raised memory limit per short
/// container, the Pod-level memory once.
fn mutate(pod: &Value, short: &[Container<'_>], size: &Size) -> (Vec<PatchOperation>, Vec<String>) {
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    let volume = json!({"name": pod::VOLUME,
                        "emptyDir": {"medium": "Memory", "sizeLimit": size.text}});
    let volumes = pod.pointer("/spec/volumes");
    append(&mut ops, volumes, strings(&["spec", "volumes"]), volume);
    let pod_level = pod::pod_resources(pod);
    let guaranteed = pod::guaranteed(pod);
    for c in short {
        let index = c.index.to_string();
        let mount = json!({"name": pod::VOLUME, "mountPath": pod::SHM_PATH});
        let mounts = strings(&["spec", c.list, &index, "volumeMounts"]);
        append(&mut ops, c.value.get("volumeMounts"), mounts, mount);
        let resources = c.value.get("resources");
        let at = |which: &str| strings(&["spec", c.list, &index, "resources", which, "memory"]);
        let limit = raise(&mut ops, resources, "limits", at("limits"), size);
        // Container requests stay within the Pod-level ones; they move only to keep a
        // container-level Guaranteed Pod Guaranteed.
        let request = (pod_level.is_none() && guaranteed)
            .then(|| raise(&mut ops, resources, "requests", at("requests"), size))
            .flatten();
        warnings.push(mounted_text(c.name, size, limit, request));
    }
    if let Some(r) = pod_level {
        let at = |which: &str| strings(&["spec", "resources", which, "memory"]);
        let limit = raise(&mut ops, Some(r), "limits", at("limits"), size);
        let request = guaranteed
            .then(|| raise(&mut ops, Some(r), "requests", at("requests"), size))
            .flatten();
        if let Some(limit) = limit {
            let also = request.map_or(String::new(), |(a, b)| format!(", request {a} -> {b}"));
            warnings.push(format!(
                "shmlink: Pod memory limit {} -> {}{also} (spec.resources): the tmpfs pages of {:?} count against it",
                limit.0,
                limit.1,
                pod::VOLUME
            ));
        }
    }
    (ops, warnings)
}

/// Replaces `resources.{which}.memory` with itself plus the size; the old and new texts.
fn raise(
    ops: &mut Vec<PatchOperation>,
    resources: Option<&Value>,
    which: &str,
    path: Vec<String>,
    size: &Size,
) -> Option<(String, String)> {
    let old = pod::memory_text(resources, which)?;
    let bytes = parse_quantity_bytes(old).ok()?;
    let new = k8s_quantity_exact(bytes.saturating_add(size.bytes));
    ops.push(PatchOperation::Replace(ReplaceOperation {
        path: PointerBuf::from_tokens(path),
        value: Value::String(new.clone()),
    }));
    Some((old.to_string(), new))
}

/// Adds `item` to the array at `path` (`existing`), or the array itself when there is none.
fn append(
    ops: &mut Vec<PatchOperation>,
    existing: Option<&Value>,
    mut path: Vec<String>,
    item: Value,
) {
    let value = if existing.is_some_and(Value::is_array) {
        path.push("-".to_string());
        item
    } else {
        Value::Array(vec![item])
    };
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(path),
        value,
    }));
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn mounted_text(
    name: &str,
    size: &Size,
    limit: Option<(String, String)>,
    request: Option<(String, String)>,
) -> String {
    let memory = match (limit, request) {
        (Some((a, b)), Some((c, d))) => format!(
            "memory limit {a} -> {b}, request {c} -> {d} (stays Guaranteed): tmpfs pages count against it"
        ),
        (Some((a, b)), None) => format!("memory limit {a} -> {b}: tmpfs pages count against it"),
        (None, _) => "no memory limit of its own to raise".to_string(),
    };
    format!(
        "shmlink: mounted emptyDir {:?} (medium: Memory, sizeLimit: {}) at /dev/shm in {name:?}; {memory}",
        pod::VOLUME,
        size.text
    )
}

#[cfg(test)]
mod tests;

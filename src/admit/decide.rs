//! Pure: one Pod, one decision: what /dev/shm its containers get, as a JSON Patch (mutate) or
//! as warnings (warn). A container is short where preflight would say so (`view`), and the
//! patch gives exactly what makes preflight pass.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use serde_json::{json, Value};

use super::pod::{self, Container, Role, SizeAnnotation};
use super::view::{is_short, preflight_need_spec, shm_short, view_of, PodNeed};
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

/// The size: the annotation when set and taken (`pod::read_size`: a quantity of at least 1Mi;
/// its own text), else what a `shmlink preflight` the Pod runs asks for (`--min-shm`, the
/// sizing helper), else the GPU default for the Pod's largest GPU count. An annotation not
/// taken is a warning, and so is one below what the Pod's own preflight asks for.
pub fn size(pod: &Value, warnings: &mut Vec<String>) -> Size {
    size_for(pod, &PodNeed::of(pod), warnings)
}

fn size_for(pod: &Value, need_of: &PodNeed, warnings: &mut Vec<String>) -> Size {
    let gpus = need_of.gpus.min(1 << 16) as usize;
    // What a preflight the Pod runs will ask for (the annotation, read below, overrides it).
    let bytes = match need_of.spec {
        NeedSpec::Unspecified => gpu_default_bytes(gpus),
        spec => need_bytes(spec, gpus),
    };
    let computed = Size {
        bytes,
        text: k8s_quantity(bytes),
    };
    match pod::shm_size(pod) {
        None => computed,
        Some(SizeAnnotation::Taken { bytes, text }) => {
            // Below what the Pod's own preflight asks, the mount would fail it.
            let asked = match preflight_need_spec(pod) {
                NeedSpec::Unspecified => 0,
                spec => need_bytes(spec, gpus),
            };
            if bytes < asked {
                warnings.push(format!(
                    "shmlink: annotation {}: {text:?} is below the {} the Pod's own `shmlink preflight` asks for: preflight will fail on it; raise the annotation to {}",
                    pod::SIZE_ANNOTATION,
                    k8s_quantity(asked),
                    k8s_quantity(asked)
                ));
            }
            Size {
                bytes,
                text: text.to_string(),
            }
        }
        Some(SizeAnnotation::Refused { text, why }) => {
            let shown: String = text.chars().take(64).collect();
            warnings.push(format!(
                "shmlink: annotation {}: {shown:?} {why}; using {}",
                pod::SIZE_ANNOTATION,
                computed.text
            ));
            computed
        }
    }
}

/// What preflight asks for `spec` with `gpus`, rounded up to a whole MiB (the GPU default
/// where the spec does not read).
fn need_bytes(spec: NeedSpec, gpus: usize) -> u64 {
    need(spec, gpus).map_or(gpu_default_bytes(gpus), |n| {
        n.bytes.div_ceil(MIB).max(1) * MIB
    })
}

/// Containers judged at most: a Pod with more is admitted unchanged, with one warning (judging
/// each costs a preflight verdict, and patching thousands an answer of megabytes).
pub const MAX_CONTAINERS: usize = 128;

/// What nothing is done for, whatever the containers: mode off, opted out, host IPC.
fn left_alone(pod: &Value, mode: Mode) -> Option<Decision> {
    if mode == Mode::Off {
        return Some(Decision::quiet(Outcome::OptedOut, "mode off"));
    }
    if pod::annotation(pod, pod::ADMISSION_ANNOTATION) == Some("off") {
        return Some(Decision::quiet(
            Outcome::OptedOut,
            "annotation shmlink.io/admission: off",
        ));
    }
    if pod::host_ipc(pod) {
        return Some(Decision::quiet(
            Outcome::HostIpc,
            "hostIPC: the node's /dev/shm",
        ));
    }
    None
}

/// The decision for a Pod too large to read whole (`parse::BUDGET`), of which only the names,
/// annotations and `containers` (init containers included) are known: left alone as any Pod
/// is, else admitted unchanged with one warning.
pub fn unjudged(pod: &Value, mode: Mode, containers: u64) -> Decision {
    left_alone(pod, mode).unwrap_or_else(|| not_judged(containers))
}

/// One warning, no patch: the Pod is too large to judge.
fn not_judged(containers: u64) -> Decision {
    let what = if containers > MAX_CONTAINERS as u64 {
        format!("has {containers} containers, more than the {MAX_CONTAINERS} the webhook judges")
    } else {
        format!(
            "is larger than the webhook reads ({} MiB of the fields it looks at)",
            super::parse::BUDGET >> 20
        )
    };
    Decision {
        outcome: Outcome::Warned,
        patch: Vec::new(),
        warnings: vec![format!(
            "shmlink: this Pod {what}: admitted unchanged. Run `shmlink preflight` in its GPU containers to check their /dev/shm"
        )],
        summary: format!("not judged: the Pod {what}"),
    }
}

/// The decision for `pod` in `mode`.
pub fn decide(pod: &Value, mode: Mode) -> Decision {
    if let Some(quiet) = left_alone(pod, mode) {
        return quiet;
    }
    let all = pod::containers(pod);
    if all.len() > MAX_CONTAINERS {
        return not_judged(all.len() as u64);
    }
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

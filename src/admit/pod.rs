//! Pure: what a Pod (the JSON the API server sends, kept whole as a `serde_json::Value`) says
//! about its GPUs, its /dev/shm and its memory. Every reader is total: a field of the wrong type
//! reads as absent, never as a panic.

use serde_json::Value;

use crate::units::{parse_quantity_bytes, parse_quantity_scaled, MIB};

/// Pod annotation: the /dev/shm size to give, overriding the computed one.
pub const SIZE_ANNOTATION: &str = "shmlink.io/shm-size";
/// Pod annotation: `off` leaves the Pod alone.
pub const ADMISSION_ANNOTATION: &str = "shmlink.io/admission";
/// The volume the webhook adds; its presence marks a Pod already mutated.
pub const VOLUME: &str = "shmlink-dshm";
pub const SHM_PATH: &str = "/dev/shm";

/// Where a container runs in the Pod's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `spec.containers`.
    Regular,
    /// `spec.initContainers` with `restartPolicy: Always`: runs beside the regular ones.
    Sidecar,
    /// A plain init container: runs to completion before the others start.
    Init,
}

/// One container of the Pod, with its place in the spec (for the patch's paths).
#[derive(Debug, Clone, Copy)]
pub struct Container<'a> {
    /// `containers` or `initContainers`.
    pub list: &'static str,
    pub index: usize,
    pub name: &'a str,
    pub role: Role,
    pub value: &'a Value,
}

/// The init containers, then the regular ones, in spec order.
pub fn containers(pod: &Value) -> Vec<Container<'_>> {
    let mut all = Vec::new();
    for list in ["initContainers", "containers"] {
        let items = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array);
        for (index, value) in items.into_iter().flatten().enumerate() {
            // Not a container: nothing to read, and no path a patch could add under.
            if !value.is_object() {
                continue;
            }
            let role = match list {
                "containers" => Role::Regular,
                _ if value.get("restartPolicy").and_then(Value::as_str) == Some("Always") => {
                    Role::Sidecar
                }
                _ => Role::Init,
            };
            all.push(Container {
                list,
                index,
                name: value.get("name").and_then(Value::as_str).unwrap_or(""),
                role,
                value,
            });
        }
    }
    all
}

/// A Pod annotation's text.
pub fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// The size annotation, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeAnnotation<'a> {
    /// Taken: its bytes and its own text.
    Taken { bytes: u64, text: &'a str },
    /// Not taken: its text and why (the words after it, `read_size`'s).
    Refused { text: &'a str, why: String },
}

/// The size annotation of `pod`, when it has one.
pub fn shm_size(pod: &Value) -> Option<SizeAnnotation<'_>> {
    let text = annotation(pod, SIZE_ANNOTATION)?;
    Some(match read_size(text) {
        Ok(bytes) => SizeAnnotation::Taken { bytes, text },
        Err(why) => SizeAnnotation::Refused { text, why },
    })
}

/// Pure: a size annotation's bytes, or why it is not taken as one (the words after the text).
/// A Kubernetes quantity of at least 1Mi: `512m` is 0.512 bytes to Kubernetes (milli), not
/// Docker's 512 MiB, and a few KiB of /dev/shm is a unit left out, never what a GPU Pod means.
pub fn read_size(text: &str) -> Result<u64, String> {
    let bytes = parse_quantity_bytes(text)
        .map_err(|e| format!("is not a Kubernetes quantity of bytes ({})", e.why))?;
    let fraction = [("m", "milli"), ("u", "micro"), ("n", "nano")]
        .into_iter()
        .find(|(suffix, _)| text.ends_with(suffix));
    if let Some((suffix, name)) = fraction {
        let number = text.trim_end_matches(suffix);
        return Err(format!(
            "is {number} {name}bytes to Kubernetes (`{suffix}` is {name}), not {number} MiB as Docker reads it: write {number}Mi"
        ));
    }
    if bytes == 0 {
        return Err("is not a Kubernetes quantity of bytes (zero)".to_string());
    }
    if bytes < MIB {
        return Err(format!(
            "is {bytes} bytes, less than 1Mi: a unit left out? (e.g. {text}Mi)"
        ));
    }
    Ok(bytes)
}

pub fn host_ipc(pod: &Value) -> bool {
    pod.pointer("/spec/hostIPC").and_then(Value::as_bool) == Some(true)
}

/// The container's GPU count: the largest quantity of a resource named `*/gpu` in its requests
/// or limits (device plugins' `nvidia.com/gpu`, `amd.com/gpu`, ...), or the GPUs its DRA claims
/// give (`super::dra`, attached by the server's lookup), whichever is more.
pub fn gpus(container: &Value) -> u64 {
    let plugin = ["requests", "limits"]
        .iter()
        .filter_map(|which| container.get("resources")?.get(which)?.as_object())
        .flatten()
        .filter(|(name, _)| name.ends_with("/gpu"))
        .filter_map(|(_, q)| match q {
            Value::String(s) => parse_quantity_bytes(s).ok(),
            other => other.as_u64(),
        })
        .max()
        .unwrap_or(0);
    let dra = container
        .get(super::dra::DRA_GPUS_KEY)
        .and_then(Value::as_u64)
        .unwrap_or(0);
    plugin.max(dra)
}

/// The container's volume mount that decides what it sees at /dev/shm: one at `/dev/shm` (or
/// `/dev/shm/`), or one over all of `/dev`.
pub fn shm_mount(container: &Value) -> Option<&Value> {
    container.get("volumeMounts")?.as_array()?.iter().find(|m| {
        let path = m.get("mountPath").and_then(Value::as_str).unwrap_or("");
        let path = path.trim_end_matches('/');
        path == SHM_PATH || path == "/dev"
    })
}

/// The Pod's volume named `name`.
pub fn volume<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod.pointer("/spec/volumes")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
}

/// A memory-backed emptyDir's sizeLimit: `Some(None)` when it has none (the node's memory
/// bounds it), `None` when the volume is not a memory-backed emptyDir.
pub fn memory_empty_dir_limit(volume: &Value) -> Option<Option<&str>> {
    let dir = volume.get("emptyDir")?;
    (dir.get("medium").and_then(Value::as_str) == Some("Memory"))
        .then(|| dir.get("sizeLimit").and_then(Value::as_str))
}

/// Whether the container runs `shmlink preflight` (its command and args, as words or in one
/// shell line): it must see the /dev/shm of the container it checks for.
pub fn runs_preflight(container: &Value) -> bool {
    preflight_options(container).is_some()
}

/// The options a container passes to `shmlink preflight` (the words after `preflight`, up to a
/// shell separator), plus `--min-shm` from its `SHMLINK_MIN_SHM` env when the words have none;
/// `None` when it does not run preflight.
pub fn preflight_options(container: &Value) -> Option<Vec<String>> {
    let words: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| container.get(k)?.as_array())
        .flatten()
        .filter_map(Value::as_str)
        .flat_map(str::split_whitespace)
        .collect();
    let at = words
        .windows(2)
        .position(|w| w[0].ends_with("shmlink") && w[1] == "preflight")?;
    let mut options: Vec<String> = words[at + 2..]
        .iter()
        .take_while(|w| !matches!(**w, "&&" | "||" | ";" | "|" | "&"))
        .map(|w| w.trim_end_matches(';').to_string())
        .collect();
    let env_min = container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|e| e.get("name").and_then(Value::as_str) == Some("SHMLINK_MIN_SHM"))
        .and_then(|e| e.get("value")?.as_str());
    if let Some(min) = env_min {
        if !options.iter().any(|o| o.starts_with("--min-shm")) {
            options.extend(["--min-shm".to_string(), min.to_string()]);
        }
    }
    Some(options)
}

/// `resources.{which}.memory` of a container (or of `spec.resources`): its text.
pub fn memory_text<'a>(resources: Option<&'a Value>, which: &str) -> Option<&'a str> {
    resources?.get(which)?.get("memory")?.as_str()
}

/// The Pod-level `spec.resources`, when it sets requests or limits.
pub fn pod_resources(pod: &Value) -> Option<&Value> {
    let r = pod.pointer("/spec/resources")?;
    let set = |k: &str| {
        r.get(k)
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    };
    (set("requests") || set("limits")).then_some(r)
}

/// Kubernetes' QoS class is Guaranteed (its `GetPodQOS`): from the Pod-level resources when set,
/// else every container (init and regular) has positive cpu and memory limits and, summed over
/// the containers, the cpu and memory requests equal the limits. A quantity that does not read
/// makes it not Guaranteed: the webhook then raises limits only, which keeps any class valid.
pub fn guaranteed(pod: &Value) -> bool {
    let mut requests = Sums::default();
    let mut limits = Sums::default();
    if let Some(r) = pod_resources(pod) {
        let ok = requests.add(r.get("requests")) && limits.add(r.get("limits"));
        return ok && limits.has_both() && requests.within(&limits);
    }
    let all = containers(pod);
    if all.is_empty() {
        return false;
    }
    for c in &all {
        let r = c.value.get("resources");
        let mut own = Sums::default();
        let ok = requests.add(r.and_then(|r| r.get("requests")))
            && own.add(r.and_then(|r| r.get("limits")))
            && limits.add(r.and_then(|r| r.get("limits")));
        if !ok || !own.has_both() {
            return false;
        }
    }
    requests.within(&limits)
}

/// cpu and memory summed in thousandths, only positive quantities counted (as Kubernetes does).
#[derive(Default)]
struct Sums {
    cpu: Option<u128>,
    memory: Option<u128>,
}

impl Sums {
    /// Adds a resource list; false when a cpu or memory quantity does not read.
    fn add(&mut self, list: Option<&Value>) -> bool {
        let Some(map) = list.and_then(Value::as_object) else {
            return true;
        };
        for (name, slot) in [("cpu", &mut self.cpu), ("memory", &mut self.memory)] {
            let Some(q) = map.get(name) else { continue };
            let Some(milli) = q.as_str().and_then(|s| parse_quantity_scaled(s, 3).ok()) else {
                return false;
            };
            if milli > 0 {
                *slot = Some(slot.unwrap_or(0).saturating_add(milli));
            }
        }
        true
    }

    fn has_both(&self) -> bool {
        self.cpu.is_some() && self.memory.is_some()
    }

    /// Requests equal the limits, resource by resource (a request without a limit fails).
    fn within(&self, limits: &Sums) -> bool {
        self.cpu == limits.cpu && self.memory == limits.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: Value, init: Value) -> Value {
        json!({"spec": {"containers": containers, "initContainers": init}})
    }

    #[test]
    fn containers_keep_their_index_and_skip_what_is_not_one() {
        let p = pod(
            json!([{"name": "a"}, "junk", {"name": "c"}]),
            json!([{"name": "i"}, {"name": "s", "restartPolicy": "Always"}]),
        );
        let got: Vec<_> = containers(&p)
            .iter()
            .map(|c| (c.list, c.index, c.name, c.role))
            .collect();
        assert_eq!(
            got,
            [
                ("initContainers", 0, "i", Role::Init),
                ("initContainers", 1, "s", Role::Sidecar),
                ("containers", 0, "a", Role::Regular),
                ("containers", 2, "c", Role::Regular),
            ]
        );
    }

    #[test]
    fn gpus_are_the_largest_gpu_quantity() {
        let c = json!({"resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "64"},
                                     "requests": {"amd.com/gpu": "2"}}});
        assert_eq!(gpus(&c), 8);
        assert_eq!(
            gpus(&json!({"resources": {"limits": {"nvidia.com/gpu": "0"}}})),
            0
        );
        assert_eq!(
            gpus(&json!({"resources": {"limits": {"nvidia.com/gpus": "4"}}})),
            0
        );
        assert_eq!(gpus(&json!({"resources": {"limits": {"x.io/gpu": 3}}})), 3);
        assert_eq!(
            gpus(&json!({"resources": {"limits": {"x.io/gpu": "lots"}}})),
            0
        );
        assert_eq!(gpus(&json!({"resources": 5})), 0);
    }

    #[test]
    fn shm_mounts_include_a_trailing_slash_and_all_of_dev() {
        let m = |p: &str| json!({"volumeMounts": [{"name": "v", "mountPath": p}]});
        assert!(shm_mount(&m("/dev/shm")).is_some());
        assert!(shm_mount(&m("/dev/shm/")).is_some());
        assert!(shm_mount(&m("/dev")).is_some());
        assert!(shm_mount(&m("/dev/shm/x")).is_none());
        assert!(shm_mount(&m("/data")).is_none());
    }

    #[test]
    fn a_size_annotation_is_a_quantity_of_at_least_a_mebibyte() {
        assert_eq!(read_size("8Gi"), Ok(8 << 30));
        assert_eq!(read_size("1Mi"), Ok(MIB));
        assert_eq!(read_size("2e9"), Ok(2_000_000_000));
        let refused = |t: &str| read_size(t).unwrap_err();
        assert_eq!(
            refused("512m"),
            "is 512 millibytes to Kubernetes (`m` is milli), not 512 MiB as Docker reads it: write 512Mi"
        );
        assert!(refused("1500u").starts_with("is 1500 microbytes"));
        assert_eq!(
            refused("4096"),
            "is 4096 bytes, less than 1Mi: a unit left out? (e.g. 4096Mi)"
        );
        assert!(refused("900Ki").starts_with("is 921600 bytes, less than 1Mi"));
        assert_eq!(refused("0"), "is not a Kubernetes quantity of bytes (zero)");
        assert!(refused("8gb").starts_with("is not a Kubernetes quantity of bytes"));
        let pod = json!({"metadata": {"annotations": {SIZE_ANNOTATION: "512m"}}});
        assert!(matches!(
            shm_size(&pod),
            Some(SizeAnnotation::Refused { text: "512m", .. })
        ));
        assert_eq!(shm_size(&json!({})), None);
    }

    #[test]
    fn preflight_is_found_in_words_or_a_shell_line() {
        assert!(runs_preflight(
            &json!({"command": ["/shmlink", "preflight", "--min-shm", "1Gi"]})
        ));
        assert!(runs_preflight(
            &json!({"command": ["sh", "-c"], "args": ["shmlink preflight && echo ok"]})
        ));
        assert!(!runs_preflight(
            &json!({"command": ["python", "preflight.py"]})
        ));
        assert!(!runs_preflight(&json!({"command": "shmlink preflight"})));
    }

    #[test]
    fn qos_follows_kubernetes_rules() {
        let full = |cpu: &str, mem: &str| {
            json!({"resources": {"limits": {"cpu": cpu, "memory": mem},
                                 "requests": {"cpu": cpu, "memory": mem}}})
        };
        assert!(guaranteed(&pod(json!([full("4", "8Gi")]), json!([]))));
        assert!(guaranteed(&pod(
            json!([full("4", "8Gi")]),
            json!([full("500m", "1Gi")])
        )));
        // Requests equal to limits written differently are still equal.
        let mixed = json!({"resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                          "requests": {"cpu": "1000m", "memory": "1073741824"}}});
        assert!(guaranteed(&pod(json!([mixed]), json!([]))));
        let burstable = json!({"resources": {"limits": {"cpu": "4", "memory": "8Gi"},
                                              "requests": {"cpu": "2", "memory": "8Gi"}}});
        assert!(!guaranteed(&pod(json!([burstable]), json!([]))));
        let no_cpu = json!({"resources": {"limits": {"memory": "8Gi"},
                                           "requests": {"memory": "8Gi"}}});
        assert!(!guaranteed(&pod(
            json!([full("4", "8Gi"), no_cpu]),
            json!([])
        )));
        assert!(!guaranteed(&pod(json!([{}]), json!([]))));
        assert!(!guaranteed(&json!({})));
        // Pod-level resources decide when set.
        let pl = json!({"spec": {"resources": {"limits": {"cpu": "8", "memory": "64Gi"},
                                               "requests": {"cpu": "8", "memory": "64Gi"}},
                                 "containers": [{}]}});
        assert!(guaranteed(&pl));
        let pl_burst = json!({"spec": {"resources": {"limits": {"memory": "64Gi"}},
                                       "containers": [full("1", "1Gi")]}});
        assert!(!guaranteed(&pl_burst));
    }
}

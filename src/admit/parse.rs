//! Pure: an AdmissionReview's JSON read into the little of it a decision looks at, in memory
//! bounded whatever the body holds. A `serde_json::Value` of a whole Pod costs 30 to 50 times
//! its text (a map, a string and a node per field); the webhook keeps only the fields `review`
//! and `decide` read ([`REVIEW`]), skips the rest as it parses (annotations but its own two,
//! `managedFields`, `status`, probes, ...), and stops keeping once the kept part would pass
//! [`BUDGET`]: then [`head`] reads again only the request's names and counts the containers,
//! so the answer can still say what it could not judge.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::Cell;
use std::fmt;

use super::pod;

/// What of one JSON node is kept.
#[derive(Clone, Copy)]
pub enum Keep {
    /// The whole node.
    All,
    /// An object's listed keys (each by its own rule; the rest skipped); an array's elements,
    /// each by this same rule; a scalar as it is.
    Only(&'static [(&'static str, Keep)]),
    /// An array's elements read by the rule, then only those the test keeps (their places in
    /// the array are not used).
    Filter(fn(&Value) -> bool, &'static Keep),
    /// An array's length, as a number; its elements skipped.
    Count,
}

use Keep::{All, Count, Filter, Only};

/// The kept part's estimated size at most, in bytes (each node and map entry counted at what
/// it costs, strings at their length): ample for a Pod of 128 containers with long command
/// lines, far below a Pod that would take the webhook's memory.
pub const BUDGET: usize = 2 << 20;

// `claims`: the DRA claims a container uses (`dra.rs`).
const RESOURCES: Keep = Only(&[("requests", All), ("limits", All), ("claims", All)]);
const CONTAINER: Keep = Only(&[
    ("name", All),
    ("restartPolicy", All),
    ("resources", RESOURCES),
    (
        "volumeMounts",
        Filter(at_shm, &Only(&[("name", All), ("mountPath", All)])),
    ),
    ("command", All),
    ("args", All),
    (
        "env",
        Filter(min_shm_env, &Only(&[("name", All), ("value", All)])),
    ),
]);
const VOLUME: Keep = Only(&[
    ("name", All),
    ("emptyDir", Only(&[("medium", All), ("sizeLimit", All)])),
]);
const METADATA: Keep = Only(&[
    ("name", All),
    ("generateName", All),
    ("namespace", All),
    (
        "annotations",
        Only(&[
            (pod::SIZE_ANNOTATION, All),
            (pod::ADMISSION_ANNOTATION, All),
        ]),
    ),
]);
const POD: Keep = Only(&[
    ("metadata", METADATA),
    (
        "spec",
        Only(&[
            ("hostIPC", All),
            ("containers", CONTAINER),
            ("initContainers", CONTAINER),
            ("volumes", Filter(shm_volume, &VOLUME)),
            ("resources", RESOURCES),
            ("resourceClaims", All),
        ]),
    ),
]);
const REQUEST: Keep = Only(&[
    ("uid", All),
    ("kind", All),
    ("resource", All),
    ("subResource", All),
    ("operation", All),
    ("namespace", All),
    ("object", POD),
]);
/// What `review::answer` and `decide` read of an AdmissionReview.
pub const REVIEW: Keep = Only(&[("apiVersion", All), ("request", REQUEST)]);

/// The request's names and the Pod's container counts, when the rest is too large to keep.
const HEAD: Keep = Only(&[
    ("apiVersion", All),
    (
        "request",
        Only(&[
            ("uid", All),
            ("kind", All),
            ("resource", All),
            ("subResource", All),
            ("operation", All),
            ("namespace", All),
            (
                "object",
                Only(&[
                    ("metadata", METADATA),
                    (
                        "spec",
                        Only(&[
                            ("hostIPC", All),
                            ("containers", Count),
                            ("initContainers", Count),
                        ]),
                    ),
                ]),
            ),
        ]),
    ),
]);

/// A mount that decides what a container sees at /dev/shm (`pod::shm_mount`'s test).
fn at_shm(mount: &Value) -> bool {
    let path = mount.get("mountPath").and_then(Value::as_str).unwrap_or("");
    matches!(path.trim_end_matches('/'), pod::SHM_PATH | "/dev")
}

/// The one variable preflight takes its need from (`pod::preflight_options`).
fn min_shm_env(var: &Value) -> bool {
    var.get("name").and_then(Value::as_str) == Some("SHMLINK_MIN_SHM")
}

/// A volume the decision can look at: a memory emptyDir (what a mount at /dev/shm may be), or
/// the webhook's own (a reinvocation).
fn shm_volume(volume: &Value) -> bool {
    volume.get("name").and_then(Value::as_str) == Some(pod::VOLUME)
        || pod::memory_empty_dir_limit(volume).is_some()
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not JSON (serde_json's words).
    Json(String),
    /// JSON whose kept part passes the budget.
    TooLarge,
}

const OVER: &str = "the kept part passes its budget";

/// The review's kept part ([`REVIEW`]).
pub fn review(body: &[u8]) -> Result<Value, ParseError> {
    kept(body, REVIEW, BUDGET)
}

/// The review's names and counts ([`HEAD`]: `spec.containers` and `spec.initContainers` as
/// numbers), in memory of the order of the names' length.
pub fn head(body: &[u8]) -> Result<Value, ParseError> {
    kept(body, HEAD, BUDGET)
}

/// `body`'s nodes that `keep` keeps, at most `budget` estimated bytes of them.
pub fn kept(body: &[u8], keep: Keep, budget: usize) -> Result<Value, ParseError> {
    let left = Cell::new(budget);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Seed { keep, left: &left }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| {
        if left.get() == 0 && e.to_string().starts_with(OVER) {
            ParseError::TooLarge
        } else {
            ParseError::Json(e.to_string())
        }
    })
}

/// One node read by its rule, its cost taken from what is left.
#[derive(Clone, Copy)]
struct Seed<'a> {
    keep: Keep,
    left: &'a Cell<usize>,
}

/// What a node costs beyond its strings: a `Value` and its share of the map or vector.
const NODE: usize = 64;

impl Seed<'_> {
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(NODE + bytes) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.left.set(0);
                Err(E::custom(OVER))
            }
        }
    }

    fn child(&self, keep: Keep) -> Seed<'_> {
        Seed {
            keep,
            left: self.left,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.charge(0)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.charge(0)?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.charge(0)?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.charge(0)?;
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.charge(v.len())?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.charge(0)?;
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.charge(0)?;
        let (rule, test) = match self.keep {
            Count => {
                let mut n = 0u64;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                return Ok(Value::from(n));
            }
            Filter(test, rule) => (*rule, Some(test)),
            rule => (rule, None),
        };
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.child(rule))? {
            if test.is_none_or(|keeps| keeps(&item)) {
                items.push(item);
            } else {
                // What was charged for it is not held: given back.
                self.left.set(self.left.get() + estimate(&item));
            }
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.charge(0)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let rule = match self.keep {
                All => Some(All),
                Only(keys) => keys.iter().find(|(k, _)| *k == key).map(|(_, r)| *r),
                // A count or a filter of an object: nothing of it is asked for.
                Count | Filter(..) => None,
            };
            match rule {
                Some(rule) => {
                    self.charge(key.len())?;
                    let value = map.next_value_seed(self.child(rule))?;
                    out.insert(key.into_owned(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// What [`Seed`] charged for `v`.
fn estimate(v: &Value) -> usize {
    NODE + match v {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(estimate).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| NODE + k.len() + estimate(v)).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review_of(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "operation": "CREATE", "namespace": "ml",
                        "userInfo": {"username": "someone", "groups": ["a", "b"]},
                        "object": pod}
        }))
        .unwrap()
    }

    #[test]
    fn only_what_the_decision_reads_is_kept() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ml",
                         "annotations": {"shmlink.io/shm-size": "8Gi", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"containers": [{"name": "t", "image": "pytorch",
                        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "32Gi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                         {"name": "dshm", "mountPath": "/dev/shm/", "readOnly": false}],
                        "env": [{"name": "A", "value": "1"}, {"name": "SHMLINK_MIN_SHM", "value": "4Gi"}],
                        "livenessProbe": {"exec": {"command": ["true"]}}},
                       "junk"],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}],
                     "hostIPC": false, "nodeSelector": {"a": "b"}},
            "status": {"phase": "Pending"}
        });
        let kept = review(&review_of(pod)).unwrap();
        let expected = json!({
            "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "operation": "CREATE", "namespace": "ml",
                        "object": {
            "metadata": {"name": "p", "namespace": "ml", "annotations": {"shmlink.io/shm-size": "8Gi"}},
            "spec": {"containers": [{"name": "t",
                        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "32Gi"}},
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm/"}],
                        "env": [{"name": "SHMLINK_MIN_SHM", "value": "4Gi"}]},
                       "junk"],
                     "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}],
                     "hostIPC": false}}}
        });
        assert_eq!(kept, expected);
    }

    #[test]
    fn a_pod_past_the_budget_is_too_large_and_its_head_still_reads() {
        let containers: Vec<Value> = (0..20_000)
            .map(|i| json!({"name": format!("c{i}"), "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
            .collect();
        let body = review_of(json!({"metadata": {"name": "crowd"},
                                    "spec": {"containers": containers, "initContainers": [{"name": "i"}]}}));
        assert_eq!(review(&body), Err(ParseError::TooLarge));
        let head = head(&body).unwrap();
        assert_eq!(head["request"]["uid"], "u1");
        assert_eq!(head["request"]["object"]["metadata"]["name"], "crowd");
        assert_eq!(head["request"]["object"]["spec"]["containers"], 20_000);
        assert_eq!(head["request"]["object"]["spec"]["initContainers"], 1);
    }

    #[test]
    fn what_is_not_json_is_said_as_such_and_what_is_dropped_costs_nothing() {
        assert!(matches!(
            review(b"{\"request\": "),
            Err(ParseError::Json(_))
        ));
        assert!(matches!(review(b"{} trailing"), Err(ParseError::Json(_))));
        assert_eq!(review(b"[1, \"two\"]").unwrap(), json!([1, "two"]));
        // Skipped parts are never charged: a large ignored field passes a small budget.
        let big = json!({"request": {"uid": "u", "userInfo": {"extra": "x".repeat(100_000)}}});
        let body = serde_json::to_vec(&big).unwrap();
        assert_eq!(
            kept(&body, REVIEW, 1024).unwrap(),
            json!({"request": {"uid": "u"}})
        );
        // Filtered-out elements give back what they were charged.
        let envs: Vec<Value> = (0..1000)
            .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
            .collect();
        let pod = json!({"spec": {"containers": [{"name": "t", "env": envs}]}});
        assert!(kept(&review_of(pod), REVIEW, 4096).is_ok());
    }
}

//! Pure: this node's GPUs as DRA drivers publish them. A ResourceSlice lists devices by name
//! within a driver's pool; NVIDIA's driver names a GPU `gpu-<minor>` (the /dev/nvidia number,
//! not NVML's index) and gives its UUID as the `uuid` attribute, so a GPU is found by its UUID,
//! never by its name. v1 and v1beta2 slices have one shape (v1beta1's `basic` wrapper is read
//! too). Of a pool published in several slices only those of its highest generation count, as
//! the scheduler reads them. With MIG enabled on a GPU the driver lists its MIG devices instead,
//! each with the GPU's UUID as its `parentUUID` attribute: found by that, sorted by name.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::Value;

/// Where a device is: what a rule's `deviceSelector` names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceRef {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// The node's devices by UUID, and the MIG devices by their parent GPU's UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceIndex {
    by_uuid: HashMap<String, DeviceRef>,
    migs: HashMap<String, Vec<DeviceRef>>,
}

impl SliceIndex {
    /// From ResourceSlice objects as the API server returns them; slices of other nodes, and
    /// of older generations of a pool, are left out; so is anything malformed.
    pub fn from_slices<'a>(slices: impl IntoIterator<Item = &'a Value>, node: &str) -> SliceIndex {
        let ours: Vec<&Value> = slices
            .into_iter()
            .filter(|s| s["spec"]["nodeName"].as_str() == Some(node))
            .collect();
        // The highest generation of each (driver, pool).
        let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for s in &ours {
            if let Some((key, generation)) = pool_of(s) {
                let g = newest.entry(key).or_insert(generation);
                *g = (*g).max(generation);
            }
        }
        let mut by_uuid = HashMap::new();
        let mut migs: HashMap<String, Vec<DeviceRef>> = HashMap::new();
        for s in &ours {
            let Some((key, generation)) = pool_of(s) else {
                continue;
            };
            if newest.get(&key) != Some(&generation) {
                continue;
            }
            for d in s["spec"]["devices"].as_array().into_iter().flatten() {
                let attributes = d
                    .get("attributes")
                    .or_else(|| d.get("basic").and_then(|b| b.get("attributes")));
                let uuid = attributes.and_then(|a| a["uuid"]["string"].as_str());
                let parent = attributes.and_then(|a| a["parentUUID"]["string"].as_str());
                let (Some(uuid), Some(name)) = (uuid, d["name"].as_str()) else {
                    continue;
                };
                let device = DeviceRef {
                    driver: key.0.to_string(),
                    pool: key.1.to_string(),
                    device: name.to_string(),
                };
                if let Some(parent) = parent {
                    migs.entry(parent.to_string())
                        .or_default()
                        .push(device.clone());
                }
                by_uuid.entry(uuid.to_string()).or_insert(device);
            }
        }
        for list in migs.values_mut() {
            list.sort();
            list.dedup();
        }
        SliceIndex { by_uuid, migs }
    }

    /// The MIG devices of the GPU whose UUID is `parent`, by name.
    pub fn migs_of(&self, parent: &str) -> &[DeviceRef] {
        self.migs.get(parent).map_or(&[], Vec::as_slice)
    }

    /// The device whose `uuid` attribute is `uuid`.
    pub fn device_of(&self, uuid: &str) -> Option<&DeviceRef> {
        self.by_uuid.get(uuid)
    }

    pub fn len(&self) -> usize {
        self.by_uuid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uuid.is_empty()
    }
}

/// A slice's (driver, pool name) and pool generation.
fn pool_of(slice: &Value) -> Option<((&str, &str), i64)> {
    let spec = &slice["spec"];
    let driver = spec["driver"].as_str()?;
    let pool = spec["pool"]["name"].as_str()?;
    let generation = spec["pool"]["generation"].as_i64().unwrap_or(0);
    Some(((driver, pool), generation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixture(name: &str) -> Value {
        let path = format!("{}/tests/fixtures/dra/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn nvidias_slice_gives_each_gpu_by_uuid_in_v1_and_v1beta2() {
        for file in [
            "resourceslice-8gpu-v1.json",
            "resourceslice-8gpu-v1beta2.json",
        ] {
            let slice = fixture(file);
            let index = SliceIndex::from_slices([&slice], "gpu-node-7");
            assert_eq!(index.len(), 8, "{file}");
            assert_eq!(
                index.device_of("GPU-9fd4e962-e6f8-1e2c-d44e-5428ff708072"),
                Some(&DeviceRef {
                    driver: "gpu.nvidia.com".into(),
                    pool: "gpu-node-7".into(),
                    device: "gpu-7".into(),
                })
            );
            assert_eq!(SliceIndex::from_slices([&slice], "gpu-node-8").len(), 0);
        }
    }

    #[test]
    fn only_the_newest_generation_of_a_pool_counts_and_odd_slices_are_skipped() {
        let mut old = fixture("resourceslice-8gpu-v1.json");
        let mut new = old.clone();
        new["spec"]["pool"]["generation"] = json!(2);
        new["spec"]["devices"] = json!([{"name": "gpu-9",
            "attributes": {"uuid": {"string": "GPU-new"}}}]);
        old["spec"]["devices"][7]["attributes"]["uuid"] = json!({"string": "GPU-old"});
        let garbage = json!({"spec": {"nodeName": "gpu-node-7", "devices": "no"}});
        let v1beta1 = json!({"spec": {"nodeName": "gpu-node-7", "driver": "other.example.com",
            "pool": {"name": "p", "generation": 1},
            "devices": [{"name": "d0", "basic": {"attributes": {"uuid": {"string": "GPU-b"}}}},
                        {"name": "d1"}, {"attributes": {"uuid": {"string": "GPU-x"}}}]}});
        let index = SliceIndex::from_slices([&old, &new, &garbage, &v1beta1], "gpu-node-7");
        assert_eq!(index.device_of("GPU-new").unwrap().device, "gpu-9");
        assert_eq!(index.device_of("GPU-old"), None, "generation 1 is gone");
        assert_eq!(
            index.device_of("GPU-b").unwrap().to_string(),
            "other.example.com/p/d0"
        );
        assert_eq!(index.len(), 2);
    }
}

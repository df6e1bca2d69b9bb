//! The fake libcuda (workspace member `fake-cuda`) and its config file, built from a fake NVML
//! config so both speak of the same GPUs (by PCI bus id).

use std::path::PathBuf;

use serde_json::{json, Value};

/// `target/<profile>/libfake_cuda.so`, beside the shmlink binary (`cargo build --workspace`).
pub fn lib() -> PathBuf {
    let path = std::path::Path::new(super::shmlink_bin())
        .parent()
        .expect("the binary has a directory")
        .join("libfake_cuda.so");
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// The PCI bus id of NVML GPU `i` in a fake NVML config.
pub fn bus(nvml: &Value, i: usize) -> String {
    nvml["gpus"][i]["pci_bus_id"].as_str().unwrap().to_string()
}

/// A config listing NVML's GPUs in `order` (CUDA's numbering: a list of NVML indices), every
/// pair healthy at `gbps`.
pub fn config(nvml: &Value, order: &[usize], gbps: f64) -> Value {
    json!({
        "devices": order.iter().map(|&i| bus(nvml, i)).collect::<Vec<_>>(),
        "default_gbps": gbps,
        "pairs": [],
    })
}

/// Adds a fault to copies from NVML GPU `from` to `to`.
pub fn fault(config: &mut Value, nvml: &Value, from: usize, to: usize, fault: Value) {
    let mut entry = json!({"from": bus(nvml, from), "to": bus(nvml, to)});
    for (k, v) in fault.as_object().unwrap() {
        entry[k] = v.clone();
    }
    config["pairs"].as_array_mut().unwrap().push(entry);
}

/// A config file (and the stats file the fake writes) in a directory of its own.
pub struct FakeCuda {
    pub dir: tempfile::TempDir,
}

impl FakeCuda {
    pub fn new(config: &Value) -> FakeCuda {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cuda.json"),
            serde_json::to_vec_pretty(config).unwrap(),
        )
        .unwrap();
        FakeCuda { dir }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("cuda.json")
    }

    pub fn stats(&self) -> PathBuf {
        self.dir.path().join("stats.json")
    }

    /// Where each driver start is written (`FAKE_CUDA_INITS`).
    pub fn inits_file(&self) -> PathBuf {
        self.dir.path().join("inits")
    }

    /// How many times a process started the driver so far.
    pub fn inits(&self) -> usize {
        std::fs::read_to_string(self.inits_file()).map_or(0, |t| t.lines().count())
    }

    /// What the fake holds now (allocations, peer mappings, retained contexts), as it last
    /// wrote it; None when it never wrote.
    pub fn held(&self) -> Option<Value> {
        let text = std::fs::read_to_string(self.stats()).ok()?;
        serde_json::from_str(&text).ok()
    }
}

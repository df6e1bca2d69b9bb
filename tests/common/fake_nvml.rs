//! The fake NVML library (workspace member `fake-nvml`) and its config file, which a test
//! replaces atomically (write + rename) to inject a fault while `serve` runs.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `target/<profile>/libfake_nvml.so`, built beside the shmlink binary by `cargo build --workspace`.
pub fn lib() -> PathBuf {
    built("libfake_nvml.so")
}

/// The same library without the symbols an old driver lacks.
pub fn legacy_lib() -> PathBuf {
    built("libfake_nvml_legacy.so")
}

fn built(name: &str) -> PathBuf {
    let path = Path::new(super::shmlink_bin())
        .parent()
        .expect("the binary has a directory")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace; scripts/test.sh does)",
        path.display()
    );
    path
}

/// A preset of `crates/fake-nvml/presets/`.
pub fn preset(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/fake-nvml/presets")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A config file in a directory of its own.
pub struct FakeNvml {
    dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl FakeNvml {
    pub fn new(config: &Value) -> FakeNvml {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeNvml {
            config: dir.path().join("nvml.json"),
            dir,
        };
        fake.write(config);
        fake
    }

    /// Replaces the config atomically, as the contract says tests do.
    pub fn write(&self, config: &Value) {
        let tmp = self.dir.path().join("nvml.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    /// The environment a process needs to load this config.
    pub fn env(&self) -> [(&'static str, &OsStr); 1] {
        [("FAKE_NVML_CONFIG", self.config.as_os_str())]
    }
}

impl FakeNvml {
    /// `check --json` on this fake NVML, with `args` after; its report whatever its exit (a
    /// finding exits 1).
    pub fn check_json(&self, args: &[&str]) -> Value {
        let lib = lib();
        let mut all = vec!["check", "--json", "--nvml-lib", lib.to_str().unwrap()];
        all.extend_from_slice(args);
        super::binary::shmlink_json(&all, &self.env())
    }
}

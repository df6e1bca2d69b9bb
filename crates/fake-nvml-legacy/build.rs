//! Builds fake-nvml's source as an old driver's library (see fake-nvml's README, "Legacy").

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fake_nvml_legacy)");
    println!("cargo::rustc-cfg=fake_nvml_legacy");
}

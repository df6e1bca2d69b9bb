//! GPU link health from NVML: per-GPU link state and error counters, per-pair P2P status, and
//! a verdict per GPU pair. `nvml.rs` is the only file that touches NVML; `pairs/` is pure.

pub mod collector;
pub mod nvml;
pub mod pairs;
pub mod xid;

use crate::model::GpuReading;

/// A PCI bus id in one spelling: NVML's `00000000:18:00.0` and the driver's `0000:18:00.0`
/// name the same device.
pub fn pci_key(bus_id: &str) -> String {
    let id = bus_id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        None => id,
    }
}

/// The driver's GPUs (PCI bus ids) that NVML does not list.
pub fn not_in_nvml(driver: &[String], nvml: &[GpuReading]) -> Vec<String> {
    let seen: std::collections::HashSet<String> =
        nvml.iter().map(|g| pci_key(&g.pci_bus_id)).collect();
    driver
        .iter()
        .filter(|id| !seen.contains(&pci_key(id)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_and_nvml_spellings_of_a_bus_id_match() {
        assert_eq!(pci_key("00000000:1A:00.0"), pci_key("0000:1a:00.0"));
        assert_ne!(pci_key("0000:1a:00.0"), pci_key("0000:1b:00.0"));
        let mut gpu = crate::fixtures::gpu_reading(0);
        gpu.pci_bus_id = "00000000:18:00.0".into();
        let driver = vec!["0000:18:00.0".to_string(), "0000:2a:00.0".to_string()];
        assert_eq!(
            not_in_nvml(&driver, &[gpu]),
            vec!["0000:2a:00.0".to_string()]
        );
    }
}

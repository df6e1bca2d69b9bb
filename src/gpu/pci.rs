//! PCI addresses, however they are spelt: NVML's `00000000:3B:00.0`, the kernel's `0000:3b:00`
//! or `PCI:0000:3b:00.0`, the driver's `0000:3b:00.0`. The one place they are parsed and
//! compared.

use crate::model::GpuReading;

/// Whether two PCI addresses name the same device, whatever the domain width (NVML: `00000000:3B:00.0`, the kernel: `0000:3b:00` or `0000:3b:00.0`): compare domain (numerically), bus, device, case-insensitively.
pub fn same_pci_device(a: &str, b: &str) -> bool {
    match (pci_address(a), pci_address(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The one spelling of a PCI device's address in what the agent writes: `0000:29:00.0`
/// (function 0: a GPU's), from any of the driver's, NVML's or the kernel's spellings.
pub fn canonical(s: &str) -> Option<String> {
    let (domain, bus, device) = pci_address(s)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

/// (domain, bus, device) of `[PCI:][domain:]bus:device[.function]`, all hex.
pub fn pci_address(s: &str) -> Option<(u32, u8, u8)> {
    let s = s.trim();
    let s = match s.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("PCI:") => &s[4..],
        _ => s,
    };
    let mut parts = s.rsplit(':');
    let dev_fn = parts.next()?;
    let bus = parts.next()?;
    let domain = parts.next().unwrap_or("0");
    if parts.next().is_some() {
        return None;
    }
    let (device, function) = match dev_fn.split_once('.') {
        Some((d, f)) => (d, Some(f)),
        None => (dev_fn, None),
    };
    if function.is_some_and(|f| hex::<u8>(f).is_none_or(|f| f > 7)) {
        return None;
    }
    let device = hex::<u8>(device).filter(|&d| d < 32)?;
    Some((hex(domain)?, hex(bus)?, device))
}

/// Hex digits only (no sign, no `0x`).
fn hex<T: TryFrom<u64>>(s: &str) -> Option<T> {
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    T::try_from(u64::from_str_radix(s, 16).ok()?).ok()
}

/// The driver's GPUs (PCI bus ids) that NVML does not list.
pub fn not_in_nvml(driver: &[String], nvml: &[GpuReading]) -> Vec<String> {
    driver
        .iter()
        .filter(|id| {
            !nvml.iter().any(|g| {
                same_pci_device(&g.pci_bus_id, id) || g.pci_bus_id.eq_ignore_ascii_case(id)
            })
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_compare_by_domain_bus_and_device() {
        for (a, b) in [
            ("00000000:3B:00.0", "0000:3b:00"),
            ("00000000:3B:00.0", "0000:3b:00.0"),
            ("0000:3b:00", "PCI:0000:3b:00"),
            ("0000:3b:00.0", "0000:3b:00.1"),
            ("3b:00.0", "0000:3B:00"),
            ("00010000:18:1f.0", "10000:18:1F"),
        ] {
            assert!(same_pci_device(a, b), "{a} {b}");
            assert!(same_pci_device(b, a), "{b} {a}");
        }
        for (a, b) in [
            ("00000000:3B:00.0", "0000:3c:00"),
            ("00000001:3B:00.0", "0000:3b:00"),
            ("0000:3b:01.0", "0000:3b:00.0"),
            ("", ""),
            ("garbage", "garbage"),
            ("0000:3b:00.9", "0000:3b:00"),
            ("0000:3b:20", "0000:3b:20"),
            ("0:0:0:3b:00", "0000:3b:00"),
            ("0000:-3b:00", "0000:3b:00"),
            ("0000:3b:00.", "0000:3b:00"),
        ] {
            assert!(!same_pci_device(a, b), "{a} {b}");
        }
    }

    #[test]
    fn driver_and_nvml_spellings_of_a_bus_id_match() {
        let mut gpu = crate::fixtures::gpu_reading(0);
        gpu.pci_bus_id = "00000000:18:00.0".into();
        let driver = vec!["0000:18:00.0".to_string(), "0000:2a:00.0".to_string()];
        assert_eq!(
            not_in_nvml(&driver, &[gpu]),
            vec!["0000:2a:00.0".to_string()]
        );
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = crate::fixtures::rng::Rng::new(0xc0ffee);
        for _ in 0..5_000 {
            let a = String::from_utf8_lossy(&rng.bytes(20)).into_owned();
            let _ = same_pci_device(&a, "0000:3b:00");
        }
    }
}

//! Pure: what sysfs says of a PCI function: its place in the tree, its AER totals, its ACS
//! control register, and whether the machine is a VM.

use crate::gpu::pci::pci_address;

/// The kernel's name of the function NVML calls `00000000:3B:00.0`: `0000:3b:00.0`.
pub fn sysfs_bdf(nvml_bus_id: &str) -> Option<String> {
    let (domain, bus, device) = pci_address(nvml_bus_id)?;
    let function = nvml_bus_id
        .rsplit_once('.')
        .and_then(|(_, f)| f.trim().parse::<u8>().ok())
        .filter(|f| *f < 8)
        .unwrap_or(0);
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function}"))
}

/// Whether a path component names a PCI function (`0000:1c:00.0`).
pub fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    // domain (4+ hex) : bus (2) : device (2) . function (1)
    let Some(colon) = s.find(':') else {
        return false;
    };
    colon >= 4
        && b.len() == colon + 8
        && b[colon + 3] == b':'
        && b[colon + 6] == b'.'
        && s[..colon].bytes().all(|c| c.is_ascii_hexdigit())
        && s[colon + 1..colon + 3]
            .bytes()
            .all(|c| c.is_ascii_hexdigit())
        && s[colon + 4..colon + 6]
            .bytes()
            .all(|c| c.is_ascii_hexdigit())
        && (b'0'..=b'7').contains(&b[colon + 7])
}

/// The functions on a device's way up, from its resolved sysfs path
/// (`.../devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:1d:00.0`): the device first, then
/// each bridge above it, up to the first component that is not a PCI function (the host
/// bridge, or a hypervisor's bus).
pub fn path_up(resolved: &str) -> Vec<String> {
    let mut up: Vec<String> = Vec::new();
    for c in resolved.rsplit('/') {
        if !is_bdf(c) {
            break;
        }
        up.push(c.to_string());
    }
    up
}

/// A `class` file (`0x060400`): a PCI-to-PCI bridge.
pub fn is_bridge_class(class: &str) -> bool {
    class.trim().to_ascii_lowercase().starts_with("0x0604")
}

/// The total of an `aer_dev_*` file: its `TOTAL_ERR_*` line, whatever the kernel calls the
/// lines before it (short names now, long ones in 4.19).
pub fn aer_total(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (name, value) = l.trim().rsplit_once(' ')?;
        name.starts_with("TOTAL_ERR_")
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// The ACS control register from a function's config space as read (`read(offset)` gives the
/// 32-bit word there, little-endian, or None past what could be read). Walks the extended
/// capability list from 0x100, as lspci does: stops on an empty or all-ones header, a next
/// pointer that goes nowhere new, or after 64 capabilities.
pub fn acs_control(mut read: impl FnMut(u16) -> Option<u32>) -> Option<Option<u16>> {
    const ACS: u32 = 0x000d;
    let mut offset: u16 = 0x100;
    let mut seen = Vec::new();
    for _ in 0..64 {
        let header = read(offset)?;
        if header == 0 || header == 0xffff_ffff {
            return Some(None);
        }
        if header & 0xffff == ACS {
            let word = read(offset + 4)?;
            return Some(Some((word >> 16) as u16));
        }
        let next = ((header >> 20) & 0xffc) as u16;
        if next < 0x100 || seen.contains(&next) {
            return Some(None);
        }
        seen.push(offset);
        offset = next;
    }
    Some(None)
}

/// The hypervisor the DMI strings (`sys_vendor`, `product_name`) name, as systemd's
/// detect-virt reads them; None on bare metal (EC2's `.metal` instances say "Amazon EC2" too).
pub fn hypervisor(sys_vendor: &str, product_name: &str) -> Option<String> {
    const VENDORS: [&str; 16] = [
        "KVM",
        "OpenStack",
        "KubeVirt",
        "Amazon EC2",
        "QEMU",
        "VMware",
        "VMW",
        "innotek GmbH",
        "VirtualBox",
        "Oracle Corporation",
        "Xen",
        "Bochs",
        "Parallels",
        "BHYVE",
        "Hyper-V",
        "Google Compute Engine",
    ];
    let (vendor, product) = (sys_vendor.trim(), product_name.trim());
    if product.contains(".metal") {
        return None;
    }
    if vendor == "Microsoft Corporation" && product == "Virtual Machine" {
        return Some("Hyper-V".into());
    }
    [vendor, product]
        .iter()
        .find_map(|s| VENDORS.iter().find(|v| s.starts_with(*v)))
        .map(|v| (*v).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_bus_ids_become_sysfs_names() {
        assert_eq!(
            sysfs_bdf("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_bdf("00000001:DB:1F.3").as_deref(),
            Some("0001:db:1f.3")
        );
        assert_eq!(sysfs_bdf("nonsense"), None);
    }

    #[test]
    fn the_way_up_stops_at_the_host_bridge() {
        let p = "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:08.0/0000:1b:00.0";
        assert_eq!(
            path_up(p),
            [
                "0000:1b:00.0",
                "0000:19:08.0",
                "0000:18:00.0",
                "0000:17:00.0"
            ]
        );
        // A hypervisor's bus above: stop there.
        let hv = "/sys/devices/LNXSYSTM:00/VMBUS:00/47505500-0001-0000-3130-444531303244/pci0001:00/0001:00:00.0";
        assert_eq!(path_up(hv), ["0001:00:00.0"]);
        assert!(path_up("/sys/devices/platform/foo").is_empty());
        assert!(!is_bdf("0000:1b:00.8") && !is_bdf("000:1b:00.0") && !is_bdf("0000:1b:00.0x"));
    }

    #[test]
    fn aer_totals_in_the_short_and_the_long_names() {
        let short = "RxErr 0\nBadTLP 3\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\n\
                     CorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 3\n";
        assert_eq!(aer_total(short), Some(3));
        let long = "Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\n\
                    Replay Timer Timeout 0\nAdvisory Non-Fatal 0\nTOTAL_ERR_COR 2\n";
        assert_eq!(aer_total(long), Some(2));
        assert_eq!(
            aer_total("TOTAL_ERR_FATAL 18446744073709551615\n"),
            Some(u64::MAX)
        );
        assert_eq!(aer_total("garbage"), None);
        assert_eq!(aer_total("TOTAL_ERR_COR x\n"), None);
    }

    /// A config space with these extended capabilities (id, body) chained from 0x100.
    fn config(caps: &[(u16, u32)]) -> Vec<u8> {
        let mut space = vec![0u8; 4096];
        let mut at = 0x100usize;
        for (i, (id, body)) in caps.iter().enumerate() {
            let next = if i + 1 < caps.len() { at + 0x40 } else { 0 };
            let header = u32::from(*id) | (1 << 16) | ((next as u32) << 20);
            space[at..at + 4].copy_from_slice(&header.to_le_bytes());
            space[at + 4..at + 8].copy_from_slice(&body.to_le_bytes());
            at = next;
        }
        space
    }

    fn reader(space: &[u8]) -> impl FnMut(u16) -> Option<u32> + '_ {
        move |off| {
            let o = usize::from(off);
            Some(u32::from_le_bytes(space.get(o..o + 4)?.try_into().ok()?))
        }
    }

    #[test]
    fn acs_control_is_found_down_the_extended_capability_list() {
        // AER, then ACS with control 0x001d (SV RR CR UF: what Linux sets under an IOMMU).
        let space = config(&[(0x0001, 0), (0x000d, 0x001d_007f)]);
        let ctrl = acs_control(reader(&space)).unwrap().unwrap();
        assert_eq!(ctrl, 0x001d);
        assert!(crate::model::AcsState::Control(ctrl).redirects());
        assert!(
            !crate::model::AcsState::Control(0x0001).redirects(),
            "SrcValid alone"
        );
        // No ACS: absent. 256 bytes only (no CAP_SYS_ADMIN): unknown.
        assert_eq!(acs_control(reader(&config(&[(0x0001, 0)]))), Some(None));
        assert_eq!(acs_control(reader(&space[..256])), None);
        // A list that loops ends.
        let mut looped = config(&[(0x0001, 0)]);
        looped[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(acs_control(reader(&looped)), Some(None));
    }

    #[test]
    fn a_vm_is_known_by_its_dmi_strings_and_ec2_metal_is_not_one() {
        assert_eq!(
            hypervisor("QEMU", "Standard PC (Q35 + ICH9, 2009)").as_deref(),
            Some("QEMU")
        );
        assert_eq!(
            hypervisor("Amazon EC2", "p5.48xlarge").as_deref(),
            Some("Amazon EC2")
        );
        assert_eq!(hypervisor("Amazon EC2", "p5.metal"), None);
        assert_eq!(
            hypervisor("Microsoft Corporation", "Virtual Machine").as_deref(),
            Some("Hyper-V")
        );
        assert_eq!(hypervisor("Supermicro", "SYS-821GE-TNHR"), None);
        assert_eq!(hypervisor("", ""), None);
    }
}

//! The PCIe path under each GPU, from sysfs (read-only, under `--sys-root`): the functions
//! from the GPU up to its root port, their AER totals and, for bridges, the ACS control
//! register. `parse.rs` is pure; this file only reads.
//!
//! Config space beyond the first 64 bytes is readable only with CAP_SYS_ADMIN in the host's
//! user namespace; without it ACS is unknown, never "off". ACS is read with a few 4-byte reads
//! down the capability list, not the whole 4 KiB (each read is a config cycle on the device).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::model::{AcsState, AerTotals, PcieHop};

pub mod parse;

/// Reads the PCI tree under a sysfs root.
#[derive(Debug, Clone)]
pub struct SysPci {
    root: PathBuf,
    /// Each GPU's functions up to its root port, and which are bridges, by NVML's bus id: the
    /// topology stays while the GPU does, its counters and registers are read each time.
    paths: HashMap<String, Vec<(String, bool)>>,
}

impl SysPci {
    pub fn new(sys_root: &Path) -> SysPci {
        SysPci {
            root: sys_root.to_path_buf(),
            paths: HashMap::new(),
        }
    }

    /// The path of the GPU NVML calls `nvml_bus_id`: the GPU first, then each bridge above
    /// it; empty where sysfs does not list it.
    pub fn path_of(&mut self, nvml_bus_id: &str) -> Vec<PcieHop> {
        let Some(bdf) = parse::sysfs_bdf(nvml_bus_id) else {
            return Vec::new();
        };
        let devices = self.root.join("bus/pci/devices");
        // A GPU gone from the bus (removed, reset, re-enumerated) is resolved anew.
        if !devices.join(&bdf).exists() {
            self.paths.remove(nvml_bus_id);
            return Vec::new();
        }
        let hops = match self.paths.get(nvml_bus_id) {
            Some(hops) => hops,
            None => {
                let Ok(resolved) = std::fs::canonicalize(devices.join(&bdf)) else {
                    return Vec::new();
                };
                let hops = parse::path_up(&resolved.to_string_lossy())
                    .into_iter()
                    .map(|bdf| {
                        let class = std::fs::read_to_string(devices.join(&bdf).join("class"));
                        let bridge = class.is_ok_and(|c| parse::is_bridge_class(&c));
                        (bdf, bridge)
                    })
                    .collect();
                self.paths.entry(nvml_bus_id.to_string()).or_insert(hops)
            }
        };
        hops.iter()
            .map(|(bdf, bridge)| {
                let dir = devices.join(bdf);
                PcieHop {
                    aer: aer(&dir),
                    acs: if *bridge {
                        acs(&dir)
                    } else {
                        AcsState::Unknown
                    },
                    bdf: bdf.clone(),
                    bridge: *bridge,
                }
            })
            .collect()
    }

    /// The hypervisor the machine's DMI strings name, if any.
    pub fn hypervisor(&self) -> Option<String> {
        let dmi = self.root.join("class/dmi/id");
        let read = |f: &str| std::fs::read_to_string(dmi.join(f)).unwrap_or_default();
        parse::hypervisor(&read("sys_vendor"), &read("product_name"))
    }
}

/// The three AER totals; None unless all three files read.
fn aer(dir: &Path) -> Option<AerTotals> {
    let total = |f: &str| parse::aer_total(&std::fs::read_to_string(dir.join(f)).ok()?);
    Some(AerTotals {
        correctable: total("aer_dev_correctable")?,
        nonfatal: total("aer_dev_nonfatal")?,
        fatal: total("aer_dev_fatal")?,
    })
}

fn acs(dir: &Path) -> AcsState {
    let Ok(config) = File::open(dir.join("config")) else {
        return AcsState::Unknown;
    };
    let read = |offset: u16| {
        let mut word = [0u8; 4];
        // A short read: past what this reader may see.
        match config.read_at(&mut word, u64::from(offset)) {
            Ok(4) => Some(u32::from_le_bytes(word)),
            _ => None,
        }
    };
    match parse::acs_control(read) {
        None => AcsState::Unknown,
        Some(None) => AcsState::Absent,
        Some(Some(ctrl)) => AcsState::Control(ctrl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::sysfs::{Bridge, SysTree};

    #[test]
    fn a_gpu_behind_a_switch_is_read_with_its_bridges_aer_and_acs() {
        let dir = tempfile::tempdir().unwrap();
        let tree = SysTree::new(dir.path());
        tree.gpu_under(
            "0000:1d:00.0",
            &[
                Bridge::root_port("0000:17:00.0"),
                Bridge::port("0000:18:00.0", None),
                Bridge::port("0000:19:08.0", Some(0x001d)),
            ],
        );
        tree.aer("0000:19:08.0", 12, 0, 0);
        tree.aer("0000:1d:00.0", 1, 2, 0);
        let mut sys = SysPci::new(tree.root());
        let path = sys.path_of("00000000:1D:00.0");
        let got: Vec<(&str, bool, AcsState)> = path
            .iter()
            .map(|h| (h.bdf.as_str(), h.bridge, h.acs))
            .collect();
        assert_eq!(
            got,
            vec![
                ("0000:1d:00.0", false, AcsState::Unknown),
                ("0000:19:08.0", true, AcsState::Control(0x001d)),
                ("0000:18:00.0", true, AcsState::Absent),
                ("0000:17:00.0", true, AcsState::Absent),
            ]
        );
        assert_eq!(
            path[1].aer,
            Some(AerTotals {
                correctable: 12,
                nonfatal: 0,
                fatal: 0
            })
        );
        assert_eq!(path[0].aer.map(|a| a.nonfatal), Some(2));
        assert_eq!(path[2].aer, None, "no AER files");
        // Read again through the path kept: the counters are read anew.
        tree.aer("0000:19:08.0", 13, 0, 0);
        let again = sys.path_of("00000000:1D:00.0");
        assert_eq!(again.len(), 4);
        assert_eq!(again[1].aer.map(|a| a.correctable), Some(13));
        // Config space cut at 256 bytes, as without CAP_SYS_ADMIN: unknown.
        tree.truncate_config("0000:19:08.0", 256);
        let path = sys.path_of("00000000:1D:00.0");
        assert_eq!(path[1].acs, AcsState::Unknown);
        // A GPU sysfs does not list: no path.
        assert!(SysPci::new(tree.root())
            .path_of("00000000:AA:00.0")
            .is_empty());
    }

    #[test]
    fn the_dmi_strings_say_vm_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let tree = SysTree::new(dir.path());
        assert_eq!(SysPci::new(tree.root()).hypervisor(), None);
        tree.dmi("QEMU", "Standard PC (Q35 + ICH9, 2009)");
        assert_eq!(
            SysPci::new(tree.root()).hypervisor().as_deref(),
            Some("QEMU")
        );
    }
}

//! The PCIe path under each GPU, from sysfs (read-only, under `--sys-root`): the functions
//! from the GPU up to its root port, their AER totals and, for bridges, the ACS control
//! register. `parse.rs` is pure; this file only reads.
//!
//! Config space beyond the first 64 bytes is readable only with CAP_SYS_ADMIN in the host's
//! user namespace; without it ACS is unknown, never "off". ACS is read with a few 4-byte reads
//! down the capability list, not the whole 4 KiB (each read is a config cycle on the device).
//!
//! Every file is read through `procfs::kfile` (a regular file, at most [`ATTRIBUTE_MAX`]
//! bytes): anything may sit at a name under a root option, and a FIFO or a device there must
//! not hang or flood a scan. Each file found bad is logged and counted once.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::procfs::kfile;

use crate::model::{AcsState, AerTotals, PcieHop};

pub mod parse;

/// Reads the PCI tree under a sysfs root.
#[derive(Debug, Clone)]
pub struct SysPci {
    root: PathBuf,
    /// Each GPU's functions up to its root port, and which are bridges, by NVML's bus id: the
    /// topology stays while the GPU does, its counters and registers are read each time.
    paths: HashMap<String, Vec<(String, bool)>>,
    reads: Reads,
}

/// The most read of one sysfs attribute: they are a page at most.
pub const ATTRIBUTE_MAX: usize = 16 * 1024;
/// Bad files remembered (each logged once); past it they are counted, not logged.
const BAD_KEPT: usize = 1024;

/// Reads of attribute files, with the files found not to be regular files.
#[derive(Debug, Clone, Default)]
struct Reads {
    bad: HashSet<PathBuf>,
    /// Bad files found since the last [`SysPci::take_errors`].
    new_errors: u64,
}

impl Reads {
    /// The text of attribute `path`; None if it is missing, unreadable or not a regular file.
    fn text(&mut self, path: &Path) -> Option<String> {
        match kfile::read_attribute(path, ATTRIBUTE_MAX) {
            Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Err(e) => {
                self.failed(path, &e);
                None
            }
        }
    }

    /// A failed read: a missing file is normal (no AER on this device); anything else is
    /// logged and counted, once per file.
    fn failed(&mut self, path: &Path, e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::NotFound || self.bad.contains(path) {
            return;
        }
        self.new_errors += 1;
        if self.bad.len() < BAD_KEPT {
            self.bad.insert(path.to_path_buf());
            tracing::warn!(path = %path.display(), error = %e, "sysfs file not read");
        }
    }
}

impl SysPci {
    pub fn new(sys_root: &Path) -> SysPci {
        SysPci {
            root: sys_root.to_path_buf(),
            paths: HashMap::new(),
            reads: Reads::default(),
        }
    }

    /// Bad files found since the last call (each file counted once).
    pub fn take_errors(&mut self) -> u64 {
        std::mem::take(&mut self.reads.new_errors)
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
        let reads = &mut self.reads;
        let hops = match self.paths.get(nvml_bus_id) {
            Some(hops) => hops,
            None => {
                let Ok(resolved) = std::fs::canonicalize(devices.join(&bdf)) else {
                    return Vec::new();
                };
                let hops = parse::path_up(&resolved.to_string_lossy())
                    .into_iter()
                    .map(|bdf| {
                        let class = reads.text(&devices.join(&bdf).join("class"));
                        let bridge = class.is_some_and(|c| parse::is_bridge_class(&c));
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
                    aer: aer(reads, &dir),
                    acs: if *bridge {
                        acs(reads, &dir)
                    } else {
                        AcsState::Unknown
                    },
                    bdf: bdf.clone(),
                    bridge: *bridge,
                    link_width: link_width(reads, &dir),
                }
            })
            .collect()
    }

    /// The hypervisor the machine's DMI strings name, if any.
    pub fn hypervisor(&mut self) -> Option<String> {
        let dmi = self.root.join("class/dmi/id");
        let vendor = self.reads.text(&dmi.join("sys_vendor")).unwrap_or_default();
        let product = self
            .reads
            .text(&dmi.join("product_name"))
            .unwrap_or_default();
        parse::hypervisor(&vendor, &product)
    }
}

/// The three AER totals; None unless all three files read.
fn aer(reads: &mut Reads, dir: &Path) -> Option<AerTotals> {
    let mut total = |f: &str| parse::aer_total(&reads.text(&dir.join(f))?);
    Some(AerTotals {
        correctable: total("aer_dev_correctable")?,
        nonfatal: total("aer_dev_nonfatal")?,
        fatal: total("aer_dev_fatal")?,
    })
}

fn acs(reads: &mut Reads, dir: &Path) -> AcsState {
    let path = dir.join("config");
    let config = match kfile::open_regular(&path) {
        Ok(fd) => fd,
        Err(e) => {
            reads.failed(&path, &e);
            return AcsState::Unknown;
        }
    };
    let read = |offset: u16| {
        let mut word = [0u8; 4];
        // A short read: past what this reader may see.
        match rustix::io::pread(&config, &mut word, u64::from(offset)) {
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

/// sysfs `current_link_width` and `max_link_width`, where both read as numbers (a width of 0
/// is a link down or not PCIe Express: nothing to compare).
fn link_width(reads: &mut Reads, dir: &Path) -> Option<(u32, u32)> {
    let read = |reads: &mut Reads, name| -> Option<u32> {
        reads
            .text(&dir.join(name))?
            .trim()
            .parse()
            .ok()
            .filter(|w| *w > 0)
    };
    Some((
        read(reads, "current_link_width")?,
        read(reads, "max_link_width")?,
    ))
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

    /// Issue 36: a FIFO and /dev/zero at AER files, a FIFO at config space: refused at once,
    /// unknown, each counted once.
    #[test]
    fn files_that_are_not_regular_are_refused_and_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let tree = SysTree::new(dir.path());
        tree.gpu_under("0000:1d:00.0", &[Bridge::root_port("0000:17:00.0")]);
        tree.aer("0000:1d:00.0", 1, 2, 0);
        let gpu = dir.path().join("bus/pci/devices/0000:1d:00.0");
        let port = dir.path().join("bus/pci/devices/0000:17:00.0");
        for f in [gpu.join("aer_dev_fatal"), port.join("config")] {
            std::fs::remove_file(&f).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &f,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
        }
        std::fs::remove_file(gpu.join("aer_dev_nonfatal")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", gpu.join("aer_dev_nonfatal")).unwrap();
        let mut sys = SysPci::new(tree.root());
        let started = std::time::Instant::now();
        for _ in 0..3 {
            let path = sys.path_of("00000000:1D:00.0");
            assert_eq!(path.len(), 2);
            assert_eq!(path[0].aer, None);
            assert_eq!(path[1].acs, AcsState::Unknown);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // /dev/zero and the config FIFO: the AER read stops at its first bad file.
        assert_eq!(sys.take_errors(), 2);
        assert_eq!(sys.take_errors(), 0);
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

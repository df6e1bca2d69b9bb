//! What the node's GPU stack runs, for the fleet's correlation (`model::NodeInfo`): the driver
//! (NVML's word), the fabric manager's version while one runs, and the kernel.
//!
//! The fabric manager has no NVML call of its own. It checks the loaded driver's version when it
//! starts and exits on any other (NVIDIA's Fabric Manager user guide), so one that runs is at
//! the driver's version: found by its process name under the proc root, looked for again every
//! few minutes (a restart of the service, or a node where it never runs: the NVL72 compute
//! trays, whose fabric is managed on the switch trays).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::model::NodeInfo;

/// `comm` of `nv-fabricmanager`: the kernel keeps 15 bytes of a process's name.
const FABRIC_MANAGER_COMM: &str = "nv-fabricmanage";

/// How often the process list is read again for the fabric manager.
const LOOK_EVERY: Duration = Duration::from_secs(300);

/// The node's info, the fabric manager looked for at most every [`LOOK_EVERY`].
#[derive(Debug, Default)]
pub struct NodeInfoKeeper {
    kernel: Option<String>,
    fabric_manager_runs: bool,
    looked_at: Option<Instant>,
}

impl NodeInfoKeeper {
    pub fn new() -> Self {
        let release = rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned();
        NodeInfoKeeper {
            kernel: (!release.is_empty()).then_some(release),
            ..NodeInfoKeeper::default()
        }
    }

    /// This scan's info; `driver` is None while NVML is not loaded (then no fabric manager is
    /// looked for: its version is the driver's).
    pub fn info(&mut self, proc_root: &Path, driver: Option<&str>, now: Instant) -> NodeInfo {
        if driver.is_some() && self.looked_at.is_none_or(|t| now - t >= LOOK_EVERY) {
            self.fabric_manager_runs = runs(proc_root, FABRIC_MANAGER_COMM);
            self.looked_at = Some(now);
        }
        NodeInfo {
            driver: driver.map(str::to_string),
            fabric_manager: driver
                .filter(|_| self.fabric_manager_runs)
                .map(str::to_string),
            kernel: self.kernel.clone(),
        }
    }
}

/// Whether a process named `comm` runs under the proc root (unreadable entries are skipped: a
/// process that exits mid-walk is no error).
fn runs(proc_root: &Path, comm: &str) -> bool {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return false;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let b = name.as_encoded_bytes();
            !b.is_empty() && b.iter().all(u8::is_ascii_digit)
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim_end_matches('\n') == comm)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_with(comms: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm) in comms {
            let p = dir.path().join(pid);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        }
        std::fs::create_dir(dir.path().join("self")).unwrap();
        dir
    }

    #[test]
    fn a_running_fabric_manager_is_at_the_drivers_version_and_none_without_one() {
        let with = proc_with(&[("1", "systemd"), ("2939", "nv-fabricmanage")]);
        let without = proc_with(&[("1", "systemd"), ("77", "nv-fabricmanager-x")]);
        let now = Instant::now();
        let mut keeper = NodeInfoKeeper::new();
        let info = keeper.info(with.path(), Some("570.133.20"), now);
        assert_eq!(info.driver.as_deref(), Some("570.133.20"));
        assert_eq!(info.fabric_manager.as_deref(), Some("570.133.20"));
        assert!(info.kernel.is_some());
        let mut keeper = NodeInfoKeeper::new();
        let info = keeper.info(without.path(), Some("570.133.20"), now);
        assert_eq!(info.fabric_manager, None);
        // Without NVML nothing is known of either.
        let info = NodeInfoKeeper::new().info(with.path(), None, now);
        assert_eq!((info.driver, info.fabric_manager), (None, None));
    }

    #[test]
    fn the_process_list_is_read_again_only_every_few_minutes() {
        let proc = proc_with(&[("1", "systemd")]);
        let now = Instant::now();
        let mut keeper = NodeInfoKeeper::new();
        assert_eq!(
            keeper.info(proc.path(), Some("d"), now).fabric_manager,
            None
        );
        let p = proc.path().join("2939");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("comm"), "nv-fabricmanage\n").unwrap();
        let soon = now + Duration::from_secs(60);
        assert_eq!(
            keeper.info(proc.path(), Some("d"), soon).fabric_manager,
            None
        );
        let later = now + LOOK_EVERY;
        assert_eq!(
            keeper
                .info(proc.path(), Some("d"), later)
                .fabric_manager
                .as_deref(),
            Some("d")
        );
    }
}

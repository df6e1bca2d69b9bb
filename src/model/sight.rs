//! What a scan could not see. A scan that saw nothing must not read as a healthy machine: the
//! shm scan counts what it could look into, and [`Sight::blind`] turns the counts into the
//! reasons `check` exits 2 for, `/readyz` answers 503 for and `shmlink_blind` exports.

use serde::Serialize;

/// Why a scan is blind, in whole or in part. The snake_case names are the contract's
/// (`check --json`'s `blind`, the `reason` label of `shmlink_blind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Blind {
    /// `--proc-root` lists no process at all: the wrong path, or nothing mounted there.
    NoProcesses,
    /// No memory cgroup hierarchy under `--cgroup-root`.
    NoCgroups,
    /// Processes run in cgroups, but none could be looked into (their namespaces or root
    /// denied): no container measured.
    ContainersUnreadable,
    /// Some containers were measured, others could not be looked into.
    SomeContainersUnreadable,
}

impl Blind {
    pub fn as_str(self) -> &'static str {
        match self {
            Blind::NoProcesses => "no_processes",
            Blind::NoCgroups => "no_cgroups",
            Blind::ContainersUnreadable => "containers_unreadable",
            Blind::SomeContainersUnreadable => "some_containers_unreadable",
        }
    }

    /// Whether the scan measured nothing for this reason (check exits 2, serve is not ready),
    /// rather than missing a part.
    pub fn is_total(self) -> bool {
        !matches!(self, Blind::SomeContainersUnreadable)
    }
}

impl std::fmt::Display for Blind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the shm scan could look at, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sight {
    /// Where it looked (`--proc-root`, `--cgroup-root`), for the words that say what to check.
    pub proc_root: String,
    pub cgroup_root: String,
    /// The proc root lists at least one process.
    pub processes: bool,
    /// A memory cgroup hierarchy was found under the cgroup root.
    pub cgroup_hierarchy: bool,
    /// Containers whose /dev/shm was measured (mounted or not).
    pub measured: u64,
    /// Cgroups (or containers) whose processes could not be looked into: their namespaces or
    /// root could not be read, mostly for want of permission.
    pub unreadable: u64,
}

impl Default for Sight {
    /// A scan that saw everything it looked for (and nothing unreadable).
    fn default() -> Self {
        Sight {
            proc_root: String::new(),
            cgroup_root: String::new(),
            processes: true,
            cgroup_hierarchy: true,
            measured: 0,
            unreadable: 0,
        }
    }
}

impl Sight {
    /// The reasons the scan is blind, sorted; empty when it saw everything.
    pub fn blind(&self) -> Vec<Blind> {
        let mut out = Vec::new();
        if !self.processes {
            out.push(Blind::NoProcesses);
        }
        if !self.cgroup_hierarchy {
            out.push(Blind::NoCgroups);
        }
        if self.processes && self.cgroup_hierarchy && self.unreadable > 0 {
            out.push(if self.measured == 0 {
                Blind::ContainersUnreadable
            } else {
                Blind::SomeContainersUnreadable
            });
        }
        out
    }
}

/// NVML's state: whether it loaded, from where, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlState {
    pub loaded: bool,
    /// The library tried (`--nvml-lib`, else the driver's `libnvidia-ml.so.1`); null with
    /// `--no-gpu`, where nothing is tried.
    pub library: Option<String>,
    /// Why it did not load; null when it did, or with `--no-gpu`.
    pub error: Option<String>,
    /// `--no-gpu`: never loaded, on purpose (not an error).
    pub disabled: bool,
}

impl Default for NvmlState {
    fn default() -> Self {
        NvmlState::disabled()
    }
}

impl NvmlState {
    pub fn disabled() -> Self {
        NvmlState {
            loaded: false,
            library: None,
            error: None,
            disabled: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sight(processes: bool, hierarchy: bool, measured: u64, unreadable: u64) -> Sight {
        Sight {
            processes,
            cgroup_hierarchy: hierarchy,
            measured,
            unreadable,
            ..Sight::default()
        }
    }

    #[test]
    fn counts_become_reasons() {
        assert_eq!(sight(true, true, 0, 0).blind(), vec![]);
        assert_eq!(sight(true, true, 5, 0).blind(), vec![]);
        assert_eq!(
            sight(true, true, 0, 10).blind(),
            vec![Blind::ContainersUnreadable]
        );
        assert_eq!(
            sight(true, true, 3, 1).blind(),
            vec![Blind::SomeContainersUnreadable]
        );
        assert_eq!(sight(false, true, 0, 0).blind(), vec![Blind::NoProcesses]);
        assert_eq!(sight(true, false, 0, 0).blind(), vec![Blind::NoCgroups]);
        assert_eq!(
            sight(false, false, 0, 0).blind(),
            vec![Blind::NoProcesses, Blind::NoCgroups]
        );
    }

    #[test]
    fn only_a_partial_view_is_not_total() {
        assert!(Blind::NoProcesses.is_total());
        assert!(Blind::NoCgroups.is_total());
        assert!(Blind::ContainersUnreadable.is_total());
        assert!(!Blind::SomeContainersUnreadable.is_total());
    }

    #[test]
    fn json_names_are_the_contracts() {
        let all = [
            Blind::NoProcesses,
            Blind::NoCgroups,
            Blind::ContainersUnreadable,
            Blind::SomeContainersUnreadable,
        ];
        for b in all {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
        let nvml = NvmlState {
            loaded: false,
            library: Some("/nonexistent/x.so".into()),
            error: Some("a libloading error".into()),
            disabled: false,
        };
        let json = serde_json::to_value(&nvml).unwrap();
        assert_eq!(json["loaded"], false);
        assert_eq!(json["library"], "/nonexistent/x.so");
        assert_eq!(json["error"], "a libloading error");
    }
}

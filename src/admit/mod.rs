//! Admission: a Pod that uses GPUs gets the /dev/shm preflight would ask for, before it runs.
//!
//! Pure: an AdmissionReview in, an AdmissionReview out (`review`), through one decision per Pod
//! (`decide`) that is preflight's own judgement applied to the Pod spec; the body read into
//! only what the decision looks at, in bounded memory (`parse`). The HTTPS server that
//! carries it (`server`, `tls`) is the only I/O.

use std::fmt;
use std::str::FromStr;

/// What the webhook does for a namespace: the label `shmlink.io/admission`, else `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Off,
    Warn,
    Mutate,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Warn => "warn",
            Mode::Mutate => "mutate",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "warn" => Ok(Mode::Warn),
            "mutate" => Ok(Mode::Mutate),
            other => Err(format!("{other:?} is not a mode (off, warn, mutate)")),
        }
    }
}

/// What one admission came to: the `outcome` label of `shmlink_admission_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The patch added /dev/shm (mutate mode).
    Mutated,
    /// Warnings only (warn mode, or something mutate mode must not change).
    Warned,
    /// A GPU Pod whose /dev/shm is already fit: nothing to do.
    Fit,
    /// No container uses GPUs and no size annotation.
    NoGpu,
    /// `hostIPC: true`: the Pod uses the node's /dev/shm.
    HostIpc,
    /// The Pod's `shmlink.io/admission: off` annotation, or mode off.
    OptedOut,
    /// Not a Pod CREATE: passed unchanged.
    NotPod,
    /// The request could not be read: answered with an error, or allowed unchanged.
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Mutated => "mutated",
            Outcome::Warned => "warned",
            Outcome::Fit => "fit",
            Outcome::NoGpu => "no_gpu",
            Outcome::HostIpc => "host_ipc",
            Outcome::OptedOut => "opted_out",
            Outcome::NotPod => "not_pod",
            Outcome::Error => "error",
        }
    }
}

pub mod decide;
pub mod dra;
pub mod dra_lookup;
pub mod metrics;
pub mod parse;
pub mod pod;
pub mod review;
pub mod server;
pub mod tls;
pub mod view;

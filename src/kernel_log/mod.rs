//! The kernel log, a source: records read from /dev/kmsg without blocking (`kmsg.rs`), or
//! through syslog(2) where a pod's device cgroup refuses the device (`syslog.rs`); one record's
//! shape (`record.rs`, pure) and its time (`time.rs`). What a record means is decided above:
//! `failures::crash` (a process crashed in a GPU library), `gpu::xid::kernel` (XIDs).

pub mod kmsg;
pub mod record;
pub mod resume;
pub mod syslog;
pub mod time;

use std::io;
use std::path::Path;
use std::time::SystemTime;

pub use kmsg::KmsgReader;
pub use record::{parse_record, KmsgRecord};
pub use syslog::SyslogReader;
pub use time::KmsgStart;

/// The kernel log, from a /dev/kmsg-like device or through syslog(2).
pub enum KernelLog {
    Device(KmsgReader),
    Syslog(SyslogReader),
}

/// `--kmsg syslog`: the syscall, not a file.
pub const SYSLOG: &str = "syslog";
/// The kernel's device, tried first by default.
pub const DEV_KMSG: &str = "/dev/kmsg";

impl KernelLog {
    /// `path` is a device like /dev/kmsg, or [`SYSLOG`]. /dev/kmsg itself falls back to
    /// syslog(2) when it cannot be opened: a pod's device cgroup refuses it unless privileged,
    /// while syslog(2) needs only CAP_SYSLOG. The error is the device's, with syslog(2)'s.
    pub fn open(path: &Path, start: KmsgStart) -> io::Result<KernelLog> {
        if path == Path::new(SYSLOG) {
            return SyslogReader::open(start).map(KernelLog::Syslog);
        }
        match KmsgReader::open(path, start) {
            Ok(r) => Ok(KernelLog::Device(r)),
            Err(e) if path == Path::new(DEV_KMSG) => match SyslogReader::open(start) {
                Ok(r) => {
                    tracing::info!(
                        "{DEV_KMSG}: {e}; reading the kernel log through syslog(2) instead"
                    );
                    Ok(KernelLog::Syslog(r))
                }
                Err(s) => Err(io::Error::new(e.kind(), format!("{e}; syslog(2): {s}"))),
            },
            Err(e) => Err(e),
        }
    }

    pub fn read_available(&mut self, max: usize) -> Vec<KmsgRecord> {
        match self {
            KernelLog::Device(r) => r.read_available(max),
            KernelLog::Syslog(r) => r.read_available(max),
        }
    }

    /// Records lost to overruns (through syslog(2): overruns, each at least one record).
    pub fn lost(&self) -> u64 {
        match self {
            KernelLog::Device(r) => r.lost(),
            KernelLog::Syslog(r) => r.lost(),
        }
    }

    /// The position past `last`, the last record told, in boot `boot_id`.
    pub fn checkpoint(&self, last: &KmsgRecord, boot_id: String) -> resume::KmsgCheckpoint {
        resume::KmsgCheckpoint {
            boot_id,
            seq: matches!(self, KernelLog::Device(_)).then_some(last.seq),
            usec: last.usec,
            at: SystemTime::now(),
        }
    }

    pub fn wall_time(&self, usec: u64) -> SystemTime {
        match self {
            KernelLog::Device(r) => r.wall_time(usec),
            KernelLog::Syslog(r) => r.wall_time(usec),
        }
    }
}

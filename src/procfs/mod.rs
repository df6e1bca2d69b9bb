//! The kernel's files as the scanners read them, whoever asks (the shm scan, the cgroup module,
//! preflight): mountinfo parsing, and small procfs/cgroupfs files read in the fewest system calls.

pub mod kept;
pub mod kfile;
pub mod mountinfo;
pub mod stat;
pub mod status;
pub mod uptime;

//! /proc/PID/cgroup and mountinfo (split at the first NUL): no panic; a located cgroup is a
//! path beneath its mount, never one that climbs out.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::cgroup::proc::locate_memory_cgroup;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (cgroup, mountinfo) = text.split_once('\0').unwrap_or((&text, ""));
    let _ = locate_memory_cgroup(cgroup, mountinfo);
});

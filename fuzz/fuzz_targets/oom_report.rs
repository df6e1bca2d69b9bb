//! The kernel's OOM reports, record by record (/dev/kmsg's format, one record a line), of any
//! shape and order: no panic; a record of user space's facility (what a container can write to
//! /dev/kmsg) never completes a kill, and records of user space alone never make one. (A kill's
//! cgroup path is placed by the cgroup_path target's parser.)
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::failures::oom::OomReports;
use shmlink::kernel_log::record::parse_record;

fuzz_target!(|data: &[u8]| {
    let mut all = OomReports::default();
    let mut user_only = OomReports::default();
    for line in data.split(|&b| b == b'\n') {
        let Some(record) = parse_record(line) else {
            continue;
        };
        if all.feed(&record).is_some() {
            assert!(record.is_kernel(), "a user-space record completed a kill");
        }
        if !record.is_kernel() {
            assert!(user_only.feed(&record).is_none());
        }
    }
});

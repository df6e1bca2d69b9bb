//! memory.stat, limits and usage of any shape: no panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::cgroup::memory::{parse_limit, parse_memory_stat, parse_usage};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_memory_stat(&text);
    let _ = parse_limit(&text);
    let _ = parse_usage(&text);
});

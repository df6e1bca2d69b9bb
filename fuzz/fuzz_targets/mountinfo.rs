//! mountinfo of any shape: no panic; what is found is what was asked for.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::procfs::mountinfo::{find_mount, parse_line};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(m) = find_mount(&text, "/dev/shm") {
        assert_eq!(m.mount_point, "/dev/shm");
    }
    for line in text.lines() {
        let _ = parse_line(line);
    }
});

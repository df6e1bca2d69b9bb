//! Any cgroup path: no panic; an identity always names a container.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::cgroup::path::parse_cgroup_path;

fuzz_target!(|data: &[u8]| {
    let path = String::from_utf8_lossy(data);
    if let Some(id) = parse_cgroup_path(&path) {
        assert!(!id.container_id.is_empty(), "{path:?} -> {id:?}");
        assert!(!id.container_id.contains('/'), "{path:?} -> {id:?}");
    }
});

//! Size strings: no panic; a size written back as a Kubernetes quantity reads as at least it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::units::{k8s_quantity, parse_size};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(bytes) = parse_size("--min-shm", &text) {
        if bytes < u64::MAX / 2 {
            let again = parse_size("--min-shm", &k8s_quantity(bytes)).expect("re-parses");
            assert!(again >= bytes, "{text:?}: {bytes} -> {again}");
        }
    }
});

//! The fake NVML library's JSON config: no panic on any input.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fake_nvml::config::Config::parse(&String::from_utf8_lossy(data));
});

//! Kernel log records of any shape, as /dev/kmsg and syslog(2) give them: no panic; a record
//! of user space's facility is never a crash, an XID, a GPU off the bus, an IOMMU fault or an
//! NVSwitch SXID (at most a lookalike: evidence, never acted on).
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::failures::crash::gpu_lib_crash;
use shmlink::gpu::xid::kernel::{kernel_gpu, KernelGpu};
use shmlink::kernel_log::record::parse_record;
use shmlink::kernel_log::syslog::parse_line;

fuzz_target!(|data: &[u8]| {
    if let Some(record) = parse_record(data) {
        let acted_on = !matches!(kernel_gpu(&record), None | Some(KernelGpu::Lookalike { .. }));
        if gpu_lib_crash(&record).is_some() || acted_on {
            assert_eq!(record.facility, 0);
        }
    }
    for line in data.split(|&b| b == b'\n') {
        if let Some((facility, level, _, _)) = parse_line(line) {
            assert!(level < 8);
            let _ = facility;
        }
    }
});

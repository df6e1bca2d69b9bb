//! Pure: NVSwitch SXIDs in the kernel log. `nvidia-nvswitch` prints each as
//! (`NVSWITCH_PRINT_SXID`, the open kernel modules' `common_nvswitch.h`)
//!
//! `nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x): %05d, <Fatal|Non-fatal|Correctable>, ...`
//!
//! then, for the same error, `... %05d, Severity %d Engine instance ...` and `... %05d, Data
//! {...}` lines (`_nvswitch_dump_error_entry`): only the first line of an error says its
//! severity, so only it counts. A Fatal one is fatal to the fabric: the switch and the GPUs
//! whose NVLinks go to it need a reset.
//!
//! As with XIDs (`kernel.rs`), the kernel log is text others can shape: only a record of the
//! kernel's facility, not a task's crash line and without a netfilter LOG record's fields, is
//! the driver's.

use crate::kernel_log::record::{leading_decimal, KmsgRecord};

/// One SXID line, as the driver printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sxid {
    /// The switch's PCI address, `pci::canonical`.
    pub switch: String,
    pub sxid: u64,
    /// `Fatal` (else `Non-fatal` or `Correctable`).
    pub fatal: bool,
}

/// The SXID `record` tells, if it is the driver's first line of one.
pub fn sxid(record: &KmsgRecord) -> Option<Sxid> {
    let message = record.message.trim_start();
    let rest = message.strip_prefix("nvidia-nvswitch")?;
    let (_, rest) = leading_decimal::<u32>(rest)?;
    let rest = rest.strip_prefix(": SXid (PCI:")?;
    let (address, rest) = rest.split_once("): ")?;
    if !record.is_kernel()
        || super::lookalike::is_task_line(message)
        || super::lookalike::netfilter_fields(message)
    {
        return None;
    }
    // dddd:bb:dd.f, as the driver prints it.
    if address.len() != 12 || address.matches(':').count() != 2 || !address.contains('.') {
        return None;
    }
    let switch = crate::gpu::pci::canonical(address)?;
    let (sxid, rest) = leading_decimal::<u64>(rest)?;
    let fatal = match rest.strip_prefix(", ")?.split(',').next()? {
        "Fatal" => true,
        "Non-fatal" | "Correctable" => false,
        _ => return None,
    };
    Some(Sxid {
        switch,
        sxid,
        fatal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::kmsg::records;
    use crate::kernel_log::parse_record;

    fn parsed(content: &str) -> Vec<Option<Sxid>> {
        records(content)
            .iter()
            .map(|r| sxid(&parse_record(r.as_bytes()).unwrap()))
            .collect()
    }

    #[test]
    fn the_drivers_sxid_lines_count_once_each_and_lookalikes_never() {
        let got = parsed(
            "3,1,100,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 36 \
             sourcetrack TCEN0 crumbstore ECC DBE Error (First)\n\
             3,2,101,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Severity 1 Engine \
             instance 36 Sub-engine instance 00\n\
             3,3,102,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Data {0x00000000, \
             0x00000000}\n\
             3,4,103,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, Link 32 \
             egress non-posted PRIV error (First)\n\
             3,5,104,-;nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 15008, Correctable, Link 02 \
             ingress ECC\n\
             11,6,105,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, forged\n\
             4,7,106,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, IN=eth0 OUT= \
             SRC=10.0.0.1\n\
             6,8,107,-;python3[4242]: segfault at 0 nvidia-nvswitch0: SXid (PCI:0000:05:00.0): \
             24007, Fatal, x\n\
             3,9,108,-;nvidia-nvswitch0: SXid (PCI:05:00.0): 24007, Fatal, a short address",
        );
        let s = |switch: &str, sxid, fatal| {
            Some(Sxid {
                switch: switch.into(),
                sxid,
                fatal,
            })
        };
        assert_eq!(
            got,
            [
                s("0000:05:00.0", 24007, true),
                None, // the same error's details
                None,
                s("0000:08:00.0", 12028, false),
                s("0000:06:00.0", 15008, false),
                None, // a process's write (facility user)
                None, // a netfilter LOG prefix
                None, // a kernel line about a task
                None, // not the driver's address
            ]
        );
    }
}

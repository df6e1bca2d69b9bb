//! Pure: the NVLink links an XID line says failed to train. The driver tells a training
//! failure only as an XID (`nvErrorLog_va`): its debug prints (`NV_PRINTF`, the NVLink core's
//! `NVLINK_PRINT`) name no PCI address, or are compiled out of release drivers. The texts, as
//! the open kernel modules print them:
//!
//! - XID 74 (`NVLINK_ERROR`): `NVLink: failed to train link %d to remote PCI:%04x:%02x:%02x`
//!   (also `Failed to train link ...`), one line per link;
//! - XID 136 (`ALI_TRAINING_FAIL`): `NVLink: Link training failed for link %u(0x%x, ...)`
//!   (Hopper), `NVLink: Link training failed for links 0x%llx(0x%x, ...)` (Blackwell: a mask).
//!
//! The line itself is an XID and goes through `kernel.rs`'s rules (the driver's shape, NVML's
//! word for a fatal one) before its links are counted.

use crate::kernel_log::record::leading_decimal;

/// XID 74, `NVLINK_ERROR`.
pub const NVLINK_ERROR: u64 = 74;
/// XID 136, `ALI_TRAINING_FAIL`.
pub const ALI_TRAINING_FAIL: u64 = 136;

/// The links (a mask, bit N for link N) XID `xid`'s `text` says failed to train; None: the line
/// is not a training failure.
pub fn training_links(xid: u64, text: &str) -> Option<u64> {
    let at = text.find("NVLink: ")?;
    let said = &text[at + "NVLink: ".len()..];
    match xid {
        NVLINK_ERROR => {
            let rest = said
                .strip_prefix("failed to train link ")
                .or_else(|| said.strip_prefix("Failed to train link "))?;
            let (link, rest) = leading_decimal::<u32>(rest)?;
            rest.starts_with(" to remote PCI:").then_some(())?;
            bit(link)
        }
        ALI_TRAINING_FAIL => {
            let rest = said.strip_prefix("Link training failed for link")?;
            if let Some(mask) = rest.strip_prefix("s 0x") {
                let digits: String = mask.chars().take_while(char::is_ascii_hexdigit).collect();
                let mask = u64::from_str_radix(&digits, 16).ok()?;
                return (mask != 0).then_some(mask);
            }
            let (link, _) = leading_decimal::<u32>(rest.strip_prefix(' ')?)?;
            bit(link)
        }
        _ => None,
    }
}

fn bit(link: u32) -> Option<u64> {
    1u64.checked_shl(link)
}

/// The links of a mask, lowest first.
pub fn links(mask: u64) -> Vec<u32> {
    (0..64).filter(|l| mask & (1 << l) != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drivers_training_failures_name_their_links() {
        let cases = [
            (74, "pid='<unknown>', name=<unknown>, NVLink: failed to train link 3 to remote PCI:0000:05:00", Some(1 << 3)),
            (74, "NVLink: Failed to train link 12 to remote PCI:0000:2a:00", Some(1 << 12)),
            (136, "pid='<unknown>', name=<unknown>, NVLink: Link training failed for link 5(0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)", Some(1 << 5)),
            (136, "NVLink: Link training failed for links 0x30000(0x1, 0x2, 0x0, 0x0, 0x0, 0x0, 0x0)", Some(0x30000)),
            // Other NVLink XIDs, and the same words under another XID.
            (74, "NVLink: fatal error detected on link 6(0x10000, 0x0)", None),
            (13, "NVLink: failed to train link 3 to remote PCI:0000:05:00", None),
            (74, "NVLink: failed to train link 99 to remote PCI:0000:05:00", None),
            (136, "NVLink: Link training failed for links 0x0(0x0)", None),
        ];
        for (xid, text, want) in cases {
            assert_eq!(training_links(xid, text), want, "{xid}: {text}");
        }
        assert_eq!(links(0x30008), [3, 16, 17]);
    }
}

//! Pure: what an XID calls for, from NVIDIA's XID catalogue ("Analyzing Xid Errors with the Xid
//! Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: the catalogue for
//! Ampere and newer GPUs, the revision whose rows run to XID 172 and cite drivers up to R575).
//! Each row is the catalogue's "Resolution Bucket (Immediate Action)"; where that is a workflow
//! the row says which action the workflow's text names. Facts only: no XID here is judged by
//! anything but that column.

use crate::model::{XidAction, XidEntry};

use XidAction::{ContactVendor, Ignore, RebootNode, ResetGpu, RestartApp, UpdateSoftware};

/// The XIDs current GPUs report (the catalogue's "Unused" rows are left out: nothing sends
/// them). Sorted by XID.
const TABLE: &[(u64, &str, XidAction)] = &[
    (8, "GPU stopped processing", RestartApp),
    (11, "Invalid or corrupted push buffer stream", RestartApp),
    (13, "Graphics Engine Exception", RestartApp),
    (14, "Fake or injected error", Ignore),
    (25, "Invalid or illegal push buffer stream", RestartApp),
    (31, "GPU memory page fault", RestartApp),
    (32, "Invalid or corrupted push buffer stream", RestartApp),
    (37, "Driver firmware error", Ignore),
    (38, "Driver firmware error", Ignore),
    (39, "Copy Engine Exception", RestartApp),
    (40, "Copy Engine Exception", RestartApp),
    (41, "Copy Engine Exception", RestartApp),
    (43, "GPU stopped processing", Ignore),
    (44, "Graphics Engine fault during context switch", Ignore),
    // WORKFLOW_XID_45: alone, restart the application; beside other XIDs, follow those.
    (45, "Preemptive cleanup, due to previous errors", RestartApp),
    (46, "GPU stopped processing", ResetGpu),
    // WORKFLOW_XID_48: "A GPU reset or node reboot is needed to clear this error."
    (48, "Double Bit ECC Error", ResetGpu),
    (
        54,
        "Auxiliary power is not connected to the GPU board",
        ContactVendor,
    ),
    (60, "Video processor exception", RestartApp),
    (62, "Internal micro-controller halt", ResetGpu),
    (63, "GPU memory remapping event", Ignore),
    (64, "GPU memory remapping failure", ResetGpu),
    (66, "Illegal access by driver", Ignore),
    (67, "Illegal access by driver", Ignore),
    (68, "NVDEC0 Exception", RestartApp),
    (69, "Graphics Engine class error", RestartApp),
    (70, "CE3: Unknown Error", RestartApp),
    (71, "CE4: Unknown Error", RestartApp),
    (72, "CE5: Unknown Error", RestartApp),
    // WORKFLOW_NVLINK_ERR: "A GPU reset or node reboot is needed to clear this error."
    (74, "NVLink Error", ResetGpu),
    (75, "CE6: Unknown Error", RestartApp),
    (76, "CE7: Unknown Error", RestartApp),
    (77, "CE8: Unknown Error", RestartApp),
    (78, "vGPU Start Error", UpdateSoftware),
    // RESTART_BM: restart the bare-metal machine.
    (79, "GPU has fallen off the bus", RebootNode),
    (80, "Corrupted data sent to GPU", RestartApp),
    (82, "NVJPG0 Error", RestartApp),
    (83, "NVDEC1 Error", RestartApp),
    (84, "NVDEC2 Error", RestartApp),
    (85, "CE9: Unknown Error", RestartApp),
    (86, "OFA Exception", RestartApp),
    (88, "NVDEC3 Error", RestartApp),
    (89, "NVDEC4 Error", RestartApp),
    (92, "High single-bit ECC error rate", Ignore),
    (
        93,
        "Non-fatal violation of provisioned InfoROM wear limit",
        Ignore,
    ),
    (94, "Contained memory error", RestartApp),
    (95, "Uncontained memory error", ResetGpu),
    (96, "NVDEC5 Error", RestartApp),
    (97, "NVDEC6 Error", RestartApp),
    (98, "NVDEC7 Error", RestartApp),
    (99, "NVJPG1 Error", RestartApp),
    (100, "NVJPG2 Error", RestartApp),
    (101, "NVJPG3 Error", RestartApp),
    (102, "NVJPG4 Error", RestartApp),
    (103, "NVJPG5 Error", RestartApp),
    (104, "NVJPG6 Error", RestartApp),
    (105, "NVJPG7 Error", RestartApp),
    (106, "SMBPBI Test Message", Ignore),
    (107, "SMBPBI Test Message Silent", Ignore),
    (109, "Context Switch Timeout Error", ResetGpu),
    (110, "Security Fault Error", ResetGpu),
    (119, "GSP RPC Timeout", ResetGpu),
    (120, "GSP Error", ResetGpu),
    (121, "C2C Error", Ignore),
    (126, "CE10: Unknown Error", RestartApp),
    (127, "CE11: Unknown Error", RestartApp),
    (128, "CE12: Unknown Error", RestartApp),
    (129, "CE13: Unknown Error", RestartApp),
    (130, "CE14: Unknown Error", RestartApp),
    (131, "CE15: Unknown Error", RestartApp),
    (132, "CE16: Unknown Error", RestartApp),
    (133, "CE17: Unknown Error", RestartApp),
    (134, "CE18: Unknown Error", RestartApp),
    (135, "CE19: Unknown Error", RestartApp),
    (136, "Link Training Failed", ResetGpu),
    (137, "NVLink Privilege Error", Ignore),
    (139, "OFA1 Error", RestartApp),
    (140, "ECC Unrecovered Error", ResetGpu),
    (141, "CUDA Fast Path Error", Ignore),
    (142, "NVENC3 Error", ContactVendor),
    (143, "GPU Initialization Error", ResetGpu),
    // 144-150 (B100, GB200; R565+): both buckets WORKFLOW_NVLINK5_ERR. The catalogue's sub-code
    // table decides by the unit and error status the kernel line prints (`144, SAW_MVB Nonfatal
    // XC0 i0 Link 0 (0x00000001 0x00000008 ...)`): its Fatal rows need RESET_GPU, its
    // Non-fatal rows IGNORE or XID_154_EVAL (the recovery action XID 154 and NVML then report).
    // An NVML event carries no sub-code, so a count is taken as its worst case: a reset.
    (144, "NVLink: SAW Error", ResetGpu),
    (145, "NVLink: RLW Error", ResetGpu),
    (146, "NVLink: TLW Error", ResetGpu),
    (147, "NVLink: TREX Error", ResetGpu),
    (148, "NVLink: NVLPW_CTRL Error", ResetGpu),
    (149, "NVLink: NETIR Error", ResetGpu),
    (150, "NVLink: MSE Error", ResetGpu),
    // RESTART_VM: the machine is a VM; reboot it.
    (151, "Key rotation Error", RebootNode),
    // XID 154 summarises another XID's recovery action; NVML's recovery action says it too.
    (154, "GPU Recovery Action Changed", Ignore),
    (155, "NVLink: SW Defined Error", ResetGpu),
    (156, "Resource Retirement Event", ResetGpu),
    (157, "Resource Retirement Failure", Ignore),
    (158, "GPU Fatal Timeout", ResetGpu),
    (160, "Channel Retirement Event", Ignore),
    (161, "Channel Retirement Failure", Ignore),
];

/// The catalogue's row for `xid`; None for an XID it does not describe (an Event, never a
/// fault: nothing says it needs more).
pub fn lookup(xid: u64) -> Option<XidEntry> {
    TABLE
        .binary_search_by_key(&xid, |(x, _, _)| *x)
        .ok()
        .map(|i| {
            let (xid, what, action) = TABLE[i];
            XidEntry { xid, what, action }
        })
}

/// An NVLink 5 XID (144-150) as the kernel line's sub-code says it: `145, RLW_REMAP Nonfatal XC0
/// i0 Link 3 (0x00000004 0x00000040 ...)`: the unit, whether the driver called it fatal, the
/// link, and the error status the catalogue's "XID 144-150 Decode" tab keys on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvlink5<'a> {
    pub unit: &'a str,
    pub fatal: bool,
    pub error_status: Option<u32>,
    /// What the decode tab calls for: its fatal rows RESET_GPU, its non-fatal rows IGNORE or
    /// XID_154_EVAL (then XID 154 and NVML's recovery action say what to do).
    pub action: XidAction,
}

/// The sub-code of an XID 144-150 line's text (after `<xid>, `); None for another XID or a
/// text in another shape.
pub fn nvlink5(xid: u64, text: &str) -> Option<Nvlink5<'_>> {
    if !(144..=150).contains(&xid) {
        return None;
    }
    let mut words = text.split_whitespace();
    let unit = words.next()?;
    // `Link Fatal` (NETIR) is fatal too.
    let severity = match words.next()? {
        "Link" => words.next()?,
        word => word,
    };
    let fatal = match severity {
        "Fatal" => true,
        "Nonfatal" | "Non-fatal" => false,
        _ => return None,
    };
    let error_status = text
        .split_once('(')
        .and_then(|(_, regs)| regs.split_whitespace().nth(1))
        .and_then(|r| {
            u32::from_str_radix(r.trim_end_matches(')').trim_start_matches("0x"), 16).ok()
        });
    let action = if fatal { ResetGpu } else { Ignore };
    Some(Nvlink5 {
        unit,
        fatal,
        error_status,
        action,
    })
}

/// Whether `xid` makes `GpuFault` True.
pub fn is_fatal(xid: u64) -> bool {
    lookup(xid).is_some_and(|e| e.action.is_fatal())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fleet rules (deploy/prometheus/shmlink.rules.yml) list the XIDs that put a GPU out
    /// and those that are a link fault as regexes; they are this catalogue's, not a copy that
    /// drifts: every fatal XID, and the fatal ones whose text says NVLink.
    #[test]
    fn the_fleet_rules_xid_lists_are_the_catalogues() {
        let rules = include_str!("../../../deploy/prometheus/shmlink.rules.yml");
        let lists = |needle: &str| -> Vec<Vec<u64>> {
            rules
                .match_indices(needle)
                .map(|(i, _)| {
                    let rest = &rules[i + needle.len()..];
                    let end = rest.find('"').unwrap();
                    let mut xids: Vec<u64> =
                        rest[..end].split('|').map(|x| x.parse().unwrap()).collect();
                    xids.sort_unstable();
                    xids
                })
                .collect()
        };
        let fatal: Vec<u64> = (0..=1000).filter(|&x| is_fatal(x)).collect();
        let link: Vec<u64> = fatal
            .iter()
            .copied()
            .filter(|&x| lookup(x).is_some_and(|e| e.what.contains("NVLink")))
            .collect();
        let in_rules = lists("xid=~\"");
        assert_eq!(in_rules.len(), 6, "three uses of each list");
        for l in &in_rules {
            assert!(
                *l == fatal || *l == link,
                "{l:?} is neither {fatal:?} nor {link:?}"
            );
        }
        assert_eq!(in_rules.iter().filter(|l| **l == link).count(), 3);
    }

    #[test]
    fn nvlink5_sub_codes_say_fatal_or_not_as_the_kernel_line_does() {
        // In the shape the catalogue gives the driver's line.
        let saw = nvlink5(
            144,
            "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000)",
        )
        .unwrap();
        assert_eq!(
            (saw.unit, saw.fatal, saw.error_status, saw.action),
            ("SAW_MVB", false, Some(8), Ignore)
        );
        let netir = nvlink5(
            149,
            "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000)",
        )
        .unwrap();
        assert_eq!((netir.fatal, netir.action), (true, ResetGpu));
        assert!(netir.action.is_fatal() && !saw.action.is_fatal());
        assert_eq!(
            nvlink5(74, "SAW_MVB Fatal XC0"),
            None,
            "not an NVLink 5 XID"
        );
        assert_eq!(nvlink5(145, "pid=1, something else"), None);
        assert_eq!(nvlink5(145, ""), None);
    }

    #[test]
    fn the_table_is_sorted_without_duplicates() {
        assert!(TABLE.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn application_xids_stay_events_and_reset_or_reboot_xids_are_faults() {
        for xid in [13, 31, 43, 45, 94] {
            assert!(!is_fatal(xid), "XID {xid}");
        }
        assert_eq!(lookup(13).unwrap().action, XidAction::RestartApp);
        assert_eq!(lookup(43).unwrap().action, XidAction::Ignore);
        for xid in [48, 74, 95, 119, 120, 64, 62, 140] {
            assert_eq!(
                lookup(xid).unwrap().action,
                XidAction::ResetGpu,
                "XID {xid}"
            );
            assert!(is_fatal(xid));
        }
        assert_eq!(lookup(79).unwrap().action, XidAction::RebootNode);
        assert_eq!(lookup(79).unwrap().what, "GPU has fallen off the bus");
        assert!(is_fatal(79));
        assert!(
            !is_fatal(999),
            "an XID the catalogue does not know is no fault"
        );
        assert_eq!(lookup(999), None);
    }
}

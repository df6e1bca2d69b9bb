//! What NVIDIA's XID catalogue says of an XID, as the types the judges and the words share;
//! the table itself is `gpu::xid::catalogue`.

/// The immediate action the catalogue lists for an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum XidAction {
    /// IGNORE: informational, or told in another XID.
    Ignore,
    /// RESTART_APP: the application that hit it must restart; the GPU is fine.
    RestartApp,
    /// UPDATE_SWFW: update the driver or firmware.
    UpdateSoftware,
    /// RESET_GPU (and the workflows of XIDs 48 and 74: "a GPU reset or node reboot is needed").
    ResetGpu,
    /// RESTART_BM / RESTART_VM: reboot the machine.
    RebootNode,
    /// CHECK_MECHANICALS, CONTACT_SUPPORT: hands on the hardware, or the vendor.
    ContactVendor,
}

impl XidAction {
    /// Whether the GPU is unusable until someone acts: a reset, a reboot, the vendor. Such an
    /// XID makes `GpuFault` True; the others stay Events.
    pub const fn is_fatal(self) -> bool {
        matches!(
            self,
            XidAction::ResetGpu | XidAction::RebootNode | XidAction::ContactVendor
        )
    }
}

/// One XID the catalogue describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u64,
    /// The catalogue's description.
    pub what: &'static str,
    pub action: XidAction,
}

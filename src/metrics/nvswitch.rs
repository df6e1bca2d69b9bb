//! `shmlink_nvswitch_sxid_errors_total`: the NVSwitch SXIDs the kernel log told, by switch (its
//! PCI address) and SXID. Apart from the GPU families, which need NVML: the switches' SXIDs are
//! the kernel log's alone.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::counter;
use crate::model::SxidCount;

/// No family while there is none (most nodes have no NVSwitch).
pub(super) fn encode(encoder: &mut DescriptorEncoder, sxids: &[SxidCount]) -> fmt::Result {
    if sxids.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(
        "shmlink_nvswitch_sxid_errors",
        "NVSwitch SXIDs the kernel log told since the agent started, by switch (its PCI address) \
         and SXID; a fatal one takes the fabric through that switch down (gpu_nvswitch_fatal)",
        None,
        MetricType::Counter,
    )?;
    for s in sxids {
        let sxid = s.sxid.to_string();
        counter(
            &mut metric,
            &[("switch", s.switch.as_str()), ("sxid", &sxid)],
            s.count,
        )?;
    }
    Ok(())
}

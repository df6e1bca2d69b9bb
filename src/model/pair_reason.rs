//! One reason a GPU pair is not ok, typed from the rule that found it to the outlet that writes
//! it: its kind, how bad it is, the GPUs and links it names, and its words (made once by
//! `text/`). The JSON (`gpu_pairs[].reasons`) writes the words alone, as strings.

use std::fmt;

use serde::{Serialize, Serializer};

use super::Weight;

/// Which rule of the pair judge found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReasonKind {
    /// One end fell off the bus.
    GpuLost,
    /// A direct NVLink between the two is inactive.
    LinkInactive,
    /// Every NVSwitch link of one end is inactive.
    SwitchLinksDown,
    /// Some NVSwitch links of one end are inactive.
    SwitchLinksSomeDown,
    /// NVML's DL error counters grew over the window (replays, recoveries, CRC, ECC).
    LinkErrors,
    /// The NVLink5 counters (recoveries, symbol errors, BER) over the window.
    Nvlink5Errors,
    /// NVML's recovery action asks for P2P to be drained.
    RecoveryDrainsP2p,
    /// The GPU's NVSwitch fabric registration is not healthy.
    FabricUnhealthy,
    /// A PCIe bridge's ACS redirects the pair's P2P to the root complex.
    PcieAcs,
    /// P2P was ok for the pair and is not now.
    P2pLost,
    /// P2P fails where pairs like it work.
    P2pUnlikePeers,
    /// The pair probe's copy failed or was slow.
    Probe,
}

/// A reason with its weight; the pair's status is the worst weight of its reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairReason {
    pub kind: ReasonKind,
    pub weight: Weight,
    /// The GPUs its words name (by NVML index): whose fault it says it is.
    pub gpus: Vec<u32>,
    /// The links its words name (of `gpus[0]`), empty where none.
    pub links: Vec<u32>,
    pub text: String,
}

impl PairReason {
    pub fn new(kind: ReasonKind, weight: Weight, text: String) -> PairReason {
        PairReason {
            kind,
            weight,
            gpus: Vec::new(),
            links: Vec::new(),
            text,
        }
    }

    /// The GPUs its words name.
    pub fn naming(mut self, gpus: &[u32]) -> PairReason {
        self.gpus = gpus.to_vec();
        self
    }

    /// The links its words name.
    pub fn on_links(mut self, links: &[u32]) -> PairReason {
        self.links = links.to_vec();
        self
    }

    pub fn names_gpu(&self, gpu: u32) -> bool {
        self.gpus.contains(&gpu)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for PairReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Its words: `check --json`'s and `/api`'s reasons are strings.
impl Serialize for PairReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_writes_the_words_alone() {
        let r = PairReason::new(
            ReasonKind::LinkInactive,
            Weight::Down,
            "link 3 of GPU 0 to GPU 1 is inactive".into(),
        )
        .naming(&[0, 1])
        .on_links(&[3]);
        assert_eq!(
            serde_json::to_string(&vec![r.clone()]).unwrap(),
            r#"["link 3 of GPU 0 to GPU 1 is inactive"]"#
        );
        assert!(r.names_gpu(1) && !r.names_gpu(2));
        assert_eq!(r.to_string(), r.text);
    }
}

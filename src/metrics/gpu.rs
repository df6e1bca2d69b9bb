//! The GPU families: GPU info, lost and PCIe replays; NVLink state, error counters and BERs;
//! recovery actions; P2P and pair health; the pair judge's suspects; XIDs; who uses which GPU; the PCIe path; the pair
//! probe; NVML up and the driver's GPU count.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::model::{
    AcsState, Blame, GpuReading, LinkReading, P2pStatus, PairProbe, PairStatus, PairVerdict,
    PcieLink, ProbeStatus, SuspectBy,
};
use crate::model::{Snapshot, XidCount};

use super::shm::container_labels;
use super::{counter, gauge};

/// Every GPU family; those of GPUs and pairs only while NVML lists GPUs.
pub(super) fn encode(encoder: &mut DescriptorEncoder, snapshot: &Snapshot) -> fmt::Result {
    encode_node_info(encoder, snapshot)?;
    if !snapshot.gpus.is_empty() {
        encode_gpus(
            encoder,
            &snapshot.gpus,
            snapshot.node_info.driver.as_deref(),
        )?;
        encode_nvlink_up(encoder, &snapshot.gpus)?;
        encode_nvlink_errors(encoder, &snapshot.gpus)?;
        encode_nvlink_ber(encoder, &snapshot.gpus)?;
        encode_recovery_action(encoder, &snapshot.gpus)?;
        encode_pairs(encoder, &snapshot.gpu_pairs)?;
        encode_blame(encoder, &snapshot.gpu_blame)?;
        encode_xids(encoder, &snapshot.xids)?;
        if !snapshot.xids_unconfirmed.is_empty() {
            encode_unconfirmed(encoder, &snapshot.xids_unconfirmed)?;
        }
        // No family while there is none (the golden node has no IOMMU).
        if !snapshot.iommu_faults.is_empty() {
            encode_iommu(encoder, &snapshot.iommu_faults)?;
        }
        encode_users(encoder, snapshot)?;
        encode_pcie(encoder, &snapshot.gpus)?;
        encode_probes(encoder, &snapshot.gpu_probes)?;
        crate::links::metrics::encode(encoder, &snapshot.link_trends)?;
    }
    encode_nvml(encoder, snapshot)
}

/// `shmlink_node_info`: what the node runs, one series (the fleet's correlation keys, joined
/// to any series of the node by `instance`), written with or without GPUs.
fn encode_node_info(encoder: &mut DescriptorEncoder, snapshot: &Snapshot) -> fmt::Result {
    let mut info = encoder.encode_descriptor(
        "shmlink_node_info",
        "The node's NVIDIA driver, fabric manager and kernel (empty where unknown)",
        None,
        MetricType::Gauge,
    )?;
    let n = &snapshot.node_info;
    let labels = [
        ("node", snapshot.node.as_str()),
        ("driver", n.driver.as_deref().unwrap_or("")),
        ("fabric_manager", n.fabric_manager.as_deref().unwrap_or("")),
        ("kernel", n.kernel.as_deref().unwrap_or("")),
    ];
    gauge(&mut info, &labels, 1i64)
}

/// `shmlink_gpu_info` (the GPU's identity and its fleet keys: NVLink domain, chassis, slot,
/// tray, module, VBIOS, driver; empty where unknown), `shmlink_gpu_lost`,
/// `shmlink_gpu_pcie_replays_total`.
fn encode_gpus(
    encoder: &mut DescriptorEncoder,
    gpus: &[GpuReading],
    driver: Option<&str>,
) -> fmt::Result {
    let mut info = encoder.encode_descriptor(
        "shmlink_gpu_info",
        "GPUs NVML reports, with where each sits (NVLink domain, chassis, slot, tray) and what \
         it runs",
        None,
        MetricType::Gauge,
    )?;
    for g in gpus {
        let gpu = g.index.to_string();
        let fabric = g.fabric.as_ref();
        let clique = fabric
            .and_then(|f| f.clique_id)
            .map_or_else(String::new, |c| c.to_string());
        let platform = g.platform.as_ref();
        let place = |f: fn(&crate::model::PlatformInfo) -> u8| {
            platform.map_or_else(String::new, |p| f(p).to_string())
        };
        let (slot, tray, module) = (place(|p| p.slot), place(|p| p.tray), place(|p| p.module_id));
        let labels = [
            ("gpu", gpu.as_str()),
            ("uuid", &g.uuid),
            ("name", &g.name),
            ("pci_bus_id", &g.pci_bus_id),
            (
                "cluster_uuid",
                fabric.and_then(|f| f.cluster_uuid.as_deref()).unwrap_or(""),
            ),
            ("clique_id", &clique),
            (
                "chassis_serial",
                platform.map_or("", |p| p.chassis_serial.as_str()),
            ),
            ("slot", &slot),
            ("tray", &tray),
            ("module_id", &module),
            ("vbios", g.vbios.as_deref().unwrap_or("")),
            ("driver", driver.unwrap_or("")),
        ];
        gauge(&mut info, &labels, 1i64)?;
    }
    let mut lost = encoder.encode_descriptor(
        "shmlink_gpu_lost",
        "1 when NVML reports the GPU lost (fell off the bus)",
        None,
        MetricType::Gauge,
    )?;
    for g in gpus {
        let gpu = [("gpu", g.index.to_string())];
        gauge(&mut lost, &gpu, i64::from(g.lost))?;
    }
    let mut replays = encoder.encode_descriptor(
        "shmlink_gpu_pcie_replays",
        "PCIe replay counter",
        None,
        MetricType::Counter,
    )?;
    for g in gpus {
        if let Some(n) = g.pcie_replays {
            counter(&mut replays, &[("gpu", g.index.to_string())], n)?;
        }
    }
    Ok(())
}

/// `shmlink_gpu_container_info`: which container uses which GPU now, from NVML's process
/// lists (no PID label: PIDs churn), with the container's labels as its /dev/shm series carry
/// them.
fn encode_users(encoder: &mut DescriptorEncoder, snapshot: &Snapshot) -> fmt::Result {
    let mut info = encoder.encode_descriptor(
        "shmlink_gpu_container_info",
        "1 for each GPU a container's processes use (NVML's running processes)",
        None,
        MetricType::Gauge,
    )?;
    for (c, gpu) in snapshot.gpu_users.containers_now() {
        let gpu = gpu.to_string();
        let reading = snapshot
            .shm
            .iter()
            .find(|r| c.container_id.as_ref() == Some(&r.container_id));
        let [ns, pod, container, id, uid] = match reading {
            Some(r) => container_labels!(r),
            None => [
                ("namespace", ""),
                ("pod", ""),
                ("container", ""),
                ("container_id", c.id_or_empty()),
                ("pod_uid", c.pod_uid.as_deref().unwrap_or("")),
            ],
        };
        let labels = [ns, pod, container, id, uid, ("gpu", gpu.as_str())];
        gauge(&mut info, &labels, 1i64)?;
    }
    Ok(())
}

/// The PCIe link per GPU (NVML), and the AER counts and ACS redirect of the functions on its
/// path (sysfs).
fn encode_pcie(encoder: &mut DescriptorEncoder, gpus: &[GpuReading]) -> fmt::Result {
    type Part = fn(&PcieLink) -> u32;
    const LINK: [(&str, &str, Part); 4] = [
        (
            "shmlink_gpu_pcie_link_generation",
            "PCIe generation the GPU's link runs at now (lower when idle)",
            |l| l.gen,
        ),
        (
            "shmlink_gpu_pcie_link_max_generation",
            "Highest PCIe generation the GPU and its slot allow",
            |l| l.max_gen,
        ),
        (
            "shmlink_gpu_pcie_link_width",
            "Lanes the GPU's PCIe link runs with now",
            |l| l.width,
        ),
        (
            "shmlink_gpu_pcie_link_max_width",
            "Most lanes the GPU and its slot allow",
            |l| l.max_width,
        ),
    ];
    for (name, help, part) in LINK {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for g in gpus {
            if let Some(link) = &g.pcie_link {
                gauge(
                    &mut metric,
                    &[("gpu", g.index.to_string())],
                    i64::from(part(link)),
                )?;
            }
        }
    }
    let mut aer = encoder.encode_descriptor(
        "shmlink_gpu_pcie_aer_errors",
        "AER errors counted since boot by the GPU or a bridge on its PCIe path (sysfs)",
        None,
        MetricType::Counter,
    )?;
    for g in gpus {
        let gpu = g.index.to_string();
        for hop in &g.pcie_path {
            let Some(t) = hop.aer else { continue };
            for (severity, n) in [
                ("correctable", t.correctable),
                ("nonfatal", t.nonfatal),
                ("fatal", t.fatal),
            ] {
                let labels = [
                    ("gpu", gpu.as_str()),
                    ("device", hop.bdf.as_str()),
                    ("severity", severity),
                ];
                counter(&mut aer, &labels, n)?;
            }
        }
    }
    let mut acs = encoder.encode_descriptor(
        "shmlink_gpu_pcie_acs_redirect",
        "1 when ACS on a bridge on the GPU's PCIe path redirects peer-to-peer traffic",
        None,
        MetricType::Gauge,
    )?;
    for g in gpus {
        let gpu = g.index.to_string();
        for hop in g.pcie_path.iter().filter(|h| h.bridge) {
            if hop.acs == AcsState::Unknown {
                continue;
            }
            let labels = [("gpu", gpu.as_str()), ("device", hop.bdf.as_str())];
            gauge(&mut acs, &labels, i64::from(hop.acs.redirects()))?;
        }
    }
    Ok(())
}

/// The pair probe's last results, per ordered pair (`gpu` -> `peer_gpu`).
fn encode_probes(encoder: &mut DescriptorEncoder, probes: &[PairProbe]) -> fmt::Result {
    let mut ok = encoder.encode_descriptor(
        "shmlink_gpu_pair_probe_ok",
        "1 when the pair probe's copies from gpu to peer_gpu were ok at its last run",
        None,
        MetricType::Gauge,
    )?;
    for p in probes {
        let labels = [
            ("gpu", p.from_gpu.to_string()),
            ("peer_gpu", p.to_gpu.to_string()),
        ];
        gauge(&mut ok, &labels, i64::from(p.status == ProbeStatus::Ok))?;
    }
    let mut gbps = encoder.encode_descriptor(
        "shmlink_gpu_pair_probe_bandwidth_bytes_per_second",
        "The pair probe's sized copy from gpu to peer_gpu at its last run",
        None,
        MetricType::Gauge,
    )?;
    for p in probes {
        if let Some(g) = p.gbps {
            let labels = [
                ("gpu", p.from_gpu.to_string()),
                ("peer_gpu", p.to_gpu.to_string()),
            ];
            gauge(&mut gbps, &labels, g * 1e9)?;
        }
    }
    Ok(())
}

/// A link's `gpu`, `link` and `peer` label values.
struct LinkLabels {
    gpu: String,
    link: String,
    peer: String,
}

impl LinkLabels {
    fn get(&self) -> [(&'static str, &str); 3] {
        [
            ("gpu", &self.gpu),
            ("link", &self.link),
            ("peer", &self.peer),
        ]
    }
}

/// Every GPU's links in order, each with its labels.
fn links(gpus: &[GpuReading]) -> impl Iterator<Item = (LinkLabels, &LinkReading)> {
    gpus.iter().flat_map(|g| {
        g.links.iter().map(|l| {
            let labels = LinkLabels {
                gpu: g.index.to_string(),
                link: l.link.to_string(),
                peer: l.peer.to_string(),
            };
            (labels, l)
        })
    })
}

/// `shmlink_nvlink_up`.
fn encode_nvlink_up(encoder: &mut DescriptorEncoder, gpus: &[GpuReading]) -> fmt::Result {
    let mut up = encoder.encode_descriptor(
        "shmlink_nvlink_up",
        "1 when the NVLink is active",
        None,
        MetricType::Gauge,
    )?;
    for (labels, l) in links(gpus) {
        gauge(&mut up, &labels.get(), i64::from(l.active))?;
    }
    Ok(())
}

/// `shmlink_nvlink_errors_total`: the DL counters, and on NVLink5 GPUs their COUNT fields (more
/// `type` values).
fn encode_nvlink_errors(encoder: &mut DescriptorEncoder, gpus: &[GpuReading]) -> fmt::Result {
    let mut errors = encoder.encode_descriptor(
        "shmlink_nvlink_errors",
        "NVLink data-link error counters",
        None,
        MetricType::Counter,
    )?;
    for (labels, l) in links(gpus) {
        let dl = l.errors.map(|e| {
            [
                ("replay", e.replay),
                ("recovery", e.recovery),
                ("crc_flit", e.crc_flit),
                ("crc_data", e.crc_data),
                ("ecc_data", e.ecc_data),
            ]
        });
        let n5 = l.nvlink5.map(|e| {
            [
                ("recovery_successful", e.recovery_successful),
                ("recovery_failed", e.recovery_failed),
                ("recovery_events", e.recovery_events),
                ("symbol", e.symbol),
                ("effective", e.effective),
            ]
        });
        for (kind, value) in dl.into_iter().flatten().chain(n5.into_iter().flatten()) {
            counter(&mut errors, &(labels.get(), [("type", kind)]), value)?;
        }
    }
    Ok(())
}

/// `shmlink_nvlink_ber`: the NVLink5 BERs the link answers.
fn encode_nvlink_ber(encoder: &mut DescriptorEncoder, gpus: &[GpuReading]) -> fmt::Result {
    let mut ber = encoder.encode_descriptor(
        "shmlink_nvlink_ber",
        "NVLink5 bit error rate NVML reports for the link",
        None,
        MetricType::Gauge,
    )?;
    for (labels, l) in links(gpus) {
        let Some(e) = l.nvlink5 else { continue };
        for (kind, value) in [("effective", e.effective_ber), ("symbol", e.symbol_ber)] {
            let Some(value) = value else { continue };
            gauge(&mut ber, &(labels.get(), [("kind", kind)]), value.value())?;
        }
    }
    Ok(())
}

/// `shmlink_gpu_recovery_action`, where NVML gives one.
fn encode_recovery_action(encoder: &mut DescriptorEncoder, gpus: &[GpuReading]) -> fmt::Result {
    let mut action = encoder.encode_descriptor(
        "shmlink_gpu_recovery_action",
        "1 for NVML's recovery action for the GPU, when it gives one",
        None,
        MetricType::Gauge,
    )?;
    for g in gpus {
        let Some(a) = g.recovery_action else { continue };
        let gpu = g.index.to_string();
        gauge(
            &mut action,
            &[("gpu", gpu.as_str()), ("action", a.as_str())],
            1i64,
        )?;
    }
    Ok(())
}

/// `shmlink_gpu_p2p_ok` (pairs whose P2P query answered) and `shmlink_gpu_pair_healthy`.
fn encode_pairs(encoder: &mut DescriptorEncoder, pairs: &[PairVerdict]) -> fmt::Result {
    let labels = |pair: &PairVerdict| (pair.gpu.to_string(), pair.peer_gpu.to_string());
    let mut p2p = encoder.encode_descriptor(
        "shmlink_gpu_p2p_ok",
        "1 when NVML reports P2P OK for the capability",
        None,
        MetricType::Gauge,
    )?;
    for pair in pairs {
        let Some(caps) = pair.p2p else { continue };
        let (a, b) = labels(pair);
        for (capability, status) in caps.iter() {
            let labels = [
                ("gpu", a.as_str()),
                ("peer_gpu", &b),
                ("capability", capability),
            ];
            gauge(&mut p2p, &labels, i64::from(status == P2pStatus::Ok))?;
        }
    }
    let mut healthy = encoder.encode_descriptor(
        "shmlink_gpu_pair_healthy",
        "1 when the GPU pair is ok, 0 degraded or down",
        None,
        MetricType::Gauge,
    )?;
    for pair in pairs {
        let (a, b) = labels(pair);
        let ok = i64::from(pair.status == PairStatus::Ok);
        gauge(&mut healthy, &[("gpu", a.as_str()), ("peer_gpu", &b)], ok)?;
    }
    encode_failing_since(encoder, pairs)
}

/// `shmlink_gpu_pair_failing_since_seconds`: only while some pair fails (no family otherwise).
fn encode_failing_since(encoder: &mut DescriptorEncoder, pairs: &[PairVerdict]) -> fmt::Result {
    let failing: Vec<(&PairVerdict, std::time::SystemTime)> =
        pairs.iter().filter_map(|p| Some((p, p.since?))).collect();
    if failing.is_empty() {
        return Ok(());
    }
    let mut since = encoder.encode_descriptor(
        "shmlink_gpu_pair_failing_since_seconds",
        "Since when (Unix time) the failing GPU pair has failed without a break, across agent \
         restarts in the same boot",
        None,
        MetricType::Gauge,
    )?;
    for (pair, at) in failing {
        let secs = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let (a, b) = (pair.gpu.to_string(), pair.peer_gpu.to_string());
        gauge(&mut since, &[("gpu", a.as_str()), ("peer_gpu", &b)], secs)?;
    }
    Ok(())
}

/// `shmlink_gpu_suspect` and `shmlink_gpu_pairs_node_wide`: the pair judge's [`Blame`] as
/// the Node condition words it, so an alert can page once per culprit GPU rather than once per
/// pair. `by` says which of the judge's rules named the GPU; the condition names a culprit for
/// `fails_with_all` and `most_pairs`, none for `either_end`, and the alert rules do the same.
fn encode_blame(encoder: &mut DescriptorEncoder, blame: &Blame) -> fmt::Result {
    let mut suspect = encoder.encode_descriptor(
        "shmlink_gpu_suspect",
        "GPUs the pair judge blames for failing pairs, valued by how many of the GPU's pairs \
         fail; by: fails_with_all or most_pairs (the culprit), either_end (failing pairs that \
         share no GPU: either end of each, no culprit)",
        None,
        MetricType::Gauge,
    )?;
    for s in &blame.suspects {
        let by = match s.by {
            SuspectBy::FailsWithAll => "fails_with_all",
            SuspectBy::MostPairs => "most_pairs",
            SuspectBy::EitherEnd => "either_end",
        };
        let gpu = s.gpu.to_string();
        let pairs = i64::try_from(s.bad_pairs).unwrap_or(i64::MAX);
        gauge(&mut suspect, &[("gpu", gpu.as_str()), ("by", by)], pairs)?;
    }
    encoder
        .encode_descriptor(
            "shmlink_gpu_pairs_node_wide",
            "1 when every pair of every GPU fails (three GPUs or more): the node (fabric, \
             platform, driver), not one GPU",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&i64::from(blame.node_wide))
}

/// `shmlink_gpu_xid_errors_total`.
fn encode_xids(encoder: &mut DescriptorEncoder, xids: &[XidCount]) -> fmt::Result {
    encode_xid_counts(
        encoder,
        "shmlink_gpu_xid_errors",
        "XID errors since the agent started",
        xids,
    )
}

/// `shmlink_gpu_xid_unconfirmed_total`: kernel log lines read as XIDs that NVML did not confirm
/// (or that were not the driver's), never acted on.
fn encode_unconfirmed(encoder: &mut DescriptorEncoder, xids: &[XidCount]) -> fmt::Result {
    encode_xid_counts(
        encoder,
        "shmlink_gpu_xid_unconfirmed",
        "Kernel log lines read as XIDs without NVML's word (a fatal XID NVML did not confirm, a \
         line not in the driver's shape, a netfilter LOG record, a process's write): not acted on",
        xids,
    )
}

/// A counter family of XID counts by `gpu` (an index, or a PCI address NVML does not list) and
/// `xid`.
fn encode_xid_counts(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    xids: &[XidCount],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for x in xids {
        let (gpu, xid) = (x.gpu_label(), x.xid.to_string());
        counter(
            &mut metric,
            &[("gpu", gpu.as_str()), ("xid", &xid)],
            x.count,
        )?;
    }
    Ok(())
}

/// `shmlink_gpu_iommu_faults_total`: IOMMU page faults the kernel log named each GPU in.
fn encode_iommu(
    encoder: &mut DescriptorEncoder,
    faults: &std::collections::BTreeMap<u32, u64>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "shmlink_gpu_iommu_faults",
        "IOMMU page faults (AMD-Vi, DMAR) the kernel log named the GPU in since the agent started: \
         its DMA, peer traffic among it, blocked",
        None,
        MetricType::Counter,
    )?;
    for (gpu, count) in faults {
        counter(&mut metric, &[("gpu", gpu.to_string().as_str())], *count)?;
    }
    Ok(())
}

/// `shmlink_nvml_up` and `shmlink_gpu_devices`, with or without GPUs.
fn encode_nvml(encoder: &mut DescriptorEncoder, snapshot: &Snapshot) -> fmt::Result {
    encoder
        .encode_descriptor(
            "shmlink_nvml_up",
            "1 when NVML is loaded and answering",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&i64::from(snapshot.nvml_up))?;
    encoder
        .encode_descriptor(
            "shmlink_gpu_devices",
            "NVIDIA GPUs the driver lists (/proc/driver/nvidia/gpus), whether or not NVML loads",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&(snapshot.driver_gpus.len() as i64))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwapOption;

    use crate::fixtures::gpu_board;
    use crate::model::{Blame, Snapshot, Suspect, SuspectBy};

    use super::super::Metrics;

    /// The sample lines of the suspect and node-wide families.
    fn blame_series(snapshot: Snapshot) -> Vec<String> {
        let metrics = Metrics::new(Arc::new(ArcSwapOption::from_pointee(snapshot)));
        let text = metrics.encode().unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("shmlink_gpu_suspect") || l.starts_with("shmlink_gpu_pairs_node_wide")
            })
            .map(str::to_string)
            .collect()
    }

    fn suspect(gpu: u32, bad_pairs: usize, by: SuspectBy) -> Suspect {
        Suspect {
            gpu,
            bad_pairs,
            by,
            reasons: vec![crate::model::PairReason::new(
                crate::model::ReasonKind::LinkInactive,
                crate::model::Weight::Down,
                format!("NVLink 0 of GPU {gpu} is inactive"),
            )
            .naming(&[gpu])
            .on_links(&[0])],
        }
    }

    /// What `gpu::blame` says of each board (its own tests hold the rule).
    fn board(gpus: u32, suspects: Vec<Suspect>, node_wide: bool) -> Snapshot {
        let mut s = gpu_board(gpus);
        s.gpu_blame = Blame {
            suspects,
            node_wide,
        };
        s
    }

    #[test]
    fn one_gpu_down_of_eight_is_one_culprit_series_with_its_seven_pairs() {
        let s = board(8, vec![suspect(7, 7, SuspectBy::FailsWithAll)], false);
        assert_eq!(
            blame_series(s),
            [
                r#"shmlink_gpu_suspect{gpu="7",by="fails_with_all"} 7"#,
                "shmlink_gpu_pairs_node_wide 0"
            ]
        );
    }

    #[test]
    fn two_separate_bad_pairs_name_either_end_of_each_and_no_culprit() {
        let ends = [0, 1, 2, 3].map(|g| suspect(g, 1, SuspectBy::EitherEnd));
        let got = blame_series(board(8, ends.to_vec(), false));
        assert_eq!(got.len(), 5, "{got:?}");
        for g in 0..4 {
            let line = format!(r#"shmlink_gpu_suspect{{gpu="{g}",by="either_end"}} 1"#);
            assert!(got.contains(&line), "{line} not in {got:?}");
        }
        assert!(!got
            .iter()
            .any(|l| l.contains("fails_with_all") || l.contains("most_pairs")));
        assert_eq!(got[4], "shmlink_gpu_pairs_node_wide 0");
    }

    #[test]
    fn a_gpu_in_the_most_failing_pairs_is_named_by_most_pairs() {
        let s = board(8, vec![suspect(7, 2, SuspectBy::MostPairs)], false);
        assert_eq!(
            blame_series(s)[0],
            r#"shmlink_gpu_suspect{gpu="7",by="most_pairs"} 2"#
        );
    }

    #[test]
    fn node_wide_names_no_gpu() {
        assert_eq!(
            blame_series(board(8, Vec::new(), true)),
            ["shmlink_gpu_pairs_node_wide 1"]
        );
    }

    #[test]
    fn without_gpus_neither_family_is_written() {
        let mut s = board(0, Vec::new(), false);
        s.nvml_up = false;
        assert!(blame_series(s).is_empty());
    }
}

//! The file as written -> `Config`: PCI ids, words (names.rs) and BERs turned into NVML's
//! values, pairs checked against the GPUs, defaults that depend on other keys (minor number,
//! NVML version, a link's remote type). Errors name where: `gpus[1].links[3]: ...`.

use std::collections::BTreeMap;

use nvml_wrapper_sys::bindings as sys;

use super::names::{
    caps_of, fabric_state, nvml_return, p2p_status, recovery_action, remote_type, topology_level,
};
use super::raw::{
    number, OneOrMany, RawConfig, RawFabric, RawGpu, RawLink, RawNvlink5, RawPlatform,
};
use super::{
    Config, Fabric, Gpu, Link, Nvlink5, P2pRule, Pci, PcieLink, Platform, Process, Utilization,
    P2P_CAPS,
};

impl RawConfig {
    /// The whole file: GPUs, then which links reach one of them, then P2P, topology, versions.
    pub(super) fn validate(self) -> Result<Config, String> {
        let count = self.gpus.len() as u32;
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for (index, g) in self.gpus.into_iter().enumerate() {
            gpus.push(g.validate(index)?);
        }
        // A remote type left out is "gpu" when the far end is one of ours, as NVML would say.
        let ours: Vec<Pci> = gpus.iter().map(|g| g.pci.clone()).collect();
        for gpu in &mut gpus {
            for link in &mut gpu.links {
                if link.remote_type
                    == sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN
                    && link.remote.as_ref().is_some_and(|r| ours.contains(r))
                {
                    link.remote_type =
                        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU;
                }
            }
        }

        let pair = |what: &str, n: usize, a: u32, b: u32| {
            if a >= count || b >= count || a == b {
                Err(format!(
                    "{what}[{n}]: gpu {a} / peer_gpu {b} is not a pair of distinct GPUs of {count}"
                ))
            } else {
                Ok((a.min(b), a.max(b)))
            }
        };

        let mut p2p_default = [sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK; P2P_CAPS];
        for (cap, status) in &self.p2p_default {
            let caps =
                caps_of(std::slice::from_ref(cap)).map_err(|e| format!("p2p_default: {e}"))?;
            let status = p2p_status(status).map_err(|e| format!("p2p_default: {e}"))?;
            for (i, slot) in p2p_default.iter_mut().enumerate() {
                if caps & (1 << i) != 0 {
                    *slot = status;
                }
            }
        }
        let mut p2p = Vec::with_capacity(self.p2p.len());
        for (n, r) in self.p2p.into_iter().enumerate() {
            let caps = match &r.capability {
                None => caps_of(&["all".into()]),
                Some(OneOrMany::One(c)) => caps_of(std::slice::from_ref(c)),
                Some(OneOrMany::Many(cs)) => caps_of(cs),
            }
            .map_err(|e| format!("p2p[{n}]: {e}"))?;
            p2p.push(P2pRule {
                pair: pair("p2p", n, r.gpu, r.peer_gpu)?,
                caps,
                status: p2p_status(&r.status).map_err(|e| format!("p2p[{n}]: {e}"))?,
            });
        }

        let default_topology =
            topology_level(&self.default_topology).map_err(|e| format!("default_topology: {e}"))?;
        let mut topology = BTreeMap::new();
        for (n, t) in self.topology.into_iter().enumerate() {
            let level = topology_level(&t.level).map_err(|e| format!("topology[{n}]: {e}"))?;
            topology.insert(pair("topology", n, t.gpu, t.peer_gpu)?, level);
        }

        let nvml_version = self
            .nvml_version
            .unwrap_or_else(|| format!("12.{}", self.driver_version));
        Ok(Config {
            driver_version: self.driver_version,
            nvml_version,
            gpus,
            p2p_default,
            p2p,
            default_topology,
            topology,
        })
    }
}

impl RawGpu {
    /// GPU `index`; its links in order, then its own keys.
    fn validate(self, index: usize) -> Result<Gpu, String> {
        let at = |e: String| format!("gpus[{index}]: {e}");
        let pci = Pci::parse(&self.pci_bus_id).map_err(at)?;
        let mut links = Vec::with_capacity(self.links.len());
        for (n, l) in self.links.into_iter().enumerate() {
            links.push(
                l.validate()
                    .map_err(|e| format!("gpus[{index}].links[{n}]: {e}"))?,
            );
        }
        if links.len() > sys::NVML_NVLINK_MAX_LINKS as usize {
            return Err(at(format!(
                "{} links, NVML has at most {}",
                links.len(),
                sys::NVML_NVLINK_MAX_LINKS
            )));
        }
        Ok(Gpu {
            name: self.name,
            uuid: self.uuid,
            pci,
            pci_device_id: number(&self.pci_device_id).map_err(at)?,
            pci_subsystem_id: number(&self.pci_subsystem_id).map_err(at)?,
            minor_number: self.minor_number.unwrap_or(index as u32),
            pcie_replays: u32::try_from(self.pcie_replays).unwrap_or(u32::MAX),
            lost: self.lost,
            xids: self.xids,
            xid_events: self.xid_events,
            error_counter_api: self.error_counter_api,
            recovery_action: self
                .recovery_action
                .as_deref()
                .map(recovery_action)
                .transpose()
                .map_err(at)?,
            fabric: self
                .fabric
                .as_ref()
                .map(RawFabric::validate)
                .transpose()
                .map_err(at)?,
            platform: self
                .platform
                .map(RawPlatform::validate)
                .transpose()
                .map_err(at)?,
            vbios: self.vbios,
            processes: check_processes(self.processes).map_err(at)?,
            pcie_link: self
                .pcie_link
                .map(PcieLink::validate)
                .transpose()
                .map_err(at)?,
            utilization: self
                .utilization
                .map(Utilization::validate)
                .transpose()
                .map_err(at)?,
            links,
        })
    }
}

impl RawLink {
    /// A remote type left out is UNKNOWN here; `RawConfig::validate` makes it GPU when the far
    /// end is one of the file's GPUs.
    fn validate(self) -> Result<Link, String> {
        let remote = self
            .remote_pci_bus_id
            .as_deref()
            .map(Pci::parse)
            .transpose()?;
        let remote_type = match self.remote_type.as_deref() {
            Some(t) => remote_type(t)?,
            None => sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
        };
        Ok(Link {
            active: self.active,
            remote,
            remote_type,
            errors: self.errors,
            nvlink5: self
                .nvlink5
                .validate()
                .map_err(|e| format!("nvlink5: {e}"))?,
        })
    }
}

impl RawFabric {
    fn validate(&self) -> Result<Fabric, String> {
        let state = fabric_state(&self.state)?;
        // Both flags are reported (TRUE 1 / FALSE 2), as a GPU with fabric health does.
        let flag = |on: bool| if on { 1 } else { 2 };
        Ok(Fabric {
            state,
            status: nvml_return(&self.status)?,
            health_mask: (flag(self.degraded_bandwidth)
                << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
                | (flag(self.route_unhealthy)
                    << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY),
            cluster_uuid: match &self.cluster_uuid {
                Some(u) => parse_uuid(u).map_err(|e| format!("fabric.cluster_uuid: {e}"))?,
                None => [0; 16],
            },
            clique_id: self.clique_id,
        })
    }
}

/// `8-4-4-4-12` hex digits (any case) -> the 16 bytes NVML's clusterUuid holds.
fn parse_uuid(text: &str) -> Result<[u8; 16], String> {
    let groups: Vec<&str> = text.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return Err(format!("{text:?} is not a UUID (8-4-4-4-12 hex digits)"));
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{text:?} is not a UUID (8-4-4-4-12 hex digits)"))?;
    }
    Ok(out)
}

impl RawPlatform {
    fn validate(self) -> Result<Platform, String> {
        if self.chassis_serial.len() > 16 || !self.chassis_serial.is_ascii() {
            return Err(format!(
                "platform.chassis_serial {:?}: at most 16 ASCII characters",
                self.chassis_serial
            ));
        }
        Ok(Platform {
            chassis_serial: self.chassis_serial,
            slot: self.slot,
            tray: self.tray,
            host_id: self.host_id,
            module_id: self.module_id,
        })
    }
}

/// NVML lists a process once per GPU.
fn check_processes(processes: Vec<Process>) -> Result<Vec<Process>, String> {
    for (n, p) in processes.iter().enumerate() {
        if processes[..n].iter().any(|q| q.pid == p.pid) {
            return Err(format!("processes[{n}]: pid {} listed twice", p.pid));
        }
    }
    Ok(processes)
}

impl PcieLink {
    /// Generations PCIe has had (1-6) and the widths a link trains at.
    fn validate(self) -> Result<PcieLink, String> {
        let bad = |e: String| Err(format!("pcie_link: {e}"));
        if !(1 <= self.generation
            && self.generation <= self.max_generation
            && self.max_generation <= 6)
        {
            return bad(format!(
                "want 1 <= gen ({}) <= max_gen ({}) <= 6",
                self.generation, self.max_generation
            ));
        }
        for w in [self.width, self.max_width] {
            if ![1, 2, 4, 8, 16, 32].contains(&w) {
                return bad(format!("width {w} is not 1, 2, 4, 8, 16 or 32"));
            }
        }
        if self.width > self.max_width {
            return bad(format!(
                "width {} > max_width {}",
                self.width, self.max_width
            ));
        }
        Ok(self)
    }
}

impl Utilization {
    fn validate(self) -> Result<Utilization, String> {
        for (what, v) in [("gpu", self.gpu), ("memory", self.memory)] {
            if v > 100 {
                return Err(format!("utilization: {what} {v} is not a percentage"));
            }
        }
        Ok(self)
    }
}

impl RawNvlink5 {
    fn validate(self) -> Result<Nvlink5, String> {
        Ok(Nvlink5 {
            recovery_successful: self.recovery_successful,
            recovery_failed: self.recovery_failed,
            recovery_events: self.recovery_events,
            symbol_errors: self.symbol_errors,
            effective_errors: self.effective_errors,
            effective_ber: pack_ber(self.effective_ber)
                .map_err(|e| format!("effective_ber: {e}"))?,
            symbol_ber: pack_ber(self.symbol_ber).map_err(|e| format!("symbol_ber: {e}"))?,
        })
    }
}

/// A BER in [0, 1] as NVML packs it: bits 0-7 the exponent, bits 8-11 the mantissa, rate =
/// mantissa x 10^-exponent (nvml.h, NVML_NVLINK_BER_*). The mantissa is one decimal digit, so
/// 2.5e-11 is served as 3e-11. 0 is served as 0.
pub fn pack_ber(ber: f64) -> Result<u64, String> {
    if !(0.0..=1.0).contains(&ber) {
        return Err(format!("{ber} is not a rate in [0, 1]"));
    }
    if ber == 0.0 {
        return Ok(0);
    }
    let mut exponent = (-ber.log10()).ceil().max(0.0) as i32;
    let mut mantissa = (ber * 10f64.powi(exponent)).round() as i64;
    if mantissa >= 10 {
        mantissa = 1;
        exponent -= 1;
    }
    if exponent > 255 {
        return Ok(0);
    }
    Ok(((mantissa.clamp(1, 15) as u64) << 8) | exponent.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistakes_are_rejected_with_where() {
        let bad = [
            (
                r#"{"gpus": [{"name": "G", "uuid": "U", "pci_bus_id": "18:00.0"}]}"#,
                "gpus[0]",
            ),
            (r#"{"gpus": [], "typo": 1}"#, "unknown field"),
            (
                r#"{"gpus": [{"name": "G", "uuid": "U", "pci_bus_id": "0:1:0.0", "links": [{"remote_type": "nvswitch"}]}]}"#,
                "gpus[0].links[0]",
            ),
            (
                r#"{"gpus": [{"name": "G", "uuid": "U", "pci_bus_id": "0:1:0.0"}], "p2p": [{"gpu": 0, "peer_gpu": 1, "status": "ok"}]}"#,
                "p2p[0]",
            ),
            (r#"{"default_topology": "numa"}"#, "default_topology"),
            (r#"{"gpus": [}"#, "expected"),
        ];
        for (text, want) in bad {
            let err = Config::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn remote_type_defaults_to_gpu_only_for_our_gpus() {
        let cfg = Config::parse(
            r#"{"gpus": [{"name": "G", "uuid": "A", "pci_bus_id": "00000000:18:00.0",
                          "links": [{"remote_pci_bus_id": "0000:2a:00.0"}, {"remote_pci_bus_id": "00000000:05:00.0"}, {}]},
                         {"name": "G", "uuid": "B", "pci_bus_id": "00000000:2A:00.0"}]}"#,
        )
        .unwrap();
        let types: Vec<u32> = cfg.gpus[0].links.iter().map(|l| l.remote_type).collect();
        assert_eq!(
            types,
            [
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
            ]
        );
    }

    #[test]
    fn recovery_action_and_fabric_parse_and_mistakes_are_named() {
        let cfg = Config::parse(
            r#"{"gpus": [{"name": "B", "uuid": "U", "pci_bus_id": "0:1:0.0", "recovery_action": "gpu_reset",
                "fabric": {"state": "completed", "status": "timeout", "route_unhealthy": true}}]}"#,
        )
        .unwrap();
        let g = &cfg.gpus[0];
        assert_eq!(g.recovery_action, Some(1));
        let f = g.fabric.unwrap();
        assert_eq!(f.state as u32, sys::NVML_GPU_FABRIC_STATE_COMPLETED);
        assert_eq!(f.status, sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT);
        // degraded bandwidth FALSE (2) at bit 0, route unhealthy TRUE (1) at bit 4.
        assert_eq!(f.health_mask, 0x12);
        for (text, want) in [
            (r#""recovery_action": "reboot""#, "recovery_action"),
            (r#""fabric": {"state": "done"}"#, "fabric state"),
            (
                r#""fabric": {"state": "completed", "status": "oops"}"#,
                "NVML status",
            ),
            (r#""error_counter_api": "nvlink6""#, "unknown variant"),
            (r#""links": [{"nvlink5": {"symbol_ber": 3}}]"#, "symbol_ber"),
            (r#""links": [{"nvlink5": {"symbols": 3}}]"#, "unknown field"),
        ] {
            let json = format!(
                r#"{{"gpus": [{{"name": "B", "uuid": "U", "pci_bus_id": "0:1:0.0", {text}}}]}}"#
            );
            let err = Config::parse(&json).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn the_nvlink_domain_platform_and_vbios_parse_and_mistakes_are_named() {
        let cfg = Config::parse(
            r#"{"gpus": [{"name": "B", "uuid": "U", "pci_bus_id": "0:1:0.0", "vbios": "97.00.A5.00.01",
                "fabric": {"state": "completed", "cluster_uuid": "7f3C0d5e-0b1a-4c2d-9e8f-001122334455", "clique_id": 32766},
                "platform": {"chassis_serial": "1821724000123", "slot": 9, "tray": 4, "module_id": 2}}]}"#,
        )
        .unwrap();
        let g = &cfg.gpus[0];
        let f = g.fabric.unwrap();
        assert_eq!(f.cluster_uuid[0], 0x7f);
        assert_eq!(f.cluster_uuid[1], 0x3c);
        assert_eq!(f.cluster_uuid[15], 0x55);
        assert_eq!(f.clique_id, 32766);
        let p = g.platform.clone().unwrap();
        assert_eq!(p.chassis_serial, "1821724000123");
        assert_eq!((p.slot, p.tray, p.host_id, p.module_id), (9, 4, 0, 2));
        assert_eq!(g.vbios.as_deref(), Some("97.00.A5.00.01"));
        for (text, want) in [
            (
                r#""fabric": {"state": "completed", "cluster_uuid": "7f3c0d5e"}"#,
                "not a UUID",
            ),
            (
                r#""fabric": {"state": "completed", "cluster_uuid": "zz3c0d5e-0b1a-4c2d-9e8f-001122334455"}"#,
                "not a UUID",
            ),
            (
                r#""platform": {"chassis_serial": "01234567890123456"}"#,
                "at most 16",
            ),
            (r#""platform": {"slot": 300}"#, "expected u8"),
            (r#""platform": {"rack": 1}"#, "unknown field"),
        ] {
            let json = format!(
                r#"{{"gpus": [{{"name": "B", "uuid": "U", "pci_bus_id": "0:1:0.0", {text}}}]}}"#
            );
            let err = Config::parse(&json).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn processes_pcie_link_and_utilization_parse_and_mistakes_are_named() {
        let cfg = Config::parse(
            r#"{"gpus": [{"name": "G", "uuid": "U", "pci_bus_id": "0:1:0.0",
                "processes": [{"pid": 4242, "used_memory": 1073741824}, {"pid": 7, "used_memory": 0}],
                "pcie_link": {"gen": 4, "max_gen": 5, "width": 8, "max_width": 16},
                "utilization": {"gpu": 100, "memory": 0}},
                {"name": "G", "uuid": "V", "pci_bus_id": "0:2:0.0"}]}"#,
        )
        .unwrap();
        let g = &cfg.gpus[0];
        assert_eq!(
            g.processes,
            [
                Process {
                    pid: 4242,
                    used_memory: 1 << 30
                },
                Process {
                    pid: 7,
                    used_memory: 0
                }
            ]
        );
        assert_eq!(
            g.pcie_link,
            Some(PcieLink {
                generation: 4,
                max_generation: 5,
                width: 8,
                max_width: 16
            })
        );
        assert_eq!(
            g.utilization,
            Some(Utilization {
                gpu: 100,
                memory: 0
            })
        );
        let h = &cfg.gpus[1];
        assert!(h.processes.is_empty() && h.pcie_link.is_none() && h.utilization.is_none());

        let link = |l: &str| format!(r#""pcie_link": {{{l}}}"#);
        for (text, want) in [
            (
                r#""processes": [{"pid": 1, "used_memory": 2}, {"pid": 1, "used_memory": 3}]"#
                    .into(),
                "processes[1]: pid 1 listed twice",
            ),
            (
                r#""processes": [{"pid": -1, "used_memory": 2}]"#.into(),
                "invalid value",
            ),
            (
                r#""processes": [{"pid": 1}]"#.into(),
                "missing field `used_memory`",
            ),
            (
                r#""processes": [{"pid": 1, "used_memory": 2, "name": "x"}]"#.into(),
                "unknown field",
            ),
            (
                link(r#""gen": 4, "max_gen": 5, "width": 8"#),
                "missing field `max_width`",
            ),
            (
                link(r#""gen": 0, "max_gen": 5, "width": 8, "max_width": 16"#),
                "gpus[0]: pcie_link: want 1 <= gen (0)",
            ),
            (
                link(r#""gen": 5, "max_gen": 4, "width": 8, "max_width": 16"#),
                "pcie_link: want",
            ),
            (
                link(r#""gen": 4, "max_gen": 7, "width": 8, "max_width": 16"#),
                "pcie_link: want",
            ),
            (
                link(r#""gen": 4, "max_gen": 5, "width": 3, "max_width": 16"#),
                "width 3 is not",
            ),
            (
                link(r#""gen": 4, "max_gen": 5, "width": 8, "max_width": 64"#),
                "width 64 is not",
            ),
            (
                link(r#""gen": 4, "max_gen": 5, "width": 16, "max_width": 8"#),
                "width 16 > max_width 8",
            ),
            (
                r#""utilization": {"gpu": 101, "memory": 0}"#.into(),
                "utilization: gpu 101 is not a percentage",
            ),
            (
                r#""utilization": {"gpu": 1, "memory": 200}"#.into(),
                "utilization: memory 200",
            ),
            (
                r#""utilization": {"gpu": 1}"#.into(),
                "missing field `memory`",
            ),
        ] {
            let json = format!(
                r#"{{"gpus": [{{"name": "B", "uuid": "U", "pci_bus_id": "0:1:0.0", {text}}}]}}"#
            );
            let err = Config::parse(&json).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn bers_pack_as_nvml_does() {
        assert_eq!(pack_ber(0.0), Ok(0));
        assert_eq!(pack_ber(1e-12), Ok((1 << 8) | 12));
        assert_eq!(pack_ber(3e-11), Ok((3 << 8) | 11));
        assert_eq!(pack_ber(9.6e-9), Ok((1 << 8) | 8));
        assert_eq!(pack_ber(1.0), Ok(1 << 8));
        assert!(pack_ber(2.0).is_err());
        assert!(pack_ber(-1e-9).is_err());
    }
}

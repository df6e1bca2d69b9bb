//! The file named by `FAKE_CUDA_CONFIG` (README.md): the devices in CUDA's order by PCI bus id,
//! and faults per ordered pair. Unknown keys are errors: a typo must not mean "healthy".

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// PCI bus ids, in CUDA's device order (which may differ from NVML's).
    pub devices: Vec<String>,
    /// Bandwidth of a peer copy where no pair entry says otherwise, GB/s (10^9 bytes/s).
    #[serde(default = "default_gbps")]
    pub default_gbps: f64,
    #[serde(default)]
    pub pairs: Vec<Pair>,
}

/// Faults of copies from `from` to `to` (PCI bus ids); every other key optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub from: String,
    pub to: String,
    /// cuDeviceCanAccessPeer's answer (and cuCtxEnablePeerAccess fails with 217 when false).
    pub peer_access: Option<bool>,
    /// cuMemcpyPeer returns this CUresult.
    pub copy_error: Option<i32>,
    /// One byte of each copy arrives flipped.
    #[serde(default)]
    pub corrupt: bool,
    pub gbps: Option<f64>,
    /// cuMemcpyPeer never returns.
    #[serde(default)]
    pub hang: bool,
    /// cuMemcpyPeer kills the process (SIGABRT), as a broken driver path can.
    #[serde(default)]
    pub crash: bool,
}

/// More than 0 (and not NaN).
fn positive(x: f64) -> bool {
    x > 0.0
}

fn default_gbps() -> f64 {
    300.0
}

/// PCI bus ids compared as the driver writes them and as NVML does: domain numerically, the
/// rest case-insensitively.
pub fn same_bus(a: &str, b: &str) -> bool {
    fn key(s: &str) -> Option<(u64, String)> {
        let (domain, rest) = s.trim().split_once(':')?;
        Some((
            u64::from_str_radix(domain, 16).ok()?,
            rest.to_ascii_lowercase(),
        ))
    }
    match (key(a), key(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let c: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if !positive(c.default_gbps) {
            return Err("default_gbps must be more than 0".into());
        }
        for p in &c.pairs {
            for end in [&p.from, &p.to] {
                if !c.devices.iter().any(|d| same_bus(d, end)) {
                    return Err(format!("pair names {end}, which is not in devices"));
                }
            }
            if p.gbps.is_some_and(|g| !positive(g)) {
                return Err(format!("{} -> {}: gbps must be more than 0", p.from, p.to));
            }
        }
        Ok(c)
    }

    /// The entry for copies from device `a` to device `b` (CUDA ordinals), if any.
    pub fn pair(&self, a: usize, b: usize) -> Option<&Pair> {
        let (from, to) = (self.devices.get(a)?, self.devices.get(b)?);
        self.pairs
            .iter()
            .rev()
            .find(|p| same_bus(&p.from, from) && same_bus(&p.to, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_parses_and_its_mistakes_are_refused() {
        let c = Config::parse(
            r#"{"devices": ["0000:18:00.0", "0000:2A:00.0"], "pairs": [
                {"from": "00000000:18:00.0", "to": "0000:2a:00.0", "corrupt": true}]}"#,
        )
        .unwrap();
        assert_eq!(c.default_gbps, 300.0);
        assert!(c.pair(0, 1).unwrap().corrupt);
        assert!(c.pair(1, 0).is_none());
        for bad in [
            r#"{"devices": [], "typo": 1}"#,
            r#"{"devices": ["0000:18:00.0"], "pairs": [{"from": "0000:18:00.0", "to": "0000:99:00.0"}]}"#,
            r#"{"devices": [], "default_gbps": 0}"#,
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        // JSON that does not parse says where it stopped.
        let e = Config::parse("{\"devices\": [\n  \"0000:18:00.0\",,\n]}").unwrap_err();
        assert!(e.contains("line 2 column"), "{e}");
    }
}

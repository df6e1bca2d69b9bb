//! Sizes: how a person writes them and reads them.

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Sizes as a person reads them: binary units, one decimal.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {value:?} is not a size (examples: 64Mi, 1Gi, 8gb, 512m, 1.5Gi, 1073741824)")]
pub struct SizeError {
    pub what: String,
    pub value: String,
}

/// A size as Kubernetes quantities or Docker spell it: plain bytes; Kubernetes' binary `Ki Mi Gi
/// Ti` (powers of 1024) and decimal `k`/`K M G T` (powers of 1000), exactly so spelt; else
/// Docker's units (go-units' RAMInBytes), any case, all powers of 1024: `b`, `m g t`, `kb mb gb
/// tb`, `kib mib gib tib`, `ki mi gi ti`. So `8GB`, `8gb` and `8g` are 8 GiB, as Docker takes
/// them, while `8G` is 8,000,000,000 as Kubernetes takes it. A fraction (`1.5Gi`) rounds up to
/// whole bytes. `what` names the option in the error.
pub fn parse_size(what: &str, value: &str) -> Result<u64, SizeError> {
    let err = || SizeError {
        what: what.to_string(),
        value: value.to_string(),
    };
    let s = value.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => docker_unit(other).ok_or_else(err)?,
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
        || int.len() > 20
    {
        return Err(err());
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| err())?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| err())?
    };
    let bytes = int * multiplier + (frac * multiplier).div_ceil(scale);
    u64::try_from(bytes).map_err(|_| err())
}

/// Docker's unit suffixes, any case, binary: a letter, then optionally `i`, then optionally `b`
/// (go-units' RAMInBytes); `k` alone is Kubernetes' 1000 and never reaches here.
fn docker_unit(suffix: &str) -> Option<u128> {
    let lower = suffix.to_ascii_lowercase();
    let unit = lower.strip_suffix('b').unwrap_or(&lower);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let power = match unit {
        "" if lower == "b" => 0,
        "k" if lower != "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        _ => return None,
    };
    Some(1u128 << (10 * power))
}

/// A size as a Kubernetes quantity, rounded up: whole `Gi` when exact, else `Mi`.
pub fn k8s_quantity(bytes: u64) -> String {
    let mib = bytes.div_ceil(MIB).max(1);
    if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// A size for docker's `--shm-size` / `--memory` (binary units, lowercase), rounded up.
pub fn docker_size(bytes: u64) -> String {
    let mib = bytes.div_ceil(MIB).max(1);
    if mib.is_multiple_of(1024) {
        format!("{}g", mib / 1024)
    } else {
        format!("{mib}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 * MIB), "64.0 MiB");
        assert_eq!(human_bytes(3 * 1024 * MIB / 2), "1.5 GiB");
    }

    #[test]
    fn sizes_parse_as_kubernetes_quantities() {
        let ok = |s: &str| parse_size("--min-shm", s).unwrap();
        assert_eq!(ok("64Mi"), 64 * MIB);
        assert_eq!(ok("1Gi"), GIB);
        assert_eq!(ok("512M"), 512_000_000);
        assert_eq!(ok("1073741824"), GIB);
        assert_eq!(ok("1.5Gi"), 3 * GIB / 2);
        assert_eq!(ok("2Ki"), 2 * KIB);
        assert_eq!(ok("1k"), 1000);
        assert_eq!(ok(" 8Gi "), 8 * GIB);
        assert_eq!(ok("0.1"), 1, "a fraction of a byte rounds up");
        for bad in [
            "",
            "Gi",
            "1ib",
            "1kk",
            "1bb",
            "1Pi",
            "-1",
            "1 Gi",
            "1..5Gi",
            "abc",
            "1e9",
            "99999999999Ti",
            ".",
        ] {
            let e = parse_size("--min-shm", bad).unwrap_err();
            assert!(
                !e.to_string().contains('\n') && e.to_string().starts_with("--min-shm: "),
                "{bad:?}: {e}"
            );
        }
    }

    /// Issue 37: `--min-shm 8GB` as Docker's `--shm-size` takes it.
    #[test]
    fn docker_sizes_parse_as_docker_takes_them() {
        let ok = |s: &str| parse_size("--min-shm", s).unwrap();
        for (s, bytes) in [
            ("8GB", 8 * GIB),
            ("8gb", 8 * GIB),
            ("8g", 8 * GIB),
            ("8GiB", 8 * GIB),
            ("8gi", 8 * GIB),
            ("512m", 512 * MIB),
            ("512MB", 512 * MIB),
            ("64kb", 64 * KIB),
            ("64KiB", 64 * KIB),
            ("1tb", 1 << 40),
            ("100b", 100),
            ("100B", 100),
            ("1.5gb", 3 * GIB / 2),
        ] {
            assert_eq!(ok(s), bytes, "{s}");
        }
        // Kubernetes' own spellings keep their meaning.
        assert_eq!(ok("8G"), 8_000_000_000);
        assert_eq!(ok("512M"), 512_000_000);
        assert_eq!(ok("1k"), 1000);
        assert_eq!(ok("1K"), 1000);
    }

    #[test]
    fn quantities_round_up_to_whole_mebibytes() {
        assert_eq!(k8s_quantity(GIB), "1Gi");
        assert_eq!(k8s_quantity(GIB + 1), "1025Mi");
        assert_eq!(k8s_quantity(1), "1Mi");
        assert_eq!(docker_size(2 * GIB), "2g");
        assert_eq!(docker_size(1536 * MIB), "1536m");
    }
}

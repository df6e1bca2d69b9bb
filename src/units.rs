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

/// A Kubernetes quantity that is not one, or not a size (negative, beyond 2^64 bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a Kubernetes quantity of bytes ({why}; examples: 32Gi, 500M, 1.5Gi, 129e6)"
)]
pub struct QuantityError {
    pub value: String,
    pub why: &'static str,
}

/// A Kubernetes quantity exactly as the API server reads one (apimachinery's `ParseQuantity`):
/// an optional `+`, digits with at most one `.`, then one suffix: binary `Ki Mi Gi Ti Pi Ei`,
/// decimal `n u m k M G T P E`, or an exponent `e`/`E` with an optionally signed integer. No
/// spaces and none of Docker's spellings. Scaled by `10^scale` and rounded up, as the API
/// server rounds a memory quantity up to whole bytes (`1000m` is 1, `0.5` is 1 at scale 0).
pub fn parse_quantity_scaled(value: &str, scale: i32) -> Result<u128, QuantityError> {
    let err = |why| QuantityError {
        value: value.chars().take(64).collect(),
        why,
    };
    // Longer than any quantity a Pod needs; keeps every product below u128's range.
    if value.is_empty() || value.len() > 40 {
        return Err(err("empty or too long"));
    }
    let body = value.strip_prefix('+').unwrap_or(value);
    if body.starts_with('-') {
        return Err(err("negative"));
    }
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(err("no number"));
    }
    let (binary, mut exp10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => {
            (0, exponent(&s[1..]).ok_or_else(|| err("bad exponent"))?)
        }
        _ => return Err(err("unknown suffix")),
    };
    let digits = format!("{int}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| err("no number"))?;
    exp10 = exp10 + scale - frac.len() as i32;
    let scaled = mantissa.checked_mul(1u128 << binary);
    let big = || err("too large");
    if exp10 >= 0 {
        let pow = 10u128.checked_pow(exp10 as u32).ok_or_else(big)?;
        scaled.and_then(|m| m.checked_mul(pow)).ok_or_else(big)
    } else {
        let scaled = scaled.ok_or_else(big)?;
        match 10u128.checked_pow(exp10.unsigned_abs()) {
            Some(pow) => Ok(scaled.div_ceil(pow)),
            // Below 10^-38 of a unit: anything above zero rounds up to one.
            None => Ok(u128::from(scaled > 0)),
        }
    }
}

/// The exponent of `1e9`-style quantities: an optionally signed integer of a few digits.
fn exponent(s: &str) -> Option<i32> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i32 = digits.parse().ok()?;
    Some(if s.starts_with('-') { -n } else { n })
}

/// A memory quantity in whole bytes, rounded up (see [`parse_quantity_scaled`]).
pub fn parse_quantity_bytes(value: &str) -> Result<u64, QuantityError> {
    let bytes = parse_quantity_scaled(value, 0)?;
    u64::try_from(bytes).map_err(|_| QuantityError {
        value: value.chars().take(64).collect(),
        why: "too large",
    })
}

/// Bytes as an exact Kubernetes quantity: the largest binary suffix that divides them, else
/// plain bytes (a raised memory limit must be exact, never rounded).
pub fn k8s_quantity_exact(bytes: u64) -> String {
    for (unit, suffix) in [(1u64 << 40, "Ti"), (GIB, "Gi"), (MIB, "Mi"), (KIB, "Ki")] {
        if bytes > 0 && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
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
    #[test]
    fn kubernetes_quantities_parse_as_the_api_server_reads_them() {
        let ok = |s: &str| parse_quantity_bytes(s).unwrap();
        assert_eq!(ok("32Gi"), 32 * GIB);
        assert_eq!(ok("1e9"), 1_000_000_000);
        assert_eq!(ok("1E9"), 1_000_000_000);
        assert_eq!(ok("500M"), 500_000_000);
        assert_eq!(ok("1.5Gi"), 3 * GIB / 2);
        assert_eq!(ok("129e6"), 129_000_000);
        assert_eq!(ok("1000m"), 1);
        assert_eq!(ok("1500m"), 2, "memory rounds up to whole bytes");
        assert_eq!(ok("+1Ki"), KIB);
        assert_eq!(ok(".5"), 1);
        assert_eq!(ok("5."), 5);
        assert_eq!(ok("1E"), 1_000_000_000_000_000_000);
        assert_eq!(ok("12e-1"), 2);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("1e-100"), 1);
        assert_eq!(parse_quantity_scaled("500m", 3).unwrap(), 500);
        assert_eq!(parse_quantity_scaled("0.5", 3).unwrap(), 500);
        assert_eq!(parse_quantity_scaled("2", 3).unwrap(), 2000);
        for bad in [
            "",
            " 1Gi",
            "1Gi ",
            "1 Gi",
            "-1Gi",
            "1gi",
            "1GB",
            "1g",
            "1..5",
            ".",
            "Gi",
            "1e",
            "1e1.5",
            "1ee3",
            "1e9999",
            "20Ei",
            "99999999999999999999Ei",
            "1Gi1",
            "abc",
            "1KiB",
            "1K",
        ] {
            let e = parse_quantity_bytes(bad).unwrap_err();
            assert!(!e.to_string().contains('\n'), "{bad:?}: {e}");
        }
    }

    #[test]
    fn exact_quantities_never_round() {
        assert_eq!(k8s_quantity_exact(33 * GIB), "33Gi");
        assert_eq!(k8s_quantity_exact(GIB + MIB), "1025Mi");
        assert_eq!(k8s_quantity_exact(1_000_000_000 + GIB), "2073741824");
        assert_eq!(k8s_quantity_exact(3 * KIB), "3Ki");
        assert_eq!(k8s_quantity_exact(0), "0");
        for b in [1, 999, GIB + 1, 5 * GIB + 3 * MIB, 1 << 50] {
            assert_eq!(parse_quantity_bytes(&k8s_quantity_exact(b)).unwrap(), b);
        }
    }
}

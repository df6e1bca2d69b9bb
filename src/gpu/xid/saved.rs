//! The fatal XIDs held, as the state store keeps them (`gpu/held_xids`): each occurrence within
//! the hold as a wall-clock time, the GPU by its key (`gpu::verdict::key`), the hold they were
//! held for, and the boot they were saved in (a reboot is the repair a fatal XID asks for, so
//! another boot's are not taken up). `serve` saves and takes them up over a restart; `check`
//! takes them up read-only, so both tell the same verdicts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::HeldAges;
use crate::model::{from_unix_ms, unix_ms};

pub const HELD_XIDS_KEY: &str = "gpu/held_xids";

#[derive(Debug, Serialize, Deserialize)]
struct SavedXids {
    boot_id: String,
    /// The hold they were held for (absent: saved by an older agent).
    #[serde(default)]
    hold_ms: Option<u64>,
    held: Vec<SavedXid>,
}

/// One held XID: when (Unix ms) each occurrence within the hold was seen, on the GPU with
/// that UUID (or PCI address: `gpu::verdict::key`). An older agent saved the GPU's index as a
/// number: taken up as `#<index>` until a scan knows that index's UUID.
#[derive(Debug, Serialize, Deserialize)]
struct SavedXid {
    gpu: GpuKey,
    xid: u64,
    seen_ms: Vec<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum GpuKey {
    Key(String),
    Index(u32),
}

impl GpuKey {
    fn key(self) -> String {
        match self {
            GpuKey::Key(k) => k,
            GpuKey::Index(i) => format!("#{i}"),
        }
    }
}

/// The held XIDs as wall-clock times: ages at `now` are `clock` minus them.
pub fn save_xids(boot_id: &str, held: &[HeldAges], hold: Duration, clock: SystemTime) -> Value {
    let saved = SavedXids {
        boot_id: boot_id.to_string(),
        hold_ms: Some(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX)),
        held: held
            .iter()
            .map(|h| SavedXid {
                gpu: GpuKey::Key(h.gpu.clone()),
                xid: h.xid,
                seen_ms: h
                    .ages
                    .iter()
                    .map(|a| unix_ms(clock.checked_sub(*a).unwrap_or(UNIX_EPOCH)))
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_value(saved).unwrap_or(Value::Null)
}

/// The saved XIDs as ages at `clock` (a time ahead of it, the clock set back, counts as now);
/// None when saved in another boot.
pub fn restore_xids(
    value: &Value,
    boot_id: &str,
    clock: SystemTime,
) -> Result<Option<Vec<HeldAges>>, serde_json::Error> {
    let saved = SavedXids::deserialize(value)?;
    if saved.boot_id != boot_id {
        return Ok(None);
    }
    Ok(Some(
        saved
            .held
            .into_iter()
            .map(|h| HeldAges {
                gpu: h.gpu.key(),
                xid: h.xid,
                ages: h
                    .seen_ms
                    .into_iter()
                    .map(|t| clock.duration_since(from_unix_ms(t)).unwrap_or_default())
                    .collect(),
            })
            .collect(),
    ))
}

/// The hold the saved XIDs were held for, where saved.
pub fn saved_hold(value: &Value) -> Option<Duration> {
    let ms = value.get("hold_ms")?.as_u64()?;
    Some(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "b0a7e1d2-0000-4000-8000-000000000001";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn held_xids_round_trip_as_wall_times_in_the_same_boot_only() {
        let held = vec![HeldAges {
            gpu: "GPU-7".into(),
            xid: 79,
            ages: vec![Duration::from_secs(180), Duration::from_secs(60)],
        }];
        let saved = save_xids(BOOT, &held, Duration::from_secs(3600), at(10_000));
        assert_eq!(
            saved["held"][0]["seen_ms"],
            serde_json::json!([9_820_000, 9_940_000])
        );
        // Restored 100 s later: 100 s older.
        let back = restore_xids(&saved, BOOT, at(10_100)).unwrap().unwrap();
        assert_eq!(
            back[0].ages,
            vec![Duration::from_secs(280), Duration::from_secs(160)]
        );
        // The clock set back before them: as if just seen, not a panic.
        let back = restore_xids(&saved, BOOT, at(5_000)).unwrap().unwrap();
        assert_eq!(back[0].ages, vec![Duration::ZERO; 2]);
        assert_eq!(restore_xids(&saved, "other", at(10_100)).unwrap(), None);
        assert!(restore_xids(&Value::String("x".into()), BOOT, at(1)).is_err());
        assert_eq!(saved_hold(&saved), Some(Duration::from_secs(3600)));
    }
    #[test]
    fn an_older_agents_index_keyed_xids_are_taken_up_by_index() {
        let saved = serde_json::json!({"boot_id": BOOT, "held": [
            {"gpu": 3, "xid": 79, "seen_ms": [9_000_000]}]});
        let back = restore_xids(&saved, BOOT, at(10_000)).unwrap().unwrap();
        assert_eq!(back[0].gpu, "#3");
        assert_eq!(saved_hold(&saved), None);
    }
}

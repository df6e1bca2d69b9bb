//! What a restart in the same boot takes up again from the state store: since when each GPU
//! pair has failed (`gpu/pairs`), the NVLink counter windows that hold growth (`gpu/link_windows`:
//! pairs degraded by errors stay so for the rest of the window) and the fatal XIDs holding
//! `GpuFault` (`gpu/held_xids`).
//! Each is saved (a checkpoint under its key) when it changes, not every scan, and read back
//! once at start. Each carries the boot it was saved in: a reboot retrains the links and
//! resets the GPUs, which repairs what the XIDs asked for, so another boot's are not taken up.
//! The serialising and restoring is pure; `Holds` and [`resume`] are the glue.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gpu::pairs::{CarriedWindow, FailingSince};
use crate::gpu::xid::saved::{restore_xids, save_xids, HELD_XIDS_KEY};
use crate::gpu::xid::HeldAges;
use crate::model::{from_unix_ms, unix_ms, LinkErrors, Snapshot};
use crate::scan::{ScanSettings, Scanner};
use crate::state::{Store, StoreSender};

pub const PAIRS_KEY: &str = "gpu/pairs";
pub const WINDOWS_KEY: &str = "gpu/link_windows";

type Windows = Vec<CarriedWindow<LinkErrors>>;

/// Failing pairs by their GPUs' keys (UUID, or `#index` without one), as the pair judge keys
/// them.
pub type PairsSince = BTreeMap<(String, String), SystemTime>;

#[derive(Debug, Serialize, Deserialize)]
struct SavedPairs {
    boot_id: String,
    pairs: Vec<SavedPair>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedPair {
    gpu: String,
    peer_gpu: String,
    since_ms: i64,
}

/// The failing pairs of a snapshot and their `since`, keyed as the pair judge keys them.
pub fn pairs_since(snapshot: &Snapshot) -> PairsSince {
    let mut uuids: HashMap<u32, &str> = HashMap::new();
    for g in snapshot.gpus.iter().filter(|g| !g.uuid.is_empty()) {
        uuids.entry(g.index).or_insert(&g.uuid);
    }
    let key = |i: u32| {
        uuids
            .get(&i)
            .map_or_else(|| format!("#{i}"), |u| u.to_string())
    };
    snapshot
        .gpu_pairs
        .iter()
        .filter_map(|p| Some(((key(p.gpu), key(p.peer_gpu)), p.since?)))
        .collect()
}

pub fn save_pairs(boot_id: &str, pairs: &PairsSince) -> Value {
    let saved = SavedPairs {
        boot_id: boot_id.to_string(),
        pairs: pairs
            .iter()
            .map(|((gpu, peer_gpu), &since)| SavedPair {
                gpu: gpu.clone(),
                peer_gpu: peer_gpu.clone(),
                since_ms: unix_ms(since),
            })
            .collect(),
    };
    serde_json::to_value(saved).unwrap_or(Value::Null)
}

/// The saved pairs, both ways round (NVML may number the GPUs otherwise after a restart, and
/// the judge keys a pair by the lower index first); None when saved in another boot.
pub fn restore_pairs(
    value: &Value,
    boot_id: &str,
) -> Result<Option<FailingSince>, serde_json::Error> {
    let saved = SavedPairs::deserialize(value)?;
    if saved.boot_id != boot_id {
        return Ok(None);
    }
    let mut out = HashMap::new();
    for p in saved.pairs {
        let since = from_unix_ms(p.since_ms);
        out.insert((p.peer_gpu.clone(), p.gpu.clone()), since);
        out.insert((p.gpu, p.peer_gpu), since);
    }
    Ok(Some(out))
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedWindows {
    boot_id: String,
    saved_ms: i64,
    windows: Windows,
}

pub fn save_windows(boot_id: &str, windows: &Windows, clock: SystemTime) -> Value {
    let saved = SavedWindows {
        boot_id: boot_id.to_string(),
        saved_ms: unix_ms(clock),
        windows: windows.clone(),
    };
    serde_json::to_value(saved).unwrap_or(Value::Null)
}

/// The saved windows and how long ago (at `clock`) they were saved; None when saved in another
/// boot (the driver's counters started over).
pub fn restore_windows(
    value: &Value,
    boot_id: &str,
    clock: SystemTime,
) -> Result<Option<(Windows, Duration)>, serde_json::Error> {
    let saved = SavedWindows::deserialize(value)?;
    if saved.boot_id != boot_id {
        return Ok(None);
    }
    let ago = clock
        .duration_since(from_unix_ms(saved.saved_ms))
        .unwrap_or_default();
    Ok(Some((saved.windows, ago)))
}

/// A window's identity and growth: new samples that add no growth change nothing saved.
type WindowShape = (String, u32, Option<LinkErrors>, Option<LinkErrors>);

fn shape(windows: &Windows) -> Vec<WindowShape> {
    windows
        .iter()
        .map(|w| {
            let count = |s: Option<&(u64, LinkErrors)>| s.map(|s| s.1);
            (
                w.gpu.clone(),
                w.link,
                count(w.samples.first()),
                count(w.samples.last()),
            )
        })
        .collect()
}

/// What was last saved, to save again only on a change.
pub(super) struct Holds {
    store: StoreSender,
    boot_id: String,
    pairs: Option<PairsSince>,
    /// (GPU, XID, occurrences) of the held XIDs last saved: their times only change with them.
    xids: Option<Vec<(String, u64, usize)>>,
    windows: Option<Vec<WindowShape>>,
}

impl Holds {
    pub(super) fn new(store: StoreSender, boot_id: String) -> Holds {
        Holds {
            store,
            boot_id,
            pairs: None,
            xids: None,
            windows: None,
        }
    }

    /// After a scan: saves what changed (the first scan always, which also replaces what
    /// another boot left). `held`: the fatal XIDs; `windows`: the pair judge's, where NVML is
    /// loaded.
    pub(super) fn after_scan(
        &mut self,
        snapshot: &Snapshot,
        (held, hold): (Vec<HeldAges>, Duration),
        windows: Option<Windows>,
        clock: SystemTime,
    ) {
        if let Some(windows) = windows {
            let now = shape(&windows);
            if self.windows.as_ref() != Some(&now) {
                self.store
                    .put(WINDOWS_KEY, save_windows(&self.boot_id, &windows, clock));
                self.windows = Some(now);
            }
        }
        let pairs = pairs_since(snapshot);
        if self.pairs.as_ref() != Some(&pairs) {
            self.store.put(PAIRS_KEY, save_pairs(&self.boot_id, &pairs));
            self.pairs = Some(pairs);
        }
        let shape: Vec<(String, u64, usize)> = held
            .iter()
            .map(|h| (h.gpu.clone(), h.xid, h.ages.len()))
            .collect();
        if self.xids.as_ref() != Some(&shape) {
            self.store
                .put(HELD_XIDS_KEY, save_xids(&self.boot_id, &held, hold, clock));
            self.xids = Some(shape);
        }
    }
}

/// Takes up, before the first scan, what the last run in this boot saved; each value that does
/// not parse is said once and left.
pub(super) fn resume(
    store: Option<&Store>,
    scan: &ScanSettings,
    scanner: &mut Scanner,
) -> Option<Holds> {
    let store = store?;
    let boot_id = crate::state::boot_id(&scan.host.proc_root);
    resume_from(store, &boot_id, scanner);
    Some(Holds::new(store.sender(), boot_id))
}

fn resume_from(store: &Store, boot_id: &str, scanner: &mut Scanner) {
    let clock = SystemTime::now();
    if let Some(v) = store.get(PAIRS_KEY) {
        match restore_pairs(v, boot_id) {
            Ok(Some(since)) if !since.is_empty() => {
                tracing::info!(
                    pairs = since.len() / 2,
                    "failing GPU pairs keep their since-times from before the restart"
                );
                scanner.resume_pairs_failing_since(since);
            }
            Ok(Some(_)) => {}
            Ok(None) => tracing::info!("GPU pair states of another boot: not resumed"),
            Err(e) => tracing::warn!(key = PAIRS_KEY, "ignoring a stored value: {e}"),
        }
    }
    if let Some(v) = store.get(WINDOWS_KEY) {
        match restore_windows(v, boot_id, clock) {
            Ok(Some((windows, ago))) if !windows.is_empty() => {
                tracing::info!(
                    links = windows.len(),
                    "NVLink error windows from before the restart go on"
                );
                scanner.resume_link_windows(windows, ago, Instant::now());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(key = WINDOWS_KEY, "ignoring a stored value: {e}"),
        }
    }
    let Some(v) = store.get(HELD_XIDS_KEY) else {
        return;
    };
    match restore_xids(v, boot_id, clock) {
        Ok(Some(held)) if !held.is_empty() => {
            tracing::info!(
                xids = held.len(),
                "fatal XIDs held before the restart stay held (GpuFault)"
            );
            scanner.resume_held_xids(held, Instant::now());
        }
        Ok(Some(_)) => {}
        Ok(None) => {
            tracing::info!("fatal XIDs held in another boot: not resumed (a reboot clears them)")
        }
        Err(e) => tracing::warn!(key = HELD_XIDS_KEY, "ignoring a stored value: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuReading, PairStatus, PairVerdict};
    use std::time::UNIX_EPOCH;

    const BOOT: &str = "b0a7e1d2-0000-4000-8000-000000000001";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn reading(index: u32, uuid: &str) -> GpuReading {
        GpuReading {
            index,
            uuid: uuid.into(),
            ..GpuReading::default()
        }
    }

    fn verdict(gpu: u32, peer_gpu: u32, since: Option<SystemTime>) -> PairVerdict {
        PairVerdict {
            gpu,
            peer_gpu,
            status: if since.is_some() {
                PairStatus::Down
            } else {
                PairStatus::Ok
            },
            p2p: None,
            topology: None,
            links: Vec::new(),
            reasons: Vec::new(),
            since,
        }
    }

    #[test]
    fn failing_pairs_round_trip_in_the_same_boot_only() {
        let s = Snapshot {
            gpus: vec![reading(6, "GPU-6"), reading(7, "GPU-7"), reading(8, "")],
            gpu_pairs: vec![
                verdict(6, 7, Some(at(1_000))),
                verdict(6, 8, None),
                verdict(7, 8, Some(at(2_000))),
            ],
            ..Snapshot::default()
        };
        let pairs = pairs_since(&s);
        assert_eq!(
            pairs,
            BTreeMap::from([
                (("GPU-6".into(), "GPU-7".into()), at(1_000)),
                (("GPU-7".into(), "#8".into()), at(2_000)),
            ])
        );
        let saved = save_pairs(BOOT, &pairs);
        let back = restore_pairs(&saved, BOOT).unwrap().unwrap();
        assert_eq!(back.len(), 4, "both ways round");
        assert_eq!(back[&("GPU-7".into(), "GPU-6".into())], at(1_000));
        assert_eq!(back[&("GPU-7".into(), "#8".into())], at(2_000));
        assert_eq!(restore_pairs(&saved, "another-boot").unwrap(), None);
        assert!(restore_pairs(&serde_json::json!({"pairs": 3}), BOOT).is_err());
    }

    #[test]
    fn link_windows_round_trip_with_their_age_in_the_same_boot_only() {
        let grown = LinkErrors {
            replay: 3,
            ..LinkErrors::default()
        };
        let windows = vec![CarriedWindow {
            gpu: "GPU-0".into(),
            link: 4,
            samples: vec![(20_000, LinkErrors::default()), (5_000, grown)],
        }];
        let saved = save_windows(BOOT, &windows, at(1_000));
        let (back, ago) = restore_windows(&saved, BOOT, at(1_007)).unwrap().unwrap();
        assert_eq!((back, ago), (windows.clone(), Duration::from_secs(7)));
        assert_eq!(restore_windows(&saved, "other", at(1_007)).unwrap(), None);
        // A later sample that adds no growth is no change to save.
        let mut later = windows.clone();
        later[0].samples.push((0, grown));
        assert_eq!(shape(&later), shape(&windows));
        later[0]
            .samples
            .push((0, LinkErrors { replay: 4, ..grown }));
        assert_ne!(shape(&later), shape(&windows));
    }
}

//! Days of a link wearing out, written into a real state store before `serve` or `check` runs:
//! their clock is the machine's, so the days are dated back from now through the store's own
//! controlled clock and the trend keeper, as serve would have written them.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shmlink::links::trend::{TrendKeeper, TrendRules};
use shmlink::model::{GpuReading, LinkErrors, LinkReading, Peer};
use shmlink::state::{self, Identity, Options, StateMetrics, Store};

const H: i64 = 3600 * 1000;

/// What was written.
pub struct Seeded {
    /// The wearing link's recovery count in the last row (the fake NVML goes on from it).
    pub last_count: u64,
    /// Unix seconds of its first recovery: the `since` serve and check must say.
    pub since_s: i64,
    /// Rows written (every link of every GPU, hourly).
    pub rows: i64,
}

/// Six days of hourly rows for every link (`links` a GPU) of the GPUs `uuids` (index =
/// position, every link to the NVSwitch), GPU `gpu`'s link `link` counting recoveries at 03:00,
/// 11:00 and 19:00 of the fixture's days 1 to 5 from 505; the last row 61 minutes old, so
/// serve keeps its first sample. Written for node `node` (serve's `--node-name`), this boot.
pub fn seed(dir: &Path, node: &str, uuids: &[String], links: u32, gpu: u32, link: u32) -> Seeded {
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let first = now - 6 * 24 * H - 61 * 60 * 1000;
    let count = |h: i64| 505 + (24..=h).filter(|x| [3, 11, 19].contains(&(x % 24))).count() as u64;
    let board = |h: i64| -> Vec<GpuReading> {
        (0..)
            .zip(uuids)
            .map(|(g, uuid)| GpuReading {
                index: g,
                uuid: uuid.clone(),
                links: (0..links)
                    .map(|l| LinkReading {
                        link: l,
                        active: true,
                        peer: Peer::Switch,
                        errors: Some(LinkErrors {
                            recovery: if (g, l) == (gpu, link) { count(h) } else { 0 },
                            ..LinkErrors::default()
                        }),
                        nvlink5: None,
                    })
                    .collect(),
                ..GpuReading::default()
            })
            .collect()
    };
    let clock = Arc::new(AtomicI64::new(first));
    let c = clock.clone();
    let options = Options {
        clock: Arc::new(move || {
            UNIX_EPOCH + Duration::from_millis(c.load(Ordering::SeqCst) as u64)
        }),
        ..Options::default()
    };
    let identity = Identity {
        node: node.into(),
        boot_id: state::boot_id(Path::new("/proc")),
    };
    let store = Store::open(dir, &identity, options, &StateMetrics::default()).unwrap();
    let mut keeper = TrendKeeper::new(TrendRules::default());
    let hours = 6 * 24;
    for h in 0..=hours {
        let at = first + h * H;
        clock.store(at, Ordering::SeqCst);
        let observed = keeper.observe(&board(h), UNIX_EPOCH + Duration::from_millis(at as u64));
        store.sender().link_samples(observed.to_store);
    }
    assert!(store.flush(Duration::from_secs(10)));
    Seeded {
        last_count: count(hours),
        since_s: (first + 27 * H) / 1000,
        rows: i64::try_from(uuids.len()).unwrap() * i64::from(links) * (hours + 1),
    }
}

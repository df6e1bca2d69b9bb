//! The library's one piece of state: the loaded config (re-read when its file changes), the XID
//! bookkeeping and the event sets. Behind one mutex; every exported call takes it briefly.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::config::Config;

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "FAKE_NVML_CONFIG";

/// Events waiting for an event set are capped: nobody may be listening.
const MAX_QUEUED: usize = 4096;

/// What identifies one version of the config file. Tests replace it by write + rename: a new
/// inode, but inode numbers are reused, so times and size count too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    fn of(path: &Path) -> std::io::Result<FileKey> {
        let m = std::fs::metadata(path)?;
        Ok(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// An XID waiting to be delivered: (GPU index, XID).
pub type Xid = (u32, u64);

#[derive(Debug, Default)]
pub struct EventSet {
    /// GPU index -> registered event type bits.
    pub registered: BTreeMap<u32, u64>,
    pub queue: VecDeque<Xid>,
}

#[derive(Debug)]
pub struct Live {
    /// nvmlInit calls not yet matched by nvmlShutdown (NVML reference-counts init).
    pub init_count: u32,
    path: PathBuf,
    /// The file version last looked at (parsed or not); None when it could not be stat'ed.
    key: Option<FileKey>,
    pub config: Config,
    /// Per GPU index, the `xids` list of the last generation that parsed.
    xids_seen: Vec<Vec<u64>>,
    /// XIDs of GPUs that no event set has registered yet, delivered on registration.
    unclaimed: VecDeque<Xid>,
    pub sets: BTreeMap<usize, EventSet>,
    next_set: usize,
}

static STATE: Mutex<Option<Live>> = Mutex::new(None);

/// The state, whatever a panicking holder left (every update keeps it consistent).
pub fn lock() -> MutexGuard<'static, Option<Live>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why nvmlInit failed, for stderr.
pub fn read_config(path: &Path) -> Result<(FileKey, Config), String> {
    let key = FileKey::of(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((key, config))
}

impl Live {
    /// The state right after nvmlInit read `config`: the XIDs it lists are history (they
    /// happened before anyone could register for them) and are not delivered.
    pub fn new(path: PathBuf, key: Option<FileKey>, config: Config) -> Live {
        Live {
            init_count: 1,
            path,
            key,
            xids_seen: config.gpus.iter().map(|g| g.xids.clone()).collect(),
            config,
            unclaimed: VecDeque::new(),
            sets: BTreeMap::new(),
            next_set: 1,
        }
    }

    /// nvmlInit on an initialised library: a fresh start from the file named now.
    pub fn reinit(&mut self, path: PathBuf, key: Option<FileKey>, config: Config) {
        let count = self.init_count;
        let sets = std::mem::take(&mut self.sets);
        let next_set = self.next_set;
        *self = Live::new(path, key, config);
        self.init_count = count + 1;
        // Handles given out before stay valid; their queues start empty.
        self.sets = sets
            .into_iter()
            .map(|(id, s)| {
                let set = EventSet {
                    registered: s.registered,
                    queue: VecDeque::new(),
                };
                (id, set)
            })
            .collect();
        self.next_set = next_set;
    }

    /// Re-reads the config if its file changed since the last look. A file that does not
    /// parse (or vanished) keeps the previous config and is reported on stderr once.
    pub fn refresh(&mut self) {
        let key = FileKey::of(&self.path).ok();
        if key == self.key {
            return;
        }
        self.key = key;
        if key.is_none() {
            eprintln!(
                "fake-nvml: {} is gone; keeping the previous config",
                self.path.display()
            );
            return;
        }
        match read_config(&self.path) {
            Ok((key, config)) => {
                // The read may have seen a later version than the stat above.
                self.key = Some(key);
                self.apply(config);
            }
            Err(e) => eprintln!("fake-nvml: {e}; keeping the previous config"),
        }
    }

    /// A new generation of the config: queue the XIDs it adds.
    pub fn apply(&mut self, config: Config) {
        let mut fresh = Vec::new();
        for (index, gpu) in config.gpus.iter().enumerate() {
            let old = self.xids_seen.get(index).map_or(&[][..], Vec::as_slice);
            fresh.extend(new_xids(old, &gpu.xids).iter().map(|&x| (index as u32, x)));
        }
        self.xids_seen = config.gpus.iter().map(|g| g.xids.clone()).collect();
        self.config = config;
        for xid in fresh {
            self.deliver(xid);
        }
    }

    /// Into every set registered for the XID's GPU, else held until one registers.
    fn deliver(&mut self, (gpu, xid): Xid) {
        let mut claimed = false;
        for set in self.sets.values_mut() {
            if set.wants(gpu) {
                push_capped(&mut set.queue, (gpu, xid));
                claimed = true;
            }
        }
        if !claimed {
            push_capped(&mut self.unclaimed, (gpu, xid));
        }
    }

    pub fn create_set(&mut self) -> usize {
        let id = self.next_set;
        self.next_set += 1;
        self.sets.insert(id, EventSet::default());
        id
    }

    /// Registers `gpu` for `types` on set `id`; hands the set what was waiting for that GPU.
    pub fn register(&mut self, id: usize, gpu: u32, types: u64) -> bool {
        let Some(set) = self.sets.get_mut(&id) else {
            return false;
        };
        *set.registered.entry(gpu).or_default() |= types;
        if set.wants(gpu) {
            let (mine, rest): (VecDeque<Xid>, VecDeque<Xid>) = std::mem::take(&mut self.unclaimed)
                .into_iter()
                .partition(|(g, _)| *g == gpu);
            self.unclaimed = rest;
            for xid in mine {
                push_capped(&mut set.queue, xid);
            }
        }
        true
    }
}

impl EventSet {
    fn wants(&self, gpu: u32) -> bool {
        self.registered.get(&gpu).is_some_and(|t| {
            t & u64::from(nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError) != 0
        })
    }
}

fn push_capped(queue: &mut VecDeque<Xid>, xid: Xid) {
    if queue.len() >= MAX_QUEUED {
        queue.pop_front();
    }
    queue.push_back(xid);
}

/// The delivery rule: what follows the longest common prefix of the previous generation's list
/// and the new one. Appending delivers the appended entries; a list that only shrank delivers
/// nothing; a rewritten list delivers from the first entry that differs.
pub fn new_xids<'a>(old: &[u64], new: &'a [u64]) -> &'a [u64] {
    let common = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    &new[common..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings as sys;

    const XID: u64 = sys::nvmlEventTypeXidCriticalError as u64;

    fn config(xids: &[&[u64]]) -> Config {
        let gpus: Vec<String> = xids
            .iter()
            .enumerate()
            .map(|(i, x)| {
                format!(
                    r#"{{"name": "G", "uuid": "GPU-{i}", "pci_bus_id": "0:{:x}:0.0", "xids": {x:?}}}"#,
                    i + 1
                )
            })
            .collect();
        Config::parse(&format!(r#"{{"gpus": [{}]}}"#, gpus.join(","))).unwrap()
    }

    #[test]
    fn the_delivery_rule() {
        assert_eq!(new_xids(&[], &[79]), [79]);
        assert_eq!(new_xids(&[79], &[79]), [] as [u64; 0]);
        assert_eq!(new_xids(&[79], &[79, 79]), [79]);
        assert_eq!(new_xids(&[79, 48], &[79]), [] as [u64; 0]);
        assert_eq!(new_xids(&[79, 48], &[79, 63, 94]), [63, 94]);
        assert_eq!(new_xids(&[79], &[48]), [48]);
    }

    #[test]
    fn xids_at_init_are_history_and_later_ones_go_to_registered_sets() {
        let mut live = Live::new(PathBuf::new(), None, config(&[&[13], &[]]));
        let set = live.create_set();
        assert!(live.register(set, 0, XID));
        live.apply(config(&[&[13], &[]]));
        assert!(live.sets[&set].queue.is_empty());

        live.apply(config(&[&[13, 79], &[31]]));
        // GPU 1 has no set yet: held.
        assert_eq!(live.sets[&set].queue, [(0, 79)]);
        assert_eq!(live.unclaimed, [(1, 31)]);

        // Registering for something else does not claim it; registering for XIDs does.
        assert!(live.register(set, 1, u64::from(sys::nvmlEventTypePState)));
        assert_eq!(live.unclaimed, [(1, 31)]);
        assert!(live.register(set, 1, XID));
        assert!(live.unclaimed.is_empty());
        assert_eq!(live.sets[&set].queue, [(0, 79), (1, 31)]);

        // The same list again: nothing new.
        live.sets.get_mut(&set).unwrap().queue.clear();
        live.apply(config(&[&[13, 79], &[31]]));
        assert!(live.sets[&set].queue.is_empty());
    }

    #[test]
    fn every_registered_set_gets_the_event() {
        let mut live = Live::new(PathBuf::new(), None, config(&[&[]]));
        let a = live.create_set();
        let b = live.create_set();
        live.register(a, 0, XID);
        live.register(b, 0, XID);
        live.apply(config(&[&[79]]));
        assert_eq!(live.sets[&a].queue, [(0, 79)]);
        assert_eq!(live.sets[&b].queue, [(0, 79)]);
        assert!(!live.register(99, 0, XID));
    }

    #[test]
    fn a_file_replaced_by_rename_is_reread_and_a_bad_one_is_ignored() {
        let dir = std::env::temp_dir().join(format!("fake-nvml-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nvml.json");
        let write = |text: &str| {
            let tmp = dir.join("nvml.json.tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        let one = r#"{"gpus": [{"name": "A", "uuid": "GPU-1", "pci_bus_id": "0:1:0.0"}]}"#;
        write(one);
        let (key, cfg) = read_config(&path).unwrap();
        let mut live = Live::new(path.clone(), Some(key), cfg);
        live.refresh();
        assert_eq!(live.config.gpus[0].name, "A");

        // Same size, new content.
        write(&one.replace("\"A\"", "\"B\""));
        live.refresh();
        assert_eq!(live.config.gpus[0].name, "B");

        write("{ not json");
        live.refresh();
        assert_eq!(live.config.gpus[0].name, "B");

        std::fs::remove_file(&path).unwrap();
        live.refresh();
        assert_eq!(live.config.gpus[0].name, "B");

        write(&one.replace("\"A\"", "\"C\""));
        live.refresh();
        assert_eq!(live.config.gpus[0].name, "C");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! shmlink's real NVML binding (nvml-wrapper loading a library by path) against fake-nvml.
//!
//! The fake libraries are the workspace members `crates/fake-nvml` and `crates/fake-nvml-legacy`;
//! `cargo build --workspace` (or `cargo test --workspace`) puts them next to this test's
//! directory. The config file is named by FAKE_NVML_CONFIG, read at nvmlInit: the environment
//! and the loaded library's state are process-wide, so every test holds `serial()`. Opening NVML
//! again in one process is fine: shmlink leaks its `Nvml`, and each nvmlInit re-reads the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shmlink::gpu::nvml::NvmlGpus;
use shmlink::gpu::xid::{self, XidCounts};
use shmlink::model::{
    FabricInfo, FabricState, GpuSample, LinkErrors, P2pCaps, P2pStatus, PcieLink, Peer,
    PlatformInfo, RecoveryAction, TopologyLevel,
};

const CONFIG_ENV: &str = "FAKE_NVML_CONFIG";

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `target/<profile>/<file>`: this test runs as `target/<profile>/deps/nvml_binding-<hash>`.
fn fake_lib(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(file);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{file} not found near {}: build it with `cargo build --workspace`",
        exe.display()
    );
}

fn fake() -> PathBuf {
    fake_lib("libfake_nvml.so")
}

fn fake_legacy() -> PathBuf {
    fake_lib("libfake_nvml_legacy.so")
}

fn preset(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/fake-nvml/presets")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("preset parses")
}

/// One config file in a temp dir, replaced atomically as the tests (and a real file writer) do.
struct Config {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Config {
    fn new(config: &Value) -> Config {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nvml.json");
        let c = Config { _dir: dir, path };
        c.replace(config);
        c
    }

    fn replace(&self, config: &Value) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    /// Points FAKE_NVML_CONFIG here and loads `lib` the way the agent does.
    fn open(&self, lib: &Path) -> NvmlGpus {
        std::env::set_var(CONFIG_ENV, &self.path);
        match NvmlGpus::open(Some(lib)) {
            Ok(gpus) => gpus,
            Err(e) => panic!("opening {}: {e}", lib.display()),
        }
    }
}

fn sample(gpus: &NvmlGpus) -> GpuSample {
    gpus.sample().0
}

fn pair(sample: &GpuSample, a: u32, b: u32) -> &shmlink::model::PairSample {
    sample
        .pairs
        .iter()
        .find(|p| p.gpu == a && p.peer_gpu == b)
        .unwrap_or_else(|| panic!("no pair ({a}, {b})"))
}

const ALL_OK: P2pCaps = P2pCaps {
    read: P2pStatus::Ok,
    write: P2pStatus::Ok,
    nvlink: P2pStatus::Ok,
    atomics: P2pStatus::Ok,
};

fn socket(gpu: u32) -> u32 {
    gpu / 4
}

#[test]
fn nvswitch_8_every_gpu_has_18_switch_links_and_all_pairs_are_fine() {
    let _serial = serial();
    let config = preset("nvswitch-8");
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    assert_eq!(gpus.driver_version().as_deref(), Some("550.54.15"));
    let (s, stats) = gpus.sample();

    assert_eq!(s.gpus.len(), 8);
    for (i, g) in s.gpus.iter().enumerate() {
        let want = &config["gpus"][i];
        assert_eq!(g.index, i as u32);
        assert_eq!(g.uuid, want["uuid"].as_str().unwrap());
        assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.pci_bus_id, want["pci_bus_id"].as_str().unwrap());
        assert_eq!(g.pcie_replays, Some(0));
        assert!(!g.lost);
        assert_eq!(g.links.len(), 18, "GPU {i}");
        for (n, l) in g.links.iter().enumerate() {
            assert_eq!(l.link, n as u32);
            assert!(l.active);
            // Needs the raw nvmlDeviceGetNvLinkRemoteDeviceType: the NVSwitch bus ids are none
            // of the GPUs', so without it the peer would be pci:<bus>.
            assert_eq!(l.peer, Peer::Switch, "GPU {i} link {n}");
            assert_eq!(l.errors, Some(LinkErrors::default()));
        }
        // The switches' own addresses (their SXIDs name them), from the links' remote PCI info.
        let switches: Vec<String> = (5..=8).map(|b| format!("0000:{b:02x}:00.0")).collect();
        assert_eq!(g.nvswitches, switches, "GPU {i}");
    }

    assert_eq!(s.pairs.len(), 28);
    for p in &s.pairs {
        assert_eq!(p.p2p, Some(ALL_OK), "({}, {})", p.gpu, p.peer_gpu);
        let level = if socket(p.gpu) == socket(p.peer_gpu) {
            TopologyLevel::Node
        } else {
            TopologyLevel::System
        };
        assert_eq!(p.topology, Some(level), "({}, {})", p.gpu, p.peer_gpu);
    }
    assert_eq!(stats.errors, 0);
}

#[test]
fn error_counters_read_back_through_both_apis() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    config["gpus"][2]["links"][5]["errors"] =
        json!({"replay": 3, "recovery": 1, "crc_flit": 10, "crc_data": 20, "ecc_data": 4});
    // GPU 3 as a newer GPU: the counter call is NOT_SUPPORTED, the scoped field values answer.
    config["gpus"][3]["error_counter_api"] = json!("field_values");
    config["gpus"][3]["links"][7]["errors"] =
        json!({"replay": 5, "recovery": 6, "crc_flit": 7, "crc_data": 8, "ecc_data": 9});
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    let s = sample(&gpus);

    let direct = &s.gpus[2].links;
    assert_eq!(
        direct[5].errors,
        Some(LinkErrors {
            replay: 3,
            recovery: 1,
            crc_flit: 10,
            crc_data: 20,
            ecc_data: 4
        })
    );
    assert_eq!(direct[4].errors, Some(LinkErrors::default()));

    // scopeId is the link: only link 7 carries the counts. The scoped CRC field is flit + data
    // in one figure, which shmlink reports as crc_data; ECC data has no scoped field.
    let scoped = &s.gpus[3].links;
    assert_eq!(
        scoped[7].errors,
        Some(LinkErrors {
            replay: 5,
            recovery: 6,
            crc_flit: 0,
            crc_data: 15,
            ecc_data: 0
        })
    );
    for (n, l) in scoped.iter().enumerate().filter(|(n, _)| *n != 7) {
        assert_eq!(l.errors, Some(LinkErrors::default()), "link {n}");
    }
}

#[test]
fn p2p_exceptions_apply_to_their_pair_in_both_orders() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    // Written as (7, 0): the rule is for the unordered pair.
    config["p2p"] = json!([
        {"gpu": 7, "peer_gpu": 0, "capability": "read", "status": "not_supported"},
        {"gpu": 2, "peer_gpu": 5, "capability": ["nvlink", "atomics"], "status": "disabled_by_regkey"}
    ]);
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    let s = sample(&gpus);

    assert_eq!(
        pair(&s, 0, 7).p2p,
        Some(P2pCaps {
            read: P2pStatus::NotSupported,
            ..ALL_OK
        })
    );
    assert_eq!(
        pair(&s, 2, 5).p2p,
        Some(P2pCaps {
            nvlink: P2pStatus::DisabledByRegkey,
            atomics: P2pStatus::DisabledByRegkey,
            ..ALL_OK
        })
    );
    let others = s
        .pairs
        .iter()
        .filter(|p| ![(0, 7), (2, 5)].contains(&(p.gpu, p.peer_gpu)));
    for p in others {
        assert_eq!(p.p2p, Some(ALL_OK), "({}, {})", p.gpu, p.peer_gpu);
    }
}

#[test]
fn pcie_8_has_no_links_and_its_topology_follows_switches_and_sockets() {
    let _serial = serial();
    let file = Config::new(&preset("pcie-8"));
    let gpus = file.open(&fake());
    let (s, stats) = gpus.sample();

    assert_eq!(s.gpus.len(), 8);
    for g in &s.gpus {
        assert_eq!(g.name, "NVIDIA L40S");
        assert!(g.links.is_empty(), "GPU {}: {:?}", g.index, g.links);
    }
    for p in &s.pairs {
        let (a, b) = (p.gpu, p.peer_gpu);
        let level = if a / 2 == b / 2 {
            TopologyLevel::Single
        } else if socket(a) == socket(b) {
            TopologyLevel::Node
        } else {
            TopologyLevel::System
        };
        assert_eq!(p.topology, Some(level), "({a}, {b})");
        assert_eq!(
            p.p2p,
            Some(P2pCaps {
                read: P2pStatus::Ok,
                write: P2pStatus::Ok,
                nvlink: P2pStatus::NotSupported,
                atomics: P2pStatus::NotSupported,
            }),
            "({a}, {b})"
        );
    }
    assert_eq!(stats.errors, 0);
}

#[test]
fn nvlink_mesh_4_links_lead_to_the_peer_gpus() {
    let _serial = serial();
    let file = Config::new(&preset("nvlink-mesh-4"));
    let gpus = file.open(&fake());
    let s = sample(&gpus);

    assert_eq!(s.gpus.len(), 4);
    for g in &s.gpus {
        assert_eq!(g.links.len(), 12);
        let peers: Vec<u32> = (0..4).filter(|p| *p != g.index).collect();
        for l in &g.links {
            let want = peers[l.link as usize / 4];
            assert_eq!(l.peer, Peer::Gpu(want), "GPU {} link {}", g.index, l.link);
            assert!(l.active);
        }
    }
    for p in &s.pairs {
        assert_eq!(p.p2p, Some(ALL_OK));
        assert_eq!(p.topology, Some(TopologyLevel::Node));
    }
}

#[test]
fn a_gpu_lost_before_open_or_after_is_reported_and_the_others_still_sample() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    config["gpus"][5]["lost"] = json!(true);
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    let s = sample(&gpus);

    // Lost before open: the handle exists, but nothing could be read from it.
    let lost = &s.gpus[5];
    assert!(lost.lost);
    assert!(lost.links.is_empty());
    assert_eq!(lost.pcie_replays, None);
    assert_eq!(lost.uuid, "");
    for g in s.gpus.iter().filter(|g| g.index != 5) {
        assert!(!g.lost);
        assert_eq!(g.links.len(), 18);
    }
    for p in &s.pairs {
        if p.gpu == 5 || p.peer_gpu == 5 {
            assert_eq!((p.p2p, p.topology), (None, None));
        } else {
            assert_eq!(p.p2p, Some(ALL_OK));
            assert!(p.topology.is_some());
        }
    }

    // Lost after open: identity is what open cached; the next sample says lost.
    config["gpus"][5]["lost"] = json!(false);
    file.replace(&config);
    let gpus = file.open(&fake());
    assert!(!sample(&gpus).gpus[5].lost);
    config["gpus"][1]["lost"] = json!(true);
    file.replace(&config);
    let s = sample(&gpus);
    assert!(s.gpus[1].lost);
    assert_eq!(s.gpus[1].uuid, config["gpus"][1]["uuid"].as_str().unwrap());
    assert!(s.gpus[1].links.is_empty());
    let lost: Vec<u32> = s.gpus.iter().filter(|g| g.lost).map(|g| g.index).collect();
    assert_eq!(lost, [1]);
    assert_eq!(pair(&s, 0, 1).p2p, None);
    assert_eq!(pair(&s, 0, 2).p2p, Some(ALL_OK));
}

#[test]
fn a_replaced_config_is_seen_by_the_next_sample() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    assert_eq!(
        sample(&gpus).gpus[0].links[3].errors,
        Some(LinkErrors::default())
    );

    config["gpus"][0]["links"][3]["errors"]["replay"] = json!(2);
    config["gpus"][0]["links"][4]["active"] = json!(false);
    config["gpus"][6]["pcie_replays"] = json!(11);
    config["p2p"] = json!([{"gpu": 1, "peer_gpu": 6, "capability": "write", "status": "unknown"}]);
    config["topology"] = json!([{"gpu": 1, "peer_gpu": 6, "level": "hostbridge"}]);
    file.replace(&config);
    let s = sample(&gpus);
    assert_eq!(s.gpus[0].links[3].errors.map(|e| e.replay), Some(2));
    assert!(!s.gpus[0].links[4].active);
    assert_eq!(s.gpus[6].pcie_replays, Some(11));
    assert_eq!(
        pair(&s, 1, 6).p2p.map(|c| c.write),
        Some(P2pStatus::Unknown)
    );
    assert_eq!(pair(&s, 1, 6).topology, Some(TopologyLevel::Hostbridge));
    // The preset's node/system levels were replaced wholesale by the new file's list.
    assert_eq!(pair(&s, 0, 1).topology, Some(TopologyLevel::System));

    // A broken file keeps the last good config.
    std::fs::write(file.path.with_extension("tmp"), "{ half a file").unwrap();
    std::fs::rename(file.path.with_extension("tmp"), &file.path).unwrap();
    let s = sample(&gpus);
    assert_eq!(s.gpus[0].links[3].errors.map(|e| e.replay), Some(2));
    assert_eq!(s.gpus[6].pcie_replays, Some(11));
}

#[test]
fn the_legacy_library_samples_without_its_optional_symbols() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    config["gpus"][3]["error_counter_api"] = json!("field_values");
    config["gpus"][2]["links"][1]["errors"]["recovery"] = json!(4);
    let file = Config::new(&config);
    let gpus = file.open(&fake_legacy());
    let (s, stats) = gpus.sample();

    assert_eq!(s.gpus.len(), 8);
    for g in &s.gpus {
        assert!(!g.lost);
        assert_eq!(g.links.len(), 18);
        for l in &g.links {
            // No nvmlDeviceGetNvLinkRemoteDeviceType: a switch is only a PCI device here.
            let remote = &config["gpus"][g.index as usize]["links"][l.link as usize];
            let bus = remote["remote_pci_bus_id"].as_str().unwrap();
            assert_eq!(l.peer, Peer::Pci(bus.to_string()));
        }
    }
    assert_eq!(s.gpus[2].links[1].errors.map(|e| e.recovery), Some(4));
    // No nvmlDeviceGetFieldValues: a GPU without the counter call has no counters at all.
    assert!(s.gpus[3].links.iter().all(|l| l.errors.is_none()));
    for p in &s.pairs {
        // No nvmlDeviceGetP2PStatus; topology still answers.
        assert_eq!(p.p2p, None);
        assert!(p.topology.is_some());
    }
    // A missing symbol is not an error.
    assert_eq!(stats.errors, 0);

    // Direct GPU links still resolve by PCI location.
    let file = Config::new(&preset("nvlink-mesh-4"));
    let gpus = file.open(&fake_legacy());
    let s = sample(&gpus);
    assert_eq!(s.gpus[0].links[0].peer, Peer::Gpu(1));
    assert_eq!(s.gpus[3].links[11].peer, Peer::Gpu(2));
}

/// The processes on each GPU, its PCIe link and how busy it is: the `_v3` process calls where
/// the driver has them, the `_v2` ones on an older driver (the legacy library lacks `_v3`).
#[test]
fn processes_pcie_link_and_utilization_come_through_either_process_call() {
    let _serial = serial();
    let mut config = preset("pcie-8");
    config["gpus"][5]["processes"] = json!([{"pid": 4242, "used_memory": 1u64 << 30}]);
    config["gpus"][7]["processes"] =
        json!([{"pid": 4242, "used_memory": 2u64 << 30}, {"pid": 77, "used_memory": 5}]);
    config["gpus"][3]["pcie_link"] = json!({"gen": 3, "max_gen": 5, "width": 8, "max_width": 16});
    config["gpus"][3]["utilization"] = json!({"gpu": 97, "memory": 40});
    let file = Config::new(&config);
    for lib in [fake(), fake_legacy()] {
        let (s, stats) = file.open(&lib).sample();
        let pids = |g: usize| -> Vec<u32> { s.gpus[g].processes.iter().map(|p| p.pid).collect() };
        assert_eq!(pids(5), vec![4242], "{}", lib.display());
        assert_eq!(pids(7), vec![4242, 77]);
        assert!(pids(0).is_empty());
        assert_eq!(s.gpus[7].processes[0].used_memory_bytes, Some(2 << 30));
        assert_eq!(
            s.gpus[3].pcie_link,
            Some(PcieLink {
                gen: 3,
                max_gen: 5,
                width: 8,
                max_width: 16
            })
        );
        assert_eq!(s.gpus[3].utilization_percent, Some(97));
        // Not given: NVML says NOT_SUPPORTED, which is no error.
        assert_eq!(
            (s.gpus[0].pcie_link, s.gpus[0].utilization_percent),
            (None, None)
        );
        assert_eq!(stats.errors, 0);
    }
}

#[test]
fn open_fails_without_a_library_or_a_config() {
    let _serial = serial();
    let missing = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/no-such-libnvidia-ml.so");
    assert!(NvmlGpus::open(Some(&missing)).is_err());

    let dir = tempfile::tempdir().unwrap();
    std::env::set_var(CONFIG_ENV, dir.path().join("absent.json"));
    let err = NvmlGpus::open(Some(&fake()))
        .err()
        .expect("no config, no NVML");
    assert!(
        matches!(err, nvml_wrapper::error::NvmlError::DriverNotLoaded),
        "{err:?}"
    );
}

/// Waits for `counts` to reach `want`; XIDs arrive through the XID thread's 500 ms waits.
fn wait_for(counts: &XidCounts, want: &[((u32, u64), u64)]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now: Vec<_> = counts.snapshot().into_iter().collect();
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "XID counts {now:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn xids_appended_to_the_config_reach_the_xid_thread() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    // At nvmlInit these are history: not delivered.
    config["gpus"][1]["xids"] = json!([48]);
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    let counts = Arc::new(XidCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let thread = xid::spawn(gpus.nvml(), gpus.devices(), counts.clone(), stop.clone())
        .expect("the fake delivers XID events");

    config["gpus"][3]["xids"] = json!([79]);
    file.replace(&config);
    wait_for(&counts, &[((3, 79), 1)]);

    // Appending delivers the new entry only; the same list again delivers nothing.
    config["gpus"][3]["xids"] = json!([79, 79]);
    config["gpus"][1]["xids"] = json!([48, 94]);
    file.replace(&config);
    wait_for(&counts, &[((1, 94), 1), ((3, 79), 2)]);
    config["description"] = json!("touched");
    file.replace(&config);
    std::thread::sleep(Duration::from_millis(700));
    wait_for(&counts, &[((1, 94), 1), ((3, 79), 2)]);

    stop.store(true, Ordering::Relaxed);
    thread.join().unwrap();
}

#[test]
fn the_legacy_library_has_no_event_wait_and_the_xid_thread_survives_it() {
    let _serial = serial();
    let mut config = preset("nvswitch-8");
    let file = Config::new(&config);
    let gpus = file.open(&fake_legacy());
    let counts = Arc::new(XidCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Registration works (an old driver has event sets); only nvmlEventSetWait_v2 is missing.
    let thread = xid::spawn(gpus.nvml(), gpus.devices(), counts.clone(), stop.clone());
    config["gpus"][0]["xids"] = json!([79]);
    file.replace(&config);
    std::thread::sleep(Duration::from_millis(600));
    assert!(counts.snapshot().is_empty());
    stop.store(true, Ordering::Relaxed);
    if let Some(thread) = thread {
        thread.join().unwrap();
    }
}

#[test]
fn the_fake_counts_the_calls_a_sample_makes() {
    let _serial = serial();
    let file = Config::new(&preset("nvswitch-8"));
    let gpus = file.open(&fake());
    // SAFETY: fakeNvmlCallCount is `extern "C" fn() -> u64` in fake-nvml.
    let count = unsafe {
        *gpus
            .nvml()
            .lib()
            .__library
            .get::<unsafe extern "C" fn() -> u64>(b"fakeNvmlCallCount\0")
            .expect("fake-nvml exports fakeNvmlCallCount")
    };
    // SAFETY: as above.
    let before = unsafe { count() };
    let (_, stats) = gpus.sample();
    // SAFETY: as above.
    let made = unsafe { count() } - before;
    eprintln!(
        "one nvswitch-8 sample: {made} NVML calls, shmlink counted {}",
        stats.calls
    );
    // Per GPU: 1 PCIe replay + 18 links x (state, remote PCI, remote type, 4 counters, ECC)
    // + 1 field-values call (recovery action, NVLink5 fields) + 1 fabric info + 2 process
    // counts (compute, graphics; none running) + 1 PCIe link call (NOT_SUPPORTED ends it) + 1
    // utilization; per pair: 4 P2P + 1 topology.
    assert_eq!(made, 8 * (1 + 18 * 8 + 2 + 4) + 28 * 5);
    assert_eq!(stats.calls, made, "shmlink's own count is exact");

    // B200: the DL counters are tried on link 0 only (the counter call, then the DL fields);
    // every NVLink5 field of every link and the recovery action come in one call per GPU.
    let file = Config::new(&preset("b200-8"));
    let gpus = file.open(&fake());
    // SAFETY: as above.
    let before = unsafe { count() };
    let (s, stats) = gpus.sample();
    // SAFETY: as above.
    let made = unsafe { count() } - before;
    eprintln!("one b200-8 sample: {made} NVML calls");
    assert_eq!(stats.calls, made, "shmlink's own count is exact");
    assert!(s
        .gpus
        .iter()
        .all(|g| g.links.iter().all(|l| l.nvlink5.is_some())));
    assert_eq!(made, 8 * (1 + 18 * 3 + 2 + 2 + 4) + 28 * 5);
}

#[test]
fn b200_nvlink5_counters_come_per_link_with_the_link_as_scope() {
    let _serial = serial();
    let mut config = preset("b200-8");
    // A distinct figure per (GPU, link): any scope mix-up shows.
    for g in 0..8 {
        for l in 0..18 {
            let n = (g * 100 + l) as u64;
            config["gpus"][g]["links"][l]["nvlink5"] = json!({
                "recovery_successful": n, "recovery_failed": n + 1, "recovery_events": 2 * n + 1,
                "symbol_errors": n + 2, "effective_errors": n + 3,
                "effective_ber": 1e-15, "symbol_ber": 3e-11
            });
        }
    }
    config["gpus"][4]["recovery_action"] = json!("drain_p2p");
    config["gpus"][6]["fabric"] =
        json!({"state": "completed", "status": "timeout", "degraded_bandwidth": true});
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    assert_eq!(gpus.driver_version().as_deref(), Some("570.133.20"));
    let (s, stats) = gpus.sample();
    assert_eq!(stats.errors, 0);
    for g in &s.gpus {
        assert_eq!(g.links.len(), 18);
        for l in &g.links {
            let n = u64::from(g.index * 100 + l.link);
            assert_eq!(l.peer, Peer::Switch);
            assert_eq!(
                l.errors, None,
                "the DL counters are NOT_SUPPORTED on NVLink5"
            );
            let e = l.nvlink5.expect("nvlink5 counters");
            assert_eq!(
                (
                    e.recovery_successful,
                    e.recovery_failed,
                    e.recovery_events,
                    e.symbol,
                    e.effective
                ),
                (n, n + 1, 2 * n + 1, n + 2, n + 3),
                "GPU {} link {}",
                g.index,
                l.link
            );
            assert_eq!(e.symbol_ber.map(|b| b.value()), Some(3e-11));
            assert_eq!(
                e.effective_ber.map(|b| (b.mantissa, b.exponent)),
                Some((1, 15))
            );
        }
        let want = if g.index == 4 {
            RecoveryAction::DrainP2p
        } else {
            RecoveryAction::None
        };
        assert_eq!(g.recovery_action, Some(want));
    }
    let healthy = FabricInfo {
        state: FabricState::Completed,
        status: "success".into(),
        degraded_bandwidth: Some(false),
        route_unhealthy: Some(false),
        cluster_uuid: None,
        clique_id: None,
    };
    assert_eq!(s.gpus[0].fabric.as_ref(), Some(&healthy));
    assert_eq!(
        s.gpus[6].fabric,
        Some(FabricInfo {
            status: "timeout".into(),
            degraded_bandwidth: Some(true),
            ..healthy
        })
    );
}

#[test]
fn every_fabric_state_and_an_unknown_recovery_action_value() {
    let _serial = serial();
    let mut config = preset("b200-8");
    for (g, state) in ["not_supported", "not_started", "in_progress", "completed"]
        .iter()
        .enumerate()
    {
        config["gpus"][g]["fabric"] = json!({"state": state, "route_unhealthy": g == 3});
    }
    config["gpus"][4].as_object_mut().unwrap().remove("fabric");
    config["gpus"][5]
        .as_object_mut()
        .unwrap()
        .remove("recovery_action");
    let file = Config::new(&config);
    let (s, stats) = file.open(&fake()).sample();
    assert_eq!(stats.errors, 0);
    let states: Vec<Option<FabricState>> = s
        .gpus
        .iter()
        .take(5)
        .map(|g| g.fabric.as_ref().map(|f| f.state))
        .collect();
    assert_eq!(
        states,
        [
            None,
            Some(FabricState::NotStarted),
            Some(FabricState::InProgress),
            Some(FabricState::Completed),
            None
        ]
    );
    assert_eq!(
        s.gpus[3].fabric.as_ref().unwrap().route_unhealthy,
        Some(true)
    );
    assert_eq!(s.gpus[5].recovery_action, None);
}

#[test]
fn an_old_driver_lacks_every_new_call_and_nothing_is_an_error() {
    let _serial = serial();
    // Hopper on today's library: the new fields answer NOT_SUPPORTED, the fabric call too
    // (the DL counters read). The B200 config on a library without field values or fabric
    // info: the symbols are missing; nothing is read, nothing is an error.
    for (config, lib, link_errors) in [
        ("nvswitch-8", fake(), Some(LinkErrors::default())),
        ("b200-8", fake_legacy(), None),
    ] {
        let file = Config::new(&preset(config));
        let (s, stats) = file.open(&lib).sample();
        assert_eq!(stats.errors, 0, "{config}");
        for g in &s.gpus {
            assert_eq!((g.recovery_action, g.fabric.as_ref()), (None, None));
            assert!(
                g.links
                    .iter()
                    .all(|l| l.nvlink5.is_none() && l.errors == link_errors),
                "{config}"
            );
        }
    }
}

/// The fleet's keys: the NVLink domain from the fabric info, where the GPU sits from the
/// platform info, the VBIOS; a library without the platform call (an old driver) and a GPU
/// that does not have it (before Blackwell) leave them out, and neither is an error.
#[test]
fn nvlink_domain_platform_and_vbios_where_the_driver_has_them() {
    let _serial = serial();
    let mut config = preset("b200-8");
    for (i, g) in config["gpus"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        g["fabric"]["cluster_uuid"] = json!("7F3C0D5E-0B1A-4C2D-9E8F-001122334455");
        g["fabric"]["clique_id"] = json!(32766);
        g["platform"] = json!({"chassis_serial": "1821724000123", "slot": 9, "tray": 4,
                               "host_id": (i / 4), "module_id": (i % 4 + 1)});
        g["vbios"] = json!("97.00.A5.00.01");
    }
    // GPU 7 not registered yet: its UUID all zero; GPU 6 on a driver that says nothing of it.
    config["gpus"][7]["fabric"]
        .as_object_mut()
        .unwrap()
        .remove("cluster_uuid");
    config["gpus"][6]
        .as_object_mut()
        .unwrap()
        .remove("platform");
    let file = Config::new(&config);
    let gpus = file.open(&fake());
    let (s, stats) = gpus.sample();
    assert_eq!(stats.errors, 0);
    let g5 = &s.gpus[5];
    let fabric = g5.fabric.as_ref().unwrap();
    assert_eq!(
        fabric.cluster_uuid.as_deref(),
        Some("7f3c0d5e-0b1a-4c2d-9e8f-001122334455")
    );
    assert_eq!(fabric.clique_id, Some(32766));
    assert_eq!(
        g5.platform,
        Some(PlatformInfo {
            chassis_serial: "1821724000123".into(),
            slot: 9,
            tray: 4,
            host_id: 1,
            module_id: 2,
        })
    );
    assert_eq!(g5.vbios.as_deref(), Some("97.00.A5.00.01"));
    let g7 = s.gpus[7].fabric.as_ref().unwrap();
    assert_eq!((g7.cluster_uuid.as_deref(), g7.clique_id), (None, None));
    assert_eq!(s.gpus[6].platform, None);

    let (s, stats) = Config::new(&config).open(&fake_legacy()).sample();
    assert_eq!(stats.errors, 0);
    assert!(s
        .gpus
        .iter()
        .all(|g| g.platform.is_none() && g.fabric.is_none()));
    // The VBIOS call is as old as NVML.
    assert_eq!(s.gpus[0].vbios.as_deref(), Some("97.00.A5.00.01"));
}

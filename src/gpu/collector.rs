//! The GPU collector: loads NVML (or says why not), samples every scan, judges pairs against
//! their history, and keeps the XID thread's counts.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::node_info::NodeInfoKeeper;
use super::nvml::NvmlGpus;
use super::pairs::{CarriedWindow, FailingSince, PairJudge, PairRules};
use super::pcie::SysPci;
use super::verdict::{self, Facts};
use super::xid::kernel::{KernelGpu, KernelXids};
use super::xid::{self, FatalXids, HeldAges, Recent, RecentXids, XidCounts};
use crate::model::{
    Blame, GpuReading, GpuUsers, GpuVerdict, LinkErrors, NodeInfo, NvmlState, PairProbe,
    PairVerdict, PcieDowntrain, Snapshot, SxidCount, TrainingCount, XidCount,
};
use crate::model::{Finding, FindingKind, Subject};
use crate::text;
/// How often a failed NVML load is retried: drivers (e.g. the GPU operator's) often come up
/// after the agent.
const RETRY_LOAD_EVERY: Duration = Duration::from_secs(60);

/// One scan's GPU results.
#[derive(Debug, Default)]
pub struct GpuScan {
    pub gpus: Vec<GpuReading>,
    pub pairs: Vec<PairVerdict>,
    /// One verdict per GPU (`verdict.rs`).
    pub verdicts: Vec<GpuVerdict>,
    /// XIDs since start per GPU (NVML's, by index; others by PCI address) and XID.
    pub xids: Vec<XidCount>,
    /// What the kernel log told as XIDs without NVML's word, per GPU and XID.
    pub xids_unconfirmed: Vec<XidCount>,
    /// IOMMU page faults naming each GPU (by index) since start.
    pub iommu_faults: BTreeMap<u32, u64>,
    /// NVSwitch SXIDs since start, by switch and SXID.
    pub sxids: Vec<SxidCount>,
    pub findings: Vec<Finding>,
    /// Which GPUs the failing pairs point at (the pair judge's word).
    pub blame: Blame,
    /// The GPUs whose PCIe link trained down (the pair judge's word), by index.
    pub pcie: BTreeMap<u32, PcieDowntrain>,
    /// Which processes used which GPUs lately (kept across scans).
    pub users: GpuUsers,
    /// The pair probe's last results.
    pub probes: Vec<PairProbe>,
    pub nvml_up: bool,
    /// Whether NVML loaded, from where, and why not.
    pub nvml: NvmlState,
    /// PCI bus ids of the GPUs the driver lists, NVML or not.
    pub driver_gpus: Vec<String>,
    /// The driver, fabric manager and kernel.
    pub node_info: NodeInfo,
    pub errors: u64,
    /// NVML calls made, for benchmarks and tests.
    pub calls: u64,
}

struct Loaded {
    gpus: NvmlGpus,
    /// NVML's driver version, read once at load.
    driver: Option<String>,
    users: GpuUsers,
    judge: PairJudge,
    xids: Arc<XidCounts>,
    recent_xids: RecentXids,
}

enum State {
    Disabled,
    Unavailable {
        reason: String,
        /// NVML's own word on why it did not load.
        error: String,
        last_try: Instant,
    },
    Loaded(Box<Loaded>),
}

pub struct GpuCollector {
    lib: Option<PathBuf>,
    /// Where to look for signs of an NVIDIA GPU when NVML does not load.
    proc_root: PathBuf,
    /// The PCIe paths under the GPUs (`--sys-root`).
    sys: SysPci,
    /// The hypervisor the machine runs under, read once.
    hypervisor: Option<String>,
    with_xid_thread: bool,
    rules: PairRules,
    stop: Arc<AtomicBool>,
    /// NVML's XID events and the kernel log's XIDs (written by the scan thread) meet here.
    xids: Arc<XidCounts>,
    state: State,
    /// What the last load attempt found, for the snapshot.
    nvml: NvmlState,
    /// The pairs' failing-since times of before a restart, for a judge made later (NVML
    /// loading after the agent).
    resume_since: FailingSince,
    node_info: NodeInfoKeeper,
    /// The fatal XIDs held for `--gpu-fault-hold`, whether or not Kubernetes is written to.
    fatal: FatalXids,
    /// The training failures (by GPU address), SXIDs (by switch and SXID) and IOMMU faults (by
    /// GPU index) told lately.
    recent_training: Recent<String>,
    recent_sxids: Recent<(String, u64)>,
    recent_iommu: Recent<u32>,
}

/// `--gpu-fault-hold`'s default.
pub const DEFAULT_FAULT_HOLD: Duration = Duration::from_secs(3600);

impl GpuCollector {
    /// `with_xid_thread` is off for one-shot `check`, where no event could arrive in time.
    pub fn new(
        no_gpu: bool,
        lib: Option<&Path>,
        proc_root: &Path,
        with_xid_thread: bool,
        rules: PairRules,
    ) -> Self {
        let mut collector = GpuCollector {
            lib: lib.map(Path::to_path_buf),
            proc_root: proc_root.to_path_buf(),
            sys: SysPci::new(Path::new("/sys")),
            hypervisor: None,
            with_xid_thread,
            rules,
            stop: Arc::new(AtomicBool::new(false)),
            xids: Arc::default(),
            state: State::Disabled,
            nvml: NvmlState::disabled(),
            resume_since: HashMap::new(),
            node_info: NodeInfoKeeper::new(),
            fatal: FatalXids::new(DEFAULT_FAULT_HOLD),
            recent_training: Recent::default(),
            recent_sxids: Recent::default(),
            recent_iommu: Recent::default(),
        };
        if no_gpu {
            tracing::info!("--no-gpu: GPU collection off");
        } else {
            collector.state = collector.load();
            collector.nvml = nvml_state(collector.lib.as_deref(), &collector.state);
        }
        collector
    }

    fn load(&self) -> State {
        match NvmlGpus::open(self.lib.as_deref()) {
            Ok(gpus) => {
                tracing::info!(
                    gpus = gpus.uuids().len(),
                    driver = gpus.driver_version().unwrap_or_default(),
                    "NVML loaded"
                );
                let xids = self.xids.clone();
                if self.with_xid_thread {
                    let devices = gpus.devices();
                    xid::spawn(gpus.nvml(), devices, xids.clone(), self.stop.clone());
                }
                State::Loaded(Box::new(Loaded {
                    driver: gpus.driver_version(),
                    gpus,
                    users: GpuUsers::default(),
                    judge: PairJudge::new(self.rules),
                    xids,
                    recent_xids: RecentXids::default(),
                }))
            }
            Err(e) => {
                let reason = text::nvml_load_failed(self.lib.as_deref(), &e);
                tracing::info!("{reason}; running shm-only");
                State::Unavailable {
                    reason,
                    error: e.to_string(),
                    last_try: Instant::now(),
                }
            }
        }
    }

    /// Reads the PCIe paths under `sys_root` (the host's /sys) instead of /sys.
    pub fn with_sys_root(mut self, sys_root: &Path) -> Self {
        self.sys = SysPci::new(sys_root);
        self.hypervisor = self.sys.hypervisor();
        if let Some(h) = &self.hypervisor {
            tracing::info!(
                hypervisor = %h,
                "running in a VM: ACS on its emulated PCIe bridges is not judged"
            );
        }
        self
    }

    /// How long a fatal XID holds `GpuFault` after it was last seen.
    pub fn with_fault_hold(mut self, hold: Duration) -> Self {
        self.fatal = FatalXids::new(hold);
        self
    }

    pub fn fault_hold(&self) -> Duration {
        self.fatal.hold()
    }

    /// The fatal XIDs held now, for a restart to carry.
    pub fn held_ages(&self, now: Instant) -> Vec<HeldAges> {
        self.fatal.ages(now)
    }

    /// Holds again what a restart carried (or what `serve` stored, for `check`).
    pub fn resume_held(&mut self, held: Vec<HeldAges>, now: Instant) {
        self.fatal.resume(held, now);
    }

    /// Where XIDs are counted: the kernel log's are added here by the scan thread.
    pub fn xid_counts(&self) -> Arc<XidCounts> {
        self.xids.clone()
    }

    /// Since when each pair failed before a restart (the pair judge's `failing_since`).
    pub fn resume_failing_since(&mut self, since: FailingSince) {
        match &mut self.state {
            State::Loaded(loaded) => loaded.judge.resume_failing_since(since),
            _ => self.resume_since = since,
        }
    }

    /// The pair judge's NVLink counter windows that hold growth (None without NVML).
    pub fn carry_windows(&self, now: Instant) -> Option<Vec<CarriedWindow<LinkErrors>>> {
        match &self.state {
            State::Loaded(loaded) => Some(loaded.judge.carry_windows(now)),
            _ => None,
        }
    }

    /// Windows carried over a restart `since_save` ago; without NVML loaded yet they are
    /// dropped (the next load is a minute away, about when they would have run out).
    pub fn resume_windows(
        &mut self,
        carried: Vec<CarriedWindow<LinkErrors>>,
        since_save: Duration,
        now: Instant,
    ) {
        if let State::Loaded(loaded) = &mut self.state {
            loaded.judge.resume_windows(carried, since_save, now);
        }
    }

    /// One scan; `probes`: the pair probe's last verdicts, judged with the sample (rule 8).
    pub fn scan(&mut self, probes: Vec<PairProbe>) -> GpuScan {
        if let State::Unavailable { last_try, .. } = &self.state {
            if last_try.elapsed() >= RETRY_LOAD_EVERY {
                self.state = self.load();
                self.nvml = nvml_state(self.lib.as_deref(), &self.state);
                if let State::Loaded(loaded) = &mut self.state {
                    let since = std::mem::take(&mut self.resume_since);
                    loaded.judge.resume_failing_since(since);
                }
            }
        }
        let driver_gpus = driver_gpus(&self.proc_root);
        let mut scan = match &mut self.state {
            State::Disabled => GpuScan::default(),
            State::Unavailable { reason, .. } => {
                let mut scan = GpuScan::default();
                if let Some(evidence) = driver_gpu_evidence(&self.proc_root) {
                    scan.findings.push(Finding::new(
                        FindingKind::NvmlUnavailable,
                        Subject::Node,
                        text::nvml_unavailable(&evidence, reason),
                    ));
                }
                scan
            }
            State::Loaded(loaded) => loaded.scan(
                &self.proc_root,
                &mut self.sys,
                self.hypervisor.as_deref(),
                probes,
            ),
        };
        scan.driver_gpus = driver_gpus;
        self.judge(&mut scan, Instant::now());
        scan.nvml = self.nvml.clone();
        let driver = match &self.state {
            State::Loaded(loaded) => loaded.driver.as_deref(),
            _ => None,
        };
        scan.node_info = self.node_info.info(&self.proc_root, driver, Instant::now());
        scan
    }
}

impl GpuCollector {
    /// `check`: the kernel log's GPU lines read back since `--since` counted by `serve`'s rules
    /// (the driver's shape; a fatal XID with NVML's word, `kernel::Word`, from the scan just
    /// made, which read NVML after the lines), then the scan's XIDs and GPU verdicts made again.
    pub fn count_kernel(&mut self, s: &mut Snapshot, events: Vec<KernelGpu>, scanned: Instant) {
        let mut kernel = KernelXids::default();
        let before = scanned
            .checked_sub(Duration::from_millis(1))
            .unwrap_or(scanned);
        kernel.count(events, &s.gpus, &self.xids, before);
        kernel.confirm(&s.gpus, s.nvml_up, scanned, &self.xids);
        let mut scan = GpuScan {
            gpus: std::mem::take(&mut s.gpus),
            pairs: std::mem::take(&mut s.gpu_pairs),
            blame: std::mem::take(&mut s.gpu_blame),
            nvml_up: s.nvml_up,
            driver_gpus: std::mem::take(&mut s.driver_gpus),
            ..GpuScan::default()
        };
        if scan.nvml_up {
            scan.xids = listed(&self.xids.snapshot(), &scan.gpus);
            scan.xids_unconfirmed = listed(&self.xids.unconfirmed(), &scan.gpus);
            scan.iommu_faults = self.xids.iommu();
        }
        // The links trained down are the pair judge's (it does not run again): the scan's.
        scan.pcie = (s.gpu_verdicts.iter())
            .filter_map(|v| Some((v.gpu?, v.pcie.clone()?)))
            .collect();
        self.judge(&mut scan, scanned);
        s.gpus = scan.gpus;
        s.gpu_pairs = scan.pairs;
        s.gpu_blame = scan.blame;
        s.driver_gpus = scan.driver_gpus;
        s.xids = scan.xids;
        s.xids_unconfirmed = scan.xids_unconfirmed;
        s.iommu_faults = scan.iommu_faults;
        s.sxids = scan.sxids;
        s.gpu_verdicts = scan.verdicts;
        // The words said once in the scan's findings: the GPUs NVML does not list, the
        // verdicts' facts.
        s.findings.retain(|f| {
            !matches!(
                f.kind,
                FindingKind::GpuNotInNvml
                    | FindingKind::GpuNvlinkTrainingFailed
                    | FindingKind::GpuNvswitchFatal
                    | FindingKind::GpuIommuFault
                    | FindingKind::GpuPcieDegraded
            )
        });
        s.findings.extend(scan.findings);
    }

    /// The held XIDs brought up to date with this scan's counts, and each GPU's verdict.
    fn judge(&mut self, scan: &mut GpuScan, now: Instant) {
        // The kernel log's XIDs on GPUs NVML does not list, by address (whether NVML loaded or
        // not).
        for ((pci, xid), count) in self.xids.by_address() {
            scan.xids.push(XidCount {
                gpu: None,
                pci_bus_id: pci,
                xid,
                count,
            });
        }
        let held = verdict::hold_xids(&mut self.fatal, &scan.gpus, &scan.xids, now);
        let training: Vec<TrainingCount> = self.xids.training();
        let training: Vec<TrainingCount> = training
            .into_iter()
            .filter(|t| self.recent_training.lasts(&t.pci_bus_id, t.count, now))
            .collect();
        scan.sxids = self.xids.sxids();
        let fatal_sxids: Vec<SxidCount> = (scan.sxids.iter())
            .filter(|s| s.fatal)
            .filter(|s| (self.recent_sxids).lasts(&(s.switch.clone(), s.sxid), s.count, now))
            .cloned()
            .collect();
        let iommu: BTreeMap<u32, u64> = (scan.iommu_faults.iter())
            .filter(|(g, n)| self.recent_iommu.lasts(g, **n, now))
            .map(|(g, n)| (*g, *n))
            .collect();
        scan.verdicts = verdict::judge(&Facts {
            nvml_up: scan.nvml_up,
            gpus: &scan.gpus,
            driver_gpus: &scan.driver_gpus,
            pairs: &scan.pairs,
            blame: &scan.blame,
            held: &held,
            training: &training,
            fatal_sxids: &fatal_sxids,
            pcie: &scan.pcie,
            iommu: &iommu,
        });
        scan.findings
            .extend(verdict::kernel_findings(&scan.verdicts));
        scan.findings
            .extend(verdict::pcie_findings(&scan.verdicts, &scan.gpus));
        let missing: Vec<String> = scan
            .verdicts
            .iter()
            .filter(|v| v.not_in_nvml)
            .map(|v| v.pci_bus_id.clone())
            .collect();
        if !missing.is_empty() {
            scan.findings.push(Finding::new(
                FindingKind::GpuNotInNvml,
                Subject::Node,
                text::gpu_not_in_nvml(&missing, scan.driver_gpus.len(), scan.gpus.len()),
            ));
        }
    }
}

/// NVML's state for the snapshot, from the collector's.
fn nvml_state(lib: Option<&Path>, state: &State) -> NvmlState {
    let library =
        Some(lib.map_or_else(|| DEFAULT_NVML_LIB.to_string(), |l| l.display().to_string()));
    match state {
        State::Disabled => NvmlState::disabled(),
        State::Unavailable { error, .. } => NvmlState {
            loaded: false,
            library,
            error: Some(error.clone()),
            disabled: false,
        },
        State::Loaded(_) => NvmlState {
            loaded: true,
            library,
            error: None,
            disabled: false,
        },
    }
}

/// The library NVML is loaded from without `--nvml-lib` (nvml-wrapper's default).
const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

impl Drop for GpuCollector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Loaded {
    fn scan(
        &mut self,
        proc_root: &Path,
        sys: &mut SysPci,
        hypervisor: Option<&str>,
        probes: Vec<PairProbe>,
    ) -> GpuScan {
        let (mut sample, stats) = self.gpus.sample();
        sample.probes = probes;
        for g in &mut sample.gpus {
            g.pcie_path = sys.path_of(&g.pci_bus_id);
        }
        sample.hypervisor = hypervisor.map(str::to_string);
        let now = Instant::now();
        super::users::observe(
            &mut self.users,
            proc_root,
            &sample.gpus,
            std::time::SystemTime::now(),
        );
        let judgement = self.judge.judge(&sample, now);
        let mut findings = judgement.findings;
        let tallies = self.xids.snapshot();
        findings.extend(self.recent_xids.findings(&tallies, now));
        let xids = listed(&tallies, &sample.gpus);
        let xids_unconfirmed = listed(&self.xids.unconfirmed(), &sample.gpus);
        GpuScan {
            gpus: sample.gpus,
            pairs: judgement.pairs,
            verdicts: Vec::new(),
            blame: judgement.blame,
            pcie: judgement.pcie,
            users: self.users.clone(),
            probes: sample.probes,
            xids,
            xids_unconfirmed,
            iommu_faults: self.xids.iommu(),
            sxids: Vec::new(),
            findings,
            nvml_up: true,
            nvml: NvmlState::default(),
            driver_gpus: Vec::new(),
            node_info: NodeInfo::default(),
            errors: stats.errors + sys.take_errors(),
            calls: stats.calls,
        }
    }
}

/// Tallies per (GPU index, XID) as the snapshot lists them, each with its GPU's address.
fn listed(tallies: &BTreeMap<(u32, u64), u64>, gpus: &[GpuReading]) -> Vec<XidCount> {
    tallies
        .iter()
        .map(|(&(gpu, xid), &count)| XidCount {
            gpu: Some(gpu),
            pci_bus_id: gpus
                .iter()
                .find(|g| g.index == gpu)
                .and_then(|g| super::pci::canonical(&g.pci_bus_id))
                .unwrap_or_default(),
            xid,
            count,
        })
        .collect()
}

/// The PCI bus ids the driver lists under `<proc root>/driver/nvidia/gpus` (one directory per
/// GPU), sorted; empty without a driver.
pub fn driver_gpus(proc_root: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(proc_root.join("driver/nvidia/gpus")) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ids.sort();
    ids
}

/// Signs that this machine has an NVIDIA GPU even though NVML did not load.
pub fn driver_gpu_evidence(proc_root: &Path) -> Option<String> {
    let driver_gpus = proc_root.join("driver/nvidia/gpus");
    if std::fs::read_dir(&driver_gpus).is_ok_and(|mut d| d.next().is_some()) {
        return Some(text::driver_lists_gpus(&driver_gpus));
    }
    Path::new("/dev/nvidia0")
        .exists()
        .then(|| text::DEV_NVIDIA0_EXISTS.to_string())
}

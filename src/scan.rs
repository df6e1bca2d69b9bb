//! One scan of the machine: every collector, then the findings, into one [`Snapshot`].
//! Blocking I/O: callers run it on a thread of its own, never on the async runtime.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::docker_records::DockerNames;
use crate::gpu::collector::GpuCollector;
use crate::gpu::pairs::PairRules;
use crate::host::{HostError, HostPaths};
use crate::kube::pods::PodIndex;
use crate::links::trend::{TrendKeeper, TrendRules};
use crate::model::{CollectorName, CollectorRun, LinkSample, ShmReading, Snapshot};
use crate::probe::schedule::ProbeResults;
use crate::shm::peak::{worth_watching, PeakSampler, PeakTarget, MAX_YOUNG, YOUNG};
use crate::shm::status::{shm_findings_by, Thresholds};
use crate::shm::ShmScanner;

/// What a scan looks at and how it judges, whichever command runs it.
#[derive(Debug, Clone)]
pub struct ScanSettings {
    pub host: HostPaths,
    /// Where sysfs is (the PCIe path under each GPU).
    pub sys_root: PathBuf,
    pub node: String,
    pub thresholds: Thresholds,
    /// `--no-gpu`: NVML is never loaded.
    pub no_gpu: bool,
    /// NVML's library, if not the driver's usual one.
    pub nvml_lib: Option<PathBuf>,
    pub pair_rules: PairRules,
    /// Docker's root, for the names and images of plain Docker containers.
    pub docker_root: Option<PathBuf>,
    /// How long a fatal XID holds its GPU's fault after it was last seen.
    pub gpu_fault_hold: Duration,
}

/// How `serve` scans, beyond what `check` does.
#[derive(Debug, Clone, Copy)]
pub struct ServeScan {
    /// How often a container's /dev/shm is sampled between scans while it is young, half full
    /// or growing.
    pub peak_period: Duration,
    /// Read each container's OOM kill counter (serve without the kernel log).
    pub oom_kills: bool,
}

pub struct ScanOutput {
    pub snapshot: Snapshot,
    pub runs: Vec<CollectorRun>,
    /// The link samples kept this scan (`links::trend`), for `serve`'s store.
    pub link_samples: Vec<LinkSample>,
}

pub struct Scanner {
    node: String,
    thresholds: Thresholds,
    shm: ShmScanner,
    gpu: GpuCollector,
    /// The pair probe's last verdicts (`serve --p2p-probe-interval`), handed to each GPU scan.
    probes: ProbeResults,
    docker: DockerNames,
    /// `serve`: samples /dev/shm between scans where it matters, for the peak.
    peaks: Option<PeakSampler>,
    /// Each container's used bytes at the previous scan (what "growing" is measured from).
    previous_used: HashMap<String, u64>,
    /// When each container's process started, as its first scan read it (young ones are
    /// watched whatever they use).
    started: HashMap<String, SystemTime>,
    /// Each link's error counters over days, judged for slow growth.
    links: TrendKeeper,
}

impl Scanner {
    pub fn new(
        host: &HostPaths,
        node: String,
        thresholds: Thresholds,
        gpu: GpuCollector,
    ) -> Result<Self, HostError> {
        Ok(Scanner {
            node,
            thresholds,
            shm: ShmScanner::new(host)?,
            gpu,
            probes: ProbeResults::default(),
            docker: DockerNames::new(None),
            peaks: None,
            previous_used: HashMap::new(),
            started: HashMap::new(),
            links: TrendKeeper::new(TrendRules::default()),
        })
    }

    /// `check`'s scanner: everything measured once, NVML's XID events not waited for.
    pub fn for_check(settings: &ScanSettings) -> Result<Self, HostError> {
        Ok(Self::with_gpu(settings, false)?.with_docker_root(settings.docker_root.clone()))
    }

    /// `serve`'s scanner: NVML's XID events on a thread of their own, the peak sampled between
    /// scans, and only what its outlets use.
    pub fn for_serve(settings: &ScanSettings, serve: ServeScan) -> Result<Self, HostError> {
        let mut scanner = Self::with_gpu(settings, true)?
            .without_shmem_stat()
            .with_docker_root(settings.docker_root.clone())
            .with_peak_sampling(settings.host.proc_root.clone(), serve.peak_period);
        if serve.oom_kills {
            scanner = scanner.with_oom_kills();
        }
        Ok(scanner)
    }

    fn with_gpu(settings: &ScanSettings, with_xid_thread: bool) -> Result<Self, HostError> {
        let gpu = GpuCollector::new(
            settings.no_gpu,
            settings.nvml_lib.as_deref(),
            &settings.host.proc_root,
            with_xid_thread,
            settings.pair_rules,
        )
        .with_sys_root(&settings.sys_root)
        .with_fault_hold(settings.gpu_fault_hold);
        Scanner::new(
            &settings.host,
            settings.node.clone(),
            settings.thresholds,
            gpu,
        )
    }

    /// Where the pair probe leaves its verdicts for the scans to judge.
    pub fn probe_results(&self) -> ProbeResults {
        self.probes.clone()
    }

    /// Where the GPU collector counts XIDs (NVML's and the kernel log's, one count).
    pub fn xid_counts(&self) -> std::sync::Arc<crate::gpu::xid::XidCounts> {
        self.gpu.xid_counts()
    }

    /// `check`: the kernel log's GPU lines since `--since`, counted into `snapshot` (made by this
    /// scanner at `scanned`) as `serve` counts them, and its GPU verdicts made again.
    pub fn count_kernel_gpus(
        &mut self,
        snapshot: &mut Snapshot,
        events: Vec<crate::gpu::xid::kernel::KernelGpu>,
        scanned: Instant,
    ) {
        self.gpu.count_kernel(snapshot, events, scanned);
    }

    /// The fatal XIDs held now (by GPU UUID), for a restart, or `check`, to take up.
    pub fn held_xids(&self, now: Instant) -> Vec<crate::gpu::xid::HeldAges> {
        self.gpu.held_ages(now)
    }

    /// Holds again the fatal XIDs the state store kept (serve's restart, or `check`).
    pub fn resume_held_xids(&mut self, held: Vec<crate::gpu::xid::HeldAges>, now: Instant) {
        self.gpu.resume_held(held, now);
    }

    /// Since when each GPU pair (by its GPUs' UUIDs) failed before a restart.
    pub fn resume_pairs_failing_since(&mut self, since: crate::gpu::pairs::FailingSince) {
        self.gpu.resume_failing_since(since);
    }

    /// The pair judge's NVLink counter windows that hold growth (None without NVML).
    pub fn carry_link_windows(
        &self,
        now: std::time::Instant,
    ) -> Option<Vec<crate::gpu::pairs::CarriedWindow<crate::model::LinkErrors>>> {
        self.gpu.carry_windows(now)
    }

    /// Takes up link windows carried over a restart `since_save` ago.
    pub fn resume_link_windows(
        &mut self,
        carried: Vec<crate::gpu::pairs::CarriedWindow<crate::model::LinkErrors>>,
        since_save: Duration,
        now: std::time::Instant,
    ) {
        self.gpu.resume_windows(carried, since_save, now);
    }

    /// Takes up the link samples kept before (the state store's), so a restart or `check`
    /// judges the same days.
    pub fn resume_link_samples(&mut self, stored: Vec<LinkSample>) {
        self.links.resume(stored);
    }

    /// Names plain Docker containers from Docker's own records under `docker_root`.
    pub fn with_docker_root(mut self, docker_root: Option<PathBuf>) -> Self {
        self.docker = DockerNames::new(docker_root);
        self
    }

    /// Samples the /dev/shm of containers that are half full or growing every `period`
    /// between scans, so a scan reports the peak since the previous one (`serve`).
    pub fn with_peak_sampling(mut self, proc_root: PathBuf, period: Duration) -> Self {
        self.peaks = Some(PeakSampler::start(proc_root, period));
        self
    }

    /// Leaves out what only `check --json` reports (`memory_shmem_bytes`, from memory.stat):
    /// `serve`'s metrics and Events do not use it, and it is a tenth of a scan's system calls.
    pub fn without_shmem_stat(mut self) -> Self {
        self.shm.set_read_shmem(false);
        self
    }

    /// Reads each container's OOM kill counter: how `serve` tells OOM kills when it does not
    /// read the kernel log (`failures::memcg`).
    pub fn with_oom_kills(mut self) -> Self {
        self.shm.set_read_oom_kills(true);
        self
    }

    /// Containers outside Kubernetes get the name and image Docker knows them by; the IDs of
    /// those Docker says were given GPUs.
    fn name_docker_containers(&mut self, readings: &mut [ShmReading]) -> HashSet<String> {
        let mut gpu = HashSet::new();
        for r in readings.iter_mut().filter(|r| r.pod_uid.is_none()) {
            if let Some(c) = self.docker.lookup(&r.container_id) {
                r.container = Some(c.name);
                r.image = Some(c.image);
                if c.uses_gpu {
                    gpu.insert(r.container_id.clone());
                }
            }
        }
        let live: HashSet<String> = readings.iter().map(|r| r.container_id.clone()).collect();
        self.docker.retain(&live);
        gpu
    }

    /// The peak since the previous scan, and which containers to sample until the next.
    fn track_peaks(&mut self, readings: &mut [ShmReading]) {
        let Some(sampler) = &self.peaks else {
            return;
        };
        let peaks = sampler.take_peaks();
        let now = SystemTime::now();
        let seen: HashSet<&str> = readings.iter().map(|r| r.container_id.as_str()).collect();
        self.started.retain(|id, _| seen.contains(id.as_str()));
        let mut targets = Vec::new();
        let mut young_watched = 0;
        for r in readings.iter_mut() {
            let Some(used) = r.used_bytes else {
                continue;
            };
            let peak = peaks.get(&r.container_id).copied().unwrap_or(0);
            r.used_peak_bytes = Some(used.max(peak));
            let previous = self.previous_used.get(&r.container_id).copied();
            let started = *self
                .started
                .entry(r.container_id.clone())
                .or_insert_with(|| {
                    crate::procfs::stat::started(sampler.proc_root(), r.pid).unwrap_or(now)
                });
            let young = now.duration_since(started).unwrap_or_default() < YOUNG
                && young_watched < MAX_YOUNG;
            young_watched += usize::from(young);
            if worth_watching(previous, used, r.available_bytes.unwrap_or(0), young) {
                targets.push(PeakTarget {
                    container_id: r.container_id.clone(),
                    pid: r.pid,
                });
            }
        }
        self.previous_used = readings
            .iter()
            .filter_map(|r| Some((r.container_id.clone(), r.used_bytes?)))
            .collect();
        sampler.watch(targets);
    }

    /// One scan without Kubernetes names.
    pub fn scan(&mut self) -> ScanOutput {
        self.scan_with(None)
    }

    /// One scan; `pods` (this node's Pods, once the cache has synced) names the containers,
    /// drops pod sandboxes, and tells which containers belong to GPU workloads.
    pub fn scan_with(&mut self, pods: Option<&PodIndex>) -> ScanOutput {
        let started = Instant::now();
        let shm = self.shm.scan();
        let shm_run = CollectorRun {
            collector: CollectorName::Shm,
            duration: started.elapsed(),
            errors: shm.errors,
        };
        let (mut readings, sight) = (shm.readings, shm.sight);
        if let Some(pods) = pods {
            pods.annotate(&mut readings);
        }
        let docker_gpu = self.name_docker_containers(&mut readings);
        self.track_peaks(&mut readings);
        let mut findings = shm_findings_by(&mut readings, &self.thresholds, |r| {
            match (pods, r.pod_uid.as_deref()) {
                (Some(pods), Some(uid)) => pods.requests_gpu(uid),
                _ => docker_gpu.contains(&r.container_id),
            }
        });

        let started = Instant::now();
        let gpu = self.gpu.scan(self.probes.latest());
        let gpu_run = CollectorRun {
            collector: CollectorName::Gpu,
            duration: started.elapsed(),
            errors: gpu.errors,
        };
        findings.extend(gpu.findings);
        let links = self.links.observe(&gpu.gpus, SystemTime::now());
        findings.extend(links.findings);
        // Worst first, so a person (and `check`'s exit status) sees what matters at the top.
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        ScanOutput {
            snapshot: Snapshot {
                node: self.node.clone(),
                shm: readings,
                sandbox_shm: shm
                    .sandboxes
                    .into_iter()
                    .map(|mut r| {
                        r.status = self.thresholds.status(&r);
                        r
                    })
                    .collect(),
                gpus: gpu.gpus,
                gpu_pairs: gpu.pairs,
                gpu_verdicts: gpu.verdicts,
                gpu_fault_hold: self.gpu.fault_hold(),
                gpu_blame: gpu.blame,
                gpu_users: gpu.users,
                job_links: Default::default(),
                gpu_probes: gpu.probes,
                xids: gpu.xids,
                xids_unconfirmed: gpu.xids_unconfirmed,
                iommu_faults: gpu.iommu_faults,
                sxids: gpu.sxids,
                findings,
                failures: Vec::new(),
                failure_counts: Vec::new(),
                failure_images: Vec::new(),
                gone_since: Default::default(),
                nvml_up: gpu.nvml_up,
                nvml: gpu.nvml,
                node_info: gpu.node_info,
                blind: sight.blind(),
                sight,
                driver_gpus: gpu.driver_gpus,
                taken_at: Some(std::time::SystemTime::now()),
                link_trends: links.trends,
            },
            runs: vec![shm_run, gpu_run],
            link_samples: links.to_store,
        }
    }
}

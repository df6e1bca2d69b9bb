//! Command line: one `Args` struct per concern, flattened into each command. Every option can
//! also come from an `SHMLINK_*` environment variable (CONTRACT.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::model::{BUS_ERROR_SHM_RATIO, SHM_OOM_SHARE};
use crate::shm::status::{SHM_CRITICAL_RATIO, SHM_WARN_RATIO};

/// The DRA drivers whose devices are GPUs (NVIDIA's, whose MIG devices are GPUs too; AMD's;
/// Intel's), as a DeviceClass's CEL selector names them: `--dra-gpu-drivers`' default.
pub const DRA_GPU_DRIVERS: [&str; 3] = ["gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com"];

#[derive(Debug, Parser)]
#[command(
    name = "shmlink",
    version,
    about = "Per-container /dev/shm and GPU link health for GPU nodes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One scan of this machine, printed as tables (or JSON with --json).
    /// Exit status: 0 all healthy, 1 any warning or critical finding, 2 it could not run.
    Check(CheckArgs),
    /// The node agent: scans every --interval, serves /metrics, /healthz and /readyz.
    Serve(ServeArgs),
    /// Run inside a workload container (or initContainer): is its own /dev/shm big enough, and
    /// are the GPUs it sees healthy? Exit status: 0 fit, 1 not fit (the fix is printed), 2 it
    /// cannot tell.
    Preflight(PreflightArgs),
    /// Copies between every ordered pair of GPUs through the CUDA driver (peer access, an
    /// 8-byte and a sized copy, read back and compared, timed) and judges each against what
    /// NVML says its path carries. Exit status: 0 every pair ok, 1 any pair degraded or failed,
    /// 2 it could not run (no libcuda, no NVML).
    Probe(ProbeArgs),
    /// The failures and findings serve stored on this node (--state-dir), oldest first.
    /// Exit status: 0, or 2 when there is no store to read.
    History(HistoryArgs),
    /// The admission webhook (HTTPS): GPU Pods get the /dev/shm they need (mutate) or a
    /// warning (warn). Exit status: 0 after SIGTERM, 2 it could not start.
    Admit(AdmitArgs),
    /// The cluster as a whole, read-only through its API (kubeconfig): what is out (Node
    /// conditions, DeviceTaintRules), since when and why, grouped by NVLink domain, with
    /// shmlink's Events and the agents' deaths. Exit status: 0 nothing out and everything read,
    /// 1 something out, 2 a source could not be read (and nothing out) or no cluster.
    Fleet(FleetArgs),
    /// The probe's worker process (run by `probe` and `serve`, not by people).
    #[command(name = "probe-worker", hide = true)]
    ProbeWorker(ProbeWorkerArgs),
}

/// Where libcuda comes from, and what the probe copies.
#[derive(Debug, Args)]
pub struct CudaArgs {
    /// libcuda to load (default: the system's libcuda.so.1).
    #[arg(long, env = "SHMLINK_CUDA_LIB")]
    pub cuda_lib: Option<PathBuf>,
    /// Bytes of the sized copy per pair, e.g. 64Mi: from 4Ki to 4Gi, and within each GPU's
    /// free memory.
    #[arg(long, value_name = "SIZE", default_value = "64Mi", value_parser = crate::probe::input::parse_bytes)]
    pub bytes: u64,
    /// How long a pair's copies may take before the pair counts as hung (larger copies get
    /// the time of the copy at 1 GB/s, three times over).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_window)]
    pub probe_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print JSON (the schema in CONTRACT.md) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only these GPUs (NVML indices), e.g. 0,5,7: two or more that NVML lists.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// A line on stderr per pair as it ends, and for a pair waiting on its deadline: auto (when
    /// stderr is a terminal), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto")]
    pub progress: When,
    /// Colour the table and the progress: auto (on a terminal, unless NO_COLOR is set),
    /// always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto")]
    pub color: When,
    #[command(flatten)]
    pub cuda: CudaArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `--progress`, `--color`: by what the output is (auto), or always, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum When {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Args)]
pub struct ProbeWorkerArgs {
    #[arg(long)]
    pub cuda_lib: Option<PathBuf>,
    #[arg(long)]
    pub bytes: u64,
    /// `none`, ordered pairs of CUDA ordinals (`0:1,1:0`), or `ask`: one such line on stdin
    /// after the devices are said.
    #[arg(long)]
    pub pairs: String,
}

#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// The /dev/shm the workload needs, e.g. 8Gi, 512Mi, 512M, 1073741824.
    #[arg(long, env = "SHMLINK_MIN_SHM", value_name = "SIZE")]
    pub min_shm: Option<String>,
    /// Sizing helper: DataLoader num_workers. Need = workers x prefetch factor x batch bytes,
    /// plus NCCL's shared-memory segments when more than one GPU is visible.
    #[arg(
        long,
        value_name = "N",
        requires = "batch_bytes",
        conflicts_with = "min_shm"
    )]
    pub dataloader_workers: Option<u64>,
    /// Sizing helper: the bytes of one batch as the DataLoader hands it over, e.g. 256Mi.
    #[arg(long, value_name = "SIZE", requires = "dataloader_workers")]
    pub batch_bytes: Option<String>,
    /// Sizing helper: the DataLoader's prefetch_factor (batches in flight per worker).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub prefetch_factor: u64,
    /// Print JSON (schema in docs/commands.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The host's IPC namespace inode, for a node that is itself a container (kind): without
    /// it, host IPC means the kernel's initial IPC namespace.
    #[arg(long, env = "SHMLINK_HOST_IPC_NS", value_name = "INODE")]
    pub host_ipc_ns: Option<u64>,
    /// The /dev/shm to check.
    #[arg(long, env = "SHMLINK_SHM_DIR", default_value = "/dev/shm")]
    pub shm_dir: PathBuf,
    /// Also copy between every ordered pair of the GPUs this container sees (the pair probe):
    /// a pair that fails or runs slow makes it not fit.
    #[arg(long)]
    pub p2p: bool,
    #[command(flatten)]
    pub cuda: CudaArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print JSON (the schema in CONTRACT.md) instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Kubernetes integration: auto, on or off.
    #[arg(long, env = "SHMLINK_KUBE", value_enum, default_value = "off")]
    pub kube: KubeMode,
    #[command(flatten)]
    pub sources: FailureSourceArgs,
    /// How far back the logs and the kernel log are read for failures, e.g. 1h, 30m; serve's
    /// stored history (`--state-dir`) over the same window is read too, where it exists.
    #[arg(long, env = "SHMLINK_SINCE", default_value = "1h", value_parser = parse_window)]
    pub since: Duration,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Run the GPU pair probe this often (off by default), on the GPUs NVML lists no process
    /// on; its results are pair verdict reasons and metrics.
    #[arg(long, env = "SHMLINK_P2P_PROBE_INTERVAL", value_name = "DURATION", value_parser = parse_window)]
    pub p2p_probe_interval: Option<Duration>,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// Address to serve /metrics, /healthz and /readyz on: IP:PORT, HOST:PORT (resolved once;
    /// localhost is the loopback) or :PORT (every address).
    #[arg(long, env = "SHMLINK_LISTEN", default_value = "0.0.0.0:9477", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Scan period, e.g. 500ms, 5s, 1m.
    #[arg(long, env = "SHMLINK_INTERVAL", default_value = "5s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Log format.
    #[arg(long, env = "SHMLINK_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Kubernetes integration: auto, on or off.
    #[arg(long, env = "SHMLINK_KUBE", value_enum, default_value = "auto")]
    pub kube: KubeMode,
    /// The kubelet's pod-resources socket: which pod holds which GPU.
    #[arg(
        long,
        env = "SHMLINK_POD_RESOURCES_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_socket: PathBuf,
    #[command(flatten)]
    pub sources: FailureSourceArgs,
    /// How often the series of an Event whose condition lasts is updated.
    #[arg(long, env = "SHMLINK_EVENT_HEARTBEAT", default_value = "5m", value_parser = parse_window)]
    pub event_heartbeat: Duration,
    /// How long an XID that calls for a GPU reset, a reboot or the vendor keeps the Node's
    /// GpuFault condition True after it was last seen.
    #[arg(long, env = "SHMLINK_GPU_FAULT_HOLD", default_value = "1h", value_parser = parse_window)]
    pub gpu_fault_hold: Duration,
    /// How often the Node's GPU conditions are written again when nothing changed.
    #[arg(long, env = "SHMLINK_CONDITION_HEARTBEAT", default_value = "5m", value_parser = parse_window)]
    pub condition_heartbeat: Duration,
    /// Keep a NoSchedule taint (shmlink.io/gpu-fault) on the Node while GpuFault is True; needs
    /// `patch` on nodes (deploy/components/gpu-fault-taint).
    #[arg(long, env = "SHMLINK_TAINT_ON_GPU_FAULT")]
    pub taint_on_gpu_fault: bool,
    /// A DRA DeviceTaintRule for each GPU the agent blames (the pair judge's culprit, a lost
    /// GPU, a fatal XID), selecting just that GPU's device, with this effect; lifted once the
    /// GPU has been healthy for --gpu-fault-hold. Needs deploy/components/gpu-device-taint.
    #[arg(
        long,
        env = "SHMLINK_GPU_DEVICE_TAINT",
        value_enum,
        default_value = "off"
    )]
    pub gpu_device_taint: DeviceTaintMode,
    /// How long the first scan, and so /readyz, waits for this node's Pod cache to sync (then
    /// it goes on without pod names and says so); 0s does not wait.
    #[arg(long, env = "SHMLINK_POD_CACHE_WAIT", default_value = "10s", value_parser = parse_wait)]
    pub pod_cache_wait: Duration,
    /// SIGBUS faults and OOM victims from the kernel's tracepoints, each container's /dev/shm
    /// read the moment its process dies (needs CAP_PERFMON or CAP_SYS_ADMIN and tracefs): on
    /// (fail at start if it cannot), off, or auto (on where the kernel and capabilities allow).
    #[arg(long, env = "SHMLINK_DEATH_TRACE", value_enum, default_value = "auto")]
    pub death_trace: DeathTraceMode,
    #[command(flatten)]
    pub state: StateArgs,
    /// Where tracefs is mounted (default: <sys-root>/kernel/tracing, else
    /// <sys-root>/kernel/debug/tracing).
    #[arg(long, env = "SHMLINK_TRACEFS", value_name = "DIR")]
    pub tracefs: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AdmitArgs {
    /// Address to serve the webhook on (HTTPS).
    #[arg(long, env = "SHMLINK_ADMIT_LISTEN", default_value = "0.0.0.0:8443", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// The serving certificate (PEM, leaf first), read again when it changes.
    #[arg(long, env = "SHMLINK_ADMIT_TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: PathBuf,
    /// Its private key (PEM).
    #[arg(long, env = "SHMLINK_ADMIT_TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: PathBuf,
    /// What `POST /mutate` does (/mutate/warn and /mutate/mutate are fixed): warn or mutate.
    #[arg(long, env = "SHMLINK_ADMIT_MODE", value_enum, default_value = "warn")]
    pub mode: AdmitMode,
    /// Plain HTTP /metrics and /healthz, or `off`.
    #[arg(long, env = "SHMLINK_ADMIT_METRICS_LISTEN", value_name = "ADDR|off", default_value = "0.0.0.0:9479", value_parser = parse_optional_listen)]
    pub metrics_listen: ListenOrOff,
    /// How often the certificate and key files are read again (by content: a Secret volume's
    /// symlink swap counts).
    #[arg(long, env = "SHMLINK_ADMIT_TLS_RELOAD_INTERVAL", value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub tls_reload_interval: Duration,
    /// Kubernetes, for what Pods' DRA resource claims give (their ResourceClaimTemplates,
    /// ResourceClaims and DeviceClasses): auto (in-cluster, else $KUBECONFIG), on, or off (DRA
    /// Pods then count only their device-plugin GPUs).
    #[arg(long, env = "SHMLINK_KUBE", value_enum, default_value = "auto")]
    pub kube: KubeMode,
    /// The DRA drivers whose devices are GPUs, as DeviceClasses' selectors name them.
    #[arg(long, env = "SHMLINK_DRA_GPU_DRIVERS", value_delimiter = ',', default_values_t = DRA_GPU_DRIVERS.map(String::from))]
    pub dra_gpu_drivers: Vec<String>,
    /// Log format.
    #[arg(long, env = "SHMLINK_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level (default info: one line per decision). SHMLINK_LOG takes a full filter.
    #[arg(long, env = "SHMLINK_LOG_LEVEL", value_enum)]
    pub log_level: Option<LogLevel>,
}

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the agents' DaemonSet (their Pods are asked through the API server's
    /// proxy).
    #[arg(long, env = "SHMLINK_NAMESPACE", default_value = "shmlink")]
    pub namespace: String,
    /// How far back Events and the agents' deaths count, e.g. 30m, 1h, 1d.
    #[arg(long, default_value = "1h", value_parser = parse_window)]
    pub since: Duration,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Log level (default warn). SHMLINK_LOG takes a full filter.
    #[arg(long, env = "SHMLINK_LOG_LEVEL", value_enum)]
    pub log_level: Option<LogLevel>,
}

/// Where serve keeps its state (and `history` reads it).
#[derive(Debug, Args)]
pub struct StateArgs {
    /// The agent's state: a directory for its store (history, positions), or `none`.
    #[arg(
        long,
        env = "SHMLINK_STATE_DIR",
        value_name = "DIR",
        default_value = "/var/lib/shmlink"
    )]
    pub state_dir: PathBuf,
}

impl StateArgs {
    /// The directory, or None for `none`.
    pub fn dir(&self) -> Option<PathBuf> {
        (self.state_dir.as_os_str() != "none").then(|| self.state_dir.clone())
    }
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// How far back, e.g. 1h, 2d.
    #[arg(long, default_value = "1d", value_parser = parse_window)]
    pub since: Duration,
    /// Only this namespace's failures and findings.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Only this Pod's.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
    /// Print JSON ({"failures": [...], "findings": [...]}) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub thresholds: ThresholdArgs,
    /// The Kubernetes node this agent runs on (default: $NODE_NAME, else the host name).
    #[arg(long, env = "SHMLINK_NODE_NAME")]
    pub node_name: Option<String>,
    /// Log level (default: info for serve, warn for check, error for preflight). SHMLINK_LOG,
    /// when set, takes a full filter instead, e.g. `shmlink=debug,kube=info`.
    #[arg(long, env = "SHMLINK_LOG_LEVEL", value_enum)]
    pub log_level: Option<LogLevel>,
}

/// Where workloads say why they died: their logs and the kernel log. `off` turns one off.
#[derive(Debug, Args)]
pub struct FailureSourceArgs {
    /// Kubernetes container logs (CRI format); a missing directory means none.
    #[arg(long, env = "SHMLINK_POD_LOG_ROOT", default_value = "/var/log/pods")]
    pub pod_log_root: PathBuf,
    /// Docker's data root: json-file logs and each container's name and image.
    #[arg(long, env = "SHMLINK_DOCKER_ROOT", default_value = "/var/lib/docker")]
    pub docker_root: PathBuf,
    /// The kernel log (crashes in GPU libraries); `off` never opens it.
    #[arg(long, env = "SHMLINK_KMSG", default_value = "/dev/kmsg")]
    pub kmsg: PathBuf,
    /// The share of a memory cgroup's usage /dev/shm's pages must reach for its OOM kill to be
    /// `shm_oom_killed` (else `workload_oom_killed`).
    #[arg(long, env = "SHMLINK_OOM_SHM_SHARE", default_value_t = SHM_OOM_SHARE, value_parser = parse_ratio)]
    pub oom_shm_share: f64,
    /// How full /dev/shm must have been at its last reading or peak (of its effective limit)
    /// for a SIGBUS death to be `shm_bus_error` (else `workload_bus_error`).
    #[arg(long, env = "SHMLINK_BUS_ERROR_SHM_RATIO", default_value_t = BUS_ERROR_SHM_RATIO, value_parser = parse_ratio)]
    pub bus_error_shm_ratio: f64,
}

impl FailureSourceArgs {
    /// A path, or None when it is `off`.
    pub fn on(path: &std::path::Path) -> Option<PathBuf> {
        (path.as_os_str() != "off").then(|| path.to_path_buf())
    }
}

#[derive(Debug, Args)]
pub struct HostArgs {
    /// The host's proc file system (in a pod: the host's /proc mounted, e.g. /host/proc).
    #[arg(long, env = "SHMLINK_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The host's cgroup file system.
    #[arg(long, env = "SHMLINK_CGROUP_ROOT", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// The host's sysfs: the PCIe path under each GPU (AER counters, ACS), DMI.
    #[arg(long, env = "SHMLINK_SYS_ROOT", default_value = "/sys")]
    pub sys_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct GpuArgs {
    /// NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, env = "SHMLINK_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Never load NVML.
    #[arg(long, env = "SHMLINK_NO_GPU")]
    pub no_gpu: bool,
    /// How long NVLink error-counter growth keeps the GPU pairs it affects degraded
    /// (DCGM's health watch uses 60s).
    #[arg(long, env = "SHMLINK_NVLINK_ERROR_WINDOW", default_value = "60s", value_parser = parse_window)]
    pub nvlink_error_window: Duration,
}

#[derive(Debug, Args)]
pub struct ThresholdArgs {
    /// used / effective limit at or above which a /dev/shm is `warning`.
    #[arg(long, env = "SHMLINK_SHM_WARN_RATIO", default_value_t = SHM_WARN_RATIO, value_parser = parse_ratio)]
    pub shm_warn_ratio: f64,
    /// used / effective limit at or above which a /dev/shm is `critical`.
    #[arg(long, env = "SHMLINK_SHM_CRITICAL_RATIO", default_value_t = SHM_CRITICAL_RATIO, value_parser = parse_ratio)]
    pub shm_critical_ratio: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeathTraceMode {
    /// On where the kernel and the capabilities allow it; else said once, and off.
    Auto,
    Off,
    /// Fail at start when the tracepoints cannot be opened.
    On,
}

/// `admit --mode`: `off` is a namespace's label, not a server's (it would answer nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AdmitMode {
    Warn,
    Mutate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeMode {
    /// In-cluster config, else $KUBECONFIG / ~/.kube/config, else off.
    Auto,
    Off,
    /// Fail at start when the API server is unreachable.
    On,
}

/// `--gpu-device-taint`: off, or the rules' effect as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceTaintMode {
    Off,
    /// Visible only: nothing changes for the device's users (a dry run).
    #[value(name = "None")]
    None,
    /// No new claim gets the device.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// As NoSchedule, and Pods using the device are evicted unless they tolerate the taint.
    #[value(name = "NoExecute")]
    NoExecute,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl CommonArgs {
    /// `--node-name`, else `$NODE_NAME` (the downward API's usual name), else the host name.
    pub fn node_name(&self) -> String {
        self.node_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
            .unwrap_or_else(crate::host::hostname)
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 5s, 1m)"))?;
    if d < Duration::from_millis(100) {
        return Err("must be at least 100ms".into());
    }
    Ok(d)
}

fn parse_window(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 1m)"))?;
    if d.is_zero() {
        return Err("must be more than 0".into());
    }
    Ok(d)
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 10s, 1m)"))
}

/// `--listen`: an IP and port, a host name and port (resolved once at start, IPv4 first:
/// `localhost` is 127.0.0.1 without asking the resolver), or `:PORT` for every address.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    listen_addr(s, |host, port| {
        std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map(Iterator::collect)
            .map_err(|e| e.to_string())
    })
}

/// [`parse_listen`] with the resolver given (tests resolve without DNS).
fn listen_addr(
    s: &str,
    resolve: impl Fn(&str, u16) -> Result<Vec<SocketAddr>, String>,
) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let examples = "examples: 0.0.0.0:9477, localhost:9477, :9477, [::1]:9477";
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} has no port ({examples})"));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port ({examples})"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host {
        "" => return Ok(SocketAddr::from(([0, 0, 0, 0], port))),
        "localhost" => return Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        _ => {}
    }
    let found = resolve(host, port).map_err(|e| format!("{host:?} does not resolve: {e}"))?;
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

/// An address to listen on, or none (`off`). A type of its own: clap takes a bare `Option`
/// as an option that may be left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenOrOff(pub Option<SocketAddr>);

/// `--metrics-listen`: an address as `--listen` takes it, or `off`.
fn parse_optional_listen(s: &str) -> Result<ListenOrOff, String> {
    match s.trim() {
        "off" => Ok(ListenOrOff(None)),
        s => parse_listen(s).map(|a| ListenOrOff(Some(a))),
    }
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("{s:?} is not a ratio in (0, 1]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_host_names_and_a_bare_port() {
        let no_dns = |_: &str, _: u16| -> Result<Vec<SocketAddr>, String> { Err("no DNS".into()) };
        let ok = |s: &str| listen_addr(s, no_dns).unwrap().to_string();
        assert_eq!(ok("0.0.0.0:9477"), "0.0.0.0:9477");
        assert_eq!(ok("[::1]:9999"), "[::1]:9999");
        assert_eq!(ok("localhost:9999"), "127.0.0.1:9999");
        assert_eq!(ok(":9999"), "0.0.0.0:9999");
        let node = |_: &str, port: u16| -> Result<Vec<SocketAddr>, String> {
            Ok(vec![
                SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 7], port)),
                SocketAddr::from(([10, 0, 0, 7], port)),
            ])
        };
        assert_eq!(
            listen_addr("node-a:9477", node).unwrap().to_string(),
            "10.0.0.7:9477",
            "IPv4 first"
        );
        for bad in [
            "localhost",
            "localhost:http",
            "host:99999",
            "nowhere.invalid:1",
        ] {
            let e = listen_addr(bad, no_dns).unwrap_err();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
        assert!(
            parse_listen("localhost:9477").is_ok(),
            "through the real parser"
        );
    }

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_contract() {
        let cli = Cli::try_parse_from(["shmlink", "serve"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.listen, "0.0.0.0:9477".parse().unwrap());
        assert_eq!(s.interval, Duration::from_secs(5));
        assert_eq!(s.kube, KubeMode::Auto);
        assert_eq!(s.common.host.proc_root, PathBuf::from("/proc"));
        assert_eq!(s.common.host.cgroup_root, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(s.common.thresholds.shm_warn_ratio, 0.80);
        assert_eq!(s.common.thresholds.shm_critical_ratio, 0.95);
        assert_eq!(s.pod_cache_wait, Duration::from_secs(10));
        assert_eq!(s.sources.oom_shm_share, 0.5);
        assert_eq!(s.common.log_level, None);
        let cli = Cli::try_parse_from(["shmlink", "check"]).unwrap();
        let Command::Check(c) = cli.command else {
            panic!("not check")
        };
        assert_eq!(c.kube, KubeMode::Off);
        assert!(!c.json);
    }

    #[test]
    fn defaults_written_as_text_are_the_librarys_own() {
        let cli = Cli::try_parse_from(["shmlink", "serve"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        let rules = crate::gpu::pairs::PairRules::default();
        assert_eq!(s.common.gpu.nvlink_error_window, rules.window);
        assert_eq!(
            s.sources.bus_error_shm_ratio,
            crate::model::DeathRules::default().bus_error_shm_ratio
        );
        assert_eq!(
            crate::shm::status::Thresholds::new(
                s.common.thresholds.shm_warn_ratio,
                s.common.thresholds.shm_critical_ratio
            ),
            Ok(crate::shm::status::Thresholds::default())
        );
    }

    #[test]
    fn log_levels_are_the_five_of_the_contract() {
        for (arg, level) in [
            ("error", LogLevel::Error),
            ("warn", LogLevel::Warn),
            ("info", LogLevel::Info),
            ("debug", LogLevel::Debug),
            ("trace", LogLevel::Trace),
        ] {
            let cli = Cli::try_parse_from(["shmlink", "check", "--log-level", arg]).unwrap();
            let Command::Check(c) = cli.command else {
                panic!("not check")
            };
            assert_eq!(c.common.log_level, Some(level));
            assert_eq!(level.as_str(), arg);
        }
        assert!(Cli::try_parse_from(["shmlink", "serve", "--log-level", "verbose"]).is_err());
    }

    #[test]
    fn intervals_and_ratios_are_validated() {
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_interval("5").is_err());
        assert!(parse_interval("1ms").is_err());
        assert_eq!(parse_ratio("0.5"), Ok(0.5));
        assert!(parse_ratio("1.5").is_err());
        assert!(parse_ratio("0").is_err());
        assert!(parse_ratio("abc").is_err());
    }
}

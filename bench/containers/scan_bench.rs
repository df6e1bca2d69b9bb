//! The measuring half of `bench/run.sh containers`: times shmlink's library against whatever
//! containers are running and prints one JSON object per mode on stdout. Needs root for the shm
//! modes.
//!
//! ```text
//! scan_bench shm     [--reps R] [--expect N] [--pause-ms P]
//!                                              shmlink's shm scan (scan::Scanner, GPU off), cold
//!                                              and warm, interleaved with the syscall floor; each
//!                                              after P ms idle (default 0: back to back)
//! scan_bench metrics [--reps R] --nvml-lib L   /metrics encode time and size: the containers
//!                                              plus the fake NVML's GPUs (FAKE_NVML_CONFIG)
//! scan_bench gpu     [--reps R] --nvml-lib L   one GPU scan: time and NVML calls
//! scan_bench profile --what warm|cold|floor [--reps R]
//!                                              only R scans of one kind, between two writes of
//!                                              `<<begin>>` / `<<end>>` to stderr, for strace
//!                                              and valgrind (`profiled_scans` is the function)
//! ```
//!
//! Options shared by all: `--proc-root` (/proc), `--cgroup-root` (/sys/fs/cgroup).
//!
//! The floor is the least any correct scanner has to ask the kernel, written with rustix and no
//! allocation per container: walk the memory cgroup tree (getdents, directory handles, no
//! paths); per cgroup read cgroup.procs once and readlink the first process's mount namespace;
//! per container open /proc/PID/root, openat2 dev/shm beneath it (RESOLVE_IN_ROOT |
//! RESOLVE_NO_SYMLINKS), fstatvfs, and read the cgroup's memory limit and usage. It reports
//! nothing the scanner reports beyond that: no IPC namespace, no mount check, no ancestor
//! limits, no memory.stat, no cgroup path parsing.

#[path = "../common/timing.rs"]
mod timing;
// The harnesses' one Prometheus text parser.
#[path = "../../tests/common/promtext.rs"]
mod promtext;

use std::fmt::Write as _;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde_json::{json, Value};

use shmlink::gpu::collector::GpuCollector;
use shmlink::gpu::nvml::NvmlGpus;
use shmlink::gpu::pairs::PairRules;
use shmlink::host::HostPaths;
use shmlink::metrics::Metrics;
use shmlink::scan::Scanner;
use shmlink::shm::status::Thresholds;

type Error = Box<dyn std::error::Error>;

struct Args {
    mode: String,
    reps: usize,
    expect: Option<usize>,
    what: String,
    pause_ms: u64,
    nvml_lib: Option<PathBuf>,
    host: HostPaths,
}

fn parse_args() -> Result<Args, Error> {
    let mut it = std::env::args().skip(1);
    let mode = it
        .next()
        .ok_or("usage: scan_bench shm|metrics|gpu [options]")?;
    let mut args = Args {
        mode,
        reps: 11,
        expect: None,
        what: "warm".into(),
        pause_ms: 0,
        nvml_lib: None,
        host: HostPaths {
            proc_root: "/proc".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
        },
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--reps" => args.reps = value()?.parse()?,
            "--expect" => args.expect = Some(value()?.parse()?),
            "--what" => args.what = value()?,
            "--pause-ms" => args.pause_ms = value()?.parse()?,
            "--nvml-lib" => args.nvml_lib = Some(value()?.into()),
            "--proc-root" => args.host.proc_root = value()?.into(),
            "--cgroup-root" => args.host.cgroup_root = value()?.into(),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if args.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    Ok(args)
}

fn main() {
    let result = parse_args().and_then(|args| match args.mode.as_str() {
        "shm" => bench_shm(&args),
        "metrics" => bench_metrics(&args),
        "gpu" => bench_gpu(&args),
        "profile" => profile(&args),
        other => Err(format!("unknown mode {other}").into()),
    });
    match result {
        Ok(out) => println!("{out}"),
        Err(e) => {
            eprintln!("scan_bench: {e}");
            std::process::exit(2);
        }
    }
}

/// Wall and CPU time of `f`, in microseconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (out, wall, cpu) = timing::timed(f);
    (out, wall * 1e6, cpu * 1e6)
}

/// Median, minimum and maximum of the samples, and the samples themselves.
fn stats(samples: &[f64]) -> Value {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    json!({"median": median, "min": s[0], "max": s[n - 1], "samples": samples})
}

fn shm_scanner(host: &HostPaths) -> Result<Scanner, Error> {
    let gpu = GpuCollector::new(true, None, &host.proc_root, false, PairRules::default());
    Ok(Scanner::new(
        host,
        "bench".into(),
        Thresholds::default(),
        gpu,
    )?)
}

fn bench_shm(args: &Args) -> Result<Value, Error> {
    let floor = Floor::new(&args.host)?;
    // warm is serve's Scanner, which leaves memory.stat alone; cold is check's.
    let mut warm_scanner = shm_scanner(&args.host)?.without_shmem_stat();
    let found = warm_scanner.scan().snapshot.shm.len();
    let floor_found = floor.scan()?;
    if let Some(expect) = args.expect {
        if found < expect {
            return Err(
                format!("shmlink found {found} containers, expected at least {expect}").into(),
            );
        }
    }
    if floor_found != found {
        return Err(format!("the floor found {floor_found} containers, shmlink {found}").into());
    }
    let (mut warm_wall, mut warm_cpu) = (Vec::new(), Vec::new());
    let (mut cold_wall, mut cold_cpu) = (Vec::new(), Vec::new());
    let (mut floor_wall, mut floor_cpu) = (Vec::new(), Vec::new());
    // Interleaved, so a neighbour's burst of load hits all three alike. With --pause-ms each
    // scan starts after an idle pause, as serve's do (caches cooled), not straight after another.
    let pause = || std::thread::sleep(std::time::Duration::from_millis(args.pause_ms));
    for _ in 0..args.reps {
        pause();
        let (n, wall, cpu) = timed(|| floor.scan());
        check_count("floor", n?, found)?;
        floor_wall.push(wall);
        floor_cpu.push(cpu);
        pause();

        let (out, wall, cpu) = timed(|| warm_scanner.scan());
        check_count("warm scan", out.snapshot.shm.len(), found)?;
        warm_wall.push(wall);
        warm_cpu.push(cpu);
        pause();

        // A new Scanner has no mountinfo cache: every container's mountinfo is read, as in
        // `shmlink check`. Building it (the host's namespaces) is not timed.
        let mut cold_scanner = shm_scanner(&args.host)?;
        let (out, wall, cpu) = timed(|| cold_scanner.scan());
        check_count("cold scan", out.snapshot.shm.len(), found)?;
        cold_wall.push(wall);
        cold_cpu.push(cpu);
    }
    Ok(json!({
        "mode": "shm",
        "containers": found,
        "reps": args.reps,
        "pause_ms": args.pause_ms,
        "unit": "us",
        "warm": {"wall": stats(&warm_wall), "cpu": stats(&warm_cpu)},
        "cold": {"wall": stats(&cold_wall), "cpu": stats(&cold_cpu)},
        "floor": {"wall": stats(&floor_wall), "cpu": stats(&floor_cpu)},
    }))
}

fn profile(args: &Args) -> Result<Value, Error> {
    let floor = Floor::new(&args.host)?;
    let mut scanner = shm_scanner(&args.host)?.without_shmem_stat();
    let found = scanner.scan().snapshot.shm.len();
    let what = args.what.as_str();
    if !["warm", "cold", "floor"].contains(&what) {
        return Err(format!("--what {what}: warm, cold or floor").into());
    }
    let mut cold = Vec::new();
    if what == "cold" {
        for _ in 0..args.reps {
            cold.push(shm_scanner(&args.host)?);
        }
    }
    eprintln!("<<begin>>");
    let ((), wall, cpu) =
        timed(|| profiled_scans(what, args.reps, &floor, &mut scanner, &mut cold));
    eprintln!("<<end>>");
    Ok(
        json!({"mode": "profile", "what": what, "containers": found, "reps": args.reps,
              "unit": "us", "wall_per_scan": wall / args.reps as f64, "cpu_per_scan": cpu / args.reps as f64}),
    )
}

#[inline(never)]
fn profiled_scans(
    what: &str,
    reps: usize,
    floor: &Floor,
    scanner: &mut Scanner,
    cold: &mut [Scanner],
) {
    match what {
        "floor" => {
            for _ in 0..reps {
                std::hint::black_box(floor.scan().ok());
            }
        }
        "cold" => {
            for scanner in cold.iter_mut().take(reps) {
                std::hint::black_box(scanner.scan());
            }
        }
        _ => {
            for _ in 0..reps {
                std::hint::black_box(scanner.scan());
            }
        }
    }
}

fn check_count(what: &str, n: usize, expected: usize) -> Result<(), Error> {
    if n != expected {
        return Err(format!(
            "{what} found {n} containers, the first scan {expected}: did containers come or go?"
        )
        .into());
    }
    Ok(())
}

fn gpu_collector(args: &Args) -> Result<GpuCollector, Error> {
    let lib = args.nvml_lib.as_deref().ok_or("--nvml-lib is needed")?;
    if std::env::var_os("FAKE_NVML_CONFIG").is_none() {
        return Err("FAKE_NVML_CONFIG is not set".into());
    }
    Ok(GpuCollector::new(
        false,
        Some(lib),
        &args.host.proc_root,
        false,
        PairRules::default(),
    ))
}

fn bench_metrics(args: &Args) -> Result<Value, Error> {
    let host = &args.host;
    let mut scanner = Scanner::new(
        host,
        "bench".into(),
        Thresholds::default(),
        gpu_collector(args)?,
    )?;
    let out = scanner.scan();
    if !out.snapshot.nvml_up || out.snapshot.gpus.is_empty() {
        return Err("the fake NVML did not load: no GPUs in the scan".into());
    }
    let (containers, gpus) = (out.snapshot.shm.len(), out.snapshot.gpus.len());
    let shared = Arc::new(ArcSwapOption::empty());
    let metrics = Metrics::new(shared.clone());
    shared.store(Some(Arc::new(out.snapshot)));
    metrics.record_scan(&out.runs);
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut size = 0;
    let mut series = 0;
    for _ in 0..args.reps {
        let (text, w, c) = timed(|| metrics.encode());
        let text = text?;
        size = text.len();
        series = promtext::samples(&text).count();
        wall.push(w);
        cpu.push(c);
    }
    Ok(json!({
        "mode": "metrics",
        "containers": containers,
        "gpus": gpus,
        "reps": args.reps,
        "unit": "us",
        "bytes": size,
        "series": series,
        "wall": stats(&wall),
        "cpu": stats(&cpu),
    }))
}

fn bench_gpu(args: &Args) -> Result<Value, Error> {
    let mut collector = gpu_collector(args)?;
    // The same library, loaded again: dlopen hands back the one already loaded, so its call
    // counter is the collector's.
    let lib = args.nvml_lib.as_deref().ok_or("--nvml-lib is needed")?;
    let counter =
        NvmlGpus::open(Some(lib)).map_err(|e| format!("loading {}: {e}", lib.display()))?;
    // SAFETY: fakeNvmlCallCount is `extern "C" fn() -> u64` in fake-nvml.
    let count = unsafe {
        *counter
            .nvml()
            .lib()
            .__library
            .get::<unsafe extern "C" fn() -> u64>(b"fakeNvmlCallCount\0")
            .map_err(|e| format!("{} is not the fake NVML: {e}", lib.display()))?
    };
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    let (mut calls, mut counted) = (0, 0);
    let mut gpus = 0;
    let mut links = 0;
    // The first scan sets the pair judge's baselines; it is timed like the others.
    for _ in 0..args.reps {
        // SAFETY: as above.
        let before = unsafe { count() };
        let (scan, w, c) = timed(|| collector.scan(Vec::new()));
        // SAFETY: as above.
        calls = unsafe { count() } - before;
        counted = scan.calls;
        if !scan.nvml_up {
            return Err("the fake NVML did not load".into());
        }
        gpus = scan.gpus.len();
        links = scan.gpus.iter().map(|g| g.links.len()).sum();
        wall.push(w);
        cpu.push(c);
    }
    Ok(json!({
        "mode": "gpu",
        "gpus": gpus,
        "links": links,
        "reps": args.reps,
        "unit": "us",
        "nvml_calls": calls,
        "nvml_calls_counted_by_shmlink": counted,
        "wall": stats(&wall),
        "cpu": stats(&cpu),
    }))
}

/// The syscall floor (see the top of the file).
struct Floor {
    proc_root: PathBuf,
    hierarchy: PathBuf,
    limit_file: &'static str,
    usage_file: &'static str,
    host_mnt: u64,
}

impl Floor {
    fn new(host: &HostPaths) -> Result<Floor, Error> {
        let (hierarchy, version) = host.memory_hierarchy()?;
        let files = version.memory_files();
        let host_mnt = host.host_namespaces()?.mnt.0;
        Ok(Floor {
            proc_root: host.proc_root.clone(),
            hierarchy,
            limit_file: files.limit,
            usage_file: files.usage,
            host_mnt,
        })
    }

    /// One pass; the number of containers measured.
    fn scan(&self) -> Result<usize, Error> {
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = rustix::fs::open(&self.hierarchy, dir_flags, Mode::empty())?;
        let mut dirent_buf = vec![MaybeUninit::<u8>::uninit(); 32 * 1024];
        let mut path = String::with_capacity(64);
        let mut stack: Vec<(OwnedFd, Option<u64>)> = Vec::new();
        let mut found = 0;
        push_children(&root, None, &mut dirent_buf, &mut stack)?;
        while let Some((dir, outer)) = stack.pop() {
            let mut inner = outer;
            if let Some(pid) = first_pid(&dir) {
                path.clear();
                write!(path, "{}/{pid}/ns/mnt", self.proc_root.display())?;
                if let Some(mnt) = read_ns(&path) {
                    if mnt != self.host_mnt && Some(mnt) != outer {
                        if self.measure(pid, &dir, &mut path) {
                            found += 1;
                        }
                        inner = Some(mnt);
                    }
                }
            }
            push_children(&dir, inner, &mut dirent_buf, &mut stack)?;
        }
        Ok(found)
    }

    /// statvfs of /dev/shm and the memory limit and usage; false when the process is gone.
    fn measure(&self, pid: u32, dir: &OwnedFd, path: &mut String) -> bool {
        path.clear();
        let _ = write!(path, "{}/{pid}/root", self.proc_root.display());
        let Ok(root) = rustix::fs::open(
            path.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        let shm = rustix::fs::openat2(
            &root,
            "dev/shm",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        );
        let vfs = shm.ok().and_then(|fd| rustix::fs::fstatvfs(&fd).ok());
        let limit = read_u64(dir, self.limit_file);
        let usage = read_u64(dir, self.usage_file);
        std::hint::black_box((vfs.map(|v| (v.f_blocks, v.f_bfree)), limit, usage));
        true
    }
}

/// Pushes every subdirectory of `dir` (opened relative to it) with the namespace above it.
fn push_children(
    dir: &OwnedFd,
    outer: Option<u64>,
    buf: &mut [MaybeUninit<u8>],
    stack: &mut Vec<(OwnedFd, Option<u64>)>,
) -> Result<(), Error> {
    let mut entries = rustix::fs::RawDir::new(dir.as_fd(), buf);
    while let Some(entry) = entries.next() {
        let entry = entry?;
        let name = entry.file_name();
        if entry.file_type() != rustix::fs::FileType::Directory
            || name.to_bytes() == b"."
            || name.to_bytes() == b".."
        {
            continue;
        }
        // A cgroup removed meanwhile is simply not there.
        if let Ok(child) = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            stack.push((child, outer));
        }
    }
    Ok(())
}

/// The first PID in the cgroup's cgroup.procs: one read of one page.
fn first_pid(dir: &OwnedFd) -> Option<u32> {
    let fd = rustix::fs::openat(
        dir,
        "cgroup.procs",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = [0u8; 4096];
    let n = rustix::io::read(&fd, &mut buf).ok()?;
    parse_u64(&buf[..n]).map(|v| v as u32)
}

fn read_u64(dir: &OwnedFd, file: &str) -> Option<u64> {
    let fd = rustix::fs::openat(dir, file, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&fd, &mut buf).ok()?;
    parse_u64(&buf[..n])
}

/// The inode number in a namespace link's text, `mnt:[4026531840]`.
fn read_ns(path: &str) -> Option<u64> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 64];
    let (init, _) = rustix::fs::readlinkat_raw(rustix::fs::CWD, path, &mut buf).ok()?;
    let start = init.iter().position(|&b| b == b'[')? + 1;
    parse_u64(&init[start..])
}

/// The leading decimal number of `bytes`.
fn parse_u64(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    bytes[..digits].iter().try_fold(0u64, |v, &b| {
        v.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

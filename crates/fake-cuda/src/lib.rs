//! A test double of `libcuda.so`: the CUDA driver API calls shmlink's pair probe makes, answered
//! from the JSON file named by `FAKE_CUDA_CONFIG` (README.md). Device memory is host memory
//! behind opaque device pointers, so copies really move (and, where the config says, corrupt)
//! bytes; a peer copy advances a simulated GPU clock by its size over the pair's bandwidth,
//! which CUDA events read, as a real GPU's events time the copy and not the host.
//!
//! With `FAKE_CUDA_STATS` set, the live allocations, enabled peer mappings and retained
//! contexts are written there (JSON) after each call that changes them, so a test can see that
//! the probe left nothing behind. With `FAKE_CUDA_INITS` set, each process's driver start (its
//! first `cuInit`) appends a line there, so a test can count them.

// Each function's safety contract is CUDA's own for the symbol of the same name.
#![allow(clippy::missing_safety_doc)]

pub mod config;

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use config::Config;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUstream = *mut c_void;

pub const CONFIG_ENV: &str = "FAKE_CUDA_CONFIG";
pub const STATS_ENV: &str = "FAKE_CUDA_STATS";
pub const INITS_ENV: &str = "FAKE_CUDA_INITS";

const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const NOT_INITIALIZED: CUresult = 3;
const NO_DEVICE: CUresult = 100;
const INVALID_DEVICE: CUresult = 101;
const INVALID_CONTEXT: CUresult = 201;
const PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const INVALID_HANDLE: CUresult = 400;
const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
const PEER_ACCESS_NOT_ENABLED: CUresult = 705;

struct State {
    config: Config,
    /// Device pointer -> (device, bytes).
    memory: HashMap<u64, (usize, Vec<u8>)>,
    next_ptr: u64,
    /// (from, to): cuCtxEnablePeerAccess from `from`'s context to `to`'s.
    peers: HashSet<(usize, usize)>,
    /// Primary context retain counts per device.
    retained: HashMap<usize, u32>,
    /// The simulated GPU clock, seconds.
    clock: f64,
    events: HashMap<u64, Option<f64>>,
    next_event: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the initialised state; a panic becomes CUDA_ERROR_UNKNOWN instead of unwinding
/// into C.
fn with(f: impl FnOnce(&mut State) -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut guard = lock();
        match guard.as_mut() {
            Some(s) => f(s),
            None => NOT_INITIALIZED,
        }
    }))
    .unwrap_or(999)
}

fn write_stats(s: &State) {
    let Some(path) = std::env::var_os(STATS_ENV) else {
        return;
    };
    let retained: u32 = s.retained.values().sum();
    let text = format!(
        "{{\"allocations\": {}, \"peers_enabled\": {}, \"contexts_retained\": {}}}\n",
        s.memory.len(),
        s.peers.len(),
        retained
    );
    let tmp = std::path::PathBuf::from(&path).with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(tmp, path);
    }
}

fn device(s: &State, d: CUdevice) -> Option<usize> {
    usize::try_from(d)
        .ok()
        .filter(|&d| d < s.config.devices.len())
}

fn ctx_of(device: usize) -> CUcontext {
    std::ptr::without_provenance_mut(device + 1)
}

fn device_of_ctx(s: &State, ctx: CUcontext) -> Option<usize> {
    ctx.addr()
        .checked_sub(1)
        .filter(|&d| d < s.config.devices.len())
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    let mut guard = lock();
    if guard.is_some() {
        return SUCCESS;
    }
    let Some(path) = std::env::var_os(CONFIG_ENV) else {
        return NO_DEVICE;
    };
    // A config named but unreadable or malformed is the test's mistake: said on stderr (with
    // the file, and where serde_json stopped) and the driver does not start, rather than
    // passing for a machine without GPUs.
    let config = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| Config::parse(&text));
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "fake-cuda: {CONFIG_ENV}={}: {e}",
                std::path::Path::new(&path).display()
            );
            return NOT_INITIALIZED;
        }
    };
    *guard = Some(State {
        config,
        memory: HashMap::new(),
        next_ptr: 0x7f00_0000_0000,
        peers: HashSet::new(),
        retained: HashMap::new(),
        clock: 0.0,
        events: HashMap::new(),
        next_event: 1,
    });
    if let Some(path) = std::env::var_os(INITS_ENV) {
        use std::io::Write;
        let line = format!("{}\n", std::process::id());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        // A count a test reads; a failure to write it only makes that test fail.
        let _ = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return INVALID_VALUE;
    }
    *version = 12040;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    with(|s| {
        if count.is_null() {
            return INVALID_VALUE;
        }
        *count = s.config.devices.len() as c_int;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    with(|s| {
        if dev.is_null() {
            return INVALID_VALUE;
        }
        match device(s, ordinal) {
            Some(d) => {
                *dev = d as CUdevice;
                SUCCESS
            }
            None => INVALID_DEVICE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    with(|s| {
        let Some(d) = device(s, dev) else {
            return INVALID_DEVICE;
        };
        // The driver writes `0000:18:00.0`: a 4-digit domain, upper-case hex.
        let id = &s.config.devices[d];
        let text = match id.split_once(':') {
            Some((domain, rest)) => format!(
                "{:04X}:{}",
                u32::from_str_radix(domain, 16).unwrap_or(0),
                rest.to_ascii_uppercase()
            ),
            None => id.clone(),
        };
        let Ok(len) = usize::try_from(len) else {
            return INVALID_VALUE;
        };
        if bus_id.is_null() || len <= text.len() {
            return INVALID_VALUE;
        }
        std::ptr::copy_nonoverlapping(text.as_ptr(), bus_id.cast::<u8>(), text.len());
        *bus_id.add(text.len()) = 0;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    with(|s| {
        let Some(d) = device(s, dev) else {
            return INVALID_DEVICE;
        };
        if pctx.is_null() {
            return INVALID_VALUE;
        }
        *s.retained.entry(d).or_default() += 1;
        *pctx = ctx_of(d);
        write_stats(s);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    with(|s| {
        let Some(d) = device(s, dev) else {
            return INVALID_DEVICE;
        };
        match s.retained.get_mut(&d) {
            Some(n) if *n > 0 => {
                *n -= 1;
                if *n == 0 {
                    s.retained.remove(&d);
                }
                write_stats(s);
                SUCCESS
            }
            _ => INVALID_CONTEXT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    with(|s| {
        if ctx.is_null() {
            CURRENT.set(None);
            return SUCCESS;
        }
        match device_of_ctx(s, ctx) {
            Some(d) => {
                CURRENT.set(Some(d));
                SUCCESS
            }
            None => INVALID_CONTEXT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    with(|_| {
        if CURRENT.get().is_some() {
            SUCCESS
        } else {
            INVALID_CONTEXT
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    with(|s| {
        let (Some(a), Some(b)) = (device(s, dev), device(s, peer)) else {
            return INVALID_DEVICE;
        };
        if can.is_null() {
            return INVALID_VALUE;
        }
        let ok = a != b && s.config.pair(a, b).and_then(|p| p.peer_access) != Some(false);
        *can = c_int::from(ok);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, _flags: c_uint) -> CUresult {
    with(|s| {
        let Some(a) = CURRENT.get() else {
            return INVALID_CONTEXT;
        };
        let Some(b) = device_of_ctx(s, peer) else {
            return INVALID_CONTEXT;
        };
        if a == b || s.config.pair(a, b).and_then(|p| p.peer_access) == Some(false) {
            return PEER_ACCESS_UNSUPPORTED;
        }
        if !s.peers.insert((a, b)) {
            return PEER_ACCESS_ALREADY_ENABLED;
        }
        write_stats(s);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    with(|s| {
        let Some(a) = CURRENT.get() else {
            return INVALID_CONTEXT;
        };
        let Some(b) = device_of_ctx(s, peer) else {
            return INVALID_CONTEXT;
        };
        if !s.peers.remove(&(a, b)) {
            return PEER_ACCESS_NOT_ENABLED;
        }
        write_stats(s);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    with(|s| {
        let Some(d) = CURRENT.get() else {
            return INVALID_CONTEXT;
        };
        if dptr.is_null() || bytes == 0 {
            return INVALID_VALUE;
        }
        let ptr = s.next_ptr;
        s.next_ptr += (bytes as u64).next_multiple_of(1 << 20) + (1 << 20);
        s.memory.insert(ptr, (d, vec![0u8; bytes]));
        *dptr = ptr;
        write_stats(s);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    with(|s| {
        if s.memory.remove(&dptr).is_none() {
            return INVALID_VALUE;
        }
        write_stats(s);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    with(|s| {
        let Some((_, mem)) = s.memory.get_mut(&dst) else {
            return INVALID_VALUE;
        };
        if src.is_null() || bytes > mem.len() {
            return INVALID_VALUE;
        }
        std::ptr::copy_nonoverlapping(src.cast::<u8>(), mem.as_mut_ptr(), bytes);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    with(|s| {
        let Some((_, mem)) = s.memory.get(&src) else {
            return INVALID_VALUE;
        };
        if dst.is_null() || bytes > mem.len() {
            return INVALID_VALUE;
        }
        std::ptr::copy_nonoverlapping(mem.as_ptr(), dst.cast::<u8>(), bytes);
        SUCCESS
    })
}

/// The pair's faults come first: a crash or a hang happens inside the call, as it would in a
/// driver; a copy error returns before anything moves.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
) -> CUresult {
    let fault = {
        let guard = lock();
        let Some(s) = guard.as_ref() else {
            return NOT_INITIALIZED;
        };
        let (Some(to), Some(from)) = (device_of_ctx(s, dst_ctx), device_of_ctx(s, src_ctx)) else {
            return INVALID_CONTEXT;
        };
        s.config.pair(from, to).cloned()
    };
    if let Some(p) = &fault {
        if p.crash {
            std::process::abort();
        }
        if p.hang {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
    with(|s| {
        if let Some(code) = fault.as_ref().and_then(|p| p.copy_error) {
            return code;
        }
        // Out of the map while it is written: the source stays borrowed beside it.
        let Some((dev, mut to)) = s.memory.remove(&dst) else {
            return INVALID_VALUE;
        };
        let copied = match s.memory.get(&src) {
            Some((_, from)) if bytes <= from.len() && bytes <= to.len() => {
                to[..bytes].copy_from_slice(&from[..bytes]);
                true
            }
            _ => false,
        };
        if copied && bytes > 0 && fault.as_ref().is_some_and(|p| p.corrupt) {
            to[bytes / 2] ^= 0x01;
        }
        s.memory.insert(dst, (dev, to));
        if !copied {
            return INVALID_VALUE;
        }
        let gbps = fault
            .as_ref()
            .and_then(|p| p.gbps)
            .unwrap_or(s.config.default_gbps);
        s.clock += bytes as f64 / (gbps * 1e9);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, _flags: c_uint) -> CUresult {
    with(|s| {
        if event.is_null() {
            return INVALID_VALUE;
        }
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(id, None);
        *event = std::ptr::without_provenance_mut(id as usize);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, _stream: CUstream) -> CUresult {
    with(|s| {
        let clock = s.clock;
        match s.events.get_mut(&(event.addr() as u64)) {
            Some(t) => {
                *t = Some(clock);
                SUCCESS
            }
            None => INVALID_HANDLE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    with(|s| {
        if s.events.contains_key(&(event.addr() as u64)) {
            SUCCESS
        } else {
            INVALID_HANDLE
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    with(|s| {
        let get = |e: CUevent| s.events.get(&(e.addr() as u64)).copied().flatten();
        match (get(start), get(end)) {
            (Some(a), Some(b)) if !ms.is_null() => {
                *ms = ((b - a) * 1000.0) as f32;
                SUCCESS
            }
            _ => INVALID_HANDLE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    with(|s| match s.events.remove(&(event.addr() as u64)) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    })
}

/// CUDA's own words for the codes this library returns (and the probe's common ones).
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    if text.is_null() {
        return INVALID_VALUE;
    }
    let s: &'static [u8] = match error {
        0 => b"no error\0",
        1 => b"invalid argument\0",
        3 => b"initialization error\0",
        100 => b"no CUDA-capable device is detected\0",
        101 => b"invalid device ordinal\0",
        201 => b"invalid device context\0",
        217 => b"peer access is not supported between these two devices\0",
        400 => b"invalid resource handle\0",
        700 => b"an illegal memory access was encountered\0",
        704 => b"peer access is already enabled\0",
        705 => b"peer access has not been enabled\0",
        719 => b"unspecified launch failure\0",
        _ => b"unknown error\0",
    };
    *text = s.as_ptr().cast();
    SUCCESS
}

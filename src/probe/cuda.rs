//! The only file that talks to libcuda: the CUDA driver API calls the pair probe makes, bound
//! with libloading. Not cudarc: it resolves every symbol of its CUDA version at load and panics
//! on one the driver lacks; these ~20 calls are in every driver since CUDA 11, and a missing one
//! is an answer ("this libcuda lacks cuX"), not a crash. No CUDA toolkit at build time.
//!
//! Runs only in the probe's worker process (`probe-worker`): a hung copy cannot be cancelled
//! and a broken driver path can crash the process, so the parent keeps a deadline and lives on.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;
use std::time::Duration;

use libloading::{Library, Symbol};

type CuResult = c_int;
type CuDevice = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;
type CuEvent = *mut c_void;

/// CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: someone else mapped it; not ours to undo.
const ALREADY_ENABLED: CuResult = 704;

/// A CUDA driver call that did not return CUDA_SUCCESS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    pub call: &'static str,
    pub code: i32,
    pub text: String,
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: CUDA error {} ({})",
            self.call, self.code, self.text
        )
    }
}

macro_rules! symbols {
    ($($name:ident: $ty:ty;)*) => {
        #[allow(non_snake_case)]
        struct Fns { $($name: $ty,)* }

        impl Fns {
            /// Every symbol, or the first one the library lacks.
            unsafe fn load(lib: &Library) -> Result<Fns, String> {
                Ok(Fns { $($name: {
                    let s: Symbol<$ty> = lib
                        .get(concat!(stringify!($name), "\0").as_bytes())
                        .map_err(|_| format!("this libcuda lacks {}", stringify!($name)))?;
                    *s
                },)* })
            }
        }
    };
}

symbols! {
    cuInit: unsafe extern "C" fn(c_uint) -> CuResult;
    cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> CuResult;
    cuDeviceGet: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
    cuDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
    cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult;
    cuDevicePrimaryCtxRelease_v2: unsafe extern "C" fn(CuDevice) -> CuResult;
    cuCtxSetCurrent: unsafe extern "C" fn(CuContext) -> CuResult;
    cuCtxSynchronize: unsafe extern "C" fn() -> CuResult;
    cuDeviceCanAccessPeer: unsafe extern "C" fn(*mut c_int, CuDevice, CuDevice) -> CuResult;
    cuCtxEnablePeerAccess: unsafe extern "C" fn(CuContext, c_uint) -> CuResult;
    cuCtxDisablePeerAccess: unsafe extern "C" fn(CuContext) -> CuResult;
    cuMemAlloc_v2: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
    cuMemFree_v2: unsafe extern "C" fn(CuDevicePtr) -> CuResult;
    cuMemcpyHtoD_v2: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
    cuMemcpyDtoH_v2: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
    cuMemcpyPeer: unsafe extern "C" fn(CuDevicePtr, CuContext, CuDevicePtr, CuContext, usize) -> CuResult;
    cuEventCreate: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult;
    cuEventRecord: unsafe extern "C" fn(CuEvent, *mut c_void) -> CuResult;
    cuEventSynchronize: unsafe extern "C" fn(CuEvent) -> CuResult;
    cuEventElapsedTime: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult;
    cuEventDestroy_v2: unsafe extern "C" fn(CuEvent) -> CuResult;
    cuGetErrorString: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
}

/// A loaded, initialised libcuda.
pub struct Cuda {
    fns: Fns,
    /// The pattern sent and the buffer read back into, made once per size: 64 MiB each, for
    /// 56 pairs on an 8-GPU board.
    buffers: std::cell::RefCell<(Vec<u8>, Vec<u8>)>,
    // Kept loaded for as long as the function pointers are used.
    _lib: Library,
}

/// What one ordered pair's copies did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairRun {
    /// cuDeviceCanAccessPeer said yes and cuCtxEnablePeerAccess worked (or it was on).
    pub peer_access: bool,
    /// Why peer access could not be had, where it could not.
    pub peer_error: Option<String>,
    /// The first call of the copies that failed.
    pub copy_error: Option<CudaError>,
    /// Where the bytes read back first differed from those sent.
    pub bad_offset: Option<u64>,
    /// The sized copy, as CUDA's events timed it.
    pub seconds: Option<f64>,
}

impl Cuda {
    /// Loads `lib` (the system's `libcuda.so.1` when None) and initialises the driver.
    pub fn open(lib: Option<&Path>) -> Result<Cuda, String> {
        let path = lib.map_or_else(|| "libcuda.so.1".into(), |p| p.as_os_str().to_owned());
        // SAFETY: loading a library runs its initialisers; libcuda's are the driver's own.
        let lib = unsafe { Library::new(&path) }
            .map_err(|e| format!("loading {}: {e}", path.to_string_lossy()))?;
        // SAFETY: each symbol is cast to the type cuda.h declares for it.
        let fns = unsafe { Fns::load(&lib) }?;
        let cuda = Cuda {
            fns,
            buffers: Default::default(),
            _lib: lib,
        };
        // SAFETY: flags must be 0.
        cuda.check("cuInit", unsafe { (cuda.fns.cuInit)(0) })
            .map_err(|e| format!("the driver did not start: {e}"))?;
        Ok(cuda)
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the driver hands back a static string, or leaves the pointer null.
        let words = unsafe {
            if (self.fns.cuGetErrorString)(code, &mut text) == 0 && !text.is_null() {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            } else {
                "unknown error".into()
            }
        };
        Err(CudaError {
            call,
            code,
            text: words,
        })
    }

    /// The PCI bus id of each device, in CUDA's order.
    pub fn devices(&self) -> Result<Vec<String>, CudaError> {
        let mut count: c_int = 0;
        // SAFETY: out-parameter.
        self.check("cuDeviceGetCount", unsafe {
            (self.fns.cuDeviceGetCount)(&mut count)
        })?;
        let mut out = Vec::new();
        for ordinal in 0..count {
            let mut dev: CuDevice = 0;
            // SAFETY: out-parameter; ordinal below the count.
            self.check("cuDeviceGet", unsafe {
                (self.fns.cuDeviceGet)(&mut dev, ordinal)
            })?;
            let mut buf = [0 as c_char; 32];
            // SAFETY: the buffer's length is passed.
            self.check("cuDeviceGetPCIBusId", unsafe {
                (self.fns.cuDeviceGetPCIBusId)(buf.as_mut_ptr(), buf.len() as c_int, dev)
            })?;
            // SAFETY: NUL-terminated by the driver within the buffer.
            out.push(
                unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        Ok(out)
    }

    /// Copies from device `from` to device `to` (CUDA ordinals): peer access where it can be
    /// had, 8 bytes, then `bytes` of a known pattern timed by CUDA events, read back and
    /// compared. Leaves no memory, mapping or context behind, whatever fails. `peer_answered`
    /// is called once peer access is settled, before the copies (which may hang).
    pub fn run_pair(
        &self,
        from: i32,
        to: i32,
        bytes: usize,
        peer_answered: &mut dyn FnMut(&PairRun),
    ) -> PairRun {
        let mut run = PairRun::default();
        let mut held = Held::new(self);
        if let Err(e) = self.copy_pair((from, to), bytes, &mut run, &mut held, peer_answered) {
            run.copy_error = Some(e);
        }
        drop(held);
        run
    }

    fn copy_pair(
        &self,
        (from, to): (i32, i32),
        bytes: usize,
        run: &mut PairRun,
        held: &mut Held<'_>,
        peer_answered: &mut dyn FnMut(&PairRun),
    ) -> Result<(), CudaError> {
        let f = &self.fns;
        let ctx_from = held.retain(from)?;
        let ctx_to = held.retain(to)?;
        self.enable_peer(from, to, (ctx_from, ctx_to), run, held)?;
        peer_answered(run);
        let mut buffers = self.buffers.borrow_mut();
        let (pattern, back) = &mut *buffers;
        if pattern.len() != bytes {
            *pattern = make_pattern(bytes);
            *back = vec![0u8; bytes];
        }
        let src = held.alloc(ctx_from, bytes)?;
        // SAFETY: `pattern` holds `bytes` bytes; `src` was allocated with as many.
        self.check("cuMemcpyHtoD_v2", unsafe {
            (f.cuMemcpyHtoD_v2)(src, pattern.as_ptr().cast(), bytes)
        })?;
        let dst = held.alloc(ctx_to, bytes)?;
        self.set(ctx_from)?;
        // SAFETY: both pointers are live allocations of at least 8 bytes in those contexts.
        self.check("cuMemcpyPeer (8 bytes)", unsafe {
            (f.cuMemcpyPeer)(dst, ctx_to, src, ctx_from, bytes.min(8))
        })?;
        run.seconds = Some(self.timed_copy((src, ctx_from), (dst, ctx_to), bytes, held)?);
        back.fill(0);
        self.set(ctx_to)?;
        // SAFETY: `back` holds `bytes` bytes.
        self.check("cuMemcpyDtoH_v2", unsafe {
            (f.cuMemcpyDtoH_v2)(back.as_mut_ptr().cast(), dst, bytes)
        })?;
        run.bad_offset = first_difference(back, pattern);
        Ok(())
    }

    /// Peer access from `from` to `to`, where CUDA says it can be had; what it answered goes
    /// into `run`. Leaves `from`'s context current.
    fn enable_peer(
        &self,
        from: i32,
        to: i32,
        (ctx_from, ctx_to): (CuContext, CuContext),
        run: &mut PairRun,
        held: &mut Held<'_>,
    ) -> Result<(), CudaError> {
        let f = &self.fns;
        let mut can: c_int = 0;
        // SAFETY: out-parameter; both devices exist.
        self.check("cuDeviceCanAccessPeer", unsafe {
            (f.cuDeviceCanAccessPeer)(&mut can, from, to)
        })?;
        self.set(ctx_from)?;
        if can != 1 {
            run.peer_error = Some("cuDeviceCanAccessPeer says no".into());
            return Ok(());
        }
        // SAFETY: current context is `from`'s; flags must be 0.
        let code = unsafe { (f.cuCtxEnablePeerAccess)(ctx_to, 0) };
        match code {
            0 => {
                run.peer_access = true;
                held.peer = Some((ctx_from, ctx_to));
            }
            ALREADY_ENABLED => run.peer_access = true,
            code => {
                run.peer_error = self
                    .check("cuCtxEnablePeerAccess", code)
                    .err()
                    .map(|e| e.to_string())
            }
        }
        Ok(())
    }

    /// The sized copy between two events of the current context: how long it took, seconds.
    fn timed_copy(
        &self,
        (src, ctx_from): (CuDevicePtr, CuContext),
        (dst, ctx_to): (CuDevicePtr, CuContext),
        bytes: usize,
        held: &mut Held<'_>,
    ) -> Result<f64, CudaError> {
        let f = &self.fns;
        let (start, end) = (held.event()?, held.event()?);
        // SAFETY: events created in this context; the legacy default stream.
        self.check("cuEventRecord", unsafe {
            (f.cuEventRecord)(start, std::ptr::null_mut())
        })?;
        // SAFETY: live allocations of `bytes` bytes on each side.
        self.check("cuMemcpyPeer", unsafe {
            (f.cuMemcpyPeer)(dst, ctx_to, src, ctx_from, bytes)
        })?;
        // SAFETY: as above.
        self.check("cuEventRecord", unsafe {
            (f.cuEventRecord)(end, std::ptr::null_mut())
        })?;
        // SAFETY: a recorded event.
        self.check("cuEventSynchronize", unsafe { (f.cuEventSynchronize)(end) })?;
        self.check("cuCtxSynchronize", unsafe { (f.cuCtxSynchronize)() })?;
        let mut ms: f32 = 0.0;
        // SAFETY: two recorded events of this context.
        self.check("cuEventElapsedTime", unsafe {
            (f.cuEventElapsedTime)(&mut ms, start, end)
        })?;
        Ok(f64::from(ms) / 1000.0)
    }

    fn set(&self, ctx: CuContext) -> Result<(), CudaError> {
        // SAFETY: a retained primary context.
        self.check("cuCtxSetCurrent", unsafe {
            (self.fns.cuCtxSetCurrent)(ctx)
        })
    }
}

/// What a pair's run holds, given back on drop in reverse: events, memory, the peer mapping
/// it made, the contexts it retained.
struct Held<'a> {
    cuda: &'a Cuda,
    contexts: Vec<(CuDevice, CuContext)>,
    memory: Vec<(CuContext, CuDevicePtr)>,
    events: Vec<CuEvent>,
    peer: Option<(CuContext, CuContext)>,
}

impl<'a> Held<'a> {
    fn new(cuda: &'a Cuda) -> Held<'a> {
        Held {
            cuda,
            contexts: Vec::new(),
            memory: Vec::new(),
            events: Vec::new(),
            peer: None,
        }
    }

    fn retain(&mut self, dev: CuDevice) -> Result<CuContext, CudaError> {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: out-parameter; a device ordinal the driver listed.
        self.cuda.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.cuda.fns.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
        })?;
        self.contexts.push((dev, ctx));
        Ok(ctx)
    }

    fn alloc(&mut self, ctx: CuContext, bytes: usize) -> Result<CuDevicePtr, CudaError> {
        self.cuda.set(ctx)?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: out-parameter.
        self.cuda.check("cuMemAlloc_v2", unsafe {
            (self.cuda.fns.cuMemAlloc_v2)(&mut ptr, bytes)
        })?;
        self.memory.push((ctx, ptr));
        Ok(ptr)
    }

    fn event(&mut self) -> Result<CuEvent, CudaError> {
        let mut ev: CuEvent = std::ptr::null_mut();
        // SAFETY: out-parameter; default flags.
        self.cuda.check("cuEventCreate", unsafe {
            (self.cuda.fns.cuEventCreate)(&mut ev, 0)
        })?;
        self.events.push(ev);
        Ok(ev)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let f = &self.cuda.fns;
        // SAFETY: each handle below was created by this run and is given back once.
        unsafe {
            for ev in self.events.drain(..) {
                let _ = (f.cuEventDestroy_v2)(ev);
            }
            for (ctx, ptr) in self.memory.drain(..) {
                let _ = (f.cuCtxSetCurrent)(ctx);
                let _ = (f.cuMemFree_v2)(ptr);
            }
            if let Some((from, to)) = self.peer.take() {
                let _ = (f.cuCtxSetCurrent)(from);
                let _ = (f.cuCtxDisablePeerAccess)(to);
            }
            let _ = (f.cuCtxSetCurrent)(std::ptr::null_mut());
            for (dev, _) in self.contexts.drain(..).rev() {
                let _ = (f.cuDevicePrimaryCtxRelease_v2)(dev);
            }
        }
    }
}

/// A pattern no stuck bit hides: a 64 KiB block of every byte value in a scrambled order,
/// repeated (built and compared with memcpy and memcmp, so 64 MiB costs milliseconds). The
/// buffer read back is zeroed before each copy, so a copy that moved nothing shows.
fn make_pattern(bytes: usize) -> Vec<u8> {
    const BLOCK: usize = 64 << 10;
    let block: Vec<u8> = (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(7) ^ ((i >> 8) as u8))
        .collect();
    let mut out = Vec::with_capacity(bytes);
    while out.len() < bytes {
        let n = (bytes - out.len()).min(BLOCK);
        out.extend_from_slice(&block[..n]);
    }
    out
}

/// Where `got` first differs from `want`, compared a block at a time.
fn first_difference(got: &[u8], want: &[u8]) -> Option<u64> {
    const BLOCK: usize = 64 << 10;
    let n = got.len().min(want.len());
    let mut at = 0;
    for (g, w) in got[..n].chunks(BLOCK).zip(want[..n].chunks(BLOCK)) {
        if g != w {
            let i = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(0);
            return Some((at + i) as u64);
        }
        at += g.len();
    }
    (got.len() != want.len()).then_some(got.len().min(want.len()) as u64)
}

/// How long the sized copy is allowed before the pair counts as hung: the copy at 1 GB/s, and
/// never under `floor`.
pub fn copy_deadline(bytes: u64, floor: Duration) -> Duration {
    floor.max(Duration::from_secs_f64(bytes as f64 / 1e9 * 3.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_is_found_where_it_is() {
        let a = make_pattern(200_000);
        assert_eq!(a.len(), 200_000);
        assert!(
            a[..256]
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                == 256
        );
        let mut b = a.clone();
        assert_eq!(first_difference(&b, &a), None);
        b[131_073] ^= 1;
        assert_eq!(first_difference(&b, &a), Some(131_073));
        assert_eq!(first_difference(&a[..10], &a), Some(10));
    }
}

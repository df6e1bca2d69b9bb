//! One tracepoint event per CPU through `perf_event_open`, and its mmap'd ring buffer read.
//! The unsafe code is here alone: the system call, the mapping and the ring's head and tail.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys as sys;

/// Data pages per ring (a power of two): 64 KiB per CPU holds ~800 SIGBUS samples between two
/// reads; past that they are counted as lost.
const DATA_PAGES: usize = 16;

/// One opened tracepoint on one CPU with its ring.
pub struct Ring {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    page: usize,
    /// Records copied out of the ring, reused.
    buf: Vec<u8>,
}

// The mapping belongs to the ring alone and is read by one thread at a time.
unsafe impl Send for Ring {}

impl Ring {
    /// Opens tracepoint `id` on `cpu` for every process, samples carrying TID, time (the
    /// monotonic clock: the real-time one is refused for tracepoints, EINVAL, as not safe in
    /// NMI; `moment.rs` turns it into wall-clock time) and the raw record; `filter` (ftrace's
    /// syntax) is applied in the kernel.
    pub fn open(id: u64, cpu: u32, filter: Option<&str>) -> io::Result<Ring> {
        let mut attr = sys::bindings::perf_event_attr {
            type_: sys::bindings::PERF_TYPE_TRACEPOINT,
            size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
            config: id,
            sample_type: u64::from(
                sys::bindings::PERF_SAMPLE_TID
                    | sys::bindings::PERF_SAMPLE_TIME
                    | sys::bindings::PERF_SAMPLE_RAW,
            ),
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        attr.__bindgen_anon_1.sample_period = 1;
        attr.__bindgen_anon_2.wakeup_events = 1;
        attr.set_use_clockid(1);
        attr.set_disabled(1);
        let cpu_arg = i32::try_from(cpu).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: attr is a whole, initialised perf_event_attr of the size it states.
        let raw = unsafe {
            sys::perf_event_open(
                &mut attr,
                -1,
                cpu_arg,
                -1,
                u64::from(sys::bindings::PERF_FLAG_FD_CLOEXEC) as _,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor the call just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if let Some(filter) = filter {
            let c = std::ffi::CString::new(filter)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: a NUL-terminated string the kernel only reads.
            if unsafe { sys::ioctls::SET_FILTER(fd.as_raw_fd(), c.as_ptr() as *mut _) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let page = rustix::param::page_size();
        let len = page * (1 + DATA_PAGES);
        // SAFETY: a fresh shared mapping of the event's ring, unmapped in Drop.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }?;
        // SAFETY: an event this process opened.
        if unsafe { sys::ioctls::ENABLE(fd.as_raw_fd(), 0) } < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: the mapping made above, not used after.
            let _ = unsafe { rustix::mm::munmap(base, len) };
            return Err(e);
        }
        Ok(Ring {
            fd,
            base: base.cast(),
            len,
            page,
            buf: Vec::with_capacity(256),
        })
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Hands each whole record in the ring to `each`, then frees the space.
    pub fn drain(&mut self, mut each: impl FnMut(&[u8])) {
        let header = self.base.cast::<sys::bindings::perf_event_mmap_page>();
        // SAFETY: the header page is mapped for the ring's life; head and tail are read and
        // written as the kernel's ABI says (load-acquire of head, store-release of tail).
        let (head_ptr, tail_ptr) = unsafe {
            (
                std::ptr::addr_of!((*header).data_head).cast::<AtomicU64>(),
                std::ptr::addr_of_mut!((*header).data_tail).cast::<AtomicU64>(),
            )
        };
        let (head, mut tail) = unsafe {
            (
                (*head_ptr).load(Ordering::Acquire),
                (*tail_ptr).load(Ordering::Relaxed),
            )
        };
        let size = (self.len - self.page) as u64;
        // SAFETY: data pages follow the header page within the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.page), self.len - self.page) };
        while tail + 8 <= head {
            let at = |off: u64| ((tail + off) % size) as usize;
            let byte = |off: u64| data[at(off)];
            let rec_size = u16::from_ne_bytes([byte(6), byte(7)]) as u64;
            if rec_size < 8 || tail + rec_size > head {
                // A broken record: nothing after it can be trusted; skip what is there.
                tail = head;
                break;
            }
            self.buf.clear();
            self.buf.extend((0..rec_size).map(byte));
            each(&self.buf);
            tail += rec_size;
        }
        // SAFETY: as above.
        unsafe { (*tail_ptr).store(tail, Ordering::Release) };
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in open, not used after.
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
    }
}

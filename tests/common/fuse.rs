//! A FUSE file system whose server hangs as a real one does: it answers FUSE_INIT, then reads
//! every further request and never answers. A caller whose request the server has read waits
//! in the kernel uninterruptibly, SIGKILL included (fs/fuse/dev.c `request_wait_answer`), so
//! a process that asks it anything can never be reaped while it stands.
//!
//! The test process holds /dev/fuse and serves it on a thread; a forked child enters the
//! target's mount namespace and mounts it there (`fd=N` names the inherited descriptor). Drop
//! stops the server, closes /dev/fuse (the kernel then aborts the connection: every stuck
//! call returns) and detaches the mount: no test leaves a hung mount behind.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const FUSE_INIT: u32 = 26;
const FUSE_ACCESS: u32 = 34;
const ENOSYS: i32 = 38;
/// fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
const IN_HEADER: usize = 40;

/// What the server saw.
#[derive(Default)]
pub struct Seen {
    /// FUSE_INIT was read and answered.
    pub initialized: AtomicBool,
    /// Opcodes of the requests read after INIT (none answered), with the asking program.
    pub requests: Mutex<Vec<(u32, std::path::PathBuf)>>,
    pub count: AtomicU64,
}

pub struct HungFuse {
    target_pid: i32,
    mount_point: String,
    fuse: Option<Arc<OwnedFd>>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
    pub seen: Arc<Seen>,
}

impl HungFuse {
    /// Mounts the hung file system (a directory at its root) at the directory `mount_point` in
    /// the mount namespace of `pid`, and waits until the server answered INIT.
    pub fn mount(pid: i32, mount_point: &str) -> HungFuse {
        HungFuse::mount_as(pid, mount_point, "40000", false, false)
    }

    /// As [`HungFuse::mount`], after unmounting what is at `mount_point`, in one go (what a
    /// container allowed to mount can do to its own /dev/shm): the kernel hands the freed mount
    /// ID to the next mount, so the FUSE usually gets it.
    #[allow(dead_code)] // not every test binary that shares this module uses it
    pub fn replace(pid: i32, mount_point: &str) -> HungFuse {
        HungFuse::mount_as(pid, mount_point, "40000", false, true)
    }

    /// As [`HungFuse::mount`], but FUSE_ACCESS is answered ENOSYS (recorded all the same): the
    /// kernel then asks it no more, and a test process can chroot into the mount (chroot's
    /// permission check is an ACCESS request) with nothing else ever answered.
    pub fn mount_chrootable(pid: i32, mount_point: &str) -> HungFuse {
        HungFuse::mount_as(pid, mount_point, "40000", true, false)
    }

    /// As [`HungFuse::mount`], over the regular file `path` (a file at its root).
    pub fn mount_over_file(pid: i32, path: &str) -> HungFuse {
        HungFuse::mount_as(pid, path, "100000", false, false)
    }

    fn mount_as(
        pid: i32,
        mount_point: &str,
        rootmode: &str,
        answer_access: bool,
        replace: bool,
    ) -> HungFuse {
        let fuse = rustix::fs::open(
            "/dev/fuse",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .expect("opening /dev/fuse");
        let fuse = Arc::new(fuse);
        let seen = Arc::new(Seen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let server = std::thread::Builder::new()
            .name("hung-fuse".into())
            .spawn({
                let (fuse, seen, stop) = (fuse.clone(), seen.clone(), stop.clone());
                move || serve(&fuse, &seen, &stop, answer_access)
            })
            .unwrap();
        in_namespace(pid, {
            let opts = format!(
                "fd={},rootmode={rootmode},user_id=0,group_id=0",
                fuse.as_raw_fd()
            );
            let (opts, target) = (
                CString::new(opts).unwrap(),
                CString::new(mount_point).unwrap(),
            );
            move || {
                // SAFETY: umount2 and mount(2) with NUL-terminated strings, in the forked child.
                if replace && unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
                    return false;
                }
                let rc = unsafe {
                    libc::mount(
                        c"hung".as_ptr(),
                        target.as_ptr(),
                        c"fuse".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        opts.as_ptr().cast(),
                    )
                };
                rc == 0
            }
        })
        .unwrap_or_else(|e| panic!("mounting the hung FUSE at {mount_point} of {pid}: {e}"));
        let hung = HungFuse {
            target_pid: pid,
            mount_point: mount_point.to_string(),
            fuse: Some(fuse),
            stop,
            server: Some(server),
            seen,
        };
        assert!(
            super::wait_until(Duration::from_secs(5), || hung
                .seen
                .initialized
                .load(Ordering::Relaxed)),
            "the FUSE server never got INIT"
        );
        hung
    }

    /// Opcodes of the requests `program` sent (the server left them unanswered) so far.
    pub fn requests_from(&self, program: &std::path::Path) -> Vec<u32> {
        let requests = self.seen.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(_, exe)| exe == program)
            .map(|(op, _)| *op)
            .collect()
    }
}

impl Drop for HungFuse {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        // The last descriptor of the connection closed: the kernel aborts it, and every call
        // waiting on it returns (ENOTCONN).
        drop(self.fuse.take());
        let target = CString::new(self.mount_point.clone()).unwrap();
        // SAFETY: umount2 with a NUL-terminated path, in the forked child.
        let _ = in_namespace(self.target_pid, move || unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH) == 0
        });
    }
}

/// Reads requests until told to stop: INIT answered, the rest recorded and never answered.
fn serve(fuse: &OwnedFd, seen: &Seen, stop: &AtomicBool, answer_access: bool) {
    // As large as libfuse's (a page and FUSE_MAX_MAX_PAGES): the kernel refuses a read into
    // less than a request can hold.
    let mut buf = vec![0u8; (1 << 20) + 4096 * 2];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [rustix::event::PollFd::new(
            fuse,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let n = match rustix::io::read(fuse, &mut buf) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            // Not mounted yet: the device is not tied to a connection until the mount is made.
            Err(rustix::io::Errno::PERM) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(rustix::io::Errno::NODEV) => return, // aborted or unmounted
            Err(e) => panic!("reading /dev/fuse: {e}"),
        };
        if n < IN_HEADER {
            continue;
        }
        let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
        let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
        if opcode == FUSE_INIT && !seen.initialized.load(Ordering::Relaxed) {
            let major = u32::from_ne_bytes(buf[IN_HEADER..IN_HEADER + 4].try_into().unwrap());
            let _ = rustix::io::write(fuse, &init_reply(unique, major));
            seen.initialized.store(true, Ordering::Relaxed);
            continue;
        }
        seen.count.fetch_add(1, Ordering::Relaxed);
        // The asking thread's program: on a shared machine other agents scan these
        // containers too, and only this build's binary is under test.
        let tid = u32::from_ne_bytes(buf[32..36].try_into().unwrap());
        let exe = std::fs::read_link(format!("/proc/{tid}/exe")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
        eprintln!(
            "hung FUSE: request {opcode} from thread {tid} ({}) of {} left unanswered",
            comm.trim(),
            exe.display()
        );
        seen.requests.lock().unwrap().push((opcode, exe));
        if answer_access && opcode == FUSE_ACCESS {
            let _ = rustix::io::write(fuse, &error_reply(unique, ENOSYS));
        }
    }
}

/// A fuse_out_header alone: the request failed with `errno`.
fn error_reply(unique: u64, errno: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&16u32.to_ne_bytes());
    out.extend_from_slice(&(-errno).to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out
}

/// fuse_out_header and fuse_init_out (protocol 7.31, no flags: the kernel asks nothing more).
fn init_reply(unique: u64, major: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(80);
    let body_len = 64u32;
    out.extend_from_slice(&(16 + body_len).to_ne_bytes());
    out.extend_from_slice(&0i32.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(&major.min(7).to_ne_bytes()); // major
    out.extend_from_slice(&31u32.to_ne_bytes()); // minor
    out.extend_from_slice(&0u32.to_ne_bytes()); // max_readahead
    out.extend_from_slice(&0u32.to_ne_bytes()); // flags
    out.extend_from_slice(&1u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&1u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.resize(16 + body_len as usize, 0); // max_pages, map_alignment, flags2, unused
    out
}

/// Runs `f` in a child forked into `pid`'s mount namespace (a threaded process cannot enter
/// one itself); the child exits at once after it.
fn in_namespace(pid: i32, f: impl Fn() -> bool + Send + Sync + 'static) -> std::io::Result<()> {
    let ns = CString::new(format!("/proc/{pid}/ns/mnt")).unwrap();
    let mut cmd = Command::new("/bin/busybox");
    cmd.arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (open, setns, mount, umount2) before exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if !f() {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("busybox true: {status}")));
    }
    Ok(())
}

/// Mounts a 64 MiB tmpfs at `mount_point` in the mount namespace of `pid` (a container's
/// /dev/shm as runtimes make it).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn mount_tmpfs(pid: i32, mount_point: &str) {
    let target = CString::new(mount_point).unwrap();
    // SAFETY: mount(2) with NUL-terminated strings, in the forked child.
    in_namespace(pid, move || unsafe {
        libc::mount(
            c"shm".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"size=65536k".as_ptr().cast(),
        ) == 0
    })
    .unwrap_or_else(|e| panic!("mounting a tmpfs at {mount_point} of {pid}: {e}"));
}

/// Whether FUSE can be mounted here (a /dev/fuse), else a skip (a failure under
/// `SHMLINK_E2E=require`).
pub fn available() -> bool {
    if std::path::Path::new("/dev/fuse").exists() {
        return true;
    }
    assert_ne!(
        std::env::var("SHMLINK_E2E").as_deref(),
        Ok("require"),
        "/dev/fuse is missing"
    );
    eprintln!("\n## SKIPPED: no /dev/fuse\n");
    false
}

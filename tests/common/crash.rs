//! A real crash in a library named `libnccl.so.2`, for the kernel to log: the program and the
//! library are built here with the host's gcc. And a real SIGBUS as a container's whole life.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::runc::host_libraries;
use super::{Container, ContainerSpec};

/// A mapped file truncated under the process, then touched: the kernel's SIGBUS. /dev/shm
/// stays empty, so it is no /dev/shm death.
const TRUNCATED_MAP: &str = r#"
import mmap, os, time
fd = os.open("/tmp/data", os.O_RDWR | os.O_CREAT)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
time.sleep(0.3)
os.ftruncate(fd, 0)
m[4096] = 1
"#;

/// A Pod's container whose main process (the host's `python`, with /usr and the libraries bound
/// read-only) dies of a real SIGBUS moments after it starts: exit status 135.
pub fn sigbus_container(pod_uid: &str, id: &str, python: &Path) -> Container {
    Container::start(ContainerSpec {
        pod_uid: Some(pod_uid.to_string()),
        id: Some(id.to_string()),
        args: vec![
            python.to_string_lossy().into_owned(),
            "-c".into(),
            TRUNCATED_MAP.into(),
        ],
        memory_limit: Some(512 << 20),
        extra_mounts: host_libraries(),
        ..ContainerSpec::default()
    })
}

/// A container (in Pod `pod_uid`'s cgroup, if given) that waits for `/nccl/go`, then becomes
/// the program `build_crashing_nccl` made in `nccl`, which crashes in libnccl.so.2 (exec keeps
/// the PID NVML lists).
pub fn crashing_when_told(pod_uid: Option<&str>, id: &str, nccl: &Path) -> Container {
    Container::start(ContainerSpec {
        pod_uid: pod_uid.map(str::to_string),
        id: Some(id.to_string()),
        args: vec![
            "sh".into(),
            "-c".into(),
            "while [ ! -e /nccl/go ]; do sleep 0.05; done; exec /nccl/crash".into(),
        ],
        extra_mounts: vec![super::ro_bind(nccl, "/nccl")],
        ..ContainerSpec::default()
    })
}

/// Whether a container can crash in `libnccl.so.2` here for the kernel to log: real
/// containers, the kernel log, and the program built in `nccl` (`build_crashing_nccl`).
pub fn nccl_crash_possible(nccl: &Path) -> bool {
    super::e2e_available() && super::kmsg_readable() && build_crashing_nccl(nccl)
}

/// A program with no libc that calls into `libnccl.so.2`, which dereferences NULL: the kernel
/// logs `crash[PID]: segfault at 0 ... in libnccl.so.2[...]`. Everything it needs (the
/// library, the program, the dynamic loader) sits in one directory bound at /nccl.
pub fn build_crashing_nccl(dir: &Path) -> bool {
    let Some(gcc) = super::tool("gcc", "gcc") else {
        return false;
    };
    std::fs::write(
        dir.join("nccl.c"),
        "int ncclAllReduce(void) { volatile int *p = (int *)0; return *p; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("crash.c"),
        "extern int ncclAllReduce(void);\nvoid _start(void) { ncclAllReduce(); for (;;) {} }\n",
    )
    .unwrap();
    let gcc = |args: &[&str]| {
        let out = Command::new(&gcc)
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gcc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    gcc(&[
        "-shared",
        "-fPIC",
        "-nostdlib",
        "-Wl,-soname,libnccl.so.2",
        "-o",
        "libnccl.so.2",
        "nccl.c",
    ]);
    gcc(&[
        "-nostdlib",
        "-fno-stack-protector",
        "-o",
        "crash",
        "crash.c",
        "-L.",
        "-l:libnccl.so.2",
        "-Wl,-rpath,/nccl",
        "-Wl,--dynamic-linker=/nccl/ld-linux-x86-64.so.2",
    ]);
    std::fs::copy(
        std::fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap(),
        dir.join("ld-linux-x86-64.so.2"),
    )
    .unwrap();
    true
}

/// Debian's interpreter, for [`sigbus_container`]. Missing: a failure under
/// `SHMLINK_E2E=require`, else SKIPPED on stderr and None (a pyenv shim on PATH would not run
/// inside the busybox root, so PATH is not searched).
pub fn host_python() -> Option<std::path::PathBuf> {
    let python = Path::new("/usr/bin/python3");
    if python.exists() {
        return Some(python.to_path_buf());
    }
    if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("{} is missing (apt-get install python3)", python.display());
    }
    eprintln!("SKIPPED: /usr/bin/python3 is missing (apt-get install python3); no real SIGBUS");
    None
}

/// A program that sets its comm (when given) and reads address 0 in its own text, built as
/// `dir/name`: the kernel logs `comm[pid]: segfault at 0 ... in <name>[...]`. None when gcc is
/// missing (said).
pub fn segfaulting(dir: &Path, name: &str, comm: Option<&[u8]>) -> Option<PathBuf> {
    let gcc = super::tool("gcc", "gcc")?;
    let set = comm.map_or(String::new(), |c| {
        let octal: String = c.iter().map(|b| format!("\\{b:03o}")).collect();
        format!("prctl(PR_SET_NAME, \"{octal}\");")
    });
    let src = dir.join("crash.c");
    std::fs::write(
        &src,
        format!("#include <sys/prctl.h>\nint main(void) {{ {set} return *(volatile int *)0; }}\n"),
    )
    .unwrap();
    let built = dir.join("crash");
    let out = Command::new(gcc)
        .arg("-o")
        .arg(&built)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = dir.join(name);
    std::fs::rename(&built, &bin).unwrap();
    Some(bin)
}

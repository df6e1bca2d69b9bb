//! A real crash in a library named `libnccl.so.2`, for the kernel to log: the program and the
//! library are built here with the host's gcc.

use std::path::Path;
use std::process::Command;

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

//! Pure: what a kernel record means for a workload: one of its processes crashed inside a GPU
//! communication or driver library (`comm[pid]: segfault at ... in libnccl.so.2[...]`).

use crate::kernel_log::record::{decimal, KmsgRecord};

/// A process killed by a fault inside a GPU library; pid is the host's (`task_pid_nr`), comm
/// at most 15 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    pub comm: String,
    pub pid: i32,
    pub library: String,
}

/// The crash a kernel-facility record tells, if any. The driver's own `NVRM: ` lines are
/// about GPUs (`gpu::xid::kernel`), never a process's crash.
pub fn gpu_lib_crash(record: &KmsgRecord) -> Option<Crash> {
    // The kernel prints these lines at KERN_INFO (KERN_EMERG for PID 1). Their ` in <file>`
    // and ` likely on CPU` pieces are KERN_CONT: when two CPUs print at once the pieces become
    // records of their own at the default level, and the one that starts ` in <file name>`
    // would read as whatever crash line the file name spells.
    if !record.is_kernel() || !matches!(record.level, LEVEL_INFO | LEVEL_EMERG) {
        return None;
    }
    let message = record.message.trim_start();
    if message.starts_with("NVRM: ") {
        return None;
    }
    crash_line(message)
}

const LEVEL_EMERG: u8 = 0;
const LEVEL_INFO: u8 = 6;

/// How long a crash line's head waits for its ` in <file>` piece.
const PIECE_WITHIN_USEC: u64 = 100_000;
/// Heads waiting at most (a burst of crashes whose pieces all came apart).
const HEADS_MAX: usize = 16;

/// Crash lines whose ` in <file>` piece the kernel logged apart: when two CPUs print at once it
/// cannot append the piece (KERN_CONT) to its line, and it becomes a record of its own. A head
/// (`comm[pid]: segfault at ... error N`, nothing after) waits for its piece; a piece joins it
/// only when no other head waits with it, since a piece names no PID. Anything ambiguous is
/// dropped: a crash missed, never one placed on the wrong process.
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    /// (comm, pid, the record's time in µs since boot)
    heads: Vec<(String, i32, u64)>,
}

impl Pieces {
    /// The crash `record` tells: a whole line, or a piece joined to the one head waiting.
    pub fn crash(&mut self, record: &KmsgRecord) -> Option<Crash> {
        if !record.is_kernel() {
            return None;
        }
        let usec = record.usec;
        self.heads
            .retain(|h| usec.saturating_sub(h.2) <= PIECE_WITHIN_USEC);
        if matches!(record.level, LEVEL_INFO | LEVEL_EMERG) {
            if let Some(crash) = gpu_lib_crash(record) {
                return Some(crash);
            }
            if let Some((comm, pid)) = head(record.message.trim_start()) {
                if self.heads.len() >= HEADS_MAX {
                    self.heads.remove(0);
                }
                self.heads.push((comm.to_owned(), pid, usec));
            }
            return None;
        }
        let piece = record.message.trim_start().strip_prefix("in ")?;
        let library = mapped_file(piece)?;
        let (comm, pid, _) = match self.heads.len() {
            1 => self.heads.remove(0),
            0 => return None,
            _ => {
                self.heads.clear(); // which head it belongs to is not said
                return None;
            }
        };
        is_gpu_library(library).then(|| Crash {
            comm,
            pid,
            library: library.to_owned(),
        })
    }
}

/// A crash line without its ` in <file>` piece (the kernel's registers, then nothing of it).
fn head(message: &str) -> Option<(&str, i32)> {
    let (comm, pid, tail) = after_pid(message, "]: segfault at ").or_else(|| trap(message))?;
    (!tail.contains(" in ")).then_some((comm, pid))
}

fn is_gpu_library(library: &str) -> bool {
    const GPU_LIBRARIES: [&str; 4] = ["libnccl.so", "libcuda.so", "libcudart.so", "libnvidia-"];
    GPU_LIBRARIES.iter().any(|p| library.starts_with(p))
}

/// The kernel's lines for a user process killed by a fault, as (comm, pid, what follows):
/// - x86 `comm[pid]: segfault at ADDR ip IP sp SP error N in lib[...] likely on CPU ...`
///   (`arch/x86/mm/fault.c`, `show_signal_msg`);
/// - x86 `traps: comm[pid] general protection fault ip:IP sp:SP error:N in lib[...]` and
///   `traps: comm[pid] trap invalid opcode ...` (`arch/x86/kernel/traps.c`, `show_signal`);
/// - arm64 `comm[pid]: unhandled exception: ..., ESR 0x..., <fault> in lib[...]`
///   (`arch/arm64/kernel/traps.c`, `arm64_show_signal`).
///
/// A comm is at most 15 bytes and may hold anything but NUL, so the anchors are texts longer
/// than a comm: the first occurrence is the kernel's.
fn crash_line(message: &str) -> Option<Crash> {
    let (comm, pid, tail) = after_pid(message, "]: segfault at ")
        .or_else(|| after_pid(message, "]: unhandled exception: "))
        .or_else(|| trap(message))?;
    // What precedes ` in ` is the kernel's (addresses, the fault's name); the file name follows.
    let (_, mapped) = tail.split_once(" in ")?;
    let library = mapped_file(mapped)?;
    is_gpu_library(library).then(|| Crash {
        comm: comm.to_owned(),
        pid,
        library: library.to_owned(),
    })
}

/// `<comm>[<pid>` + `anchor` + tail, at the first anchor preceded by `[digits`.
fn after_pid<'a>(message: &'a str, anchor: &str) -> Option<(&'a str, i32, &'a str)> {
    message.match_indices(anchor).find_map(|(i, _)| {
        let (comm, pid) = comm_and_pid(&message[..i])?;
        Some((comm, pid, &message[i + anchor.len()..]))
    })
}

/// `comm[pid` at the end of `head`: the comm is what precedes the last `[`.
fn comm_and_pid(head: &str) -> Option<(&str, i32)> {
    let open = head.rfind('[')?;
    let digits = &head[open + 1..];
    Some((&head[..open], decimal(digits.as_bytes())?))
}

/// `traps: comm[pid] <description> ip:HEX sp:HEX error:HEX in ...`: the first ` ip:` that
/// the kernel's register dump follows (a comm cannot hold all of it); the description has
/// no `[`.
fn trap(message: &str) -> Option<(&str, i32, &str)> {
    let rest = message.strip_prefix("traps: ")?;
    rest.match_indices(" ip:").find_map(|(i, _)| {
        let tail = &rest[i..];
        registers(tail)?;
        let head = &rest[..i];
        let open = head.rfind('[')?;
        let (digits, _description) = head[open + 1..].split_once("] ")?;
        Some((&head[..open], decimal(digits.as_bytes())?, tail))
    })
}

/// ` ip:HEX sp:HEX error:HEX` at the start of `s`.
fn registers(s: &str) -> Option<()> {
    let mut rest = s;
    for label in [" ip:", " sp:", " error:"] {
        rest = rest.strip_prefix(label)?;
        let hex = rest.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex == 0 {
            return None;
        }
        rest = &rest[hex..];
    }
    Some(())
}

/// The file name of `name[start+size]` or, since Linux 6.1, `name[offset,start+size]`,
/// optionally followed by ` likely on CPU ...`; older kernels may append ` (deleted)` to the
/// name.
fn mapped_file(mapped: &str) -> Option<&str> {
    let end = mapped.rfind(" likely on CPU ").unwrap_or(mapped.len());
    let inner = mapped[..end].trim_end().strip_suffix(']')?;
    let open = inner.rfind('[')?;
    let range = &inner[open + 1..];
    let is_range = range.contains('+')
        && range
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'+' || b == b',');
    let name = inner[..open].trim_end_matches(" (deleted)");
    (is_range && !name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crash in a file whose name holds a newline and a whole crash line, as syslog(2)'s
    /// reader joins it (a newline, as /dev/kmsg's reader unescapes it): the crash is the real
    /// crasher's, in a file that is no GPU library; PID 1 is never blamed.
    #[test]
    fn a_crash_line_inside_a_file_name_is_not_a_crash() {
        let record = KmsgRecord {
            facility: 0,
            level: 6,
            seq: 1,
            usec: 1,
            message: "crash[4242]: segfault at 0 ip 0000000000401000 sp 00007ffc2b6c1f40 error \
                      4 in x\ntrainer[1]: segfault at 0 ip 00007f0000001000 sp \
                      00007ffc2b6c1f40 error 4 in libnccl.so.2[7f0000000000+1000]"
                .into(),
        };
        assert_eq!(gpu_lib_crash(&record), None);
    }

    /// Two crashes printed at once: the continuation ` in <file>` became a record of its own
    /// at the default level (as the kernel logged it here, two test crashers on two CPUs).
    #[test]
    fn a_crash_lines_continuation_printed_apart_is_not_a_crash() {
        let fragment = |level| KmsgRecord {
            facility: 0,
            level,
            seq: 1,
            usec: 1,
            message: " in x\ntrainer[1]: segfault at 0 ip 0000000000401000 sp \
                      00007ffc2b6c1f40 error 4 in libnccl.so.2[115b,55a2d5e51000+1000] likely \
                      on CPU 0 (core 0, socket 0)"
                .into(),
        };
        assert_eq!(gpu_lib_crash(&fragment(4)), None);
        // The same text at the level the kernel gives the line itself would be read: the level
        // is what tells them apart.
        assert!(gpu_lib_crash(&fragment(6)).is_some());
    }
    use crate::fixtures::kmsg::{self, records};
    use crate::kernel_log::parse_record;

    fn kernel(level: u8, usec: u64, message: &str) -> KmsgRecord {
        KmsgRecord {
            facility: 0,
            level,
            seq: usec,
            usec,
            message: message.into(),
        }
    }

    /// As this machine's kernel logged two test crashers on two CPUs: both heads, then both
    /// pieces, each a record of its own.
    #[test]
    fn a_piece_logged_apart_joins_its_head_only_when_no_other_head_waits() {
        let head = |pid: i32, usec| {
            kernel(
                6,
                usec,
                &format!(
                    "victim[{pid}]: segfault at 0 ip 000055a2d5e5115b sp 00007ffd444d54b0 error 4"
                ),
            )
        };
        let piece =
            |usec, file: &str| kernel(4, usec, &format!(" in {file}[115b,55a2d5e51000+1000]"));
        // One crash, its piece apart: joined.
        let mut p = Pieces::default();
        assert_eq!(p.crash(&head(4242, 1_000)), None);
        assert_eq!(
            p.crash(&piece(1_010, "libnccl.so.2")),
            Some(Crash {
                comm: "victim".into(),
                pid: 4242,
                library: "libnccl.so.2".into()
            })
        );
        // The CPU's own piece after it, and a piece with nothing waiting: nothing.
        assert_eq!(
            p.crash(&kernel(4, 1_020, " likely on CPU 1 (core 1, socket 0)")),
            None
        );
        assert_eq!(p.crash(&piece(1_030, "libnccl.so.2")), None);
        // Two heads waiting: which one a piece is is not said; neither is told.
        assert_eq!(p.crash(&head(1, 2_000)), None);
        assert_eq!(p.crash(&head(4343, 2_001)), None);
        assert_eq!(p.crash(&piece(2_005, "libnccl.so.2")), None);
        assert_eq!(p.crash(&piece(2_006, "libcuda.so.1")), None);
        // A file name that spells a crash line, in its piece: the file is what it is.
        assert_eq!(p.crash(&head(4444, 3_000)), None);
        let forged = " in x\ntrainer[1]: segfault at 0 ip 0000000000401000 sp \
                      00007ffc2b6c1f40 error 4 in libnccl.so.2[115b,55a2d5e51000+1000]";
        assert_eq!(p.crash(&kernel(4, 3_010, forged)), None);
        // A head too old for the piece.
        assert_eq!(p.crash(&head(4545, 4_000)), None);
        assert_eq!(
            p.crash(&piece(4_000 + PIECE_WITHIN_USEC + 1, "libnccl.so.2")),
            None
        );
    }

    fn crashes(content: &str) -> Vec<Option<Crash>> {
        records(content)
            .iter()
            .map(|r| gpu_lib_crash(&parse_record(r.as_bytes()).unwrap_or_else(|| panic!("{r}"))))
            .collect()
    }

    fn crash(comm: &str, pid: i32, library: &str) -> Option<Crash> {
        Some(Crash {
            comm: comm.into(),
            pid,
            library: library.into(),
        })
    }

    #[test]
    fn segfaults_in_gpu_libraries_are_crashes_others_are_not() {
        assert_eq!(
            crashes(kmsg::SEGFAULT),
            [
                crash("python3", 4242, "libnccl.so.2.21.5"),
                crash("python3", 4243, "libnccl.so.2"),
                crash("pt_main_thread", 777, "libcuda.so.550.54.15"),
                crash("python", 31337, "libnvidia-ml.so.1"),
                crash("python3", 90, "libcudart.so.12"),
                crash("my [odd]: job", 5150, "libnccl.so.2"),
                crash("python3", 88, "libnccl.so.2"),
                None, // libc
                None, // no file mapped at the faulting address
                None, // libnccl-net.so: a plugin, not in the list
            ]
        );
    }

    #[test]
    fn traps_in_gpu_libraries_are_crashes() {
        assert_eq!(
            crashes(kmsg::TRAPS),
            [
                crash("python3", 4242, "libnccl.so.2"),
                crash("python3", 4244, "libcuda.so.1"),
                crash("x ip:1 sp:1 e", 4245, "libnccl.so.2"),
                None, // libstdc++
                crash("python3", 4246, "libnccl.so.2"),
            ]
        );
    }

    #[test]
    fn user_space_records_are_never_kernel_facts() {
        use crate::gpu::xid::kernel::kernel_gpu;
        let rs = records(kmsg::USER);
        for r in &rs {
            let record = parse_record(r.as_bytes()).unwrap();
            assert_ne!(record.facility, 0, "{r}");
            assert_eq!(gpu_lib_crash(&record), None, "{r}");
            // At most a lookalike: evidence, never an XID, a fall off the bus or an SXID.
            assert!(
                matches!(
                    kernel_gpu(&record),
                    None | Some(crate::gpu::xid::kernel::KernelGpu::Lookalike { .. })
                ),
                "{r}"
            );
            // The same text from the kernel, at the level it prints such lines, would count, as
            // a crash or as a GPU's XID: the facility tells them apart.
            let forged = KmsgRecord {
                facility: 0,
                level: LEVEL_INFO,
                ..record
            };
            let xid = kernel_gpu(&forged)
                .filter(|g| !matches!(g, crate::gpu::xid::kernel::KernelGpu::Lookalike { .. }));
            assert!(gpu_lib_crash(&forged).is_some() || xid.is_some(), "{r}");
        }
    }

    #[test]
    fn other_kernel_records_are_nothing() {
        assert!(crashes(kmsg::OTHER).iter().all(Option::is_none));
    }

    #[test]
    /// Both parsers of kernel records, the crash's and the XIDs'.
    fn garbage_never_panics() {
        use crate::gpu::xid::kernel::kernel_gpu;
        let mut rng = crate::fixtures::rng::Rng::new(0xc0ffee);
        let seeds: Vec<String> = kmsg::ALL.iter().flat_map(|c| records(c)).collect();
        for _ in 0..20_000 {
            let seed = rng.below(seeds.len());
            let bytes = if rng.below(4) == 0 {
                rng.bytes(200)
            } else {
                rng.mutate(seeds[seed].as_bytes())
            };
            if let Some(record) = parse_record(&bytes) {
                let _ = (gpu_lib_crash(&record), kernel_gpu(&record));
                let kernel = KmsgRecord {
                    facility: 0,
                    ..record
                };
                let _ = (gpu_lib_crash(&kernel), kernel_gpu(&kernel));
            }
        }
        for seed in &seeds {
            for cut in 0..=seed.len() {
                if let Some(record) = parse_record(&seed.as_bytes()[..cut]) {
                    let _ = (gpu_lib_crash(&record), kernel_gpu(&record));
                }
            }
        }
    }
}

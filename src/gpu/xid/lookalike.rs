//! What tells a kernel-log line that only looks like the driver's from the driver's own: the
//! shapes user space and other kernel code give such a line. The XID and SXID readers both ask.

/// The kernel's lines about a task: `comm[pid]: ` (a segfault, a trap, a general protection
/// fault), whatever the comm holds. The driver's lines never have `[digits]: ` in them.
pub(super) fn is_task_line(message: &str) -> bool {
    message.match_indices("]: ").any(|(i, _)| {
        let head = &message[..i];
        head.rfind('[').is_some_and(|open| {
            let digits = &head[open + 1..];
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
    })
}

/// Whether `message` carries the fields netfilter's LOG target prints after its prefix
/// (`IN=<if> OUT=<if> `, `nf_log_dump_packet_common`): the driver's lines never do.
pub(super) fn netfilter_fields(message: &str) -> bool {
    message.match_indices("IN=").any(|(i, _)| {
        let rest = &message[i + 3..];
        let iface = rest.split(' ').next().unwrap_or("");
        rest.get(iface.len()..)
            .is_some_and(|r| r.starts_with(" OUT="))
    })
}

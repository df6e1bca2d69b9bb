//! Pure: /proc/PID/mountinfo lines -> the mount at a given point.

/// One mountinfo line, with octal escapes (`\040`) decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u64,
    pub parent_id: u64,
    pub major: u32,
    pub minor: u32,
    pub root: String,
    pub mount_point: String,
    pub mount_options: String,
    pub fs_type: String,
    pub source: String,
    pub super_options: String,
}

/// The topmost (last listed) mount at `mount_point`, or `None`. Malformed lines are skipped.
pub fn find_mount(content: &str, mount_point: &str) -> Option<MountEntry> {
    // The last matching line is the topmost mount: search from the end.
    content
        .lines()
        .rev()
        .filter(|line| {
            // Cheap pre-filter on the raw 5th field; an escaped field may still decode to a match.
            line.split(' ')
                .nth(4)
                .is_some_and(|raw| raw == mount_point || raw.contains('\\'))
        })
        .filter_map(parse_line)
        .find(|e| e.mount_point == mount_point)
}

/// Parses one line; `None` when it is malformed.
pub fn parse_line(line: &str) -> Option<MountEntry> {
    let (head, tail) = line.split_once(" - ")?;
    let mut f = head.split(' ');
    let mount_id = f.next()?.parse().ok()?;
    let parent_id = f.next()?.parse().ok()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let root = unescape(f.next()?);
    let mount_point = unescape(f.next()?);
    let mount_options = f.next()?.to_string();
    let mut t = tail.split(' ');
    Some(MountEntry {
        mount_id,
        parent_id,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root,
        mount_point,
        mount_options,
        fs_type: t.next()?.to_string(),
        source: unescape(t.next()?),
        // The kernel always writes super options (at least `rw` or `ro`): without them the
        // line was cut short.
        super_options: t.next()?.to_string(),
    })
}

/// Decodes the kernel's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push(v as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/mountinfo/", $name))
        };
    }

    const CONTAINERD: &str = fixture!("containerd-container.mountinfo");
    const EMPTYDIR_MEMORY: &str = fixture!("emptydir-memory.mountinfo");
    const EMPTYDIR_DISK: &str = fixture!("emptydir-disk.mountinfo");
    const HOST_IPC: &str = fixture!("hostipc-container.mountinfo");
    const STACKED: &str = fixture!("stacked-shm.mountinfo");
    const ESCAPED: &str = fixture!("escaped-space.mountinfo");
    const NO_SHM: &str = fixture!("no-shm.mountinfo");
    const MALFORMED: &str = fixture!("malformed.mountinfo");
    const HOST_V1: &str = fixture!("host-cgroup-v1.mountinfo");
    const HOST_V2: &str = fixture!("host-cgroup-v2.mountinfo");

    const POD_UID: &str = "0b6c1a2e-7f3d-4c1b-9a2e-5d6f7a8b9c0d";

    fn shm(content: &str) -> MountEntry {
        find_mount(content, "/dev/shm").expect("a mount at /dev/shm")
    }

    #[test]
    fn the_documented_example_line_parses_field_by_field() {
        let e = parse_line(
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
        )
        .unwrap();
        assert_eq!(
            e,
            MountEntry {
                mount_id: 36,
                parent_id: 35,
                major: 98,
                minor: 0,
                root: "/mnt1".into(),
                mount_point: "/mnt2".into(),
                mount_options: "rw,noatime".into(),
                fs_type: "ext3".into(),
                source: "/dev/root".into(),
                super_options: "rw,errors=continue".into(),
            }
        );
    }

    #[test]
    fn every_line_of_the_well_formed_fixtures_parses() {
        // Guards the fixtures themselves: a typo there would make the other tests prove less.
        for (name, content) in [
            ("containerd", CONTAINERD),
            ("emptydir-memory", EMPTYDIR_MEMORY),
            ("emptydir-disk", EMPTYDIR_DISK),
            ("hostipc", HOST_IPC),
            ("stacked", STACKED),
            ("escaped", ESCAPED),
            ("no-shm", NO_SHM),
            ("host v1", HOST_V1),
            ("host v2", HOST_V2),
        ] {
            for line in content.lines() {
                assert!(parse_line(line).is_some(), "{name}: {line}");
            }
        }
    }

    #[test]
    fn a_containerd_container_has_the_pod_sandbox_shm_at_dev_shm() {
        let e = shm(CONTAINERD);
        assert_eq!((e.mount_id, e.parent_id), (1545, 1536));
        assert_eq!((e.major, e.minor), (0, 305));
        assert_eq!(e.root, "/");
        assert_eq!(e.fs_type, "tmpfs");
        assert_eq!(e.source, "shm");
        assert_eq!(e.mount_options, "rw,nosuid,nodev,noexec,relatime");
        // The size lives in the super options, not the per-mount ones.
        assert_eq!(e.super_options, "rw,size=65536k,inode64");
        // It is the sandbox's shm tmpfs the host mounted under /run/containerd.
        let sandbox = HOST_V2
            .lines()
            .filter_map(parse_line)
            .find(|h| h.mount_point.ends_with("/shm") && h.mount_point.contains("sandboxes"))
            .unwrap();
        assert_eq!((sandbox.major, sandbox.minor), (e.major, e.minor));
    }

    #[test]
    fn optional_propagation_fields_do_not_shift_the_fields_after_them() {
        let e = find_mount(CONTAINERD, "/mnt/datasets").unwrap();
        assert_eq!(e.root, "/srv/datasets");
        assert_eq!(e.mount_options, "rw,relatime");
        assert_eq!(e.fs_type, "ext4");
        assert_eq!(e.source, "/dev/nvme0n1p1");
        let root = find_mount(CONTAINERD, "/").unwrap();
        assert_eq!((root.mount_id, root.fs_type.as_str()), (1534, "overlay"));
    }

    #[test]
    fn a_memory_emptydir_at_dev_shm_is_the_kubelets_sized_tmpfs() {
        let e = shm(EMPTYDIR_MEMORY);
        assert_eq!(e.mount_id, 2195);
        assert_eq!(e.fs_type, "tmpfs");
        // A bind of the whole tmpfs the kubelet mounted, so its root is the tmpfs's root.
        assert_eq!(e.root, "/");
        assert_eq!(e.super_options, "rw,size=8388608k,inode64");
        let volume = find_mount(
            HOST_V2,
            &format!("/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/dshm"),
        )
        .unwrap();
        assert_eq!((volume.major, volume.minor), (e.major, e.minor));
    }

    #[test]
    fn a_disk_backed_emptydir_at_dev_shm_is_not_tmpfs() {
        // `medium: Memory` forgotten: /dev/shm is a directory on the node's disk.
        let e = shm(EMPTYDIR_DISK);
        assert_eq!(e.fs_type, "ext4");
        assert_eq!(
            e.root,
            format!("/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/dshm")
        );
    }

    #[test]
    fn a_host_ipc_container_sees_the_hosts_dev_shm() {
        let e = shm(HOST_IPC);
        let host = shm(HOST_V2);
        assert_eq!((e.major, e.minor), (host.major, host.minor));
        // The host's /dev/shm has no size= of its own: the kernel default, half of RAM.
        assert!(!e.super_options.contains("size="), "{}", e.super_options);
        assert_eq!(e.fs_type, "tmpfs");
    }

    #[test]
    fn of_two_mounts_stacked_at_dev_shm_the_last_listed_is_the_one_seen() {
        let e = shm(STACKED);
        assert_eq!(e.mount_id, 1890);
        // Stacked on the first one: its parent is the mount it hides.
        assert_eq!(e.parent_id, 1876);
        assert_eq!(e.super_options, "rw,size=8388608k,inode64");
    }

    #[test]
    fn octal_escapes_in_mount_points_roots_and_sources_are_decoded() {
        let e = find_mount(ESCAPED, "/mnt/training data").unwrap();
        assert_eq!(e.root, "/home/alice/Training Data");
        assert_eq!(find_mount(ESCAPED, "/mnt/training\\040data"), None);
        let odd = find_mount(ESCAPED, "/mnt/odd").unwrap();
        assert_eq!(odd.root, "/home/alice/tab\tand\\backslash");
        let hosts = find_mount(ESCAPED, "/etc/hosts").unwrap();
        assert!(
            hosts.root.ends_with("/etc-hosts (deleted)"),
            "{}",
            hosts.root
        );
        let nfs = find_mount(ESCAPED, "/mnt/nfs share").unwrap();
        assert_eq!(nfs.source, "fileserver:/exports/team a");
        // The escapes elsewhere on the line do not disturb finding /dev/shm.
        assert_eq!(shm(ESCAPED).mount_id, 1976);
    }

    #[test]
    fn a_container_without_dev_shm_has_no_mount_there_not_even_a_prefix_match() {
        assert_eq!(find_mount(NO_SHM, "/dev/shm"), None);
        assert!(find_mount(NO_SHM, "/dev/shm/cache").is_some());
        assert_eq!(find_mount("", "/dev/shm"), None);
    }

    #[test]
    fn malformed_lines_are_skipped_and_the_last_good_one_wins() {
        // Every later /dev/shm line is broken: truncated, no separator, non-numeric or
        // overflowing IDs, missing fields.
        let e = shm(MALFORMED);
        assert_eq!(e.mount_id, 1610);
        assert_eq!(e.source, "shm");
        for line in MALFORMED.lines().skip(3) {
            let parsed = parse_line(line);
            assert!(
                parsed.as_ref().is_none_or(|p| p.mount_point != "/dev/shm"),
                "{line} -> {parsed:?}"
            );
        }
    }

    #[test]
    fn garbage_and_cut_escapes_never_panic() {
        for line in [
            "",
            " - ",
            "1 2 3:4 \\ \\0 rw - tmpfs \\77 rw",
            "1 2 3:4 / /a\\ rw - tmpfs x rw",
            "1 2 3:4 / /\\777\\400 rw - tmpfs x rw",
            "1 2 3:4 / /é\\303 rw - tmpfs x rw",
            "\u{0}\u{0}\u{0} - \u{0}",
        ] {
            let _ = parse_line(line);
            let _ = find_mount(line, "/dev/shm");
        }
        // An escape decoding to invalid UTF-8 is replaced, not a panic.
        let e = parse_line("1 2 3:4 / /a\\377b rw - tmpfs x rw").unwrap();
        assert_eq!(e.mount_point, "/a\u{fffd}b");
    }

    #[test]
    fn a_cgroup_v1_hybrid_node_mounts_memory_beside_unified() {
        let memory = find_mount(HOST_V1, "/sys/fs/cgroup/memory").unwrap();
        assert_eq!(memory.fs_type, "cgroup");
        assert!(memory.super_options.split(',').any(|o| o == "memory"));
        assert_eq!(
            find_mount(HOST_V1, "/sys/fs/cgroup/unified")
                .unwrap()
                .fs_type,
            "cgroup2"
        );
        assert_eq!(
            find_mount(HOST_V1, "/sys/fs/cgroup").unwrap().fs_type,
            "tmpfs"
        );
        // A 5.4 kernel: no inode64, no size= on the host's /dev/shm.
        assert_eq!(shm(HOST_V1).super_options, "rw");
        // A namespace file's root is not a path.
        assert_eq!(
            find_mount(HOST_V1, "/run/docker/netns/2f6a9c1b8e3d")
                .unwrap()
                .root,
            "net:[4026532384]"
        );
    }

    #[test]
    fn a_cgroup_v2_node_mounts_one_unified_hierarchy() {
        let cgroup = find_mount(HOST_V2, "/sys/fs/cgroup").unwrap();
        assert_eq!(cgroup.fs_type, "cgroup2");
        assert_eq!(cgroup.super_options, "rw,nsdelegate,memory_recursiveprot");
        assert_eq!(find_mount(HOST_V2, "/sys/fs/cgroup/memory"), None);
        assert_eq!(shm(HOST_V2).mount_id, 30);
    }
}

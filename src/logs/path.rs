//! Pure: whose log a file is and where it stands in its rotation, from the names on its path.
//!
//! Kubelet: `<root>/<namespace>_<pod>_<uid>/<container>/<restart>.log`, rotated by renaming to
//! `<restart>.log.<YYYYMMDD-HHMMSS>` and later gzipped to `….gz` (through a `….tmp`, which is not
//! a log). Docker's json-file: `<root>/containers/<id>/<id>-json.log`, rotated to
//! `-json.log.1`, `.2`, … (1 the newest), gzipped to `.N.gz` with `compress=true`.

use crate::model::ContainerRef;

/// Where a file stands in its rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rotation {
    /// The file the runtime writes.
    Live,
    /// A renamed one; a smaller `order` is older.
    Rotated { order: u64, gz: bool },
}

/// A log file's name, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogFile<'a> {
    /// The live file's name: the rotated files of one live file share it.
    pub live: &'a str,
    pub rotation: Rotation,
}

/// `<namespace>_<pod>_<uid>` -> the three. Namespace and pod names cannot contain `_` (they are
/// DNS names); the UID is last.
pub(super) fn pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let (rest, uid) = name.rsplit_once('_')?;
    let (namespace, pod) = rest.split_once('_')?;
    (plain(namespace) && plain(pod) && plain(uid) && !pod.contains('_'))
        .then_some((namespace, pod, uid))
}

/// Whose log a file under `<pod dir>/<container dir>/` is; `None` when the names are not
/// kubelet's.
pub(super) fn pod_origin(pod_dir_name: &str, container: &str) -> Option<ContainerRef> {
    let (namespace, pod, uid) = pod_dir(pod_dir_name)?;
    plain(container).then(|| ContainerRef::in_pod(namespace, pod, uid, container, None))
}

/// A name kubelet could have written: not empty, not hidden, no separators or control
/// characters. Stricter checks (DNS labels) would only refuse logs a future kubelet writes.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// `<N>.log`, `<N>.log.<YYYYMMDD-HHMMSS>`, `<N>.log.<YYYYMMDD-HHMMSS>.gz`.
pub(super) fn pod_file(name: &str) -> Option<LogFile<'_>> {
    let end = name.find(".log")? + ".log".len();
    let (live, suffix) = name.split_at(end);
    if !digits(&live[..live.len() - ".log".len()]) {
        return None;
    }
    let rotation = match suffix {
        "" => Rotation::Live,
        _ => {
            let (stamp, gz) = rotated_tail(suffix)?;
            Rotation::Rotated {
                order: kubelet_stamp(stamp)?,
                gz,
            }
        }
    };
    Some(LogFile { live, rotation })
}

/// `YYYYMMDD-HHMMSS` as the number YYYYMMDDHHMMSS, which sorts as the time does.
fn kubelet_stamp(stamp: &str) -> Option<u64> {
    let (date, time) = stamp.split_once('-')?;
    if date.len() != 8 || time.len() != 6 || !digits(date) || !digits(time) {
        return None;
    }
    Some(date.parse::<u64>().ok()? * 1_000_000 + time.parse::<u64>().ok()?)
}

/// Docker's container directory: the 64-hex ID.
pub(super) fn docker_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `<id>-json.log`, `<id>-json.log.<N>`, `<id>-json.log.<N>.gz` in the directory of `id`.
pub(super) fn docker_file<'a>(id: &str, name: &'a str) -> Option<LogFile<'a>> {
    let rest = name.strip_prefix(id)?.strip_prefix("-json.log")?;
    let live = &name[..name.len() - rest.len()];
    let rotation = match rest {
        "" => Rotation::Live,
        _ => {
            let (n, gz) = rotated_tail(rest)?;
            if !digits(n) {
                return None;
            }
            // `.1` is the newest: the larger N, the older.
            let n: u64 = n.parse().ok()?;
            Rotation::Rotated {
                order: u64::MAX - n,
                gz,
            }
        }
    };
    Some(LogFile { live, rotation })
}

/// A rotated name's tail after the live name, `.<mark>` or `.<mark>.gz`: the mark, and gzipped
/// or not.
fn rotated_tail(tail: &str) -> Option<(&str, bool)> {
    let mark = tail.strip_prefix('.')?;
    Some(match mark.strip_suffix(".gz") {
        Some(mark) => (mark, true),
        None => (mark, false),
    })
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";

    fn pod(ns: &str, pod: &str, uid: &str, container: &str) -> ContainerRef {
        ContainerRef::in_pod(ns, pod, uid, container, None)
    }

    #[test]
    fn a_pod_dir_names_namespace_pod_and_uid() {
        assert_eq!(
            pod_origin(
                "ml-team_trainer-7f9c5d8b4-x2x7q_0f6c8a52-3b1e-4f0e-9d6a-2c4b8e1f7a90",
                "pytorch"
            ),
            Some(pod(
                "ml-team",
                "trainer-7f9c5d8b4-x2x7q",
                "0f6c8a52-3b1e-4f0e-9d6a-2c4b8e1f7a90",
                "pytorch"
            ))
        );
    }

    #[test]
    fn odd_but_valid_names() {
        // A static pod: dotted node name in the pod name, a 32-hex config hash as UID.
        assert_eq!(
            pod_dir("kube-system_etcd-gpu-node-01.example.com_4b1e0c2f9a8d7e6f5a4b3c2d1e0f9a8b"),
            Some((
                "kube-system",
                "etcd-gpu-node-01.example.com",
                "4b1e0c2f9a8d7e6f5a4b3c2d1e0f9a8b"
            ))
        );
        assert_eq!(pod_dir("a_b_c"), Some(("a", "b", "c")));
        assert_eq!(
            pod_origin("default_web-0_uid", "istio-proxy"),
            Some(pod("default", "web-0", "uid", "istio-proxy"))
        );
    }

    #[test]
    fn names_not_in_the_layout_are_refused() {
        for name in [
            "",
            "default",
            "default_pod",
            "_pod_uid",
            "default__uid",
            "default_pod_",
            "default_po_d_uid",
            ".hidden_pod_uid",
            "default_pod\n_uid",
        ] {
            assert_eq!(pod_dir(name), None, "{name:?}");
        }
        assert_eq!(pod_origin("default_pod_uid", ""), None);
        assert_eq!(pod_origin("default_pod_uid", ".trash"), None);
        assert_eq!(pod_origin("default_pod_uid", "a\u{7}b"), None);
    }

    #[test]
    fn live_and_rotated_pod_files() {
        let live = |live| LogFile {
            live,
            rotation: Rotation::Live,
        };
        assert_eq!(pod_file("0.log"), Some(live("0.log")));
        assert_eq!(pod_file("12.log"), Some(live("12.log")));
        assert_eq!(
            pod_file("0.log.20261123-101502"),
            Some(LogFile {
                live: "0.log",
                rotation: Rotation::Rotated {
                    order: 20261123101502,
                    gz: false
                }
            })
        );
        assert_eq!(
            pod_file("3.log.20261123-101502.gz"),
            Some(LogFile {
                live: "3.log",
                rotation: Rotation::Rotated {
                    order: 20261123101502,
                    gz: true
                }
            })
        );
    }

    #[test]
    fn rotated_pod_files_sort_by_their_time() {
        let order = |name| match pod_file(name).unwrap().rotation {
            Rotation::Rotated { order, .. } => order,
            Rotation::Live => panic!("{name} is live"),
        };
        assert!(order("0.log.20261123-235959") < order("0.log.20261124-000000"));
    }

    #[test]
    fn other_pod_files_are_ignored() {
        for name in [
            "log",
            ".log",
            "a.log",
            "0.log.tmp",
            "0.log.20261123-101502.tmp",
            "0.log.20261123-101502.gz.tmp",
            "0.log.2026112-101502",
            "0.log.20261123101502",
            "0.log.20261123-10150x",
            "0.log.",
            "0.logx",
            "-1.log",
            "0.json",
            "99999999999999999999999.log",
        ] {
            assert_eq!(pod_file(name), None, "{name}");
        }
    }

    #[test]
    fn docker_files() {
        assert!(docker_id(ID));
        assert!(!docker_id(&ID.to_uppercase()));
        assert!(!docker_id(&ID[1..]));
        assert!(!docker_id("mounts"));
        let live = format!("{ID}-json.log");
        assert_eq!(
            docker_file(ID, &live),
            Some(LogFile {
                live: &live,
                rotation: Rotation::Live
            })
        );
        let older = |n: &str| match docker_file(ID, &format!("{ID}-json.log.{n}")) {
            Some(LogFile {
                rotation: Rotation::Rotated { order, gz },
                ..
            }) => Some((order, gz)),
            _ => None,
        };
        let (one, _) = older("1").unwrap();
        let (two, gz) = older("2.gz").unwrap();
        assert!(two < one, ".2 is older than .1");
        assert!(gz);
        assert_eq!(older("x"), None);
        assert_eq!(older(""), None);
    }

    #[test]
    fn other_docker_files_are_ignored() {
        let other = "0000000000000000000000000000000000000000000000000000000000000000";
        for name in [
            "config.v2.json".to_string(),
            "hostconfig.json".into(),
            format!("{ID}-json.log.tmp"),
            format!("{ID}-json.logs"),
            format!("{other}-json.log"),
            "-json.log".into(),
        ] {
            assert_eq!(docker_file(ID, &name), None, "{name}");
        }
    }
}

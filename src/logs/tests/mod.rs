//! The tailer against kubelet- and Docker-style log trees in a TempDir: the tree and line
//! builders here, the tests one file per concern.

mod appends;
mod discovery;
mod floods;
mod hostile;
mod limits;
mod notify;
mod resume;
mod roots;
mod rotation;
mod since;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::*;

const POD: &str = "ml-team_trainer-0_0f6c8a52-3b1e-4f0e-9d6a-2c4b8e1f7a90";
const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
const SHM: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
    </torch_13_1234_0>: No space left on device (28)";

struct Node {
    tmp: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let node = Node {
            tmp: tempfile::tempdir().unwrap(),
        };
        fs::create_dir_all(node.pods()).unwrap();
        fs::create_dir_all(node.docker().join("containers")).unwrap();
        node
    }

    fn pods(&self) -> PathBuf {
        self.tmp.path().join("var/log/pods")
    }

    fn docker(&self) -> PathBuf {
        self.tmp.path().join("var/lib/docker")
    }

    fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    fn settings(&self) -> LogSettings {
        LogSettings {
            pod_log_root: Some(self.pods()),
            docker_root: Some(self.docker()),
            max_lines_per_sec: 0,
        }
    }

    /// `<pods>/<POD>/<container>/`, created.
    fn container(&self, name: &str) -> PathBuf {
        let dir = self.pods().join(POD).join(name);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `<docker>/containers/<ID>/`, created.
    fn docker_dir(&self) -> PathBuf {
        let dir = self.docker().join("containers").join(ID);
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}

fn pod(container: &str) -> ContainerRef {
    ContainerRef::in_pod(
        "ml-team",
        "trainer-0",
        "0f6c8a52-3b1e-4f0e-9d6a-2c4b8e1f7a90",
        container,
        None,
    )
}

fn ts(h: u32, m: u32, s: u32) -> String {
    format!("2026-11-23T{h:02}:{m:02}:{s:02}.123456789Z")
}

fn time(h: u32, m: u32, s: u32) -> SystemTime {
    parse_time(ts(h, m, s).as_bytes()).unwrap()
}

/// CRI lines on stderr at 10:15:02, one per text.
fn cri(texts: &[&str]) -> String {
    cri_at(&ts(10, 15, 2), texts)
}

fn cri_at(at: &str, texts: &[&str]) -> String {
    texts
        .iter()
        .map(|t| format!("{at} stderr F {t}\n"))
        .collect()
}

fn docker_line(log: &str, at: &str) -> String {
    let entry = serde_json::json!({ "log": log, "stream": "stderr", "time": at });
    format!("{entry}\n")
}

fn append(path: &Path, text: impl AsRef<[u8]>) {
    let mut f = File::options()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_ref()).unwrap();
}

fn set_mtime(path: &Path, at: SystemTime) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(at)
        .unwrap();
}

fn gzip(path: &Path, text: &str) {
    let mut gz = flate2::write::GzEncoder::new(File::create(path).unwrap(), Default::default());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
}

/// Rediscovers and reads everything on every poll: the tests change the tree between polls
/// (`notify.rs` tests what inotify spares).
fn eager(mut tailer: LogTailer) -> LogTailer {
    tailer.follower.rediscover = Duration::ZERO;
    tailer.follower.safety = Duration::ZERO;
    tailer
}

fn from_end(node: &Node) -> LogTailer {
    eager(LogTailer::from_end(node.settings()))
}

fn texts(lines: &[LogLine]) -> Vec<&str> {
    lines.iter().map(|l| l.text.as_str()).collect()
}

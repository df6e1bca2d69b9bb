//! The probe's worker process (`shmlink probe-worker`): loads libcuda, says which devices it
//! sees, then runs the ordered pairs it was given one by one, saying each before it starts,
//! what peer access answered before the copies, and its outcome after, one JSON line each on
//! stdout. It is expendable: the parent ends it when a
//! pair outlives its deadline, and a crash ends it too; the parent carries on with a new one.

use std::io::Write;
use std::path::Path;

use super::cuda::Cuda;
use super::{Line, PairLine, PeerLine};

/// Runs the worker; `pairs` are CUDA ordinals, or None: read from stdin (one line, as
/// `--pairs` spells them) once the devices are said. Returns the exit status.
pub fn run(cuda_lib: Option<&Path>, bytes: usize, pairs: Option<Vec<(i32, i32)>>) -> u8 {
    let mut out = std::io::stdout().lock();
    let mut say = |line: &Line| {
        let mut text = serde_json::to_string(line).unwrap_or_default();
        text.push('\n');
        // The parent reads line by line: each must leave at once.
        out.write_all(text.as_bytes()).is_ok() && out.flush().is_ok()
    };
    let cuda = match Cuda::open(cuda_lib) {
        Ok(c) => c,
        Err(e) => {
            say(&Line::Error(e));
            return 2;
        }
    };
    let devices = match cuda.devices() {
        Ok(d) => d,
        Err(e) => {
            say(&Line::Error(e.to_string()));
            return 2;
        }
    };
    if !say(&Line::Devices(devices)) {
        return 2;
    }
    let pairs = match pairs {
        Some(p) => p,
        None => {
            let mut line = String::new();
            let told = std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| e.to_string())
                .and_then(|_| super::parse_pairs(line.trim_end()));
            match told {
                Ok(p) => p,
                Err(e) => {
                    say(&Line::Error(format!("the pairs to run: {e}")));
                    return 2;
                }
            }
        }
    };
    for &(from, to) in &pairs {
        if !say(&Line::Start { from, to }) {
            return 2;
        }
        // Said before the copies: a pair that then hangs is told with its peer access.
        let run = cuda.run_pair(from, to, bytes, &mut |run| {
            say(&Line::Peer(PeerLine {
                from,
                to,
                peer_access: run.peer_access,
                peer_error: run.peer_error.clone(),
            }));
        });
        let line = PairLine {
            from,
            to,
            peer_access: run.peer_access,
            peer_error: run.peer_error,
            copy_error: run.copy_error.as_ref().map(|e| e.to_string()),
            copy_code: run.copy_error.map(|e| e.code),
            bad_offset: run.bad_offset,
            seconds: run.seconds,
            bytes: bytes as u64,
        };
        if !say(&Line::Pair(line)) {
            return 2;
        }
    }
    0
}

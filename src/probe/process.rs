//! The worker process as the parent holds it: started with its pairs (or told them on stdin),
//! its stdout read line by line on a thread of its own, the last lines of its stderr kept (what
//! a driver says when it will not start), ended when it outlives a deadline.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::{pairs_arg, Line, ProbeOptions, ASK, WORKER_COMMAND};

/// Lines of the worker's stderr kept, and bytes of each: enough for a driver's complaint,
/// bounded whatever it prints.
const STDERR_LINES: usize = 4;
const STDERR_LINE_BYTES: usize = 400;

/// A running worker and the lines it has said.
pub(super) struct Worker {
    child: Child,
    pub(super) lines: mpsc::Receiver<Line>,
    said: Arc<Mutex<VecDeque<String>>>,
    /// Ends (disconnects) when the worker's stderr has been read to its end.
    stderr_read: Option<mpsc::Receiver<()>>,
}

impl Worker {
    /// Runs `pairs`; None: the pairs are told after the devices ([`Worker::tell`]).
    pub(super) fn spawn(
        opts: &ProbeOptions,
        pairs: Option<&[(i32, i32)]>,
    ) -> Result<Worker, String> {
        let mut cmd = Command::new(&opts.worker);
        cmd.arg(WORKER_COMMAND)
            .arg("--bytes")
            .arg(opts.bytes.to_string())
            .arg("--pairs")
            .arg(pairs.map_or_else(|| ASK.to_string(), pairs_arg))
            .stdin(if pairs.is_some() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(lib) = &opts.cuda_lib {
            cmd.arg("--cuda-lib").arg(lib);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the probe's worker {}: {e}", opts.worker.display()))?;
        let stdout = child.stdout.take().ok_or("the worker has no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line that does not parse is the worker's garbage, not an answer.
                if let Ok(l) = serde_json::from_str::<Line>(&line) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            }
        });
        let said = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_read = child
            .stderr
            .take()
            .map(|e| keep_last_lines(e, said.clone()));
        Ok(Worker {
            child,
            lines,
            said,
            stderr_read,
        })
    }

    /// Its first line: the devices, or why it could not start (with what it printed).
    pub(super) fn devices(&mut self, within: Duration) -> Result<Vec<String>, String> {
        match self.lines.recv_timeout(within) {
            Ok(Line::Devices(d)) => Ok(d),
            Ok(Line::Error(e)) => Err(self.with_stderr(e)),
            Ok(other) => Err(format!("the probe's worker began with {other:?}")),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.kill();
                Err(format!("the CUDA driver did not start within {within:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let how = self.exit();
                Err(self.with_stderr(format!("the probe's worker ended at start ({how})")))
            }
        }
    }

    /// `e`, and what the worker (the driver in it) printed on stderr, once it has ended: the
    /// worker exits right after saying why it cannot start. A second at most for the rest of
    /// its stderr: a process it left behind may hold it open.
    fn with_stderr(&mut self, e: String) -> String {
        let _ = self.child.wait();
        if let Some(read) = self.stderr_read.take() {
            let _ = read.recv_timeout(Duration::from_secs(1));
        }
        let said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.is_empty() {
            return e;
        }
        let lines: Vec<&str> = said.iter().map(String::as_str).collect();
        format!("{e}; it printed: {}", lines.join(" / "))
    }

    /// Tells a worker spawned without pairs which to run (one line on its stdin, then EOF).
    pub(super) fn tell(&mut self, pairs: &[(i32, i32)]) -> Result<(), String> {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().ok_or("the worker has no stdin")?;
        writeln!(stdin, "{}", pairs_arg(pairs))
            .map_err(|e| format!("telling the probe's worker its pairs: {e}"))
    }

    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to end; how it ended, for a person.
    pub(super) fn exit(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.child.wait() {
            Ok(s) => match (s.code(), s.signal()) {
                (_, Some(sig)) => format!("killed by signal {sig}"),
                (Some(c), _) => format!("exit status {c}"),
                _ => "ended".into(),
            },
            Err(e) => format!("could not be waited for: {e}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Reads `from` to its end on a thread, keeping its last lines (each cut to a bound); the
/// receiver disconnects when it is done.
fn keep_last_lines(
    from: impl Read + Send + 'static,
    into: Arc<Mutex<VecDeque<String>>>,
) -> mpsc::Receiver<()> {
    let (done, read) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _done = done;
        let mut reader = BufReader::new(from);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.by_ref().take(64 << 10).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&buf);
            let line = text.trim();
            if line.is_empty() {
                continue;
            }
            let cut = crate::model::prefix_within(line, STDERR_LINE_BYTES).to_string();
            let mut kept = into.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() == STDERR_LINES {
                kept.pop_front();
            }
            kept.push_back(cut);
        }
    });
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lines_are_kept_each_bounded() {
        let long = "x".repeat(1000);
        let text = format!("one\n\ntwo\nthree\n{long}\nfive\nsix");
        let kept = Arc::new(Mutex::new(VecDeque::new()));
        let read = keep_last_lines(std::io::Cursor::new(text.into_bytes()), kept.clone());
        assert_eq!(
            read.recv_timeout(Duration::from_secs(5)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        let kept: Vec<String> = kept.lock().unwrap().iter().cloned().collect();
        assert_eq!(kept, ["three", &long[..STDERR_LINE_BYTES], "five", "six"]);
    }
}

//! A `shmlink serve` child process and a plain-socket HTTP client to scrape it.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A GET over a plain socket: the tests need a status line and a body, nothing more.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    get_from(None, addr, path)
}

/// [`get`] from the loopback address `from` (127.0.0.x: another client, as the server counts
/// them).
pub fn get_from(from: Option<IpAddr>, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let raw = request_from(
        from,
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    // An answer written as it is read (`/api/v1/failures`) comes in chunks.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        String::from_utf8(dechunk(body.as_bytes())?).ok()?
    } else {
        body.to_string()
    };
    Some((status, body))
}

/// An HTTP/1.1 chunked body, joined; None when it is cut short.
pub fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// The status of a bodiless request with any method.
pub fn method(addr: SocketAddr, method: &str, path: &str) -> Option<u16> {
    let raw = request(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )?;
    raw.split_whitespace().nth(1)?.parse().ok()
}

fn request(addr: SocketAddr, head: &str) -> Option<String> {
    request_from(None, addr, head)
}

fn request_from(from: Option<IpAddr>, addr: SocketAddr, head: &str) -> Option<String> {
    let mut s = match from {
        None => TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?,
        Some(ip) => connect_from(ip, addr).ok()?,
    };
    // Longer than a heavy answer's wait for its turn (the server's TURN_WAIT, 5 s): a request
    // that waited its turn gets its answer (or its 503), not a client that gave up first.
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    s.write_all(head.as_bytes()).ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    Some(raw)
}

/// A blocking TCP connection to `addr` from the local address `from` (std cannot bind before
/// it connects; tokio's socket can, on a runtime of its own for the moment).
pub fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let stream = tokio::time::timeout(Duration::from_secs(2), socket.connect(addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        stream.into_std()
    })?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The value of the one series of `metric` whose labels include every pair of `labels`.
pub fn sample(body: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    super::promtext::value(body, metric, labels)
}

/// The scans `collector` (`shm`, `gpu`, ...) has made by the scrape `body` (its duration
/// histogram's count).
pub fn scans_in(body: &str, collector: &str) -> Option<f64> {
    sample(
        body,
        "shmlink_scan_duration_seconds_count",
        &[("collector", collector)],
    )
}

/// Whether the scrape `body` lists container `id` on every one of `gpus`.
pub fn on_gpus(body: &str, id: &str, gpus: &[&str]) -> bool {
    gpus.iter().all(|g| {
        sample(
            body,
            "shmlink_gpu_container_info",
            &[("container_id", id), ("gpu", g)],
        ) == Some(1.0)
    })
}

/// `shmlink serve` on a free loopback port, scanning every 200 ms; killed on drop.
/// What the harness turns off unless a test names it: the machine's own logs are no test's
/// business, the kernel's tracepoints see every process of the machine, nor is the machine's
/// /var/lib/shmlink.
const QUIET: [(&str, &str); 5] = [
    ("--pod-log-root", "off"),
    ("--docker-root", "off"),
    ("--kmsg", "off"),
    ("--death-trace", "off"),
    ("--state-dir", "none"),
];

pub struct Agent {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(extra: &[&str], env: &[(&str, &OsStr)]) -> Agent {
        Agent::start_under(&[], extra, env)
    }

    /// `serve` with Kubernetes on against the fake API server's `kubeconfig`, as `node`, GPUs
    /// off, and `extra`.
    #[allow(dead_code)] // not every test binary that shares this module starts one
    pub fn start_kube(kubeconfig: &std::path::Path, node: &str, extra: &[&str]) -> Agent {
        let mut args = vec!["--kube", "on", "--node-name", node, "--no-gpu"];
        args.extend_from_slice(extra);
        Agent::start(&args, &[("KUBECONFIG", kubeconfig.as_os_str())])
    }

    /// `serve` on the fake NVML `fake`, Kubernetes off, and `extra`; ready.
    #[allow(dead_code)] // not every test binary that shares this module starts one
    pub fn start_gpu(fake: &super::fake_nvml::FakeNvml, extra: &[&str]) -> Agent {
        let lib = super::fake_nvml::lib();
        let mut args = vec!["--nvml-lib", lib.to_str().unwrap()];
        args.extend_from_slice(extra);
        let agent = Agent::start(&args, &fake.env());
        agent.wait_ready();
        agent
    }

    /// `serve` with Kubernetes on against the fake API server's `kubeconfig` as `node`, the
    /// fake NVML `fake` (no kubelet unless `extra` names a pod-resources socket) and `extra`;
    /// ready.
    #[allow(dead_code)] // not every test binary that shares this module starts one
    pub fn start_gpu_kube(
        kubeconfig: &std::path::Path,
        fake: &super::fake_nvml::FakeNvml,
        node: &str,
        extra: &[&str],
    ) -> Agent {
        let agent = Agent::spawn_gpu_kube(kubeconfig, fake, node, extra);
        agent.wait_ready();
        agent
    }

    /// As `start_gpu_kube`, not waited for: for a test that acts before the first scan ends.
    #[allow(dead_code)] // not every test binary that shares this module starts one
    pub fn spawn_gpu_kube(
        kubeconfig: &std::path::Path,
        fake: &super::fake_nvml::FakeNvml,
        node: &str,
        extra: &[&str],
    ) -> Agent {
        let lib = super::fake_nvml::lib();
        let mut env = fake.env().to_vec();
        env.push(("KUBECONFIG", kubeconfig.as_os_str()));
        let mut args = vec!["--kube", "on", "--node-name", node];
        args.extend_from_slice(&["--nvml-lib", lib.to_str().unwrap()]);
        if !extra.contains(&"--pod-resources-socket") {
            args.extend_from_slice(&["--pod-resources-socket", "/nonexistent/kubelet.sock"]);
        }
        args.extend_from_slice(extra);
        Agent::start(&args, &env)
    }

    /// `start`, with the binary run by `wrapper` (e.g. `setpriv ... --`), which must exec it.
    pub fn start_under(wrapper: &[&str], extra: &[&str], env: &[(&str, &OsStr)]) -> Agent {
        Agent::spawn(wrapper, extra, env, &QUIET)
    }

    /// `serve` as the default install runs it: the kernel's tracepoints of deaths as its
    /// default (`auto`) leaves them, the test's roots, ports and sources otherwise.
    #[allow(dead_code)] // not every test binary that shares this module starts one
    pub fn start_as_installed(wrapper: &[&str], extra: &[&str]) -> Agent {
        let defaults: Vec<_> = QUIET
            .iter()
            .filter(|(o, _)| *o != "--death-trace")
            .copied()
            .collect();
        Agent::spawn(wrapper, extra, &[], &defaults)
    }

    fn spawn(
        wrapper: &[&str],
        extra: &[&str],
        env: &[(&str, &OsStr)],
        defaults: &[(&str, &str)],
    ) -> Agent {
        let addr = super::free_local_addr();
        let log = std::env::temp_dir().join(format!("shmlink-serve-{}.log", addr.port()));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(super::shmlink_bin());
                c
            }
            None => Command::new(super::shmlink_bin()),
        };
        let child = command
            .args(["serve", "--listen", &addr.to_string()])
            // Fast scans, unless the test sets its own.
            .args(if extra.contains(&"--interval") {
                &[][..]
            } else {
                &["--interval", "200ms"][..]
            })
            // A developer's kubeconfig must not make `--kube auto` reach a real cluster.
            .args(if extra.contains(&"--kube") {
                &[][..]
            } else {
                &["--kube", "off"][..]
            })
            // The machine's own logs are no test's business unless it names a source.
            .args(
                defaults
                    .iter()
                    .filter(|(option, _)| !extra.contains(option))
                    .flat_map(|(option, value)| [*option, *value]),
            )
            .args(extra)
            // The log filter is the test's to give, never its own environment's.
            .env_remove("SHMLINK_LOG")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent { child, addr, log }
    }

    /// Waits for /readyz (the first scan done).
    pub fn wait_ready(&self) {
        assert!(
            super::wait_until(Duration::from_secs(20), || get(self.addr, "/readyz")
                .is_some_and(|(s, _)| s == 200)),
            "serve never got ready; its log:\n{}",
            self.log_text()
        );
    }

    pub fn metrics(&self) -> String {
        let (status, body) = get(self.addr, "/metrics").expect("scrape");
        assert_eq!(status, 200);
        body
    }

    /// Scrapes until `done` holds for a scrape, or panics with the last one.
    pub fn wait_for_metrics(&self, what: &str, done: impl FnMut(&str) -> bool) -> String {
        self.wait_for_metrics_within(what, Duration::from_secs(20), done)
    }

    /// Scrapes until the counter `name` (no labels) reaches `target`, for as long as it keeps
    /// growing: panics with the last scrape once it has not grown for `stall`. A loaded
    /// machine reads slowly but goes on; a reader that stopped stops the counter.
    pub fn wait_for_counter(&self, name: &str, target: f64, stall: Duration) -> String {
        let mut body = String::new();
        let mut last = f64::NAN;
        let mut grew = Instant::now();
        loop {
            if let Some((200, scraped)) = get(self.addr, "/metrics") {
                body = scraped;
                let now = sample(&body, name, &[]).unwrap_or(0.0);
                if now >= target {
                    return body;
                }
                if now > last || last.is_nan() {
                    last = now;
                    grew = Instant::now();
                }
            }
            assert!(
                grew.elapsed() < stall,
                "{name} stopped at {last} short of {target} for {stall:?}; last scrape:\n{body}\nlog:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// As `wait_for_metrics`, for up to `within`.
    pub fn wait_for_metrics_within(
        &self,
        what: &str,
        within: Duration,
        mut done: impl FnMut(&str) -> bool,
    ) -> String {
        let mut body = String::new();
        // Until serve answers (its port is bound before it serves), no scrape is a wrong one.
        let ok = super::wait_until(within, || match get(self.addr, "/metrics") {
            Some((200, scraped)) => {
                body = scraped;
                done(&body)
            }
            _ => false,
        });
        assert!(
            ok,
            "never saw {what}; last scrape:\n{body}\nlog:\n{}",
            self.log_text()
        );
        body
    }

    /// The scans `collector` has made so far (0 before its first).
    pub fn scans(&self, collector: &str) -> f64 {
        scans_in(&self.metrics(), collector).unwrap_or(0.0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// SIGTERM, then the exit status (within 10 s).
    pub fn terminate(mut self) -> std::process::ExitStatus {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

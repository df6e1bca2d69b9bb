//! Debian's Prometheus and Alertmanager as child processes, an HTTP/1.0 client for their APIs and
//! a webhook receiver for Alertmanager's notifications (e2e_containers/prometheus.rs, e2e_gpu/fleet.rs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";

/// Whether Prometheus and Alertmanager are installed; says SKIPPED (or fails under
/// SHMLINK_E2E=require) when not.
pub fn tools_available(test: &str) -> bool {
    let missing: Vec<&str> = [PROMETHEUS, ALERTMANAGER]
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not installed (apt-get install prometheus prometheus-alertmanager)",
        missing.join(" and ")
    );
    if std::env::var("SHMLINK_E2E").as_deref() == Ok("require") {
        panic!("{test} needs {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// A server child process with its log in a file; killed on drop.
pub struct Server {
    name: &'static str,
    child: Child,
    log: std::path::PathBuf,
    pub addr: SocketAddr,
}

impl Server {
    /// Starts `bin` with `args` in `dir` on a free loopback port; waits for `/-/ready`.
    pub fn start(name: &'static str, bin: &str, args: &[String], dir: &Path) -> Server {
        let addr = super::free_local_addr();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(bin)
            .args(args)
            .arg(format!("--web.listen-address={addr}"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        let server = Server {
            name,
            child,
            log,
            addr,
        };
        assert!(
            super::wait_until(Duration::from_secs(30), || http_get(addr, "/-/ready")
                .is_some_and(|(s, _)| s == 200)),
            "{name} never got ready; its log:\n{}",
            server.log_text()
        );
        server
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log:\n{}", self.name, self.log_text());
        }
    }
}

/// An HTTP/1.0 GET (so no chunked answer): status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query: the result vector, or the error Prometheus gave.
pub fn query(prom: SocketAddr, expr: &str) -> Result<Vec<Value>, String> {
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(expr)))
        .ok_or_else(|| "no answer".to_string())?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The alerts firing in Prometheus whose labels match `selector` (`alertname="X", ...`).
pub fn firing(prom: SocketAddr, selector: &str) -> Vec<Value> {
    query(
        prom,
        &format!("ALERTS{{alertstate=\"firing\", {selector}}}"),
    )
    .unwrap()
}

/// A webhook receiver: every POST body, as JSON, on the channel.
pub fn webhook() -> (SocketAddr, mpsc::Receiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    (addr, rx)
}

/// (panel title, expr) or (variable name, query).
pub type Named = Vec<(String, String)>;

/// Every (panel title, expr) of a dashboard, and its template variables' queries.
pub fn dashboard_queries(dashboard: &Value) -> (Named, Named) {
    let mut exprs = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    // Panels inside collapsed rows.
    let nested: Vec<&Value> = panels
        .iter()
        .filter_map(|p| p["panels"].as_array())
        .flatten()
        .collect();
    panels.extend(nested);
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                exprs.push((p["title"].as_str().unwrap_or("").to_string(), expr.into()));
            }
        }
    }
    let vars = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or_default();
            (v["name"].as_str().unwrap().to_string(), q.to_string())
        })
        .collect();
    (exprs, vars)
}

/// Grafana's variables as they are with "All" selected; the data source is the one queried.
/// `job` has no all-value, so Grafana joins its values (the shmlink jobs) into a regex.
pub fn substitute(expr: &str) -> String {
    let mut e = expr
        .replace("$__rate_interval", "10s")
        .replace("$__range", "1h")
        .replace("\"$job\"", "\"(shmlink)\"");
    for var in ["$cluster", "$node", "$namespace", "$pod"] {
        e = e.replace(&format!("\"{var}\""), "\".*\"");
    }
    assert!(
        !e.contains('$'),
        "a variable the test does not know in {expr}"
    );
    e
}

/// The shipped rules with every `for:` and group `interval:` divided by `by` (at least 1s):
/// the shipped durations keep a short spike from paging anyone (promtool's unit tests check
/// them); a test that follows a fault to a notification keeps their order, not their minutes.
pub fn rules_scaled(rules: &str, by: u64) -> String {
    let mut changed = 0;
    let out: Vec<String> = rules
        .lines()
        .map(|l| {
            let trimmed = l.trim_start();
            let indent = &l[..l.len() - trimmed.len()];
            for key in ["for: ", "interval: "] {
                if let Some(d) = trimmed.strip_prefix(key) {
                    let d = humantime::parse_duration(d.trim()).expect("a duration");
                    changed += 1;
                    let secs = (d.as_secs() / by).max(1);
                    return format!("{indent}{key}{secs}s");
                }
            }
            l.to_string()
        })
        .collect();
    assert!(changed > 0, "the rules have no `for:` to shorten");
    out.join("\n") + "\n"
}

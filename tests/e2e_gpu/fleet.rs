//! The fleet on one machine: eight `shmlink serve` agents, each its own node name, port, state
//! directory and fake NVML board (an 8-GPU NVSwitch node whose GPUs report an NVLink domain:
//! nodes fleet-a-* in domain A, fleet-b-* in domain B, and their chassis), all against one
//! in-process API server; Debian's Prometheus scrapes them with the shipped rules (their `for:`
//! and group intervals divided by 15, their order kept) and sends to Debian's Alertmanager
//! with the shipped routes and inhibitions, delivering to a webhook here.
//!
//! A GPU's NVLinks go down on three nodes of domain A and on one node of domain B: one
//! GpuFabricDomainDegraded page for A naming its three nodes, no per-GPU page for A (inhibited),
//! B's culprit GPU its own GpuLinkDegraded page, nothing for B's domain. Every query of
//! dashboards/shmlink-fleet.json returns data, the fleet row's values are what the faults say,
//! and the series each agent writes and the rules' cost are printed (BENCHMARKS.md). Run with
//! --nocapture to read them.
//!
//! Needs `prometheus` and `prometheus-alertmanager` (scripts/test.sh installs them); without
//! them SKIPPED, unless SHMLINK_E2E=require, where it fails. No containers: root not needed.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::fake_nvml::{self, FakeNvml};
use common::kube_api::{pod, Dra, FakeApi};
use common::prom::{dashboard_queries, query, substitute, webhook, Server};
use serde_json::{json, Value};

const DOMAIN_A: &str = "7f3c0d5e-0b1a-4c2d-9e8f-00000000000a";
const DOMAIN_B: &str = "7f3c0d5e-0b1a-4c2d-9e8f-00000000000b";
const TORCH_LINE: &str = "RuntimeError: unable to allocate shared memory(shm) for file \
                          </torch_31552_3195629858_0>: No space left on device (28)";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// One node of the fleet: its name, board, agent and where its Pods' logs go.
struct Node {
    name: String,
    board: Value,
    fake: FakeNvml,
    agent: Agent,
    logs: PathBuf,
}

/// Node `i` (0-3: domain A, 4-7: domain B): the nvswitch-8 board with UUIDs of its own, each
/// GPU registered in its domain, in its domain's chassis (slot and tray the node's).
fn board(i: usize) -> Value {
    let mut b = fake_nvml::preset("nvswitch-8");
    let (domain, clique, chassis) = if i < 4 {
        (DOMAIN_A, 1, "1821724000A01")
    } else {
        (DOMAIN_B, 2, "1821724000B01")
    };
    for (g, gpu) in b["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
        let uuid = gpu["uuid"].as_str().unwrap();
        gpu["uuid"] = json!(format!("{}{i:02x}", &uuid[..uuid.len() - 2]));
        gpu["fabric"] = json!({"state": "completed", "cluster_uuid": domain, "clique_id": clique});
        gpu["platform"] = json!({"chassis_serial": chassis, "slot": i % 4 + 1, "tray": i % 4,
                                 "module_id": g + 1});
        gpu["vbios"] = json!("96.00.89.00.01");
    }
    b
}

fn node_name(i: usize) -> String {
    format!("fleet-{}-{}", if i < 4 { "a" } else { "b" }, i % 4)
}

/// The node's ResourceSlice as NVIDIA's DRA driver publishes it, with this board's UUIDs.
fn slice(name: &str, board: &Value) -> Value {
    let text =
        std::fs::read_to_string(repo("tests/fixtures/dra/resourceslice-8gpu-v1.json")).unwrap();
    let mut s: Value = serde_json::from_str(&text).unwrap();
    s["metadata"]["name"] = json!(format!("00000-gpu.nvidia.com-{name}"));
    s["spec"]["nodeName"] = json!(name);
    s["spec"]["pool"]["name"] = json!(name);
    for (d, gpu) in s["spec"]["devices"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .zip(board["gpus"].as_array().unwrap())
    {
        d["attributes"]["uuid"]["string"] = gpu["uuid"].clone();
    }
    s
}

fn start_node(i: usize, api: &FakeApi, dir: &Path) -> Node {
    let name = node_name(i);
    let board = board(i);
    let fake = FakeNvml::new(&board);
    api.apply_slice(slice(&name, &board));
    let logs = dir.join(format!("pods-{name}"));
    let state = dir.join(format!("state-{name}"));
    std::fs::create_dir_all(&logs).unwrap();
    let kubeconfig = api.kubeconfig_path();
    let agent = Agent::spawn_gpu_kube(
        &kubeconfig,
        &fake,
        &name,
        &[
            "--interval",
            "1s",
            "--gpu-device-taint",
            "None",
            "--pod-log-root",
            logs.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    Node {
        name,
        board,
        fake,
        agent,
        logs,
    }
}

impl Node {
    /// Every NVLink of `gpu` inactive: the pair judge names it the culprit of its 7 pairs.
    fn links_down(&mut self, gpu: usize) {
        for link in self.board["gpus"][gpu]["links"].as_array_mut().unwrap() {
            link["active"] = json!(false);
        }
        self.fake.write(&self.board);
    }

    /// A Pod of `namespace` with image `image` on this node whose container says PyTorch's
    /// /dev/shm failure in its log.
    fn shm_death(&self, api: &FakeApi, namespace: &str, name: &str, image: &str) {
        let uid = common::random_pod_uid();
        let mut p = pod(&self.name, namespace, name, &uid, &[("trainer", "0")]);
        p["spec"]["containers"][0]["image"] = json!(image);
        p["status"]["containerStatuses"] = json!([]);
        api.apply_pod(p);
        let dir = self.logs.join(format!("{namespace}_{name}_{uid}/trainer"));
        std::fs::create_dir_all(&dir).unwrap();
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%fZ");
        std::fs::write(dir.join("0.log"), format!("{now} stderr F {TORCH_LINE}\n")).unwrap();
    }
}

/// Prometheus over the agents (the `node` label a ServiceMonitor would add), with the rules.
fn prometheus(dir: &Path, nodes: &[Node], am: SocketAddr) -> Server {
    let rules = std::fs::read_to_string(repo("deploy/prometheus/shmlink.rules.yml")).unwrap();
    std::fs::write(
        dir.join("shmlink.rules.yml"),
        common::prom::rules_scaled(&rules, 15),
    )
    .unwrap();
    let targets: String = nodes
        .iter()
        .map(|n| {
            format!(
                "      - targets: ['{}']\n        labels: {{node: {}}}\n",
                n.agent.addr, n.name
            )
        })
        .collect();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [shmlink.rules.yml]\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n\
             scrape_configs:\n  - job_name: shmlink\n    honor_labels: true\n    static_configs:\n{targets}"
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.join("tsdb")).unwrap();
    let args = [
        "--config.file=prometheus.yml".into(),
        "--storage.tsdb.path=tsdb".into(),
    ];
    Server::start("prometheus", common::prom::PROMETHEUS, &args, dir)
}

/// The shipped Alertmanager configuration (its routes and inhibitions), its receivers the
/// webhook and its waits seconds.
fn alertmanager(dir: &Path, hook: SocketAddr) -> Server {
    let text = std::fs::read_to_string(repo("deploy/alertmanager/alertmanager.yml")).unwrap();
    let (head, rest) = text
        .split_once("\nreceivers:\n")
        .expect("a receivers section");
    let (_, inhibit) = rest
        .split_once("\ninhibit_rules:\n")
        .expect("inhibit_rules");
    let head = head
        .replace("group_wait: 30s", "group_wait: 2s")
        .replace("group_interval: 5m", "group_interval: 2s");
    let receiver = |name: &str| {
        format!(
            "  - name: {name}\n    webhook_configs:\n      - url: http://{hook}/alerts\n        send_resolved: false\n"
        )
    };
    let config = format!(
        "{head}\nreceivers:\n{}{}inhibit_rules:\n{inhibit}",
        receiver("shmlink-pager"),
        receiver("shmlink-tickets")
    );
    assert!(config.contains("group_wait: 2s") && config.contains("group_interval: 2s"));
    std::fs::write(dir.join("alertmanager.yml"), config).unwrap();
    std::fs::create_dir(dir.join("am-data")).unwrap();
    let args = [
        "--config.file=alertmanager.yml".into(),
        "--storage.path=am-data".into(),
        "--cluster.listen-address=".into(),
    ];
    Server::start("alertmanager", common::prom::ALERTMANAGER, &args, dir)
}

/// Every alert notified so far, as (alertname, labels), draining the channel.
fn notified(payloads: &Receiver<Value>, into: &mut Vec<Value>) {
    while let Ok(p) = payloads.try_recv() {
        into.extend(p["alerts"].as_array().cloned().unwrap_or_default());
    }
}

fn names(alerts: &[Value]) -> Vec<String> {
    alerts
        .iter()
        .map(|a| {
            format!(
                "{}{{node={},gpu={},cluster_uuid={}}}",
                a["labels"]["alertname"].as_str().unwrap_or(""),
                a["labels"]["node"].as_str().unwrap_or(""),
                a["labels"]["gpu"].as_str().unwrap_or(""),
                a["labels"]["cluster_uuid"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Prometheus's first scrape of every agent, with every GPU's fleet keys.
fn wait_scraped(p: SocketAddr) {
    let count = |expr: &str| {
        query(p, expr)
            .ok()
            .and_then(|r| r.first().cloned())
            .and_then(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()))
            .unwrap_or(0.0)
    };
    assert!(
        common::wait_until(Duration::from_secs(60), || {
            count("count(up{job=\"shmlink\"} == 1)") == 8.0
                && count("count(shmlink_gpu_info{cluster_uuid!=\"\"})") == 64.0
        }),
        "Prometheus never had the eight agents' GPUs: {:?}",
        query(p, "up")
    );
}

/// The series one agent writes (sample lines of its /metrics).
fn series_of(agent: &Agent) -> usize {
    let body = agent.metrics();
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

#[test]
fn faults_on_three_nodes_of_a_domain_page_once_and_one_node_of_another_pages_alone() {
    if !common::prom::tools_available("the fleet end-to-end test") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("shmlink-e2e-fleet-")
        .tempdir()
        .unwrap();
    let api = FakeApi::start();
    api.set_dra(Dra::RulesV1);
    let (hook, payloads) = webhook();
    let am = alertmanager(dir.path(), hook);
    let mut nodes: Vec<Node> = (0..8).map(|i| start_node(i, &api, dir.path())).collect();
    for n in &nodes {
        n.agent.wait_ready();
    }
    let prom = prometheus(dir.path(), &nodes, am.addr);
    let p = prom.addr;
    wait_scraped(p);
    let healthy: Vec<usize> = nodes.iter().map(|n| series_of(&n.agent)).collect();

    let faulted = Instant::now();
    for n in &mut nodes[0..3] {
        n.links_down(0);
    }
    nodes[4].links_down(3);
    nodes[1].shm_death(&api, "ml", "trainer-a", "nvcr.io/nvidia/pytorch:24.05-py3");
    nodes[5].shm_death(&api, "vision", "detector-0", "ghcr.io/acme/detector:1.2");

    let mut got = Vec::new();
    let paged = |got: &[Value], name: &str, label: (&str, &str)| {
        got.iter()
            .any(|a| a["labels"]["alertname"] == name && a["labels"][label.0] == label.1)
    };
    assert!(
        common::wait_until(Duration::from_secs(60), || {
            notified(&payloads, &mut got);
            paged(&got, "GpuFabricDomainDegraded", ("cluster_uuid", DOMAIN_A))
                && paged(&got, "GpuLinkDegraded", ("node", "fleet-b-0"))
        }),
        "the pages never came: {:?}\nfiring: {:?}",
        names(&got),
        query(p, "ALERTS{alertstate=\"firing\"}")
    );
    println!(
        "first pages {:.1} s after the faults",
        faulted.elapsed().as_secs_f64()
    );
    // Alertmanager's groups flush every 2 s: what it would send for domain A's GPUs it sends
    // within a few flushes after their own `for`.
    std::thread::sleep(Duration::from_secs(6));
    notified(&payloads, &mut got);
    check_pages(&got, p, am.addr);
    check_dashboard(p);
    print_costs(&nodes, &healthy, p, prom.addr);
    check_fleet_command(&api, &nodes);
    drop(nodes);
}

/// `shmlink fleet` against the same cluster: run as the operator would, its output and status.
fn fleet(api: &FakeApi, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(common::shmlink_bin())
        .arg("fleet")
        .args(["--kubeconfig", api.kubeconfig_path().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// What is out, grouped by domain, from the Node conditions and DeviceTaintRules the agents
/// keep, their Events and, through the proxy to their Pods, their GPUs and deaths; then as a
/// user without the proxy's RBAC: said, and the rest still read.
fn check_fleet_command(api: &FakeApi, nodes: &[Node]) {
    for n in nodes {
        api.apply_pod(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("shmlink-{}", n.name), "namespace": "shmlink",
                         "uid": common::random_pod_uid(),
                         "labels": {"app.kubernetes.io/name": "shmlink"}},
            "spec": {"nodeName": n.name, "containers": [{"name": "shmlink",
                     "ports": [{"name": "metrics", "containerPort": n.agent.addr.port()}]}]},
            "status": {"phase": "Running", "podIP": n.agent.addr.ip().to_string()}}));
    }
    let a = format!(
        "NVLink domain {DOMAIN_A} clique 1: 3 of its 4 nodes out (fleet-a-0, fleet-a-1, fleet-a-2)"
    );
    let b = format!("NVLink domain {DOMAIN_B} clique 2: 1 of its 4 nodes out (fleet-b-0)");
    let mut last = (0, String::new(), String::new());
    // The device-taint keepers make their rules within a pass or two of the faults.
    let ok = common::wait_until(Duration::from_secs(30), || {
        last = fleet(api, &[]);
        last.1.contains(&a) && last.1.contains(&b) && last.1.matches("DeviceTaintRule").count() == 4
    });
    assert!(ok, "shmlink fleet said:\n{}\n{}", last.1, last.2);
    let (status, text, _) = last;
    println!("shmlink fleet:\n{text}");
    assert_eq!(status, 1, "something is out");
    assert!(!text.contains("Not read"), "{text}");
    assert!(
        text.contains("fleet-a-1  GpuLinkDegraded True  since "),
        "{text}"
    );
    assert!(
        text.contains("Deaths told by the agents in the last 1h:"),
        "{text}"
    );
    assert!(
        text.contains("ml/trainer-a/trainer  shm_allocation_failed"),
        "{text}"
    );
    let (_, json_text, _) = fleet(api, &["--json"]);
    let report: Value = serde_json::from_str(&json_text).unwrap();
    let da = &report["domains"][0];
    assert_eq!(da["domain"], format!("{DOMAIN_A}.1"));
    let rules: Vec<&Value> = da["out"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["what"] == "DeviceTaintRule")
        .collect();
    assert_eq!(rules.len(), 3, "{da}");
    assert!(rules
        .iter()
        .all(|r| r["gpu"] == 0 && r["effect"] == "None" && r["since"].is_string()));
    assert_eq!(report["deaths"].as_array().unwrap().len(), 2, "{report}");

    // A user who may not reach the agents (pods/proxy) nor list nodes: both said, with the RBAC
    // they take; the rules still say what is out.
    api.forbid("GET", "/api/v1/namespaces/shmlink/pods/");
    api.forbid("GET", "/api/v1/nodes");
    let (status, text, stderr) = fleet(api, &[]);
    println!("shmlink fleet without the proxy's and the Nodes' RBAC:\n{text}");
    assert_eq!(status, 1, "{text}{stderr}");
    assert!(
        text.contains("Node conditions: forbidden: it needs RBAC `list nodes (cluster-wide)`"),
        "{text}"
    );
    assert!(
        text.contains("16 agent answers (the agent on fleet-a-0 (GPUs), ...): forbidden: it needs RBAC `get pods/proxy (the agents' namespace)`"),
        "{text}"
    );
    assert!(
        text.contains("GPU 0 tainted (None, DeviceTaintRule shmlink-fleet-a-0-gpu-0)"),
        "{text}"
    );
}

/// One domain page for A naming its three nodes and none for B; B's culprit GPU paged alone;
/// A's GPUs fire in Prometheus but Alertmanager holds them back.
fn check_pages(got: &[Value], p: SocketAddr, am: SocketAddr) {
    let of = |name: &str| -> Vec<&Value> {
        got.iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .collect()
    };
    let domains = of("GpuFabricDomainDegraded");
    let distinct: std::collections::BTreeSet<String> =
        domains.iter().map(|a| a["labels"].to_string()).collect();
    assert_eq!(distinct.len(), 1, "one domain page: {:?}", names(got));
    let page = domains[0];
    assert_eq!(page["labels"]["cluster_uuid"], DOMAIN_A);
    assert_eq!(page["labels"]["clique_id"], "1");
    assert_eq!(page["labels"]["severity"], "critical");
    let description = page["annotations"]["description"].as_str().unwrap();
    assert!(
        description.contains("nodes fleet-a-0 fleet-a-1 fleet-a-2 ."),
        "{description}"
    );
    let gpu_pages = of("GpuLinkDegraded");
    assert!(
        gpu_pages
            .iter()
            .all(|a| a["labels"]["node"] == "fleet-b-0" && a["labels"]["gpu"] == "3"),
        "only fleet-b-0's GPU 3 pages on its own: {:?}",
        names(got)
    );
    assert_eq!(gpu_pages[0]["labels"]["cluster_uuid"], DOMAIN_B);
    // Every alert that reached the webhook, by name and labels, for the closing note.
    let mut sent: Vec<String> = got
        .iter()
        .map(|a| format!("{} {}", a["labels"]["alertname"], a["labels"]))
        .collect();
    sent.sort();
    sent.dedup();
    println!("notified:\n  {}", sent.join("\n  "));
    println!("GpuFabricDomainDegraded: {description}");
    // In Prometheus all four culprits fire; A's three are inhibited in Alertmanager.
    let firing = common::prom::firing(p, "alertname=\"GpuLinkDegraded\"");
    assert_eq!(firing.len(), 4, "{firing:?}");
    let (_, body) = common::prom::http_get(am, "/api/v2/alerts").unwrap();
    let alerts: Vec<Value> = serde_json::from_str(&body).unwrap();
    for a in alerts
        .iter()
        .filter(|a| a["labels"]["alertname"] == "GpuLinkDegraded")
    {
        let node = a["labels"]["node"].as_str().unwrap();
        let want = if node.starts_with("fleet-a") {
            "suppressed"
        } else {
            "active"
        };
        assert_eq!(a["status"]["state"], want, "{a}");
        println!(
            "Alertmanager: GpuLinkDegraded on {node}: {}",
            a["status"]["state"]
        );
    }
}

/// The value of a result row as a number.
fn value(s: &Value) -> f64 {
    s["value"][1].as_str().unwrap().parse().unwrap()
}

/// Every query of the fleet dashboard (and its variables) has data, as Grafana asks with every
/// variable at All; the fleet rows say what the faults are.
fn check_dashboard(p: SocketAddr) {
    let path = repo("dashboards/shmlink-fleet.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (exprs, vars) = dashboard_queries(&dashboard);
    for (title, expr) in &exprs {
        let e = substitute(expr);
        let mut last = Ok(Vec::new());
        // The day's group is evaluated every 20 s here.
        let ok = common::wait_until(Duration::from_secs(45), || {
            last = query(p, &e);
            last.as_ref().is_ok_and(|r| !r.is_empty())
        });
        assert!(ok, "panel {title:?}: no data for {e}: {last:?}");
        let result = last.unwrap();
        let rows: Vec<String> = result
            .iter()
            .map(|s| format!("{} = {}", s["metric"], s["value"][1]))
            .collect();
        println!("panel {title:?}:\n    {}", rows.join("\n    "));
        let row = |label: &str, v: &str| result.iter().find(|s| s["metric"][label] == v);
        match title.as_str() {
            "GPUs out now" => assert_eq!(value(&result[0]), 4.0),
            "Nodes with GPUs out" => assert_eq!(value(&result[0]), 4.0),
            "Nodes with link faults per NVLink domain (10 min)" => {
                assert_eq!(value(row("cluster_uuid", DOMAIN_A).unwrap()), 3.0);
                assert_eq!(value(row("cluster_uuid", DOMAIN_B).unwrap()), 1.0);
            }
            "GPUs out and why" => {
                assert_eq!(result.len(), 4, "{rows:?}");
                assert!(result.iter().all(|s| s["metric"]["reason"] == "link"));
            }
            "/dev/shm deaths per namespace (last day)" => {
                assert_eq!(value(row("namespace", "ml").unwrap()), 1.0);
                assert_eq!(value(row("namespace", "vision").unwrap()), 1.0);
            }
            "/dev/shm deaths per namespace and image (last day)" => {
                let ml = row("image", "nvcr.io/nvidia/pytorch:24.05-py3").unwrap();
                assert_eq!(ml["metric"]["namespace"], "ml");
            }
            _ => {}
        }
    }
    for (name, q) in vars {
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: {q}"));
        let (selector, _) = inner.rsplit_once(',').unwrap();
        let result = query(p, &substitute(selector));
        // `namespace` lists the nodes' containers' namespaces: this test runs none (its deaths
        // come from logs), so only its query is checked here; e2e_containers::prometheus has its values.
        if name == "namespace" {
            assert!(result.is_ok(), "variable {name}: {result:?}");
            continue;
        }
        assert!(
            !result.unwrap().is_empty(),
            "variable {name}: no series for {q}"
        );
    }
    println!("{} fleet dashboard queries returned data", exprs.len());
}

/// What each node costs Prometheus, measured here (BENCHMARKS.md): the series each agent
/// writes, the samples Prometheus ingests per target, and each rule group's evaluation time.
fn print_costs(nodes: &[Node], healthy: &[usize], p: SocketAddr, prom: SocketAddr) {
    let now: Vec<usize> = nodes.iter().map(|n| series_of(&n.agent)).collect();
    println!("series per agent, healthy: {healthy:?}; after the faults: {now:?}");
    let per_target = query(p, "scrape_samples_scraped{job=\"shmlink\"}").unwrap();
    let counts: Vec<f64> = per_target.iter().map(value).collect();
    println!("samples per scrape of each target (Prometheus's scrape_samples_scraped): {counts:?}");
    // Each rule's own last evaluation time (Prometheus's rules API).
    let (_, rules) = common::prom::http_get(prom, "/api/v1/rules").unwrap();
    let rules: Value = serde_json::from_str(&rules).unwrap();
    for g in rules["data"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or("");
            let t = r["evaluationTime"].as_f64().unwrap_or(0.0);
            println!(
                "  rule {}/{name}: {:.2} ms",
                g["name"].as_str().unwrap_or(""),
                t * 1000.0
            );
        }
    }
    let (_, own) = common::prom::http_get(prom, "/metrics").unwrap();
    for l in own.lines().filter(|l| {
        l.starts_with("prometheus_rule_group_last_duration_seconds{")
            || l.starts_with("prometheus_rule_group_rules{")
            || l.starts_with("prometheus_rule_group_last_evaluation_samples{")
    }) {
        println!("  {l}");
    }
}

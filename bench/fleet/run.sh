#!/usr/bin/env bash
# The fleet suite: how the dashboard's fleet view holds up on a big cluster: synthetic series
# of N nodes (8 GPUs, 28 pairs, C containers each; a few nodes with unhealthy pairs), backfilled
# into a TSDB with promtool, served by a real Prometheus, and timed: each recording rule of the
# shmlink-fleet group (what Prometheus pays per evaluation), each fleet panel's query as Grafana
# sends it with every variable at All (read from dashboards/shmlink.json), and the same panel
# computed from the raw series for comparison. Needs prometheus and promtool.
#
#   bench/run.sh fleet [NODES] [CONTAINERS_PER_NODE]     (default 1000 20)
#   (alone: bench/fleet/run.sh, the same arguments)
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${1:-1000}
CONTAINERS=${2:-20}
for tool in prometheus promtool; do
  command -v $tool >/dev/null || { echo "$tool is not installed (apt-get install prometheus)" >&2; exit 1; }
done
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

python3 - "$dir/data.om" "$NODES" "$CONTAINERS" <<'PY'
import random, sys
out, N, C = open(sys.argv[1], "w"), int(sys.argv[2]), int(sys.argv[3])
random.seed(1)
T0 = 1_800_000_000
steps = [T0 + 30 * i for i in range(5)]
pairs = [(a, b) for a in range(8) for b in range(a + 1, 8)]
bad = {n: set(random.sample(range(len(pairs)), 3)) for n in random.sample(range(N), max(1, N // 100))}
used = {(n, c): random.randint(0, 100) for n in range(N) for c in range(C)}
def target(n):
    return f'node="n{n:05d}",instance="10.{n // 65536}.{n // 256 % 256}.{n % 256}:9477",job="shmlink",cluster="c1"'
out.write("# TYPE shmlink_gpu_pair_healthy gauge\n")
for n in range(N):
    for i, (a, b) in enumerate(pairs):
        v = 0 if i in bad.get(n, ()) else 1
        for t in steps:
            out.write(f'shmlink_gpu_pair_healthy{{{target(n)},gpu="{a}",peer_gpu="{b}"}} {v} {t}\n')
for m in ("used", "available"):
    out.write(f"# TYPE shmlink_shm_{m}_bytes gauge\n")
    for n in range(N):
        for c in range(C):
            v = used[n, c] if m == "used" else 100 - used[n, c]
            for t in steps:
                out.write(f'shmlink_shm_{m}_bytes{{{target(n)},namespace="ns{c % 5}",pod="p{n}-{c}",container="main",'
                          f'container_id="id{n}-{c}",pod_uid="u{n}-{c}"}} {v} {t}\n')
# What the shmlink-fleet rules would have recorded (one series per node).
recorded = {
    "node:shmlink_gpu_pairs_unhealthy:sum": lambda n: len(bad.get(n, ())),
    "node:shmlink_shm_fullness:max": lambda n: max(used[n, c] for c in range(C)) / 100,
    "node:shmlink_shm_pods_near_full:count": lambda n: sum(used[n, c] >= 80 for c in range(C)),
}
for name, value in recorded.items():
    for n in range(N):
        for t in steps:
            out.write(f"{name}{{{target(n)}}} {value(n)} {t}\n")
out.write("# EOF\n")
PY
promtool tsdb create-blocks-from openmetrics "$dir/data.om" "$dir/tsdb" >/dev/null
rm "$dir/data.om"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'global:\n  scrape_interval: 1h\n' >"$dir/prometheus.yml"
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$port" >"$dir/prometheus.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -fsS "127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done

python3 - "$port" "$NODES" "$CONTAINERS" <<'PY'
import json, sys, time, urllib.parse, urllib.request, yaml
port, N, C = sys.argv[1], sys.argv[2], sys.argv[3]
T = 1_800_000_120
def timed(expr):
    best, result = float("inf"), None
    for _ in range(5):
        start = time.perf_counter()
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": T})
        body = json.load(urllib.request.urlopen(url))
        best = min(best, time.perf_counter() - start)
        if body["status"] != "success":
            sys.exit(f"FAIL: {expr}: {body}")
        result = body["data"]["result"]
    if not result:
        sys.exit(f"FAIL: no data for {expr}")
    return best * 1000, len(result)
def all_selected(expr):
    e = expr.replace('"$job"', '"(shmlink)"')
    for var in ("$cluster", "$node", "$namespace", "$pod"):
        e = e.replace(f'"{var}"', '".*"')
    return e
print(f"{N} nodes, 28 GPU pairs and {C} containers each")
groups = yaml.safe_load(open("deploy/prometheus/shmlink.rules.yml"))["groups"]
for rule in next(g for g in groups if g["name"] == "shmlink-fleet")["rules"]:
    ms, n = timed(rule["expr"])
    print(f"{ms:8.1f} ms {n:6d} series  rule {rule['record']} (one evaluation)")
dashboard = json.load(open("dashboards/shmlink.json"))
for p in dashboard["panels"]:
    for t in p.get("targets", []):
        if "node:shmlink_" in t.get("expr", ""):
            e = all_selected(t["expr"])
            ms, n = timed(e)
            print(f"{ms:8.1f} ms {n:6d} series  panel {p['id']} {p['title']!r}: {e}")
raw = 'sort_desc(topk(25, sum by (cluster, node) (shmlink_gpu_pair_healthy{cluster=~".*", job=~"(shmlink)", node=~".*"} == bool 0)))'
ms, n = timed(raw)
print(f"{ms:8.1f} ms {n:6d} series  for comparison, panel 25 from the raw series: {raw}")
PY

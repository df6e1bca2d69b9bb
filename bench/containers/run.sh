#!/usr/bin/env bash
# The containers suite: N real runc containers, and in the same run shmlink's shm scan against
# the syscall floor and against the shell loop people use today, /metrics encoding, the GPU scan
# of the fake NVSwitch board, and `shmlink serve` beside prometheus-node-exporter. Needs root.
#
#   bench/run.sh containers              # N = 100 500 1000, 11 repetitions, serve 120 s each
#   bench/run.sh containers --sizes "100 500" --reps 21 --serve-seconds 300
#   bench/run.sh containers --write BENCHMARKS.md   # also replaces the results block there
#   bench/run.sh containers --smoke      # N = 20, a few seconds, debug build; fails on
#                                        # harness errors, never on timing
#   bench/run.sh containers --sizes 300 --isolated --baseline DIR
#       --isolated: the containers' cgroups under /shmlink-bench and only that subtree scanned
#       (by shmlink and the floor alike), so containers that other work starts and stops on the
#       machine meanwhile are neither counted nor measured;
#       --baseline DIR: a build to compare with in the same run (DIR/shmlink, and
#       DIR/scan_bench if there), measured beside this one at every step
# (bench/run.sh --smoke, what CI runs, is the parser benchmarks once each, then this --smoke.)
# The script runs alone too: bench/containers/run.sh [options].
#
# Results: target/bench/results.jsonl (one JSON object per measurement) and
# target/bench/report.md (the tables). The containers are removed however the run ends.
set -euo pipefail
cd "$(dirname "$0")/../.."

sizes="100 500 1000" reps=11 diy_reps=3 serve_seconds=120 interval=5s write="" smoke=0
profile=release parallel=8 isolated=0 baseline=""
side_reps="" side_seconds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --diy-reps) diy_reps=$2; shift 2 ;;
    --serve-seconds) serve_seconds=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --write) write=$2; shift 2 ;;
    --isolated) isolated=1; shift ;;
    --baseline) baseline=$(cd "$2" && pwd); shift 2 ;;
    # Isolated: what else runs on the machine (a test's leftover, a service with a mount
    # namespace of its own) is not the smoke's to count.
    --smoke) smoke=1 isolated=1; sizes=20 reps=3 diy_reps=1 serve_seconds=4 interval=1s profile=debug; shift ;;
    *) echo "usage: $0 [--sizes \"N ...\"] [--reps R] [--diy-reps R] [--serve-seconds S] [--interval D] [--parallel P] [--isolated] [--baseline DIR] [--write FILE] [--smoke]" >&2; exit 2 ;;
  esac
done

# The processes side by side (floor_side.py): as many as the rest, a second only in the smoke.
side_reps=${side_reps:-$reps} side_seconds=${side_seconds:-$serve_seconds}
[ $smoke = 0 ] || side_reps=1 side_seconds=2

if [ "$(id -u)" != 0 ]; then
  if [ $smoke = 1 ]; then
    echo "SKIPPED: bench smoke: not root, cannot start containers" >&2
    exit 0
  fi
  echo "bench/run.sh containers: needs root (runc containers, other processes' namespaces)" >&2
  exit 2
fi

missing=()
command -v runc >/dev/null || missing+=(runc)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
command -v cc >/dev/null || missing+=(gcc)
[ $smoke = 1 ] || command -v prometheus-node-exporter >/dev/null || missing+=(prometheus-node-exporter)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== building ($profile)"
# The binaries and the fake NVML library, then the example (an --example flag alone builds
# only the example, and a stale shmlink would be measured).
if [ $profile = release ]; then
  cargo build -q --release --workspace
  cargo build -q --release --example scan_bench
  bin=target/release
else
  cargo build -q --workspace
  cargo build -q --example scan_bench
  bin=target/debug
fi
scan_bench=$bin/examples/scan_bench
shmlink=$bin/shmlink
fake_nvml=$bin/libfake_nvml.so
export FAKE_NVML_CONFIG=$PWD/crates/fake-nvml/presets/nvswitch-8.json

# The scrape period: the scan interval, as a number of seconds.
case "$interval" in
  *ms) scrape_every=$(python3 -c "print(${interval%ms} / 1000)") ;;
  *s) scrape_every=${interval%s} ;;
  *m) scrape_every=$(( ${interval%m} * 60 )) ;;
  *) echo "--interval: use e.g. 500ms, 5s, 1m" >&2; exit 2 ;;
esac

out=target/bench
mkdir -p "$out"
# The floor as a process of its own (floor.c), which `check` is compared with.
cc -O2 -o "$out/floor" bench/containers/floor.c
[ -z "$baseline" ] || [ -x "$baseline/shmlink" ] || { echo "--baseline: no $baseline/shmlink" >&2; exit 2; }
results=$out/results.jsonl
: >"$results"

# --isolated: the bench's containers under their own cgroup parent, and a cgroup root that
# holds only that subtree (cgroup v2: the subtree itself; v1: its memory hierarchy bound at
# <view>/memory).
cgroot=/sys/fs/cgroup under="" view=/run/shmlink-bench-cgroup
if [ $isolated = 1 ]; then
  export SHMLINK_BENCH_CGROUP_PARENT=/shmlink-bench
  under=/shmlink-bench
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    cgroot=/sys/fs/cgroup/shmlink-bench
  else
    cgroot=$view
  fi
fi
isolate() {
  [ $isolated = 1 ] && [ "$cgroot" = "$view" ] || return 0
  mountpoint -q "$view/memory" && return 0
  mkdir -p "$view/memory" /sys/fs/cgroup/memory/shmlink-bench
  mount --bind /sys/fs/cgroup/memory/shmlink-bench "$view/memory"
}
unisolate() {
  [ $isolated = 1 ] || return 0
  ! mountpoint -q "$view/memory" || umount "$view/memory"
  rmdir "$view/memory" "$view" 2>/dev/null || true
}
scan_bench_args=(--cgroup-root "$cgroot")

pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]}"; do kill "$p" 2>/dev/null || true; done
  unisolate || true
  bench/containers/containers.sh stop || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bench/containers/containers.sh stop # whatever an interrupted run left

# One measurement that ran through: the harness checks of each step passed.
passed=0
record() { echo "$1" >>"$results"; passed=$((passed + 1)); }
note() { echo "$1" >>"$results"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_kib() { awk "/^$2:/ {print \$2}" "/proc/$1/status"; }
wait_http() {
  for _ in $(seq 1 200); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "bench/run.sh containers: $1 did not answer" >&2
  return 1
}

r=$(python3 - "$profile" "$sizes" "$reps" "$serve_seconds" "$interval" <<'PY'
import json, os, platform, sys, subprocess
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
def version(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
    except Exception:
        return None
print(json.dumps({"mode": "machine", "kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
  "mem_gib": round(mem / 2**20, 1), "load": os.getloadavg(), "profile": sys.argv[1],
  "sizes": sys.argv[2], "reps": int(sys.argv[3]), "serve_seconds": int(sys.argv[4]), "interval": sys.argv[5],
  "rustc": version(["rustc", "--version"]), "runc": version(["runc", "--version"]),
  "node_exporter": version(["prometheus-node-exporter", "--version"])}))
PY
)
note "$r"

echo "== GPU: one scan of the fake nvswitch-8 board"
r=$("$scan_bench" gpu --reps "$reps" --nvml-lib "$fake_nvml"); record "$r"

running=0
for n in $sizes; do
  echo "== N=$n: starting $((n - running)) more containers"
  t0=$SECONDS
  bench/containers/containers.sh start $((n - running)) "$parallel"
  running=$n
  echo "   started in $((SECONDS - t0)) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
  # Let runc's teardown and the page cache settle before timing.
  isolate
  sleep 2

  echo "== N=$n: shm scan, cold and warm, against the floor ($reps repetitions)"
  r=$("$scan_bench" shm --reps "$reps" --expect "$n" "${scan_bench_args[@]}"); record "$r"
  if [ -n "$baseline" ] && [ -x "$baseline/scan_bench" ]; then
    echo "== N=$n: the same with the baseline's scan_bench"
    r=$("$baseline/scan_bench" shm --reps "$reps" --expect "$n" "${scan_bench_args[@]}")
    record "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["label"]="baseline"; print(json.dumps(r))' "$r")"
  fi

  echo "== N=$n: check and serve as processes against the floor process, side by side"
  side=(--shmlink "this=$shmlink")
  [ -z "$baseline" ] || side+=(--shmlink "baseline=$baseline/shmlink")
  r=$(python3 bench/containers/floor_side.py --containers "$n" --floor "$out/floor" "${side[@]}" \
      --reps "$side_reps" --serve-seconds "$side_seconds" --interval "$scrape_every" \
      --cgroup-root "$cgroot" ${under:+--under "$under"}); record "$r"

  echo "== N=$n: what people do today: nsenter -t PID -m -p df -B1 /dev/shm per container"
  r=$(bench/containers/diy.py "$n" "$diy_reps" $(bench/containers/containers.sh pids)); record "$r"

  echo "== N=$n: /metrics with the containers and 8 fake GPUs"
  r=$("$scan_bench" metrics --reps "$reps" --nvml-lib "$fake_nvml" "${scan_bench_args[@]}"); record "$r"

  echo "== N=$n: shmlink serve --interval $interval beside prometheus-node-exporter, ${serve_seconds} s"
  port=$(free_port)
  "$shmlink" serve --no-gpu --kube off --state-dir none --cgroup-root "$cgroot" --listen "127.0.0.1:$port" --interval "$interval" 2>"$out/serve.log" &
  serve_pid=$!
  pids_to_kill+=("$serve_pid")
  ne_port=""
  if command -v prometheus-node-exporter >/dev/null; then
    ne_port=$(free_port)
    prometheus-node-exporter --web.listen-address="127.0.0.1:$ne_port" 2>"$out/node-exporter.log" &
    ne_pid=$!
    pids_to_kill+=("$ne_pid")
    wait_http "http://127.0.0.1:$ne_port/metrics"
  fi
  wait_http "http://127.0.0.1:$port/readyz"
  # One scrape of each first: node_exporter's collectors set themselves up on the first.
  curl -sf -o /dev/null "127.0.0.1:$port/metrics"
  [ -z "$ne_port" ] || curl -sf -o /dev/null "127.0.0.1:$ne_port/metrics"
  s0=$(cpu_ticks "$serve_pid"); [ -z "$ne_port" ] || n0=$(cpu_ticks "$ne_pid")
  t_start=$(date +%s.%N)
  scrapes=$out/scrapes.txt; : >"$scrapes"
  # Scraped every interval, as a Prometheus would.
  while python3 -c "import sys,time; sys.exit(0 if time.time() - $t_start < $serve_seconds else 1)"; do
    curl -sf -o /dev/null -w "shmlink %{time_total} %{size_download}\n" "127.0.0.1:$port/metrics" >>"$scrapes"
    [ -z "$ne_port" ] || curl -sf -o /dev/null -w "node_exporter %{time_total} %{size_download}\n" "127.0.0.1:$ne_port/metrics" >>"$scrapes"
    sleep "$scrape_every"
  done
  t_end=$(date +%s.%N)
  s1=$(cpu_ticks "$serve_pid"); [ -z "$ne_port" ] || n1=$(cpu_ticks "$ne_pid")
  curl -sf "127.0.0.1:$port/metrics" >"$out/serve-metrics.txt"
  r=$(PYTHONPATH=tests/common python3 - "$n" "$interval" "$t_start" "$t_end" "$(getconf CLK_TCK)" "$scrapes" \
      "$s0" "$s1" "$(rss_kib "$serve_pid" VmRSS)" "$(rss_kib "$serve_pid" VmHWM)" \
      "${n0:-}" "${n1:-}" "$( [ -z "$ne_port" ] || rss_kib "$ne_pid" VmRSS)" "$( [ -z "$ne_port" ] || rss_kib "$ne_pid" VmHWM)" \
      "$out/serve-metrics.txt" <<'PY'
import json, statistics, sys
from promtext import samples
(n, interval, t0, t1, hz, scrapes, s0, s1, rss, hwm, n0, n1, ne_rss, ne_hwm, metrics) = sys.argv[1:]
secs = float(t1) - float(t0)
m = {}
for name, labels, value in samples(open(metrics).read()):
    # The shm scan histogram's _sum and _count.
    if name.startswith("shmlink_scan_duration_seconds_") and labels.get("collector") == "shm":
        m[name.rsplit("_", 1)[1]] = value
    if name == "shmlink_shm_used_bytes" and labels:
        m["containers"] = m.get("containers", 0) + 1
times = {"shmlink": [], "node_exporter": []}
sizes = {}
for line in open(scrapes):
    who, t, size = line.split()
    times[who].append(float(t) * 1e3)
    sizes[who] = int(size)
def proc(c0, c1, rss, hwm, who):
    if not c0:
        return None
    cpu = (float(c1) - float(c0)) / float(hz)
    return {"cpu_s": cpu, "cpu_pct": 100 * cpu / secs, "rss_mib": int(rss) / 1024, "hwm_mib": int(hwm) / 1024,
            "scrape_ms_median": statistics.median(times[who]) if times[who] else None,
            "scrape_ms_max": max(times[who]) if times[who] else None, "scrape_bytes": sizes.get(who)}
if m.get("containers", 0) < int(n):
    sys.exit(f"serve saw {m.get('containers', 0)} containers, expected {n}")
if not m.get("count"):
    sys.exit("serve finished no scan")
print(json.dumps({"mode": "serve", "containers": m["containers"], "interval": interval, "seconds": round(secs, 1),
  "scans": int(m["count"]), "mean_scan_ms": 1e3 * m["sum"] / m["count"],
  "shmlink": proc(s0, s1, rss, hwm, "shmlink"), "node_exporter": proc(n0, n1, ne_rss, ne_hwm, "node_exporter")}))
PY
)
  record "$r"
  kill "$serve_pid"; wait "$serve_pid" || true
  if [ -n "$ne_port" ]; then kill "$ne_pid"; wait "$ne_pid" 2>/dev/null || true; fi
  pids_to_kill=()
done

note "$(python3 -c 'import json,os; print(json.dumps({"mode": "load_after", "load": os.getloadavg()}))')"
unisolate
bench/containers/containers.sh stop
echo "== report"
bench/containers/report.py "$results" >"$out/report.md"
cat "$out/report.md"
[ -z "$write" ] || bench/containers/report.py "$results" --write "$write"
echo "bench: $passed passed, 0 failed"

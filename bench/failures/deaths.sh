#!/usr/bin/env bash
# The cost of telling deaths that print nothing (bench/failures/bench_deaths.rs), against issue
# 24's goals: serve under 1% of a core with N containers and both failure sources on, and the
# delay from the kernel's OOM report to the Event at the API server, p99 < 1 s.
#
#   bench/run.sh deaths [--containers N] [--kills K] [--cpu-seconds S]   # 300, 20, 60
#
# Needs root (real containers, /dev/kmsg; says SKIPPED otherwise). The report (markdown) goes to
# stdout and target/bench/deaths.md, the raw result to target/bench/deaths.jsonl. It fails on
# harness errors (a kill never told), never on timing.
set -euo pipefail
cd "$(dirname "$0")/../.."
containers=300 kills=20 cpu=60
while [ $# -gt 0 ]; do
  case "$1" in
    --containers) containers=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --cpu-seconds) cpu=$2; shift 2 ;;
    *) echo "usage: $0 [--containers N] [--kills K] [--cpu-seconds S]" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "################################################################################" >&2
  echo "##  SKIPPED: bench/run.sh deaths needs root (real containers, /dev/kmsg)." >&2
  echo "################################################################################" >&2
  exit 0
fi
missing=()
command -v runc >/dev/null || missing+=(runc)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p target/bench
echo "== building (release) and running: $containers containers, $kills OOM kills, CPU over $cpu s" >&2
BENCH_CONTAINERS=$containers BENCH_KILLS=$kills BENCH_CPU_SECS=$cpu \
  cargo test -q --release --test bench_deaths -- --ignored --nocapture 2>&2 \
  | sed -n 's/^BENCH_JSON //p' >target/bench/deaths.jsonl
[ -s target/bench/deaths.jsonl ] || { echo "bench deaths: the harness gave no result (above: why)" >&2; exit 1; }
python3 - target/bench/deaths.jsonl <<'PY' | tee target/bench/deaths.md
import json, os, sys
r = json.loads(open(sys.argv[1]).read())
k, c = r["kernel_report_to_event"], r["kernel_report_to_counted_kmsg_off"]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"## Deaths that print nothing: cost ({r['containers']} containers, {os.cpu_count()} cores, {cpu})\n")
print("| measure | figure | goal | met |\n|---|---|---|---|")
print(f"| serve's CPU, pod logs + /dev/kmsg, over {r['cpu_window_s']:.0f} s | {r['cpu_pct_both_sources']:.2f}% of a core | < 1% | {'yes' if r['cpu_pct_both_sources'] < 1 else 'NO'} |")
print(f"| serve's CPU, pod logs + OOM counters (`--kmsg off`) | {r['cpu_pct_kmsg_off']:.2f}% of a core | < 1% | {'yes' if r['cpu_pct_kmsg_off'] < 1 else 'NO'} |")
print(f"| kernel's OOM report -> Event, {k['n']} kills: p50 / p95 / p99 / max | {k['p50_ms']:.0f} / {k['p95_ms']:.0f} / {k['p99_ms']:.0f} / {k['max_ms']:.0f} ms | p99 < 1 s | {'yes' if k['p99_ms'] < 1000 else 'NO'} |")
if c:
    print(f"| kernel's OOM report -> counted by `--kmsg off` (scan every 5 s): p50 / max | {c['p50_ms']:.0f} / {c['max_ms']:.0f} ms | one interval | - |")
PY

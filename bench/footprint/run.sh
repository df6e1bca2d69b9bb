#!/usr/bin/env bash
# The footprint suite: runs `shmlink serve` for SECONDS at INTERVAL against whatever containers
# are running and reports its scan time (from its own histogram), RSS and CPU. Needs a release
# build.
#
#   bench/run.sh footprint [SECONDS=60] [INTERVAL=5s] [shmlink serve options ...]
#   (alone: bench/footprint/run.sh, the same arguments)
#
# Without options it runs with --no-gpu; pass e.g. `--nvml-lib target/release/libfake_nvml.so`
# (and FAKE_NVML_CONFIG in the environment) to include a GPU scan.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}; interval=${2:-5s}; shift $(( $# < 2 ? $# : 2 ))
opts=("$@"); [ ${#opts[@]} -gt 0 ] || opts=(--no-gpu)
bin=target/release/shmlink
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 2; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve "${opts[@]}" --kube off --listen "127.0.0.1:$port" --interval "$interval" 2>/dev/null &
pid=$!
metrics=$(mktemp)
trap 'kill $pid 2>/dev/null || true; rm -f "$metrics"' EXIT
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
t0=$(awk '{print $14+$15}' /proc/$pid/stat)
sleep "$secs"
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
curl -sf "127.0.0.1:$port/metrics" >"$metrics"
rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
hz=$(getconf CLK_TCK)
PYTHONPATH=tests/common python3 - "$metrics" "$rss" "$t0" "$t1" "$hz" "$secs" "$interval" <<'PY'
import sys
from promtext import samples
metrics, rss, t0, t1, hz, secs, interval = sys.argv[1:]
all_samples = samples(open(metrics).read())
c = sum(1 for name, labels, _ in all_samples if name == "shmlink_shm_used_bytes" and labels)
def scan(collector, part):
    return next((v for name, labels, v in all_samples
                 if name == f"shmlink_scan_duration_seconds_{part}" and labels.get("collector") == collector), None)
s, n, gs, gn = scan("shm", "sum"), scan("shm", "count"), scan("gpu", "sum"), scan("gpu", "count")
gpu = f" mean_gpu_scan_ms={1000*gs/gn:.3f}" if gs else ""
cpu = (float(t1) - float(t0)) / float(hz)
print(f"containers={c} interval={interval} scans={int(n)} "
      f"mean_scan_ms={1000*s/n:.2f}{gpu} rss_mib={int(rss)/1024:.1f} "
      f"cpu_s={cpu:.2f} in {secs}s = {100*cpu/float(secs):.3f}% of one core")
PY

#!/usr/bin/env bash
# Runs `shmlink serve` for SECONDS at INTERVAL against whatever containers are running and
# reports its scan time (from its own histogram), RSS and CPU. Needs a release build.
#
#   bench/serve-footprint.sh [SECONDS=60] [INTERVAL=5s] [shmlink serve options ...]
#
# Without options it runs with --no-gpu; pass e.g. `--nvml-lib target/release/libfake_nvml.so`
# (and FAKE_NVML_CONFIG in the environment) to include a GPU scan.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}; interval=${2:-5s}; shift $(( $# < 2 ? $# : 2 ))
opts=("$@"); [ ${#opts[@]} -gt 0 ] || opts=(--no-gpu)
bin=target/release/shmlink
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 2; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve "${opts[@]}" --kube off --listen "127.0.0.1:$port" --interval "$interval" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
t0=$(awk '{print $14+$15}' /proc/$pid/stat)
sleep "$secs"
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
metrics=$(curl -sf "127.0.0.1:$port/metrics")
rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
hz=$(getconf CLK_TCK)
containers=$(grep -c '^shmlink_shm_used_bytes{' <<<"$metrics" || true)
sum=$(awk '/^shmlink_scan_duration_seconds_sum\{collector="shm"\}/ {print $2}' <<<"$metrics")
count=$(awk '/^shmlink_scan_duration_seconds_count\{collector="shm"\}/ {print $2}' <<<"$metrics")
gsum=$(awk '/^shmlink_scan_duration_seconds_sum\{collector="gpu"\}/ {print $2}' <<<"$metrics")
gcount=$(awk '/^shmlink_scan_duration_seconds_count\{collector="gpu"\}/ {print $2}' <<<"$metrics")
python3 - "$containers" "$sum" "$count" "$rss" "$t0" "$t1" "$hz" "$secs" "$interval" "$gsum" "$gcount" <<'PY'
import sys
c, s, n, rss, t0, t1, hz, secs, interval, gs, gn = sys.argv[1:]
gpu = f" mean_gpu_scan_ms={1000*float(gs)/float(gn):.3f}" if gs and float(gs) > 0 else ""
cpu = (float(t1) - float(t0)) / float(hz)
print(f"containers={c} interval={interval} scans={int(float(n))} "
      f"mean_scan_ms={1000*float(s)/float(n):.2f}{gpu} rss_mib={int(rss)/1024:.1f} "
      f"cpu_s={cpu:.2f} in {secs}s = {100*cpu/float(secs):.3f}% of one core")
PY

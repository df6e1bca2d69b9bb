#!/usr/bin/env bash
# The one entry point of shmlink's benchmarks (BENCHMARKS.md has what each measures and its
# results). Each suite lives in bench/<suite>/ and keeps its own options:
#
#   bench/run.sh containers [--sizes "N ..."] [--reps R] [--diy-reps R] [--serve-seconds S]
#                           [--interval D] [--parallel P] [--write FILE] [--smoke]
#       N real runc containers: shm scan vs the syscall floor vs nsenter+df, /metrics encoding,
#       the GPU scan of the fake NVSwitch board, serve beside node_exporter (root)
#   bench/run.sh failures [--seconds S] [--mib M] [--reps R] [--containers N]
#                         [--lines-per-sec L] [--pods P] [--spread S]
#       failure detection: log bytes per CPU-second, serve's CPU following busy logs, failure
#       line -> Event delay (root)
#   bench/run.sh deaths [--containers N] [--kills K] [--cpu-seconds S]
#       deaths that print nothing: serve's CPU with N real containers and both failure sources
#       on (and with --kmsg off), the kernel's OOM report -> Event delay over K real kills (root)
#   bench/run.sh death-trace race [DEATHS] | cost [SECONDS] [RATE]
#       serve --death-trace: the reading against real SIGBUS deaths, CPU idle and in a SIGBUS
#       storm, traced and not (root, release build)
#   bench/run.sh state [--containers N] [--seconds S] [--lines-per-sec L] [--death-every D]
#       the state store's cost in serve: CPU, commits, rows, disk writes and fsyncs with and
#       without --state-dir, N containers' logs (release build)
#   bench/run.sh admission [--smoke] [--rate R] [--seconds S] [--connections C] [--http 2|1]
#       shmlink admit (release build) under an open loop of 8-GPU PyTorch Pod reviews over
#       HTTPS keep-alive: latency from the intended send time (p50/p90/p99/max), errors, the
#       server's CPU and RSS; --smoke: 3 s
#   bench/run.sh parsers [criterion options]      the parser micro-benchmarks (cargo bench)
#   bench/run.sh fleet [NODES] [CONTAINERS_PER_NODE]
#       the dashboard's fleet queries and recording rules on a synthetic big cluster
#   bench/run.sh footprint [SECONDS] [INTERVAL] [shmlink serve options ...]
#       serve's scan time, RSS and CPU against whatever containers run (release build)
#   bench/run.sh --smoke
#       what CI runs: the parser benchmarks once each, `admission` for 3 s, then
#       `containers --smoke` (N = 20; debug builds); fails on harness errors, never on timing;
#       not as root it says SKIPPED
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

suite=${1:-}
[ $# -eq 0 ] || shift
case "$suite" in
  containers | failures | fleet | footprint) exec "bench/$suite/run.sh" "$@" ;;
  deaths) exec bench/failures/deaths.sh "$@" ;;
  state) cargo build -q --release --bin shmlink && exec python3 bench/state/cost.py "$@" ;;
  death-trace) exec python3 bench/death_trace/race.py "$@" ;;
  admission)
    profile=release
    if [ "${1:-}" = --smoke ]; then shift; set -- --seconds 3 "$@"; fi
    cargo build -q --$profile --bin shmlink --example admission_bench
    exec target/$profile/examples/admission_bench --shmlink target/$profile/shmlink "$@"
    ;;
  parsers) exec cargo bench --bench parsers -- "$@" ;;
  --smoke)
    [ $# -eq 0 ] || { usage >&2; exit 2; }
    echo "== parser micro-benchmarks, once each (cargo test --bench parsers)"
    cargo test -q --bench parsers
    echo "== admission webhook, 3 s (debug build)"
    cargo build -q --bin shmlink --example admission_bench
    target/debug/examples/admission_bench --shmlink target/debug/shmlink --seconds 3
    exec bench/containers/run.sh --smoke
    ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Fuzzes every parser with cargo fuzz (libFuzzer): `scripts/fuzz.sh [--dev] [--build-only]
# [SECONDS_PER_TARGET]` (default 15). `--build-only` builds the targets and stops: CI builds them
# in the background while the tests run, then fuzzes. `--dev` (what CI runs) builds without optimizations: cargo fuzz's release build
# uses one codegen unit and took 8-13 minutes of a cold CI run, for a 15-second smoke per target
# where executions per second matter less than finishing; a long local run leaves it out. Seeds come from fuzz/corpus/<target>/seed-* (copied from
# tests/fixtures and the fake NVML presets); what a run learns stays in fuzz/corpus (ignored by
# git). A crash fails the run and leaves its input in fuzz/artifacts/<target>/.
# cargo fuzz passes nightly-only flags to rustc; RUSTC_BOOTSTRAP=1 lets this stable toolchain
# accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
build=()
if [ "${1:-}" = --dev ]; then build=(--dev); shift; fi
build_only=
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
secs="${1:-15}"
if ! command -v cargo-fuzz >/dev/null; then
  if [ "$(id -u)" = 0 ] || [ -n "${CI:-}" ]; then
    echo "== installing cargo-fuzz"; cargo install --locked cargo-fuzz
  else
    echo "SKIPPED fuzzing: cargo-fuzz is not installed (cargo install --locked cargo-fuzz)" >&2
    exit 0
  fi
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build "${build[@]}"
[ -z "$build_only" ] || exit 0
targets=$(cargo fuzz list)
printf '%-18s %12s %8s\n' target executions seconds
for t in $targets; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo fuzz run "${build[@]}" "$t" "corpus/$t" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "FAILED: fuzz target $t (input in fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  printf '%-18s %12s %8s\n' "$t" "${runs:-?}" "${took:-$secs}"
  rm -f "$log"
done

#!/usr/bin/env bash
# Runs the whole test suite. As root it installs what end-to-end tests need (runc,
# busybox-static); otherwise it says loudly what it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  missing=()
  command -v runc >/dev/null || missing+=(runc)
  command -v busybox >/dev/null || missing+=(busybox-static)
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
else
  echo "SKIPPED: not root, so runc/busybox-static are not installed and end-to-end container tests cannot run" >&2
fi
cargo build --workspace
cargo test --workspace

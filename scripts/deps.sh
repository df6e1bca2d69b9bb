#!/usr/bin/env bash
# Checks the dependency tree with cargo deny (deny.toml): licences, bans and sources always (they
# need nothing but Cargo.lock); known advisories (RustSec) when its database, on GitHub, can be
# fetched. Where it cannot (a network that reaches crates.io but not GitHub), that part says
# SKIPPED loudly instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deny >/dev/null; then
  if [ "$(id -u)" = 0 ] || [ -n "${CI:-}" ]; then
    echo "== installing cargo-deny"; cargo install --locked cargo-deny
  else
    echo "SKIPPED dependency checks: cargo-deny is not installed (cargo install --locked cargo-deny)" >&2
    exit 0
  fi
fi
echo "== cargo deny check licenses bans sources"
cargo deny --log-level error check licenses bans sources
if timeout 20 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
  echo "== cargo deny check advisories"
  cargo deny --log-level error check advisories
else
  cat >&2 <<'MSG'
############################################################################
SKIPPED: known-advisory check. The RustSec advisory database
(github.com/rustsec/advisory-db) cannot be fetched from this machine, so
`cargo deny check advisories` did not run. Licences, bans and sources were
checked. Run scripts/deps.sh where GitHub is reachable.
############################################################################
MSG
fi
